# The last step of the master process in -reproduce-16-second/sitting/g.sh (the 301 s its budget left):
cd /tmp/r && . .gpu/env.sh && PYTHONPATH=/tmp/r/impl:/tmp/r .venv/bin/python -m suite.measure.floor --workload stepaudio2_mini \
  --workload moshi --workload qwen3_omni --workload minicpmo45 --device cuda --memory --units 2 --warm-units 3 \
  --timed-units 2 --timeout-s 200 --out /tmp/m/floor
