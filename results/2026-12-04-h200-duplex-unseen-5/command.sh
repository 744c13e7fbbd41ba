#!/usr/bin/env bash
# the duplex:minicpmo45_5step step of the master in ../2026-12-03-h200-reproduce-20/sitting-3/command.sh (main at
# 0368b34, impl tree fae1575): MiniCPM-o 5 steps, DuplexCadence, tail only, unseen scripts (the serve half), threads
cd /tmp/r && . .gpu/env.sh
PYTHONPATH=/tmp/r/impl:/tmp/r timeout 360 .venv/bin/python -m suite.measure.duplex --workload minicpmo45_5step \
  --device cuda --modes cadence --ar none --seconds 60 --policy threads --prepare learned:64 --start 16 --grow 1.5 \
  --budget-s 240 --out /tmp/m/duplex-minicpmo45_5step
