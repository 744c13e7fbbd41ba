# The first step of the master process in -duplex-unseen/sitting/g.sh (after `WHEELS=.whl make setup`):
cd /tmp/r && . .gpu/env.sh && PYTHONPATH=/tmp/r/impl:/tmp/r .venv/bin/python -m suite.measure.stress --device cuda \
  --threads 16 --seconds 600 --quiesce-every 16 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out /tmp/m/stress
