# After -reproduce-16's gate in the same master process (-reproduce-16/sitting/g.sh), on the same set-up in /tmp/r:
cd /tmp/r && . .gpu/env.sh && PYTHONPATH=/tmp/r/impl:/tmp/r timeout 280 .venv/bin/python -m suite.measure.duplex \
  --workload minicpmo45 --device cuda --modes cadence --ar none --seconds 60 --policy threads --prepare learned:64 \
  --start 6 --grow 1.5 --budget-s 240 --out /tmp/m/duplex-learned
