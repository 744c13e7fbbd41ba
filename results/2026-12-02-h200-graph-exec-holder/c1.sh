set -u
. .gpu/env.sh
WHEELS=.whl make setup > $OUT/setup.log 2>&1 || { echo setup failed; tail -5 $OUT/setup.log; exit 1; }
echo "setup done $SECONDS s"
export PYTHONPATH=$PWD/impl:$PWD
for v in ${VARIANTS:-streams tiny onestream manystr sa2}; do
  OUT=$OUT timeout 100 .venv/bin/python .gpu/holder.py $v 2>&1 | grep -v Warning > $OUT/holder-$v.log
  echo "$v rc=${PIPESTATUS[0]} $SECONDS s"
done
python3 - <<'PY'
import json,glob,os
for f in sorted(glob.glob(os.environ["OUT"]+"/holder-*.log")):
    for line in open(f):
        try: r=json.loads(line)
        except Exception: continue
        print(f'{r["variant"]:9s} {str(r["round"]):26s} k={r["k"]:3d} rss={r["rss_mib"]:8.1f} heap={r.get("heap_in_use_mib",0):8.1f} drv={r["driver_used_mib"]:8.1f} alloc={r["alloc_mib"]:8.1f}')
PY
