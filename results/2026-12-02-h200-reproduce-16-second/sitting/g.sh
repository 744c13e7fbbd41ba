#!/usr/bin/env bash
# Master (started with setsid by g0.sh in its copy /tmp/r), main's tree, no impl change since the gate of -16:
# set-up + Ray; the five verify stages through Ray (the second run of impl tree ccc4b7e, for the second-run bar
# against -16); the 10-minute CUDA stress of four models on 16 threads (memory flat over 100 closes?); then
# the itemised floor (timeline, data movement, memory) for the time left before END.
set -u
W=/tmp/m; R=/tmp/r; T0=$(date +%s); END=$(( T0 + ${BUDGET:-1600} ))
log() { echo "$(( $(date +%s) - T0 )) s: $*" >> $W/m.log; }
cd $R
. .gpu/env.sh
cp .gpu/g.sh .gpu/g0.sh .gpu/w.sh .gpu/env.sh $W/
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
WHEELS=.whl make setup > $W/setup.log 2>&1 || { log "setup failed"; touch $W/done; exit 1; }
.venv/bin/python -m pip install -q --no-index --find-links .whl-ray --find-links .whl --no-build-isolation -e ".[ray]" > $W/ray-install.log 2>&1 && touch .venv/.ray-stamp
log "setup + ray done"
mkdir -p results
WHEELS=.whl timeout 640 make reproduce RAY=1 ARGS="--ray local --device cuda --stages '*.verify' --run-dir $W/$RUN --budget-s 620" > $W/reproduce-v.log 2>&1; log "verify rc=$?"
left=$(( END - $(date +%s) )); ss=600; [ $(( left - 200 )) -lt $ss ] && ss=$(( left - 200 ))
log "stress seconds $ss (left $left)"
if [ $ss -gt 60 ]; then
  PYTHONPATH=$R/impl:$R timeout $(( ss + 190 )) .venv/bin/python -m suite.measure.stress --device cuda --threads 16 \
    --seconds $ss --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1
  log "stress rc=$?"
fi
left=$(( END - $(date +%s) ))
log "floor (left $left)"
if [ $left -gt 90 ]; then
  PYTHONPATH=$R/impl:$R timeout $(( left - 15 )) .venv/bin/python -m suite.measure.floor --workload stepaudio2_mini \
    --workload moshi --workload qwen3_omni --workload minicpmo45 --device cuda --memory --units 2 --warm-units 3 \
    --timed-units 2 --timeout-s 200 --out $W/floor > $W/floor.log 2>&1
  log "floor rc=$?"
fi
touch $W/done
