#!/usr/bin/env bash
# one device sitting, three calls (start.sh, then wait.sh twice)
STRESS_ARGS="--trace-python 20" BUDGET=1800 WAIT=585 bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh test-gpu verify asv stress:240
