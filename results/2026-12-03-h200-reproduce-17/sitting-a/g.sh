#!/usr/bin/env bash
# Master of the gate (started with setsid by tools/lent_gpu/start.sh in its copy /tmp/r): set-up + Ray, make
# test-gpu, the five verify stages through Ray, make asv for this commit, then the CUDA stress (16 threads, the
# warm-up first, quiescent samples every 16 closes) for the time left before END.
set -u
W=/tmp/m; R=/tmp/r; T0=$(date +%s); END=$(( T0 + ${BUDGET:-1520} )); RUN=${RUN:-2026-12-03-h200-reproduce-17}
log() { echo "$(( $(date +%s) - T0 )) s: $*" >> $W/m.log; }
cd $R
. .gpu/env.sh
cp .gpu/g.sh .gpu/env.sh $W/
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
WHEELS=.whl make setup > $W/setup.log 2>&1 || { log "setup failed"; touch $W/done; exit 1; }
.venv/bin/python -m pip install -q --no-index --find-links .whl-ray --find-links .whl --no-build-isolation -e ".[ray]" > $W/ray-install.log 2>&1 && touch .venv/.ray-stamp
log "setup + ray done"
timeout 330 make test-gpu GPU_LOG=$W/test-gpu.log > $W/test-gpu.out 2>&1; log "test-gpu rc=$?"
mkdir -p results
WHEELS=.whl timeout 460 make reproduce RAY=1 ARGS="--ray local --device cuda --stages '*.verify' --max-speak-units 16 --run-dir $W/$RUN --budget-s 440" > $W/reproduce-v.log 2>&1; log "verify rc=$?"
GIT_DIR=$R/.gpu/shallow.git WHEELS=.whl timeout 335 make asv ASV_MACHINE=h200 ARGS="--bench \"time_steady_unit\(.*'cuda'\)\" --show-stderr" > $W/asv.log 2>&1; log "asv rc=$?"
mkdir -p $W/asv; cp -r results/asv/results/h200 $W/asv/ 2>/dev/null; cp results/asv/results/benchmarks.json $W/asv/ 2>/dev/null
left=$(( END - $(date +%s) )); ss=$(( left - 300 ))
log "stress seconds $ss (left $left)"
if [ $ss -gt 60 ]; then
  PYTHONPATH=$R/impl:$R timeout $(( left - 5 )) .venv/bin/python -m suite.measure.stress --device cuda --threads 16 \
    --seconds $ss --quiesce-every 16 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1
  log "stress rc=$?"
fi
touch $W/done
