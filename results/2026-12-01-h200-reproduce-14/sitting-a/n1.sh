#!/usr/bin/env bash
# Sitting 1: set-up, Ray, make test-gpu, the verify stages through Ray as the time left allows.
set -u
. .gpu/env.sh
W=/tmp/n1; mkdir -p $W results; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
cp .gpu/n1.sh .gpu/env.sh $W/
pack() { cp -r results/$RUN $W/ 2>/dev/null; tar czf $OUT/n1.tgz --exclude='*.wav' -C $W .; }
WHEELS=.whl make setup > $W/setup.log 2>&1 || { tail -30 $W/setup.log; pack; exit 1; }
.venv/bin/python -m pip install -q --no-index --find-links .whl-ray --find-links .whl --no-build-isolation -e ".[ray]" > $W/ray-install.log 2>&1 && touch .venv/.ray-stamp
echo "setup + ray $(( $(date +%s) - T0 )) s"
t0=$(date +%s)
timeout 300 make test-gpu GPU_LOG=$W/test-gpu.log > $W/test-gpu.out 2>&1; echo "test-gpu rc=$? $(( $(date +%s) - t0 )) s"
pack
left=$(( 575 - ($(date +%s) - T0) ))
if [ $left -gt 140 ]; then
  t0=$(date +%s)
  WHEELS=.whl timeout $left make reproduce RAY=1 ARGS="--ray local --device cuda --stages '*.verify' --run-dir results/$RUN --budget-s $(( left - 15 ))" > $W/reproduce-1.log 2>&1; echo "reproduce rc=$? $(( $(date +%s) - t0 )) s"
fi
pack
grep -E "passed|failed" $W/test-gpu.log | tail -2; grep -E "^(FAILED|ERROR)" $W/test-gpu.log | head -20
grep -E "^stage|bytes|stop" $W/reproduce-1.log | tail -12
