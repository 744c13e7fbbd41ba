"""Step-Audio 2 mini: the same flow classes as MiniCPM-o, with the original HiFT and its cross-fade.

Model facts (shared/notes/stock_decoders.md sections 2.6 and 3):
* The flow (UpsampleConformerEncoderV2 + CausalConditionalCFM/DiT) is the same code as MiniCPM-o's; the
  stock classes come from minicpmo-utils 1.0.7 (package `stepaudio2`), which also ships the original
  non-causal `HiFTGenerator` (flashcosyvoice/modules/hifigan.py L80-99); upstream builds it as
  `HiFTGenerator()`, so its released configuration is the class defaults.
* Upstream streaming driver: stepfun-ai/Step-Audio2 @ b1bb23c ("streaming hift"), `token2wav.py`
  (set_stream_cache L102-115, stream L118-169) and `examples-vllm-stream.py` (L1-30, L44-69), read in the
  history of the fork weedge/Step-Audio2 (the stepfun-ai snapshot is too large to fetch). It is not
  installable, so `duplexcadence.adapters.flow_hift` (`build.StockToken2wav`, `cadence_sa2`) follows it over the
  installed modules (the adapter's `variant="stepaudio2"`, reached through flow_hift): CHUNK_SIZE = 25,
  3-token lookahead (set-up lookahead = the prompt's first three tokens), n_timesteps 10; a stream call
  whenever 28 tokens are buffered, keeping the last 3; HiFT on 8 + 50 mel frames with the 3 840-sample
  source cache and a Hamming(7 680) cross-fade, the first call emitting 20 160 samples; a final flush
  (last_chunk) of the rest at the end of each response; only the estimator cache is trimmed
  (prompt + 100 frames): the conformer cache grows by 50 frames per call and is never trimmed.
* One `set_stream_cache` per session and voice; the responses (turns) of a session run on the same caches
  (upstream never resets them), so the conformer cache grows over the whole session, not per turn.
* HiFT draws torch.rand/randn_like on the default generator of its device on every call; each session
  (stock or DuplexCadence) seeds the default generators with the weights seed when it opens, so both
  modes consume the same random stream (the GPU check compares generator offsets per unit).
* Step-Audio 2 mini is turn-based (the LLM interleaves text and audio tokens), so a "unit" here means
  every 25 new audio tokens; the session uses the same LISTEN/SPEAK pattern and tokens as MiniCPM-o.
  A turn's first unit streams nothing (fewer than 28 tokens buffered): audio lags one unit.
* Voice prompt: the whole LibriSpeech clip, 5.17 s -> 129 prompt tokens -> 258 mel frames (P = 258).

The position-table limit. The encoder's relative positions come from EspnetRelPositionalEncoding
(max_len 5000), sliced for size L + new frames on every call without being extended; the untrimmed
conformer cache reaches it after (5000 - 258) / 50 ~ 94 one-second calls (about 95 s of speech in one
session). Past it the stock driver breaks inside the encoder (a negative slice start gives a
positional embedding of the wrong length: RuntimeError). DuplexCadence declares the conformer region
KeepAll(5000) and rejects the unit whose calls would cross it with a ClockError naming the region, the
bound and the value, before any state changes (clocks, token buffer, arena, vocoder caches, generator).
The session script of this workload (39 SPEAK units) stays well inside the limit.

Memory: the conformer region reserves its bound once (layers x 8 heads x 5000 x 128 floats = 205 MB at
the released depth) at a stable address; on the CUDA VMM backend physical memory is mapped in 2 MiB
granules as it grows (40 KiB per mel frame, ~117 MiB per minute of speech); CPU and prealloc hold the bound.
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
    notes="Upstream Step-Audio 2 streaming path (stepfun-ai/Step-Audio2 @ b1bb23c token2wav.py: n_timesteps "
          "10, original HiFT with 8-frame overlap, untrimmed conformer cache; caches kept across turns) over "
          "the stepaudio2 classes of minicpmo-utils 1.0.7; prompt = the whole 5.17 s LibriSpeech clip "
          "(prompt_seconds None); a unit past the 5000-entry position table is rejected (ClockError).")

WORKLOADS = (STEPAUDIO2_MINI,)
