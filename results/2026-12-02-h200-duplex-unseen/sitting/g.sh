#!/usr/bin/env bash
# Master (started with setsid by tools/lent_gpu/start.sh in its copy /tmp/r), main's tree, no impl change since
# the gate of -16: set-up; the 10-minute CUDA stress of four models on 16 threads judged on quiescent samples
# (--quiesce-every 16); then the sessions-per-GPU searches on unseen scripts (DuplexCadence, the duplex stages'
# arguments, suite/stages/duplex_sessions.json) for MiniCPM-o 10 steps, Moshi, Qwen3-Omni and Step-Audio 2 in the
# time left before END.
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
timeout 800 $PY -m suite.measure.stress --device cuda --threads 16 --seconds 600 --quiesce-every 16 \
  --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out $W/stress > $W/stress.log 2>&1
log "stress rc=$?"
duplex() {  # name cap-seconds extra-args...: the search's budget is the cap or what is left before END less 60 s
  local name=$1 cap=$2; shift 2
  local left=$(( END - $(date +%s) )); local b=$(( left - 60 )); [ $b -gt $cap ] && b=$cap
  log "duplex $name budget $b (left $left)"
  [ $b -lt 100 ] && return
  timeout $(( b + 60 )) $PY -m suite.measure.duplex --device cuda --modes cadence --ar none --seconds 60 \
    --budget-s $b --out $W/duplex-$name "$@" > $W/duplex-$name.log 2>&1
  log "duplex $name rc=$?"
}
duplex minicpmo45 330 --workload minicpmo45 --start 12 --grow 1.5 --policy threads --prepare learned:64 --reference-sessions 12
duplex moshi 150 --workload moshi --start 32 --grow 1.5
duplex qwen3_omni 150 --workload qwen3_omni --start 32 --grow 1.5
duplex stepaudio2_mini 400 --workload stepaudio2_mini --start 8 --grow 1.5 --prepare learned:64
touch $W/done
