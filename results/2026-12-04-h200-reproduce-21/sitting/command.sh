#!/usr/bin/env bash
# one device loan on main (commit 2b0dde0, impl tree 20756d4), three calls: start.sh, then wait.sh twice; the
# master's steps wrote test-gpu, verify (this folder), asv (results/asv/results/h200/2b0dde0e-*.json) and
# duplex:minicpmo45 (duplex-minicpmo45.log: one count of 18 sessions, cut by its time limit, 450 s, before 10 s
# of cadence had run: no progress line; no record)
mv results /tmp/results_aside        # the carry limit; .whl, .whl-ray and .gpu carried
RUN=2026-12-04-h200-reproduce-21 DUPLEX_ARGS_minicpmo45="--prepare learned:64 --start 18 --grow 1.2 --budget-s 330" \
  WAIT=570 bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh test-gpu verify asv duplex:minicpmo45
WAIT=570 bash tools/lent_gpu/wait.sh
WAIT=560 bash tools/lent_gpu/wait.sh
# the report, rendered here against the gate of main's previous impl tree:
#   python -m suite.report results/2026-12-04-h200-reproduce-21 --compare results/2026-12-03-h200-reproduce-19
