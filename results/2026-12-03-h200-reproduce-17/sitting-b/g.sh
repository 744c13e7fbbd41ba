#!/usr/bin/env bash
# Master of the gate's second sitting (started with setsid by tools/lent_gpu/start.sh in its copy /tmp/r), impl
# tree as the first: set-up + Ray, the CUDA test whose order the first sitting's make test-gpu failed, the verify
# stages the first sitting did not finish (--resume of its run folder), make asv for this commit, then the CUDA
# stress (16 threads, warm-up first) for the time left before END.
set -u
W=/tmp/m; R=/tmp/r; T0=$(date +%s); END=$(( T0 + ${BUDGET:-780} )); RUN=2026-12-03-h200-reproduce-17
log() { echo "$(( $(date +%s) - T0 )) s: $*" >> $W/m.log; }
cd $R
. .gpu/env.sh
cp .gpu/g.sh .gpu/env.sh $W/; cp -r .gpu/run17 $W/$RUN
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
WHEELS=.whl make setup > $W/setup.log 2>&1 || { log "setup failed"; touch $W/done; exit 1; }
.venv/bin/python -m pip install -q --no-index --find-links .whl-ray --find-links .whl --no-build-isolation -e ".[ray]" > $W/ray-install.log 2>&1 && touch .venv/.ray-stamp
log "setup + ray done"
timeout 120 .venv/bin/python -m pytest -q -m gpu -rs tests/test_graphs_sessions.py > $W/test-gpu-2.log 2>&1; log "test_graphs_sessions rc=$?"
mkdir -p results
WHEELS=.whl timeout 330 make reproduce RAY=1 ARGS="--ray local --device cuda --stages '*.verify' --max-speak-units 16 --resume --run-dir $W/$RUN --budget-s 310" > $W/reproduce-v2.log 2>&1; log "verify rc=$?"
GIT_DIR=$R/.gpu/shallow.git WHEELS=.whl timeout 320 make asv ASV_MACHINE=h200 ARGS="--bench \"time_steady_unit\(.*'cuda'\)\" --show-stderr" > $W/asv.log 2>&1; log "asv rc=$?"
mkdir -p $W/asv; cp -r results/asv/results/h200 $W/asv/ 2>/dev/null; cp results/asv/results/benchmarks.json $W/asv/ 2>/dev/null
left=$(( END - $(date +%s) )); ss=$(( left - 200 ))
log "stress seconds $ss (left $left)"
if [ $ss -gt 60 ]; then
  PYTHONPATH=$R/impl:$R timeout $(( left - 5 )) .venv/bin/python -m suite.measure.stress --device cuda --threads 16 \
    --seconds $ss --quiesce-every 16 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1
  log "stress rc=$?"
fi
touch $W/done
