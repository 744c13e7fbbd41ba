"""Moshi: the Mimi codec decoder, run at 12.5 Hz for the whole session.

Model facts (shared/notes/stock_decoders.md section 4):
* Stock code: moshi 0.2.13, `MimiModel.decode` under `mimi.streaming(1)` (compression.py L406-429); the
  model from `moshi.models.loaders.get_mimi(None, num_codebooks=8)` (loaders.py L323-362) with seeded
  random weights.
* 24 kHz, 12.5 frames/s (loaders.py L28-29), 1 920 samples per frame; 8 of 32 codebooks, 2 048 bins
  (`_quantizer_kwargs`, loaders.py L58-61).
* The server decodes one frame per 80 ms, listening or speaking (server.py L129-151): every unit of
  the session, LISTEN included, carries codes (8 codebooks x 12 or 13 frames on the exact 12.5 Hz clock).
  Moshi has no end-of-turn call; `final` is kept in the script for uniformity and means nothing here.
* No voice prompt: Moshi's voice lives in its LM, not in the codec decoder.
"""
from __future__ import annotations

from workloads.common import DATA_DIR, SEEDS, Workload

MOSHI = Workload(
    name="moshi", model="Moshi", architecture="mimi", stock_package="moshi==0.2.13", dtype="float32",
    euler_steps=None, voice_prompt=None, prompt_seconds=None,
    script=DATA_DIR / "sessions" / "mimi.jsonl",
    token_source=("seeded generator (random.Random(seeds['tokens'])): uniform Mimi codes in [0, 2048), "
                  "8 codebooks x 12/13 frames on every unit, VoxConverse mpvoh/spk01 pattern, "
                  "sessions/mimi.jsonl"),
    seeds=dict(SEEDS["s0"]), spec={},
    notes="Mimi decode (1, 8, 1) -> 1 920 samples, 12.5 calls per unit; moshi's own CUDAGraphed path is a "
          "second baseline, not the bit-exact reference (DESIGN section 1).")

WORKLOADS = (MOSHI,)
