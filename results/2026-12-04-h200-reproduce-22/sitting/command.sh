#!/usr/bin/env bash
# one device loan on main (commit 899e294, impl tree d54f900), three calls: start.sh, then wait.sh twice; the
# master's steps wrote test-gpu, verify (this folder), asv (results/asv/results/h200/899e294c-*.json) and
# duplex:minicpmo45 (../duplex-minicpmo45/duplex.json: one count of 18 sessions on unseen scripts, 10 units
# missed; the search stopped there on its budget)
mv results /tmp/results_aside        # the carry limit; .whl, .whl-ray and .gpu carried
RUN=2026-12-04-h200-reproduce-22 DUPLEX_ARGS_minicpmo45="--prepare learned:64 --start 18 --grow 1.2 --budget-s 360" \
  WAIT=570 bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh test-gpu verify asv duplex:minicpmo45
WAIT=570 bash tools/lent_gpu/wait.sh
WAIT=575 bash tools/lent_gpu/wait.sh
# the report, rendered here against the gate of main's previous impl tree:
#   python -m suite.report results/2026-12-04-h200-reproduce-22 --compare results/2026-12-04-h200-reproduce-21
