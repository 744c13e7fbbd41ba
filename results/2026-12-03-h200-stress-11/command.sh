#!/usr/bin/env bash
# The CUDA stress of this folder, as the sitting's master (sitting/g.sh) ran it on the lent H200, in a copy of the
# tree of the commit env.sh names (DUPLEXCADENCE_GIT_REV), after `WHEELS=.whl make setup`.
. env.sh
PYTHONPATH=impl:. timeout 900 .venv/bin/python -m suite.measure.stress --device cuda --threads 16 \
  --seconds 600 --quiesce-every 16 --workloads minicpmo45,stepaudio2_mini,moshi,qwen3_omni --out stress
