#!/usr/bin/env bash
# Sitting C: make asv (the CUDA steady-unit benchmarks) for this commit, then a stress run as the time left allows.
set -u
. .gpu/env.sh
W=/tmp/c; mkdir -p $W results; T0=$(date +%s)
pack() { mkdir -p $W/asv; cp -r results/asv/results/h200 $W/asv/ 2>/dev/null; cp results/asv/results/benchmarks.json $W/asv/ 2>/dev/null; tar czf $OUT/c.tgz --exclude='*.wav' -C $W .; }
WHEELS=.whl make setup > $W/setup.log 2>&1 || { tail -30 $W/setup.log; pack; exit 1; }
echo "setup $(( $(date +%s) - T0 )) s"
t0=$(date +%s)
GIT_DIR=$PWD/.gpu/shallow.git WHEELS=.whl timeout 330 make asv ASV_MACHINE=h200 ARGS="--bench \"time_steady_unit\(.*'cuda'\)\" --show-stderr" > $W/asv.log 2>&1; echo "asv rc=$? $(( $(date +%s) - t0 )) s"
pack
left=$(( 555 - ($(date +%s) - T0) ))
echo "left $left s"
if [ $left -gt 120 ]; then
  t0=$(date +%s)
  timeout $left .venv/bin/python -m suite.measure.stress --device cuda --threads 16 --seconds $(( left - 95 )) --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1; echo "stress rc=$? $(( $(date +%s) - t0 )) s"
fi
pack
tail -5 $W/asv.log; tail -14 $W/stress.log
