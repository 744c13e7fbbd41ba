# The fourth device call of the session (after -reproduce-15's sitting, on the same warm machine and set-up in /tmp/r):
cd /tmp/r && . .gpu/env.sh && PYTHONPATH=/tmp/r/impl:/tmp/r timeout 470 .venv/bin/python -m suite.measure.duplex \
  --workload minicpmo45 --device cuda --modes cadence --ar none --seconds 60 --budget-s 400 --start 12 --grow 1.5 \
  --policy threads --out /tmp/d
