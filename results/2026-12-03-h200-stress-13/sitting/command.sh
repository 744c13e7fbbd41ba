#!/usr/bin/env bash
# one device call on branch concurrent-capture (commit fe2f292, impl tree 1c4ec5f); the master was stopped in its
# third step (verify) once the first two had failed, and the loan went on with -reproduce-18-second
DUPLEX_ARGS="--prepare learned:64 --start 9 --grow 1.5 --budget-s 200" BUDGET=1700 WAIT=585 \
  bash tools/lent_gpu/start.sh tools/lent_gpu/master.sh test-gpu stress:90 verify asv duplex:minicpmo45
