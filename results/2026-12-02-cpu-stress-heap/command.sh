# On the 2-core CPU machine, main at 306c5fa (impl tree ccc4b7e):
PYTHONUNBUFFERED=1 TORCHDYNAMO_DISABLE=1 .venv/bin/python -m suite.measure.stress --device cpu --depth reduced \
  --threads 4 --seconds 300 --max-units 4 --quiesce-every 8 --out results/2026-12-02-cpu-stress-heap
