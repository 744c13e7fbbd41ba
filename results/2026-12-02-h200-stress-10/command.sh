# The first step of the master process in sitting/g.sh (after `WHEELS=.whl make setup`; started with
# tools/lent_gpu/start.sh .gpu/g.sh and two calls of tools/lent_gpu/wait.sh):
cd /tmp/r && . .gpu/env.sh && PYTHONPATH=/tmp/r/impl:/tmp/r timeout 1150 .venv/bin/python -m suite.measure.stress --device cuda \
  --threads 16 --seconds 900 --quiesce-every 16 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out /tmp/m/stress
