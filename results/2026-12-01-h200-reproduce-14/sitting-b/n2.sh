#!/usr/bin/env bash
# Sitting 2: make asv for this commit, then the remaining verify stages (--resume; through Ray where the venv has it).
set -u
. .gpu/env.sh
W=/tmp/n2; mkdir -p $W results; T0=$(date +%s)
cp .gpu/n2.sh $W/
pack() { mkdir -p $W/asv; cp -r results/asv/results/h200 $W/asv/ 2>/dev/null; cp results/asv/results/benchmarks.json $W/asv/ 2>/dev/null; cp -r results/$RUN $W/ 2>/dev/null; tar czf $OUT/n2.tgz --exclude='*.wav' -C $W .; }
WHEELS=.whl make setup > $W/setup.log 2>&1 || { tail -30 $W/setup.log; pack; exit 1; }
echo "setup $(( $(date +%s) - T0 )) s"
t0=$(date +%s)
GIT_DIR=$PWD/.gpu/shallow.git WHEELS=.whl timeout 335 make asv ASV_MACHINE=h200 ARGS="--bench \"time_steady_unit\(.*'cuda'\)\" --show-stderr" > $W/asv.log 2>&1; echo "asv rc=$? $(( $(date +%s) - t0 )) s"
pack
left=$(( 580 - ($(date +%s) - T0) ))
R=""; .venv/bin/python -c "import ray" 2>/dev/null && R="--ray local"
echo "left $left s; ray: ${R:-none}"
if [ $left -gt 100 ]; then
  t0=$(date +%s)
  WHEELS=.whl timeout $left make reproduce ARGS="$R --device cuda --stages '*.verify' --run-dir results/$RUN --resume --budget-s $(( left - 10 ))" > $W/reproduce-2.log 2>&1; echo "reproduce rc=$? $(( $(date +%s) - t0 )) s"
fi
pack
tail -4 $W/asv.log; grep -E "^stage|bytes|stop" $W/reproduce-2.log | tail -12
