#!/usr/bin/env bash
# Sitting B: the remaining verify stages through a local Ray instance (--resume).
set -u
. .gpu/env.sh
W=/tmp/b; mkdir -p $W; T0=$(date +%s)
pack() { cp -r results/$RUN $W/ 2>/dev/null; tar czf $OUT/b.tgz --exclude='*.wav' -C $W .; }
WHEELS=.whl make setup > $W/setup.log 2>&1 || { tail -30 $W/setup.log; pack; exit 1; }
.venv/bin/python -m pip install -q --no-index --find-links .whl-ray --find-links .whl --no-build-isolation -e ".[ray]" > $W/ray-install.log 2>&1 && touch .venv/.ray-stamp
left=$(( 565 - ($(date +%s) - T0) ))
echo "setup + ray $(( $(date +%s) - T0 )) s; left $left s"
t0=$(date +%s)
WHEELS=.whl timeout $left make reproduce RAY=1 ARGS="--ray local --device cuda --stages '*.verify' --run-dir results/$RUN --resume --budget-s $(( left - 15 ))" > $W/reproduce-b.log 2>&1; echo "reproduce rc=$? $(( $(date +%s) - t0 )) s"
pack
grep -E "^stage|bytes|stop" $W/reproduce-b.log | tail -12
