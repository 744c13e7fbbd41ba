# The last step of -reproduce-16's master process (-reproduce-16/sitting/g.sh), with the 133 s its budget left:
cd /tmp/r && . .gpu/env.sh && PYTHONPATH=/tmp/r/impl:/tmp/r .venv/bin/python -m suite.measure.stress --device cuda \
  --threads 16 --seconds 133 --memory-sites --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out /tmp/m/stress
