#!/usr/bin/env bash
# the second loan of this run (main at 364213d, impl tree fae1575 as in the first), one device call: the verify
# step resumed this folder (carried as .gpu/2026-12-03-h200-reproduce-20) and ran stepaudio2_mini.verify to done;
# the sitting then ended with rc=2, because rendering REPORT.md after the stage needed the reference run
# -reproduce-19, which the lent machine did not have (mended in 0368b34: a report that cannot be rendered no
# longer ends a sitting). The same master's duplex steps wrote ../../2026-12-04-h200-duplex-unseen-4; its
# minicpmo45_5step step was lost when the machine went back idle before the next call (sitting-3 ran it again).
RUN=2026-12-03-h200-reproduce-20 \
DUPLEX_ARGS_minicpmo45="--prepare learned:64 --start 14 --grow 1.5 --budget-s 280" \
DUPLEX_ARGS_minicpmo45_5step="--prepare learned:64 --start 16 --grow 1.5 --budget-s 240" \
WAIT=570 bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh verify duplex:minicpmo45 duplex:minicpmo45_5step
