"""MiniCPM-o 4.5: the token2wav tail of the full-duplex model (flow-matching DiT + causal HiFT).

Model facts (shared/notes/stock_decoders.md section 2; upstream file/lines cited there):
* Stock code: minicpmo-utils 1.0.7 (package `stepaudio2`), `Token2wav.stream` (token2wav.py L249-279),
  driven as the duplex loop drives it: OpenBMB/minicpm-o-4_5-pytorch-simple-demo @c7e1660
  `MiniCPMO45/modeling_minicpmo_unified.py` (per-voice cache L4398-4404, turn reset L4406-4410, token
  loop L5446-5525). Releases 1.0.0-1.0.6 use another vocoder and conformer trim: the pin matters.
* Euler steps: 10 in the HF-style model file (`init_tts(..., n_timesteps=10)`, modeling_minicpmo.py
  L239-252); 5 in the simple-demo server (`init_token2wav(..., n_timesteps=5)`, unified L275-289).
  fp32 by default (`enable_float16=False`).
* One SPEAK unit = 25 speech tokens @ 25 Hz (S3 tokenizer v2, vocab 6561) -> one
  `stream(28 tokens)` call (25 new + 3 lookahead) -> 50 mel frames -> 24 000 samples @ 24 kHz.
* Voice prompt: the first 6.0 s of the LJSpeech clip = 150 prompt tokens = 300 mel frames (P = 300),
  the prompt length of the measured stock baseline (DESIGN section 7).
"""
from __future__ import annotations

from workloads.common import DATA_DIR, SEEDS, Workload

VOICE_PROMPT = DATA_DIR / "voice_prompts" / "ljspeech_LJ001-0001_24k.wav"
PROMPT_SECONDS = 6.0          # 6.0 s -> 150 tokens @ 25 Hz -> 300 mel frames @ 50 Hz
SCRIPT = DATA_DIR / "sessions" / "flow_hift.jsonl"
TOKEN_SOURCE = ("seeded generator (random.Random(seeds['tokens'])): uniform speech-token ids in [0, 6561) "
                "on the VoxConverse mpvoh/spk01 LISTEN/SPEAK pattern, sessions/flow_hift.jsonl")


def _minicpmo45(name: str, steps: int, notes: str) -> Workload:
    return Workload(
        name=name, model="MiniCPM-o 4.5", architecture="flow_hift", stock_package="minicpmo-utils==1.0.7",
        dtype="float32", euler_steps=steps, voice_prompt=VOICE_PROMPT, prompt_seconds=PROMPT_SECONDS,
        script=SCRIPT, token_source=TOKEN_SOURCE, seeds=dict(SEEDS["s0"]), spec={"n_timesteps": steps},
        notes=notes)


MINICPMO45 = _minicpmo45(
    "minicpmo45", 10,
    "10 Euler steps as in the HF-style model file (modeling_minicpmo.py init_tts L239-252); "
    "the default workload.")
MINICPMO45_5STEP = _minicpmo45(
    "minicpmo45_5step", 5,
    "5 Euler steps as in the MiniCPM-o 4.5 simple-demo server (modeling_minicpmo_unified.py "
    "init_token2wav L275-289); same tokens and voice as minicpmo45.")

WORKLOADS = (MINICPMO45, MINICPMO45_5STEP)
