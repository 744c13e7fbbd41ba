#!/usr/bin/env bash
# the duplex:minicpmo45 step of the master in ../2026-12-04-h200-reproduce-22/sitting/command.sh (main at 899e294,
# impl tree d54f900): MiniCPM-o 10 steps, DuplexCadence, tail only, unseen scripts (the serve half), threads; the
# count runs first, each session alone (its reference) after it
cd /tmp/r && . .gpu/env.sh
PYTHONPATH=/tmp/r/impl:/tmp/r timeout 480 .venv/bin/python -m suite.measure.duplex --workload minicpmo45 \
  --device cuda --modes cadence --ar none --seconds 60 --policy threads --prepare learned:64 --start 18 --grow 1.2 \
  --budget-s 360 --out /tmp/m/duplex-minicpmo45
