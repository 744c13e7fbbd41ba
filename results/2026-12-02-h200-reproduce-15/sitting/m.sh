#!/usr/bin/env bash
# One master process for the whole session (started with setsid by m0.sh, outlives calls while the machine is
# held): set-up in its own copy /tmp/r, the 10-minute 16-thread CUDA stress, then minicpmo45.duplex_cadence with
# the time left before END (BUDGET s after start). w.sh calls wait for it and bring /tmp/m back.
set -u
W=/tmp/m; R=/tmp/r; T0=$(date +%s); END=$(( T0 + ${BUDGET:-1530} ))
log() { echo "$(( $(date +%s) - T0 )) s: $*" >> $W/m.log; }
cd $R
. .gpu/env.sh
cp .gpu/m.sh .gpu/m0.sh .gpu/w.sh .gpu/env.sh $W/
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
WHEELS=.whl make setup > $W/setup.log 2>&1 || { log "setup failed"; touch $W/done; exit 1; }
log "setup done"
PYTHONPATH=$R/impl:$R timeout 980 .venv/bin/python -m suite.measure.stress --device cuda --threads 16 \
  --seconds 600 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1
log "stress rc=$?"
left=$(( END - $(date +%s) )); sb=$(( left < 560 ? left : 560 ))
log "duplex stage budget $sb s"
if [ $sb -gt 240 ]; then
  WHEELS=.whl timeout $(( sb + 30 )) make reproduce ARGS="--device cuda --stages minicpmo45.duplex_cadence --run-dir $W/$RUN --stage-budget-s $sb" > $W/reproduce.log 2>&1
  log "reproduce rc=$?"
fi
touch $W/done
