#!/usr/bin/env bash
# the fourth step of results/2026-12-03-h200-reproduce-18/sitting/master.sh (steps.txt), with STRESS_ARGS="--trace-python 20"
STRESS_ARGS="--trace-python 20" BUDGET=1800 WAIT=585 bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh test-gpu verify asv stress:240
