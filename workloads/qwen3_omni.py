"""Qwen3-Omni: the Code2Wav decoder of the talker's 16-codebook codec, chunked at the unit cadence.

Model facts (shared/notes/stock_decoders.md section 5):
* Stock code: transformers 5.17.0 `Qwen3OmniMoeCode2Wav`, built with
  `_from_config(Qwen3OmniMoeCode2WavConfig())` and seeded random weights. Config defaults =
  the released `code2wav_config`: codebook_size 2048, num_quantizers 16 (configuration_qwen3_omni_moe.py
  L541, L554), 8 sliding-window (72) layers, 1 920 samples per frame at 24 kHz (12.5 Hz).
* Stock transformers decodes once at the end: `chunked_decode(codes, chunk_size=300,
  left_context_size=25)` (modeling_qwen3_omni_moe.py L3778-3789, called at L4118). Streaming at the
  unit cadence re-decodes 25 frames of left context plus the unit's 12 or 13 new frames
  (`spec["left_context"]`), the window of the measured stock baseline (DESIGN section 7); a turn's
  first unit starts with a 4-frame initial chunk (`spec["initial_frames"]`, vLLM-Omni #4828's
  "4/25/25" schedule). Every call returns 1920 (C + N) - 555 samples (the 555-sample loss is stock
  behaviour). Both numbers are serving choices, not model constants: they are recorded here.
* Released weights are bfloat16. SPEAK units carry 16 codebooks x 12/13 frames (the exact 12.5 Hz
  clock, restarted at every turn); LISTEN units carry none. No voice prompt (the voice is the talker's).
"""
from __future__ import annotations

from workloads.common import DATA_DIR, SEEDS, Workload

QWEN3_OMNI = Workload(
    name="qwen3_omni", model="Qwen3-Omni", architecture="code2wav", stock_package="transformers==5.17.0",
    dtype="bfloat16", euler_steps=None, voice_prompt=None, prompt_seconds=None,
    script=DATA_DIR / "sessions" / "code2wav.jsonl",
    token_source=("seeded generator (random.Random(seeds['tokens'])): uniform codec ids in [0, 2048), "
                  "16 codebooks x 12/13 frames per SPEAK unit, VoxConverse mpvoh/spk01 pattern, "
                  "sessions/code2wav.jsonl"),
    seeds=dict(SEEDS["s0"]), spec={"left_context": 25, "initial_frames": 4},
    notes="Stateless decoder: the caller keeps the last 25 code frames; first / ramp / steady / final "
          "chunk shapes per turn.")

WORKLOADS = (QWEN3_OMNI,)
