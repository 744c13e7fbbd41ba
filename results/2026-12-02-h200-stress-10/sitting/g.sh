#!/usr/bin/env bash
# Master (started with setsid by tools/lent_gpu/start.sh in its copy /tmp/r), main's impl tree ccc4b7e, no impl
# change since the gate of -16: set-up; the CUDA stress of four models on 16 threads judged on quiescent samples
# (--quiesce-every 16), 900 s so that the last quiescent samples lie past the first few hundred closes, each
# sample reading the host heap and torch's cuFFT plan count; then the Step-Audio 2 sessions-per-GPU search on
# unseen scripts (the duplex stage's arguments) in the time left before END.
set -u
W=/tmp/m; R=/tmp/r; T0=$(date +%s); END=$(( T0 + ${BUDGET:-1560} ))
log() { echo "$(( $(date +%s) - T0 )) s: $*" >> $W/m.log; }
cd $R
. .gpu/env.sh
cp .gpu/g.sh .gpu/env.sh $W/
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.txt 2>&1
WHEELS=.whl make setup > $W/setup.log 2>&1 || { log "setup failed"; touch $W/done; exit 1; }
log "setup done"
PY=".venv/bin/python"; export PYTHONPATH=$R/impl:$R
timeout 1150 $PY -m suite.measure.stress --device cuda --threads 16 --seconds 900 --quiesce-every 16 \
  --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1
log "stress rc=$?"
left=$(( END - $(date +%s) )); b=$(( left - 90 ))
log "duplex stepaudio2_mini budget $b (left $left)"
if [ $b -ge 100 ]; then
  timeout $(( b + 80 )) $PY -m suite.measure.duplex --device cuda --modes cadence --ar none --seconds 60 \
    --budget-s $b --out $W/duplex-stepaudio2_mini --workload stepaudio2_mini --start 8 --grow 1.5 \
    --prepare learned:64 > $W/duplex-stepaudio2_mini.log 2>&1
  log "duplex stepaudio2_mini rc=$?"
fi
touch $W/done
