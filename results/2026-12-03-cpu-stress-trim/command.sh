#!/usr/bin/env bash
# this 2-core CPU machine, main at cf269dc (impl tree fae1575), while nothing else ran
PYTHONPATH=impl:. TORCHDYNAMO_DISABLE=1 timeout 900 .venv/bin/python -m suite.measure.stress --device cpu --depth reduced \
  --threads 4 --seconds 480 --quiesce-every 16 --trim-heap --reference shared-first \
  --workloads moshi,qwen3_omni,minicpmo45,stepaudio2_mini --out results/2026-12-03-cpu-stress-trim
