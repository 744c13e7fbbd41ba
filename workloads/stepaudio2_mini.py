"""Step-Audio 2 mini: the same flow classes as MiniCPM-o, with the original HiFT and its cross-fade.

Model facts (shared/notes/stock_decoders.md sections 2.6 and 3):
* The flow (UpsampleConformerEncoderV2 + CausalConditionalCFM/DiT) is the same code as MiniCPM-o's; the
  stock classes come from minicpmo-utils 1.0.7 (package `stepaudio2`), which also ships the original
  non-causal `HiFTGenerator` (flashcosyvoice/modules/hifigan.py L80-99).
* Upstream streaming (stepfun-ai/Step-Audio2 `token2wav.py`, read through its packaged copies):
  `CHUNK_SIZE = 25`, 3-token lookahead, n_timesteps fixed at 10; HiFT on 8 + 50 mel frames with a
  3 840-sample Hamming(7 680) cross-fade; only the estimator cache is trimmed (prompt + 100 frames),
  the conformer cache grows by 50 frames per chunk; HiFT draws CUDA RNG on every call. Upstream ships
  no streaming driver package: the adapter's `variant="stepaudio2"` stock driver follows that code.
* Step-Audio 2 mini is turn-based (the LLM interleaves text and audio tokens), so a "unit" here means
  every 25 new audio tokens; the session uses the same LISTEN/SPEAK pattern and tokens as MiniCPM-o.
* Voice prompt: the whole LibriSpeech clip, 5.17 s -> 129 prompt tokens -> 258 mel frames.
"""
from __future__ import annotations

from workloads.common import DATA_DIR, SEEDS, Workload
from workloads.minicpmo45 import SCRIPT, TOKEN_SOURCE

VOICE_PROMPT = DATA_DIR / "voice_prompts" / "librispeech_8297-275156-0011_24k.wav"

STEPAUDIO2_MINI = Workload(
    name="stepaudio2_mini", model="Step-Audio 2 mini", architecture="flow_hift",
    stock_package="minicpmo-utils==1.0.7", dtype="float32", euler_steps=10, voice_prompt=VOICE_PROMPT,
    prompt_seconds=None, script=SCRIPT, token_source=TOKEN_SOURCE, seeds=dict(SEEDS["s0"]),
    spec={"n_timesteps": 10, "variant": "stepaudio2"},
    notes="Upstream Step-Audio 2 streaming path (n_timesteps 10, original HiFT with 8-frame overlap, "
          "untrimmed conformer cache) over the stepaudio2 classes of minicpmo-utils 1.0.7; prompt = the "
          "whole 5.17 s LibriSpeech clip (prompt_seconds None).")

WORKLOADS = (STEPAUDIO2_MINI,)
