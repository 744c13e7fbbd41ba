#!/usr/bin/env bash
# Master of one sitting (started with setsid by tools/lent_gpu/start.sh in its copy /tmp/r), main at the commit
# env.sh names, no impl change since the gate of its impl tree: set-up, the 10-minute CUDA stress (16 threads,
# warm-up first, quiescent samples every 16 closes), with each quiescent sample in stress.log as it is taken; then make test-gpu for
# what time is left (the tests changed since the last full run).
set -u
W=/tmp/m; R=/tmp/r; T0=$(date +%s)
log() { echo "$(( $(date +%s) - T0 )) s: $*" >> $W/m.log; }
cd $R
. .gpu/env.sh
cp .gpu/g.sh .gpu/env.sh $W/
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
WHEELS=.whl make setup > $W/setup.log 2>&1 || { log "setup failed"; touch $W/done; exit 1; }
log "setup done"
PYTHONPATH=$R/impl:$R timeout 900 .venv/bin/python -m suite.measure.stress --device cuda --threads 16 \
  --seconds 600 --quiesce-every 16 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1
log "stress rc=$?"
WHEELS=.whl timeout 330 make test-gpu GPU_LOG=$W/test-gpu-pytest.log > $W/test-gpu.log 2>&1; log "test-gpu rc=$?"
nvidia-smi > $W/nvidia-smi-end.txt 2>&1
touch $W/done
