# the duplex-unseen-3 step of the master in ../2026-12-03-h200-reproduce-19/sitting/command.sh (commit e9b1afc, impl tree fae1575)
cd /tmp/r && . .gpu/env.sh
PYTHONPATH=/tmp/r/impl:/tmp/r timeout 320 .venv/bin/python -m suite.measure.duplex --workload minicpmo45 --device cuda \
  --modes cadence --ar none --seconds 60 --policy threads --prepare learned:64 --start 9 --grow 1.5 --budget-s 200 \
  --out /tmp/m/duplex-minicpmo45
