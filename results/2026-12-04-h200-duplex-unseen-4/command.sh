#!/usr/bin/env bash
# the duplex:minicpmo45 step of the master in ../2026-12-03-h200-reproduce-20/sitting-2/command.sh (main at 364213d,
# impl tree fae1575): MiniCPM-o 10 steps, DuplexCadence, tail only, unseen scripts (the serve half), threads
cd /tmp/r && . .gpu/env.sh
PYTHONPATH=/tmp/r/impl:/tmp/r timeout 400 .venv/bin/python -m suite.measure.duplex --workload minicpmo45 --device cuda \
  --modes cadence --ar none --seconds 60 --policy threads --prepare learned:64 --start 14 --grow 1.5 --budget-s 280 \
  --out /tmp/m/duplex-minicpmo45
# duplex-21-cut.log: the last device call of the session (main at 0368b34, same impl tree), one count, cut by its
# time limit (rc=124) 30 s into the 69 s cadence, so no record was written; at that point 7 units had missed:
PYTHONPATH=/tmp/r/impl:/tmp/r timeout 540 .venv/bin/python -m suite.measure.duplex --workload minicpmo45 --device cuda \
  --modes cadence --ar none --seconds 60 --policy threads --prepare learned:64 --start 21 --grow 1.5 --budget-s 350 \
  --out $OUT/duplex-minicpmo45-21
