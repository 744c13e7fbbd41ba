#!/usr/bin/env bash
# one device loan on branch concurrent-capture (commit e9b1afc, impl tree fae1575), three calls: start.sh, then
# wait.sh twice; the master's steps wrote test-gpu, stress (../../2026-12-03-h200-stress-14), verify (this folder),
# asv (results/asv/results/h200/e9b1afc6-*.json) and duplex:minicpmo45 (../../2026-12-03-h200-duplex-unseen-3)
DUPLEX_ARGS="--prepare learned:64 --start 9 --grow 1.5 --budget-s 200" STRESS_ARGS="--trim-heap" BUDGET=1800 WAIT=585 \
  bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh test-gpu stress:90 verify asv duplex:minicpmo45
WAIT=585 bash tools/lent_gpu/wait.sh
WAIT=480 bash tools/lent_gpu/wait.sh
# the report, rendered here against the gate of main's impl tree:
#   python -m suite.report results/2026-12-03-h200-reproduce-19 --compare results/2026-12-03-h200-reproduce-18
