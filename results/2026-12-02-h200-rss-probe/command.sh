# One device call (timeout 265 s) from the checkout root, with .whl and .gpu carried; .gpu/probe.py is probe.py here.
set -u
. .gpu/env.sh
WHEELS=.whl make setup > $OUT/setup.log 2>&1 || { echo setup failed; tail -5 $OUT/setup.log; exit 1; }
echo "setup done $SECONDS s"
export PYTHONPATH=$PWD/impl:$PWD
mkdir -p $OUT/graphs $OUT/nographs
OUT=$OUT/graphs timeout 150 .venv/bin/python .gpu/probe.py cuda released 2>&1 | grep -v Warning | tee $OUT/graphs.log | tail -12
echo "graphs done $SECONDS s"
GRAPHS=0 OUT=$OUT/nographs timeout $(( 245 - SECONDS )) .venv/bin/python .gpu/probe.py cuda released 2>&1 | grep -v Warning | tee $OUT/nographs.log | tail -12
echo "all done $SECONDS s"
