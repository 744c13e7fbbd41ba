"""Step-Audio 2 mini's token-to-audio tail, driven as its upstream streaming code drives it (stock).

Module code (wrapped, imported from minicpmo-utils==1.0.7, package `stepaudio2`, never re-typed): the flow
`CausalMaskedDiffWithXvec` (`cosyvoice2/flow/flow.py`: `setup_cache` L115-170, `inference_chunk`
L173-229) with `UpsampleConformerEncoderV2` + `CausalConditionalCFM`/`DiT`, built from the released
flow.yaml by `flow_hift` (same classes as MiniCPM-o), and the original CosyVoice2 `HiFTGenerator`
(`flashcosyvoice/modules/hifigan.py` L75-248).

The streaming driver is NOT installable: it lives only in the upstream repository. Source read:
stepfun-ai/Step-Audio2 commit b1bb23c4fd455dbbce8f1736c721411b3f5cf4c1 ("streaming hift", 2025-09-17,
author yangpeng@stepfun.com), files `token2wav.py` and `examples-vllm-stream.py`. The stepfun-ai snapshot
itself (1.35 GB) could not be fetched; the commit was read in the history of the fork weedge/Step-Audio2,
whose later commits add CPU support only. Below, "t2w Lx" = token2wav.py @ b1bb23c line x and
"ex Lx" = examples-vllm-stream.py @ b1bb23c line x. What `StockToken2wav` / `StockSession` mirror:

* t2w L45-48: `self.hift = HiFTGenerator()` -- no arguments: the released HiFT config is the class
  defaults (`HIFT_CONFIG` records them; the 1.0.7 package builds its original HiFT the same way,
  `stepaudio2/token2wav.py` L160). Weights here: seeded random (`flow_hift.randomize_`), as flow_hift.
* t2w L53-55: `mel_cache_len = 8`, `source_cache_len = 8 * 480 = 3840`,
  `speech_window = torch.from_numpy(np.hamming(7680))` (float64, on the device).
* t2w L14-22: `fade_in_out` (the driver's own; the installed `cosyvoice2.utils.common.fade_in_out` differs:
  it round-trips through the CPU). Reproduced as `fade_in_out` below, same expression.
* t2w L102-115 `set_stream_cache`: `flow.setup_cache(cat(prompt_tokens, prompt_tokens[:, :3]), prompt_mels,
  spk_emb, n_timesteps=10)`; HiFT cache = empty mel (1, 80, 0), source (1, 1, 0), speech (1, 0).
* t2w L118-169 `stream`: tokens -> int32 (1, n) on the device (L123); `flow.inference_chunk(...,
  n_timesteps=10)` under `torch.amp.autocast("cuda", dtype=float32)` (L129-136); estimator-only trim
  `if L > P + 100: cat(att[..., :P], att[..., -100:])` (L137-141) -- the conformer cache is never trimmed;
  `mel = concat(cache mel, chunk mel)` (L147); `speech, source = hift(mel, cache_source)` (L149); cross-fade
  with the cached speech tail when there is one (L152-153); new caches = last 8 mel frames, last 3840
  source samples, last 3840 speech samples, `.clone().detach()` (L156-160); a non-final call drops the
  last 3840 samples (L161-162); `speech.cpu().numpy()`, clip to [-1, 1], `* 32767`, `astype('<i2')`
  (L164-167).
* ex L1-30 `stream_client`: CHUNK_SIZE = 25 (L1); each response (turn) starts with an empty token buffer
  (L5); whenever `len(buffer) >= 25 + 3` it streams `buffer[:28]` and keeps `buffer[25:]` (L20-25); at the
  end of the response a non-empty buffer is flushed with `last_chunk=True` (L26-27).
* ex L44-47, L59, L69: one `set_stream_cache` per process and voice, then several responses (turns) on the
  SAME caches: flow and HiFT state carry over from one turn to the next (no reset anywhere).

Inferred (said plainly):
* Token arrival. Upstream checks the buffer once per arriving piece of tokens (`if`, ex L21); a unit here
  delivers up to 25 tokens at once, so the session loops (`while`), which is what per-token arrival gives.
* Warm-up. ex L47 streams 28 demo tokens once after set-up and never resets: that warm-up call's state
  leaks into the first response. The session does NOT make that call (its tokens are arbitrary demo ids).
* Device. b1bb23c is CUDA-only (`.cuda()`, `device='cuda'`); on the CPU the driver runs the same code on
  CPU tensors without autocast (later CPU-support commits do the same); on CUDA it keeps the fp32 autocast.
* Randomness. HiFT draws `torch.rand`/`randn_like` on the default generator of its device on every call
  (hifigan_components/layers.py L314, L378, L432); upstream never seeds it. Each session here seeds the
  default generators (`torch.manual_seed(rng_seed)`) once when it opens, so that stock and cadence
  sessions consume the same random stream.
* The position table. `EspnetRelPositionalEncoding(max_len=5000)` (embedding.py L40-47) holds relative
  positions for sizes <= 5000; `forward_chunk` asks `position_encoding(size=L + new mel frames)`
  (upsample_encoder_v2.py L440, L463) without extending the table, so past 5000 the slice start goes
  negative and stock breaks (a wrong-length positional embedding). The untrimmed conformer cache gets
  there after (5000 - P) / 50 one-second calls (~95 s for this voice). DuplexCadence rejects the call
  that would cross it (`stepaudio2_cadence`).
"""
from __future__ import annotations

import inspect
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from duplexcadence import clocks as _clocks
from duplexcadence import upstream
from duplexcadence.adapters import flow_hift as fh
from duplexcadence.errors import InputError
from duplexcadence.session import UnitOutput

UPSTREAM = ("stepfun-ai/Step-Audio2 @ b1bb23c4fd455dbbce8f1736c721411b3f5cf4c1: token2wav.py, "
            "examples-vllm-stream.py")
CHUNK_TOKENS = 25                        # ex L1: CHUNK_SIZE = 25
PRE_LOOKAHEAD = fh.PRE_LOOKAHEAD         # flow.pre_lookahead_len = 3 (ex L21)
CALL_TOKENS = CHUNK_TOKENS + PRE_LOOKAHEAD   # 28: ex L21-22
N_TIMESTEPS = 10                         # t2w L108, L135: n_timesteps=10 (hard-coded upstream)
MEL_CACHE_LEN = 8                        # t2w L53
HOP_SAMPLES = fh.HOP_SAMPLES             # 480 (t2w L54: 50 Hz mel -> 24 kHz)
SOURCE_CACHE_LEN = MEL_CACHE_LEN * HOP_SAMPLES   # 3840 (t2w L54)
SAMPLE_RATE = fh.SAMPLE_RATE
TAIL_FRAMES = 100                        # t2w L137-141: estimator trim keeps P + last 100
POSITION_TABLE = 5000                    # EspnetRelPositionalEncoding max_len (embedding.py L40)
#: The largest single advance: a final flush of up to 27 tokens (< 28 stay buffered) adds 2 x 27 frames.
MAX_ADVANCE = 2 * (CALL_TOKENS - 1)     # 54 mel frames
DIT_BUFFER_FRAMES = 1000                 # CausalConditionalCFM.att_cache_buffer length (flow_matching.py L36)
MAX_UNIT_TOKENS = 2 * CHUNK_TOKENS       # a unit carries <= 25 tokens in the session scripts; 50 is lenient

#: The released HiFT configuration: upstream builds `HiFTGenerator()` with no arguments (t2w L45), so it is
#: the class defaults of flashcosyvoice/modules/hifigan.py L80-99 (checked against the signature at build).
HIFT_CONFIG = {
    "in_channels": 80, "base_channels": 512, "nb_harmonics": 8, "sampling_rate": 24000,
    "nsf_alpha": 0.1, "nsf_sigma": 0.003, "nsf_voiced_threshold": 10,
    "upsample_rates": [8, 5, 3], "upsample_kernel_sizes": [16, 11, 7],
    "istft_params": {"n_fft": 16, "hop_len": 4},
    "resblock_kernel_sizes": [3, 7, 11], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "source_resblock_kernel_sizes": [7, 7, 11],
    "source_resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "lrelu_slope": 0.1, "audio_limit": 0.99, "f0_predictor": None,
}
#: CI's reduced configuration of the same class: fewer channels and one resblock kernel per stage; the
#: upsampling (hop 480) and iSTFT are the released ones, so every cache length is the released one.
HIFT_REDUCED = dict(HIFT_CONFIG, base_channels=64, resblock_kernel_sizes=[3],
                    resblock_dilation_sizes=[[1, 3, 5]])
RELEASED = fh.RELEASED
REDUCED = fh.REDUCED


def hift_class():
    """The stock original CosyVoice2 HiFTGenerator (minicpmo-utils 1.0.7, flashcosyvoice/modules/hifigan.py)."""
    upstream.stepaudio2()
    from stepaudio2.flashcosyvoice.modules.hifigan import HiFTGenerator
    return HiFTGenerator


def check_hift_config() -> None:
    """Raise ValueError if HIFT_CONFIG is not the installed HiFTGenerator's defaults (upstream relies on them)."""
    sig = inspect.signature(hift_class().__init__)
    for k, v in HIFT_CONFIG.items():
        default = sig.parameters[k].default
        if default != v:
            raise ValueError(f"HIFT_CONFIG[{k!r}]: {v!r}, but HiFTGenerator's default is {default!r}")


def fade_in_out(fade_in_mel: torch.Tensor, fade_out_mel: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Upstream's cross-fade, t2w L14-22 (the driver's own function; not in the installed package).

    fade_in_mel: speech [1, S] float32; fade_out_mel: cached speech tail [1, 3840]; window: float64
    Hamming [7680]. Returns a copy of fade_in_mel whose first 3840 samples are faded in over the faded-out
    tail (float64 arithmetic, stored back as float32, exactly as upstream).
    """
    mel_overlap_len = int(window.shape[0] / 2)
    fade_in_mel = fade_in_mel.clone()
    fade_in_mel[..., :mel_overlap_len] = \
        fade_in_mel[..., :mel_overlap_len] * window[:mel_overlap_len] + \
        fade_out_mel[..., -mel_overlap_len:] * window[mel_overlap_len:]
    return fade_in_mel


def autocast_like_upstream(device: torch.device, float16: bool = False):
    """t2w L129: `torch.amp.autocast("cuda", dtype=float16 if float16 else float32)` on CUDA; nothing on
    the CPU (b1bb23c is CUDA-only; inferred). Stock and cadence both use this, so they match bit for bit."""
    if torch.device(device).type == "cuda":
        return torch.amp.autocast("cuda", dtype=torch.float16 if float16 else torch.float32)
    return nullcontext()


class StockToken2wav:
    """Upstream `Token2wav` (t2w L25-169) minus the ONNX front end, on the installed stock modules.

    flow: CausalMaskedDiffWithXvec; hift: HiFTGenerator; both on `device`, eval. `cache[key]` holds a
    prepared prompt as t2w L81 returns it: (tokens int32 [1, n], lens, spk [1, 192], mel [1, 2n, 80], mel_lens).
    """

    def __init__(self, flow, hift, device, *, n_timesteps: int = N_TIMESTEPS, float16: bool = False):
        self.device = torch.device(device)
        self.flow, self.hift = flow, hift
        self.float16 = float16
        self.n_timesteps = n_timesteps
        self.cache: dict = {}
        self.stream_cache = None
        self.mel_cache_len = MEL_CACHE_LEN                               # t2w L53
        self.source_cache_len = int(self.mel_cache_len * HOP_SAMPLES)    # t2w L54
        self.speech_window = torch.from_numpy(np.hamming(2 * self.source_cache_len)).to(self.device)  # t2w L55
        self.hift_cache_dict: dict = {}                                  # t2w L58

    def set_stream_cache(self, prompt_key: str) -> None:
        """t2w L102-115. Raises KeyError naming the prompt if it was not installed (`fh.install_prompt`)."""
        if prompt_key not in self.cache:
            raise KeyError(f"prompt {prompt_key!r} not installed (upstream prepares it from the wav: t2w L103-104)")
        prompt_speech_tokens, _, spk_emb, prompt_mels, _ = self.cache[prompt_key]
        self.stream_cache = self.flow.setup_cache(
            torch.cat([prompt_speech_tokens, prompt_speech_tokens[:, :3]], dim=1),
            prompt_mels, spk_emb, n_timesteps=self.n_timesteps)
        self.hift_cache_dict = dict(
            mel=torch.zeros(1, prompt_mels.shape[2], 0, device=self.device),
            source=torch.zeros(1, 1, 0, device=self.device),
            speech=torch.zeros(1, 0, device=self.device),
        )

    def stream(self, generated_speech_tokens: list, prompt_key: str, last_chunk: bool = False) -> torch.Tensor:
        """t2w L118-162: one call. Returns the float32 speech [1, S] on the device, before upstream's
        `.cpu()`/clip/int16 (L164-167, `flow_hift.to_pcm16`). S = 2(n-3)*480 - 3840 for a non-final call
        (minus nothing more on later calls: the 3840 held back last time come back cross-faded), all of it
        for last_chunk. Raises ValueError if set_stream_cache was not called (L126-127)."""
        _, _, spk_emb, prompt_mels, _ = self.cache[prompt_key]
        generated_speech_tokens = torch.tensor([generated_speech_tokens], dtype=torch.int32, device=self.device)
        if self.stream_cache is None:
            raise ValueError("stream_cache is not set")
        with autocast_like_upstream(self.device, self.float16):
            chunk_mel, self.stream_cache = self.flow.inference_chunk(
                token=generated_speech_tokens, spk=spk_emb, cache=self.stream_cache,
                last_chunk=last_chunk, n_timesteps=self.n_timesteps)
        if self.stream_cache['estimator_att_cache'].shape[4] > (prompt_mels.shape[1] + TAIL_FRAMES):
            self.stream_cache['estimator_att_cache'] = torch.cat([
                self.stream_cache['estimator_att_cache'][:, :, :, :, :prompt_mels.shape[1]],
                self.stream_cache['estimator_att_cache'][:, :, :, :, -TAIL_FRAMES:],
            ], dim=4)
        return self.vocode(chunk_mel, last_chunk)

    def vocode(self, chunk_mel: torch.Tensor, last_chunk: bool) -> torch.Tensor:
        """t2w L143-162: HiFT on (cached 8 + new) mel frames, cross-fade, cache update, hold back 3840."""
        hift_cache_mel = self.hift_cache_dict['mel']
        hift_cache_source = self.hift_cache_dict['source']
        hift_cache_speech = self.hift_cache_dict['speech']
        mel = torch.concat([hift_cache_mel, chunk_mel], dim=2)
        speech, source = self.hift(mel, hift_cache_source)
        if hift_cache_speech.shape[-1] > 0:
            speech = fade_in_out(speech, hift_cache_speech, self.speech_window)
        self.hift_cache_dict = dict(
            mel=mel[..., -self.mel_cache_len:].clone().detach(),
            source=source[:, :, -self.source_cache_len:].clone().detach(),
            speech=speech[:, -self.source_cache_len:].clone().detach(),
        )
        if not last_chunk:
            speech = speech[:, :-self.source_cache_len]
        return speech


def build_token2wav(*, n_timesteps: int = N_TIMESTEPS, device="cpu", seed: int = 0,
                    depth: dict | None = None, hift_config: dict | None = None) -> StockToken2wav:
    """The released flow (flow_hift.FLOW_YAML through the stock `_load_config`) and HiFT (`HiFTGenerator()`,
    HIFT_CONFIG) with seeded random weights, as `flow_hift.build_token2wav` does: `torch.manual_seed(seed)`
    before construction (construction-time tables: the flow's `rand_noise`), `randomize_(flow, seed + 1)`,
    `randomize_(hift, seed + 2)` and `_quiet_vocoder_`. depth: flow layer counts (RELEASED or REDUCED);
    hift_config: HiFTGenerator kwargs (None: HIFT_CONFIG, the released defaults; HIFT_REDUCED for CI).
    Raises ValueError for n_timesteps outside [1, 16] or a HIFT_CONFIG that is not the class defaults."""
    if isinstance(n_timesteps, bool) or not isinstance(n_timesteps, int) or not 1 <= n_timesteps <= 16:
        raise ValueError(f"n_timesteps: expected an int in [1, 16] (the DiT cache buffers hold 16 steps), "
                         f"got {n_timesteps!r}")
    t2w_mod = upstream.stepaudio2()
    check_hift_config()
    device = torch.device(device)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = fh.write_config_dir(Path(tmp), depth)
        flow = t2w_mod._load_config(cfg / "flow.yaml")["flow"]
    hift = hift_class()(**(HIFT_CONFIG if hift_config is None else hift_config))
    fh.randomize_(flow, seed + 1)
    fh.randomize_(hift, seed + 2)
    fh._quiet_vocoder_(hift)
    return StockToken2wav(flow.to(device).eval(), hift.float().to(device).eval(), device,
                          n_timesteps=n_timesteps)


# --- the driver ---------------------------------------------------------------------------------
def plan_calls(buffer: list[int], new_tokens: list[int], final: bool) -> tuple[list[fh.Call], list[int]]:
    """ex L20-27 on the host: append the unit's tokens; while >= 28 are buffered, stream buffer[:28] and
    keep buffer[25:]; at the end of the turn flush a non-empty rest with last_chunk=True. Pure: returns
    (calls, buffer left); the caller commits the buffer only after every call succeeded."""
    buf = list(buffer) + list(new_tokens)
    calls = []
    while len(buf) >= CALL_TOKENS:
        calls.append(fh.Call(buf[:CALL_TOKENS], False))
        buf = buf[CHUNK_TOKENS:]
    if final:
        if buf:
            calls.append(fh.Call(buf, True))
        buf = []
    return calls, buf


def mel_advance(n_tokens: int, last_chunk: bool) -> int:
    """Mel frames a call adds to the conformer cache: 2(n-3), or 2n for last_chunk (flow_hift.mel_advance)."""
    return fh.mel_advance(n_tokens, last_chunk)


def position_limit(flow) -> int:
    """The longest relative-position size the encoder's table serves: (pe.size(1) + 1) / 2 (5000 for the
    released max_len; embedding.py L47, L115-118). `forward_chunk` uses `self.embed`'s table for both
    conformer stacks (upsample_encoder_v2.py L440, L463)."""
    return (int(flow.encoder.embed.pos_enc.pe.size(1)) + 1) // 2


CLOCKS = {
    "tokens": _clocks.Clock("tokens", Fraction(25), "S3 speech tokens"),
    "mel": _clocks.Clock("mel", Fraction(50), "mel frames (hop 480)"),
    "samples": _clocks.Clock("samples", Fraction(24000), "audio samples"),
}


def regions(prompt_frames: int, limit: int = POSITION_TABLE) -> list:
    """Step-Audio 2's flow regions for a voice of P mel frames (P even), in mel frames along the stock axis.

    conformer_att (layers, 1, 8, L, 128): KeepAll up to the position table (`limit`): t2w never trims it,
    and a call reads positions of size L + advance, so L + advance <= limit. estimator_att
    (steps, 16, 2, 8, L, 128): HeadTail(P, 100, 54) (t2w L137-141). Conv caches fixed.
    Raises ClockError if even the first call would not fit."""
    P = int(prompt_frames)
    if P % 2:
        raise ValueError(f"prompt_frames: expected an even mel-frame count (2 x tokens), got {P}")
    first = P + MAX_ADVANCE
    if first > limit:
        raise _clocks.ClockError(f"region 'conformer_att': a prompt of {P} mel frames plus one call reaches "
                                 f"{first}, past the position table of {limit}")
    longest = P + TAIL_FRAMES + MAX_ADVANCE
    if longest > DIT_BUFFER_FRAMES:
        raise _clocks.ClockError(f"region 'estimator_att': a prompt of {P} mel frames makes the DiT cache reach "
                                 f"{longest} frames, past the stock DiT buffers of {DIT_BUFFER_FRAMES} "
                                 f"(flow_matching.py L36)")
    return [
        _clocks.RegionSpec("conformer_att", "mel", P, _clocks.KeepAll(limit), axis=3),
        _clocks.RegionSpec("estimator_att", "mel", P, _clocks.HeadTail(P, TAIL_FRAMES, MAX_ADVANCE), axis=4),
        _clocks.RegionSpec("conformer_cnn", "mel", 6, _clocks.Fixed(6), axis=2),
        _clocks.RegionSpec("estimator_cnn", "mel", 2, _clocks.Fixed(2), axis=4),
    ]


def check_unit_tokens(tokens) -> list[int]:
    """Token ids of one unit: ints in [0, 6561), at most MAX_UNIT_TOKENS. Raises InputError naming it."""
    tokens = fh.check_tokens(tokens)
    if len(tokens) > MAX_UNIT_TOKENS:
        raise InputError(f"tokens: at most {MAX_UNIT_TOKENS} per unit, got {len(tokens)}")
    return tokens


class StockSession:
    """One session on the upstream driver: `set_stream_cache` once when the session opens (ex L46), every
    turn (response) starts with an empty buffer (ex L5) on the SAME caches (ex L59, L69), each unit makes
    the calls of `plan_calls`, a turn's final unit flushes (ex L26-27).

    rng_seed: the default generators are seeded with it when the session opens (inferred; see module doc).
    draws_default_generator: True: the HiFT's noise comes from the process's default generators, shared
    by every session of the process (a harness that runs several sessions must keep each one's state).
    """

    #: What start_turn does to the state (duplex_session.turn_state): nothing; the caches carry over
    #: turns (upstream never resets them).
    turn_state = "carried"

    draws_default_generator = True

    def __init__(self, t2w: StockToken2wav, prompt: fh.Prompt, *, rng_seed: int = 0):
        if getattr(t2w, "stock_buffers_released", False):
            raise RuntimeError("StockSession: this model's stock DiT cache buffers were released for a "
                               "cadence-only process (flow_hift.for_mode); build another model for stock sessions")
        self.t2w, self.prompt = t2w, prompt
        torch.manual_seed(rng_seed)
        fh.install_prompt(t2w, prompt)
        t2w.set_stream_cache(prompt.key)     # no inference_mode around it: upstream has none (the stock
        #                                      flow/HiFT methods carry their own @torch.inference_mode)
        self._flow_cache, self._hift_cache = t2w.stream_cache, t2w.hift_cache_dict
        self.buffer: list[int] | None = None
        self.turn = -1
        self.calls_made = 0

    @property
    def caches(self) -> dict:
        return self._flow_cache

    def stats(self) -> dict:
        return {"conformer_frames": int(self._flow_cache["conformer_att_cache"].shape[3]),
                "estimator_frames": int(self._flow_cache["estimator_att_cache"].shape[4]),
                "calls": self.calls_made}

    def close(self) -> None:
        """Drop this session's caches from the shared instance (the runner calls it after the session), so
        that a later session's memory is measured without them. The session cannot speak afterwards."""
        t2w = self.t2w
        if t2w.stream_cache is self._flow_cache:
            t2w.stream_cache = None
        if t2w.hift_cache_dict is self._hift_cache:
            t2w.hift_cache_dict = {}
        self._flow_cache = self._hift_cache = None
        self.buffer = None

    def start_turn(self) -> None:
        """A new response: empty token buffer (ex L5); flow and HiFT caches carry over (no reset upstream).
        Raises InputError on a closed session."""
        if self._flow_cache is None:
            raise InputError("start_turn: the session is closed")
        self.buffer = []
        self.turn += 1

    def speak(self, tokens, *, final: bool = False) -> UnitOutput:
        """One SPEAK unit: tokens = the speech token ids (<= 50, ints in [0, 6561)) the LLM emitted.

        Returns the unit's float32 waveform [samples] @ 24 kHz (every call's output in order; empty when
        fewer than 28 tokens are buffered) and its int16 PCM (t2w L164-167). Raises InputError for bad
        tokens or no open turn, state untouched. Past the position table stock breaks inside the encoder
        (whatever torch raises there), as upstream does.
        """
        if self.buffer is None:
            raise InputError("speak: no open turn (call start_turn first; a finalised turn is closed)")
        if self._flow_cache is None:
            raise InputError("speak: the session is closed")
        final = fh.check_final(final)
        tokens = check_unit_tokens(tokens)
        calls, rest = plan_calls(self.buffer, tokens, final)
        t2w = self.t2w
        t2w.stream_cache, t2w.hift_cache_dict = self._flow_cache, self._hift_cache
        waves = []
        try:
            for call in calls:
                waves.append(t2w.stream(call.tokens, self.prompt.key, last_chunk=call.last_chunk)
                             .cpu().numpy().reshape(-1))
                self.calls_made += 1
        finally:
            self._flow_cache, self._hift_cache = t2w.stream_cache, t2w.hift_cache_dict
        self.buffer = None if final else rest
        wave = np.concatenate(waves) if waves else np.zeros(0, np.float32)
        return UnitOutput(wave.astype(np.float32, copy=False), fh.to_pcm16(wave),
                          {"calls": [len(c.tokens) for c in calls]})


# --- adapter contract (duplexcadence.runtime), reached through flow_hift when spec variant = stepaudio2 ---
@dataclass
class Model:
    """One stock Step-Audio 2 tail instance and its voice prompt, shared by every session."""
    t2w: StockToken2wav
    prompt: fh.Prompt
    spec: dict
    rng_seed: int


def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0) -> Model:
    """spec: voice_prompt (24 kHz WAV), prompt_seconds (None: whole clip), n_timesteps (10 upstream).
    Raises ValueError for an unknown depth or a checkpoint (not supported for this variant yet)."""
    if depth not in ("released", "reduced"):
        raise ValueError(f"depth: expected 'released' or 'reduced', got {depth!r}")
    if spec.get("checkpoint"):
        raise ValueError("checkpoint: the stepaudio2 variant builds seeded random weights only")
    released = depth == "released"
    t2w = build_token2wav(n_timesteps=int(spec.get("n_timesteps", N_TIMESTEPS)), device=device, seed=seed,
                          depth=RELEASED if released else REDUCED,
                          hift_config=HIFT_CONFIG if released else HIFT_REDUCED)
    prompt = fh.prepare_prompt(spec["voice_prompt"], seconds=spec.get("prompt_seconds"), device=device)
    return Model(t2w, prompt, dict(spec), seed)


def new_session(model: Model, mode: str, spec: dict | None = None):
    """mode: "stock" (StockSession) or "cadence" (stepaudio2_cadence.CadenceSession)."""
    if mode == "stock":
        return StockSession(model.t2w, model.prompt, rng_seed=model.rng_seed)
    if mode == "cadence":
        from duplexcadence.adapters.stepaudio2_cadence import CadenceSession
        return CadenceSession(model.t2w, model.prompt, rng_seed=model.rng_seed,
                              **(spec or {}).get("cadence", {}))
    raise ValueError(f"mode: expected 'stock' or 'cadence', got {mode!r}")
