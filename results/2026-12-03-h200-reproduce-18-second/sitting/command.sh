#!/usr/bin/env bash
# one device sitting, the verify on main (commit 2e12578, impl tree c9a3506), two calls (start.sh, then wait.sh);
# started in the same loan after an earlier master of branch concurrent-capture was stopped (its files: -stress-13)
RUN=verify2 BUDGET=1000 WAIT=570 bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh verify
WAIT=400 bash tools/lent_gpu/wait.sh
