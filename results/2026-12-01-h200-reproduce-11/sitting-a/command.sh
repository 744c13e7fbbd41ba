#!/usr/bin/env bash
# Sitting A: set-up, make test-gpu, a stress run (16 threads, four workloads), then verify stages through a local Ray instance as the time left allows.
set -u
. .gpu/env.sh
W=/tmp/a; mkdir -p $W results; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
pack() { cp -r results/$RUN $W/ 2>/dev/null; tar czf $OUT/a.tgz --exclude='*.wav' -C $W .; }
WHEELS=.whl make setup > $W/setup.log 2>&1 || { tail -30 $W/setup.log; pack; exit 1; }
echo "setup $(( $(date +%s) - T0 )) s"
t0=$(date +%s)
timeout 270 make test-gpu GPU_LOG=$W/test-gpu.log > $W/test-gpu.out 2>&1; echo "test-gpu rc=$? $(( $(date +%s) - t0 )) s"
pack
t0=$(date +%s)
timeout 200 .venv/bin/python -m suite.measure.stress --device cuda --threads 16 --seconds 90 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1; echo "stress rc=$? $(( $(date +%s) - t0 )) s"
pack
t0=$(date +%s)
.venv/bin/python -m pip install -q --no-index --find-links .whl-ray --find-links .whl --no-build-isolation -e ".[ray]" > $W/ray-install.log 2>&1 && touch .venv/.ray-stamp
left=$(( 560 - ($(date +%s) - T0) ))
echo "ray install $(( $(date +%s) - t0 )) s; left $left s"
if [ $left -gt 60 ]; then
  t0=$(date +%s)
  WHEELS=.whl timeout $left make reproduce RAY=1 ARGS="--ray local --device cuda --stages '*.verify' --run-dir results/$RUN --budget-s $(( left - 15 ))" > $W/reproduce-a.log 2>&1; echo "reproduce rc=$? $(( $(date +%s) - t0 )) s"
fi
pack
grep -E "passed|failed" $W/test-gpu.log | tail -2; grep -E "^(FAILED|ERROR)" $W/test-gpu.log | head -20
tail -16 $W/stress.log
grep -E "^stage|bytes|stop" $W/reproduce-a.log | tail -12
