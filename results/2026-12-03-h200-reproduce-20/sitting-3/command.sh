#!/usr/bin/env bash
# the third sitting (a fresh machine in the same session, main at 0368b34, impl tree fae1575): moshi.verify and
# qwen3_omni.verify resumed to done, then MiniCPM-o 5 steps' sessions-per-GPU search
# (../../2026-12-04-h200-duplex-unseen-5). The master script is sitting-2's.
RUN=2026-12-03-h200-reproduce-20 \
DUPLEX_ARGS_minicpmo45_5step="--prepare learned:64 --start 16 --grow 1.5 --budget-s 240" \
WAIT=570 bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh verify duplex:minicpmo45_5step
# the report, rendered here as a second run of the same impl tree:
#   python -m suite.report results/2026-12-03-h200-reproduce-20 --compare results/2026-12-03-h200-reproduce-19
