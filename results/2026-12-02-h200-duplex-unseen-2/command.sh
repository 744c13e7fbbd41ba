# The second step of the master process in ../2026-12-02-h200-stress-10/sitting/g.sh (after -stress-10's stress in the
# same process chain, set-up in /tmp/r as there); --budget-s was what was left of the sitting less 90 s.
cd /tmp/r && . .gpu/env.sh && export PYTHONPATH=/tmp/r/impl:/tmp/r
timeout 538 .venv/bin/python -m suite.measure.duplex --device cuda --modes cadence --ar none --seconds 60 --budget-s 458 \
  --out /tmp/m/duplex-stepaudio2_mini --workload stepaudio2_mini --start 8 --grow 1.5 --prepare learned:64
