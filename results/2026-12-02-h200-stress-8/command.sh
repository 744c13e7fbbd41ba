# The second step of the master process in -reproduce-16-second/sitting/g.sh (after the five verify stages):
cd /tmp/r && . .gpu/env.sh && PYTHONPATH=/tmp/r/impl:/tmp/r .venv/bin/python -m suite.measure.stress --device cuda \
  --threads 16 --seconds 600 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out /tmp/m/stress
