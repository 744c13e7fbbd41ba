#!/usr/bin/env bash
# one device loan on main (commit 15a2c45, impl tree fae1575, the tree -reproduce-19 gated), three calls: start.sh,
# then wait.sh twice; the master's steps wrote the stress (../../2026-12-03-h200-stress-15) and verify (this folder).
# The session's device time ran out during the third stage (stepaudio2_mini): the last call's archive came back
# empty, so this folder is the second call's archive (2 stages done, 1 running, 2 pending).
STRESS_ARGS="--trim-heap" BUDGET=1700 WAIT=585 \
  bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh stress:600 verify
WAIT=585 bash tools/lent_gpu/wait.sh
WAIT=360 bash tools/lent_gpu/wait.sh
# the report, rendered here as a second run of the same impl tree:
#   python -m suite.report results/2026-12-03-h200-reproduce-20 --compare results/2026-12-03-h200-reproduce-19
