#!/usr/bin/env bash
# One device call: set-up, then a short CUDA stress of the two small models with the host-heap readings.
set -u
. .gpu/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt 2>&1
WHEELS=.whl make setup > $OUT/setup.log 2>&1 || { echo setup failed; exit 1; }
PYTHONPATH=$PWD/impl:$PWD timeout 130 .venv/bin/python -m suite.measure.stress --device cuda --threads 8 --seconds 70 \
  --quiesce-every 8 --window 40 --workloads moshi,qwen3_omni --out $OUT/stress > $OUT/stress.log 2>&1
echo "stress rc=$?"; tail -22 $OUT/stress.log
