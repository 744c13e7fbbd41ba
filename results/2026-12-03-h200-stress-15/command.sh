# the stress step of the master in ../2026-12-03-h200-reproduce-20/sitting/command.sh (commit 15a2c45, impl tree fae1575)
cd /tmp/r && . .gpu/env.sh
PYTHONPATH=/tmp/r/impl:/tmp/r timeout 1200 .venv/bin/python -m suite.measure.stress \
  --device cuda --threads 16 --seconds 600 --quiesce-every 16 --reference shared-first \
  --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --trim-heap --out /tmp/m/stress
