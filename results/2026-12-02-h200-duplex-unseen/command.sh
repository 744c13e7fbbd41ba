# Steps 2-4 of the master process in sitting/g.sh (after -stress-9's stress in the same process chain, set-up in
# /tmp/r as there); each search's --budget-s was the smaller of its cap and what was left of the sitting less 60 s.
cd /tmp/r && . .gpu/env.sh && export PYTHONPATH=/tmp/r/impl:/tmp/r
timeout 390 .venv/bin/python -m suite.measure.duplex --device cuda --modes cadence --ar none --seconds 60 --budget-s 330 \
  --out /tmp/m/duplex-minicpmo45 --workload minicpmo45 --start 12 --grow 1.5 --policy threads --prepare learned:64 \
  --reference-sessions 12        # killed by the timeout (rc 124) near the end of the cadence (after the 12 references): no duplex.json
timeout 210 .venv/bin/python -m suite.measure.duplex --device cuda --modes cadence --ar none --seconds 60 --budget-s 150 \
  --out /tmp/m/duplex-moshi --workload moshi --start 32 --grow 1.5
timeout 210 .venv/bin/python -m suite.measure.duplex --device cuda --modes cadence --ar none --seconds 60 --budget-s 150 \
  --out /tmp/m/duplex-qwen3_omni --workload qwen3_omni --start 32 --grow 1.5
# stepaudio2_mini: 63 s were left, below the 100 s the master asks for a search: not run.
