#!/usr/bin/env bash
# one device loan, the gate of impl tree 2e6c2c9 (commit 9850b5e, branch gate-impl-2e6c2c9; .gpu/env.sh names
# it). A plain call for nvidia-h200 got an H100 80GB HBM3 (the tool lends H200s only for work that does not fit
# 78 GiB). Three calls: start.sh, then wait.sh; the machine was released between the second wait and the third
# call (idle past 30 s), so asv (near its last benchmark) and duplex:minicpmo45 never returned, and a new start
# failed ("no device machine could be started right now", 180 s of device time).
mv results /tmp/results_aside        # the carry limit; .whl, .whl-ray and .gpu carried
RUN=2026-12-05-h100-reproduce-23 DUPLEX_ARGS_minicpmo45="--prepare learned:64 --start 14 --grow 1.2 --budget-s 330" \
  WAIT=560 bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh test-gpu verify asv duplex:minicpmo45
WAIT=565 bash tools/lent_gpu/wait.sh
# the report, rendered here:
#   python -m suite.report results/2026-12-05-h100-reproduce-23 --compare results/2026-12-04-h200-reproduce-22
