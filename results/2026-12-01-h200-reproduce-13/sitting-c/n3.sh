#!/usr/bin/env bash
# Sitting 3: any verify stage left (--resume), the itemised memory of MiniCPM-o, a stress run for the time left.
# LIMIT: seconds this sitting may take (default 570).
set -u
. .gpu/env.sh
W=/tmp/n3; mkdir -p $W results; T0=$(date +%s); L=${LIMIT:-570}
cp .gpu/n3.sh $W/
pack() { cp -r results/$RUN $W/ 2>/dev/null; tar czf $OUT/n3.tgz --exclude='*.wav' -C $W .; }
WHEELS=.whl make setup > $W/setup.log 2>&1 || { tail -30 $W/setup.log; pack; exit 1; }
R=""; .venv/bin/python -c "import ray" 2>/dev/null && R="--ray local"
if [ -n "${VERIFY:-}" ]; then
  t0=$(date +%s)
  WHEELS=.whl timeout 200 make reproduce ARGS="$R --device cuda --stages '*.verify' --run-dir results/$RUN --resume --budget-s 190" > $W/reproduce-3.log 2>&1; echo "reproduce rc=$? $(( $(date +%s) - t0 )) s"
  pack
fi
t0=$(date +%s)
PYTHONPATH=$PWD/impl:$PWD timeout 150 .venv/bin/python -m suite.measure.floor --workload minicpmo45 --device cuda --memory --units 2 --warm-units 3 --timed-units 2 --out $W/floor > $W/floor.log 2>&1; echo "floor rc=$? $(( $(date +%s) - t0 )) s"
pack
left=$(( L - ($(date +%s) - T0) ))
echo "left $left s"
if [ $left -gt 150 ]; then
  t0=$(date +%s)
  timeout $left .venv/bin/python -m suite.measure.stress --device cuda --threads 16 --seconds $(( left - 100 )) --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1; echo "stress rc=$? $(( $(date +%s) - t0 )) s"
fi
pack
tail -30 $W/floor.log; grep -E "^stage|bytes|stop" $W/reproduce-3.log 2>/dev/null | tail -6; tail -16 $W/stress.log
