#!/usr/bin/env bash
# Sitting 3b: the drop-in speed lines (mimi, code2wav, token2wav; 3 fresh processes each), then the report; stress with what is left.
set -u
. .gpu/env.sh
W=/tmp/n3; mkdir -p $W results; T0=$(date +%s); L=${LIMIT:-570}
cp .gpu/n3b.sh $W/
pack() { cp -r results/$RUN $W/ 2>/dev/null; tar czf $OUT/n3.tgz --exclude='*.wav' -C $W .; }
WHEELS=.whl make setup > $W/setup.log 2>&1 || { tail -30 $W/setup.log; pack; exit 1; }
echo "setup $(( $(date +%s) - T0 )) s"
for d in mimi code2wav token2wav; do
  left=$(( L - ($(date +%s) - T0) - 15 ))
  [ $left -gt 60 ] || { echo "no time for $d"; continue; }
  t0=$(date +%s)
  PYTHONPATH=$PWD/impl:$PWD timeout $left .venv/bin/python -m suite.measure.dropin --dropin $d --device cuda --processes 3 --out $W/dropin > $W/dropin-$d.log 2>&1; echo "dropin $d rc=$? $(( $(date +%s) - t0 )) s"
  pack
done
PYTHONPATH=$PWD/impl:$PWD .venv/bin/python -m suite.report $W/dropin > $W/dropin-report.log 2>&1; echo "report rc=$?"
pack
for d in mimi code2wav token2wav; do tail -5 $W/dropin-$d.log; done; tail -30 $W/dropin-report.log
