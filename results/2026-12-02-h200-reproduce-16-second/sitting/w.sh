#!/usr/bin/env bash
# Wait for m.sh (at most WAIT s), packing /tmp/m into $OUT/m.tgz every 60 s and at the end.
set -u
W=/tmp/m; T0=$(date +%s); WAIT=${WAIT:-570}; last=0
pack() { tar czf $OUT/m.tgz.tmp --exclude='*.wav' -C $W . 2>/dev/null && mv $OUT/m.tgz.tmp $OUT/m.tgz; }
while [ ! -e $W/done ] && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do
  sleep 5; now=$(date +%s); [ $(( now - last )) -ge 60 ] && { pack; last=$now; }
done
pack; echo "waited $(( $(date +%s) - T0 )) s; done=$([ -e $W/done ] && echo yes || echo no)"
cat $W/m.log 2>/dev/null; grep -E "passed|failed" $W/test-gpu.log 2>/dev/null | tail -1; grep -E "^stage|bytes" $W/reproduce-v.log 2>/dev/null | tail -6; tail -4 $W/stress.log 2>/dev/null; tail -8 $W/floor.log 2>/dev/null
