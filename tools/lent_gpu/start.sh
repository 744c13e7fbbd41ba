#!/usr/bin/env bash
# First device call of a sitting: copy the tree to /tmp/r, start MASTER (a script path inside the tree, run
# from /tmp/r) in its own process session so that it outlives the call, then wait on it like wait.sh.
#   bash tools/lent_gpu/start.sh MASTER [ARGS...]      (BUDGET, WAIT as wait.sh; ARGS go to the master, which
#                                                        writes under /tmp/m and touches /tmp/m/done when it ends;
#                                                        tools/lent_gpu/master.sh runs the steps ARGS name)
set -u
master=${1:?usage: start.sh MASTER [ARGS...]}
mkdir -p /tmp/m; cp -a . /tmp/r
( cd /tmp/r && setsid nohup bash "$master" "${@:2}" > /tmp/m/m.out 2>&1 < /dev/null & )
sleep 2; exec bash "$(dirname "$0")/wait.sh"
