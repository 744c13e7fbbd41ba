# the stress-14 step of the master in ../2026-12-03-h200-reproduce-19/sitting/command.sh (commit e9b1afc, impl tree fae1575)
cd /tmp/r && . .gpu/env.sh
PYTHONPATH=/tmp/r/impl:/tmp/r timeout 690 .venv/bin/python -m suite.measure.stress \
  --device cuda --threads 16 --seconds 90 --quiesce-every 16 --reference shared-first \
  --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --trim-heap --out /tmp/m/stress
