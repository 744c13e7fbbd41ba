#!/usr/bin/env bash
# Master for the gate of gate-next (started with setsid by g0.sh in its copy /tmp/r): set-up + Ray, make test-gpu,
# the five verify stages through Ray, make asv for this commit, then the MiniCPM-o duplex search with a learned
# graph set, then a stress run with allocation sites for the time left before END.
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
timeout 330 make test-gpu GPU_LOG=$W/test-gpu.log > $W/test-gpu.out 2>&1; log "test-gpu rc=$?"
mkdir -p results
WHEELS=.whl timeout 640 make reproduce RAY=1 ARGS="--ray local --device cuda --stages '*.verify' --run-dir $W/$RUN --budget-s 620" > $W/reproduce-v.log 2>&1; log "verify rc=$?"
GIT_DIR=$R/.gpu/shallow.git WHEELS=.whl timeout 335 make asv ASV_MACHINE=h200 ARGS="--bench \"time_steady_unit\(.*'cuda'\)\" --show-stderr" > $W/asv.log 2>&1; log "asv rc=$?"
mkdir -p $W/asv; cp -r results/asv/results/h200 $W/asv/ 2>/dev/null; cp results/asv/results/benchmarks.json $W/asv/ 2>/dev/null
left=$(( END - $(date +%s) )); db=$(( left > 560 ? 300 : left - 250 ))
log "duplex budget $db s (left $left)"
if [ $db -gt 120 ]; then
  PYTHONPATH=$R/impl:$R timeout $(( db + 40 )) .venv/bin/python -m suite.measure.duplex --workload minicpmo45 --device cuda \
    --modes cadence --ar none --seconds 60 --policy threads --prepare learned:64 --start 6 --grow 1.5 --budget-s $db \
    --out $W/duplex-learned > $W/duplex.log 2>&1; log "duplex rc=$?"
fi
left=$(( END - $(date +%s) )); ss=$(( left - 150 ))
log "stress seconds $ss (left $left)"
if [ $ss -gt 40 ]; then
  PYTHONPATH=$R/impl:$R timeout $(( left - 10 )) .venv/bin/python -m suite.measure.stress --device cuda --threads 16 \
    --seconds $ss --memory-sites --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1
  log "stress rc=$?"
fi
touch $W/done
