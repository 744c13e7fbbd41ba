#!/usr/bin/env bash
# Every later device call of a sitting: wait for the master (at most WAIT s, default 570), packing /tmp/m into
# $OUT/m.tgz every 60 s and at the end (WAVs left out), so that what it wrote comes back even if the call is
# cut; then print the master's log (/tmp/m/m.log) and the last lines of each *.log under /tmp/m.
set -u
W=/tmp/m; T0=$(date +%s); WAIT=${WAIT:-570}; last=0
pack() { tar czf "$OUT/m.tgz.tmp" --exclude='*.wav' -C $W . 2>/dev/null && mv "$OUT/m.tgz.tmp" "$OUT/m.tgz"; }
while [ ! -e $W/done ] && [ $(( $(date +%s) - T0 )) -lt "$WAIT" ]; do
  sleep 5; now=$(date +%s); [ $(( now - last )) -ge 60 ] && { pack; last=$now; }
done
pack; echo "waited $(( $(date +%s) - T0 )) s; done=$([ -e $W/done ] && echo yes || echo no)"
cat $W/m.log 2>/dev/null
for f in $W/*.log; do [ -e "$f" ] && { echo "== ${f##*/}"; tail -4 "$f"; }; done
