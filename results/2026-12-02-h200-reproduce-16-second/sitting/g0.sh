#!/usr/bin/env bash
# First call: copy the tree to /tmp/r, start g.sh there in its own process session, then wait like w.sh.
set -u
mkdir -p /tmp/m; cp -a . /tmp/r
( cd /tmp/r && BUDGET=${BUDGET:-1600} setsid nohup bash .gpu/g.sh > /tmp/m/m.out 2>&1 < /dev/null & )
sleep 2; WAIT=${WAIT:-560} bash .gpu/w.sh
