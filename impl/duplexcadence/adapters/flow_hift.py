"""Flow-matching DiT + causal HiFT tail of MiniCPM-o 4.5 (minicpmo-utils==1.0.7, package `stepaudio2`).

Everything that computes audio is the stock code: `stepaudio2.token2wav.Token2wav` and the modules it
loads (`CausalMaskedDiffWithXvec` with `UpsampleConformerEncoderV2` + `CausalConditionalCFM`/`DiT`, the
CosyVoice3 `CausalHiFTGenerator` through `BoundedVocoder`). This module only

* writes the released hyperparameters as the `flow.yaml` / `config.yaml` that ship with the weights
  (they are not in the wheel) and builds the stock model from them through the stock loader
  (`stepaudio2.token2wav._load_config`, L28-59; `load_causal_vocoder`, L62-79), with seeded random
  weights or from a checkpoint directory in the released layout;
* stands in for the two ONNX front-end models (S3 speech tokenizer, CAMPPlus) that are not available:
  see `prepare_prompt`;
* drives `Token2wav.stream` exactly as the MiniCPM-o 4.5 duplex loop does: `StockSession`.

Sources: minicpmo-utils 1.0.7 `stepaudio2/token2wav.py`; OpenBMB/minicpm-o-4_5-pytorch-simple-demo @c7e1660
`MiniCPMO45/modeling_minicpmo_unified.py` (init L275-289, per-voice cache L4398-4404, turn reset L4406-4410,
token loop L5446-5525). shared/notes/stock_decoders.md section 2 has the details.
"""
from __future__ import annotations

import hashlib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from duplexcadence import upstream
from duplexcadence.errors import InputError
from duplexcadence.session import UnitOutput

# --- model facts (cited) -----------------------------------------------------------------------
VOCAB_SIZE = 6561            # S3 tokenizer v2 codebook (flow.yaml vocab_size)
SILENCE_TOKEN = 4218         # unified L4408: turn buffer starts as [4218] * 3
PRE_LOOKAHEAD = 3            # flow.pre_lookahead_len (encoder PreLookaheadLayer)
CHUNK_TOKENS = 25            # unified L5446ff: CHUNK_SIZE = 25 (1.00 s at 25 Hz)
MIN_CALL_TOKENS = PRE_LOOKAHEAD + 5   # unified loop: `while len(buf) >= pre_lookahead + 5`
SAMPLE_RATE = 24000
HOP_SAMPLES = 480            # samples per mel frame (50 Hz)
TOKEN_RATE_HZ = 25
PROMPT_SECONDS_DEFAULT = 6.0

# The released flow.yaml (MiniCPM-o-4_5/assets/token2wav/flow.yaml, Step-Audio-2-mini/token2wav/flow.yaml):
# the constructor contract vLLM-Omni validates it against (_FLOW_CONTRACT), shared/notes/stock_decoders.md 2.3.
FLOW_YAML = """\
flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    output_size: 80
    spk_embed_dim: 192
    output_type: 'mel'
    vocab_size: 6561
    encoder: !new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2
        input_size: 512
        output_size: 512
        input_layer: 'linear'
        pre_lookahead_len: 3
        num_blocks: {num_blocks}
        num_up_blocks: {num_up_blocks}
        up_stride: 2
        up_scale_factor: 2
        attention_heads: 8
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        key_bias: true
        linear_units: 2048
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: true
    decoder: !new:cosyvoice2.flow.flow_matching.CausalConditionalCFM
        inference_cfg_rate: 0.7
        estimator: !new:cosyvoice2.flow.decoder_dit.DiT
            in_channels: 320
            out_channels: 80
            mlp_ratio: 4.0
            depth: {dit_depth}
            num_heads: 8
            head_dim: 64
            hidden_size: 512
"""

# The released config.yaml of the 1.0.7 causal vocoder: CosyVoice3 cosyvoice3.yaml `hift:` block with the
# mel front end Token2wav asserts (token2wav.py L62-79); shared/notes/stock_decoders.md 2.5.
VOCODER_YAML = """\
sample_rate: 24000
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: 24000
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: 8000
    center: false
hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: 512
    nb_harmonics: 8
    sampling_rate: 24000
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: 512
"""

#: Released depth, and the reduced depth CI uses for fast bit-exactness checks of the same classes.
RELEASED = {"num_blocks": 6, "num_up_blocks": 4, "dit_depth": 16}
REDUCED = {"num_blocks": 2, "num_up_blocks": 1, "dit_depth": 2}

CHECKPOINT_FILES = ("flow.yaml", "flow.pt", "config.yaml", "hift.pt", "hift_original.pt")




def write_config_dir(directory: Path, depth: dict | None = None) -> Path:
    """Write flow.yaml and config.yaml (released hyperparameters; `depth` overrides layer counts)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "flow.yaml").write_text(FLOW_YAML.format(**(depth or RELEASED)))
    (directory / "config.yaml").write_text(VOCODER_YAML)
    return directory


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Seeded random weights at a scale that gives non-degenerate audio.

    The stock initialisers zero the DiT's adaLN and output layers (decoder_dit.py L409-431), which would
    make every mel frame zero; a released checkpoint has none of that. Matrices get N(0, 1/fan_in),
    norm scales 1 + N(0, 0.02), biases N(0, 0.02). Buffers (noise tables) are left as constructed.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if p.ndim >= 2:
                fan_in = max(1, math.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            elif name.endswith("weight") or name.endswith("gamma") or name.endswith("alpha"):
                p.copy_(1 + 0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))


def _quiet_vocoder_(hift) -> None:
    """Put random-weight audio in a speech-like range instead of mostly clipped at audio_limit.

    conv_post's first n_fft/2 + 1 channels are log-magnitudes (generator.py L704: magnitude = exp(x));
    a bias of -2 and 0.3 of the gain keep random output mostly inside [-0.99, 0.99].
    """
    with torch.no_grad():
        bins = hift.istft_params["n_fft"] // 2 + 1
        for name, p in hift.conv_post.named_parameters():
            if name == "bias":
                p[:bins] -= 2.0
            elif p.ndim >= 2 and "original0" in name or name == "weight":
                p.mul_(0.3)


def build_token2wav(model_dir: str | Path | None = None, *, n_timesteps: int = 10,
                    device: str | torch.device = "cpu", seed: int = 0, depth: dict | None = None):
    """Build a stock `stepaudio2.token2wav.Token2wav` without its CUDA-only, ONNX-loading `__init__`.

    model_dir: a directory in the released layout (flow.yaml, flow.pt, config.yaml, hift.pt,
    hift_original.pt); the ONNX tokenizer and speaker model are not read (see `prepare_prompt`).
    None builds the released architecture with seeded random weights. The construction-time random
    tables (`decoder.rand_noise`, the vocoder's `sine_waves`/`rand_ini`/`uv`) come from the global CPU
    RNG, so they are drawn after `torch.manual_seed(seed)`: stock and cadence must share one instance.
    Mirrors Token2wav.__init__ (token2wav.py L92-134) attribute for attribute.
    Raises FileNotFoundError naming missing checkpoint files; ValueError for bad n_timesteps.
    """
    t2w_mod = upstream.stepaudio2()
    if not isinstance(n_timesteps, int) or not 1 <= n_timesteps <= 16:
        raise ValueError(f"n_timesteps: expected an int in [1, 16] (the DiT cache buffers hold 16 steps), "
                         f"got {n_timesteps!r}")
    device = torch.device(device)
    torch.manual_seed(seed)
    if model_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = write_config_dir(Path(tmp), depth)
            flow = t2w_mod._load_config(cfg / "flow.yaml")["flow"]
            vocoder_cfg = t2w_mod._load_config(cfg / "config.yaml", {"hifigan": None})
        hift = vocoder_cfg["hift"]
        randomize_(flow, seed + 1)
        randomize_(hift, seed + 2)
        _quiet_vocoder_(hift)
        hift = hift.float().to(device).eval()
        checkpoint = None
    else:
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise FileNotFoundError(f"model_dir: {model_dir} is not a directory")
        missing = [n for n in CHECKPOINT_FILES if not (model_dir / n).is_file()]
        if missing:
            raise FileNotFoundError(f"model_dir {model_dir}: missing {missing} "
                                    f"(released layout: {list(CHECKPOINT_FILES)})")
        flow = t2w_mod._load_config(model_dir / "flow.yaml")["flow"]
        state = torch.load(model_dir / "flow.pt", map_location="cpu", weights_only=True)
        flow.load_state_dict(state, strict=True)
        hift, checkpoint, _ = t2w_mod.load_causal_vocoder(model_dir, device)
    flow = flow.to(device).eval()

    t2w = t2w_mod.Token2wav.__new__(t2w_mod.Token2wav)
    t2w.float16 = False
    t2w.n_timesteps = n_timesteps
    t2w.device = device
    t2w.model_path = Path(model_dir) if model_dir is not None else None
    t2w.flow = flow
    t2w.hift = hift
    t2w.vocoder_checkpoint = checkpoint
    t2w.bounded_vocoder = t2w_mod.BoundedVocoder(hift)
    t2w.sample_rate = SAMPLE_RATE
    t2w.hop_samples = HOP_SAMPLES
    t2w.vocoder_delay_frames = (hift.f0_predictor.condnet[0].causal_padding + hift.conv_pre_look_right + 1)
    if t2w.vocoder_delay_frames != 8:
        raise ValueError(f"vocoder delay: expected 8 frames, got {t2w.vocoder_delay_frames}")
    t2w.vocoder_delay_samples = t2w.vocoder_delay_frames * HOP_SAMPLES
    t2w.source_cache_len = t2w.vocoder_delay_samples
    t2w.original_vocoder_checkpoint = (Path(model_dir) / "hift_original.pt") if model_dir else None
    t2w.original_hift = None
    t2w.cache = {}
    t2w.stream_cache = None
    t2w.hift_cache_dict = {}
    t2w._stream_prompt = None
    return t2w


# --- voice prompt ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    """A prepared voice prompt, as `Token2wav._prepare_prompt` returns it (token2wav.py L136-156).

    tokens: int32 [1, n] @ 25 Hz; spk: float32 [1, 192]; mel: float32 [1, 2n, 80] @ 50 Hz.
    `key` names it in `Token2wav.cache` (stock keys by the prompt path).
    """
    key: str
    tokens: torch.Tensor
    spk: torch.Tensor
    mel: torch.Tensor

    @property
    def mel_frames(self) -> int:
        return int(self.mel.shape[1])


def prepare_prompt(wav_path: str | Path, *, seconds: float | None = PROMPT_SECONDS_DEFAULT,
                   device: str | torch.device = "cpu") -> Prompt:
    """Prepare a voice prompt from a real 24 kHz WAV.

    The mel is the stock front end: `stepaudio2.flashcosyvoice.utils.audio.mel_spectrogram` on the 24 kHz
    audio, right-padded by replicate to exactly 2 x n_tokens frames (token2wav.py L148-155).
    Stand-in (documented, deterministic): the S3 tokenizer v2 and CAMPPlus ONNX models ship with the
    weights and are unavailable, so the prompt's n = floor(16 kHz samples / 640) speech tokens (25 Hz)
    and its 192-d speaker embedding are drawn from a generator seeded by the sha256 of the audio samples.
    seconds: keep the first `seconds` of the clip (None keeps it all).
    Raises FileNotFoundError / ValueError naming the file for a missing, unreadable or wrong-rate WAV.
    """
    import soundfile as sf

    wav_path = Path(wav_path)
    if not wav_path.is_file():
        raise FileNotFoundError(f"voice prompt: {wav_path} does not exist")
    try:
        audio, rate = sf.read(str(wav_path), dtype="float32", always_2d=True)
    except Exception as exc:
        raise ValueError(f"voice prompt: {wav_path} is not a readable audio file ({exc})") from exc
    if rate != SAMPLE_RATE:
        raise ValueError(f"voice prompt: {wav_path} is {rate} Hz, expected {SAMPLE_RATE} Hz")
    audio = audio.mean(axis=1)
    if seconds is not None:
        audio = audio[: int(round(seconds * SAMPLE_RATE))]
    n_tokens = (len(audio) * 16000 // SAMPLE_RATE) // 640
    if n_tokens < 10:
        raise ValueError(f"voice prompt: {wav_path} gives {n_tokens} tokens; need >= 10 (0.4 s)")
    upstream.stepaudio2()
    from stepaudio2.flashcosyvoice.utils.audio import mel_spectrogram

    wave = torch.from_numpy(np.ascontiguousarray(audio)).unsqueeze(0)
    mel = mel_spectrogram(wave).transpose(1, 2)                      # [1, T, 80]
    mel = torch.nn.functional.pad(mel, (0, 0, 0, 2 * n_tokens - mel.shape[1]), mode="replicate")
    digest = hashlib.sha256(audio.tobytes()).hexdigest()
    gen = torch.Generator().manual_seed(int(digest[:15], 16))
    tokens = torch.randint(0, VOCAB_SIZE, (1, n_tokens), generator=gen, dtype=torch.int64).to(torch.int32)
    spk = torch.randn(1, 192, generator=gen)
    device = torch.device(device)
    return Prompt(key=f"{wav_path.name}#{seconds}s#{digest[:12]}", tokens=tokens.to(device),
                  spk=spk.to(device), mel=mel.contiguous().to(device))


def install_prompt(t2w, prompt: Prompt) -> None:
    """Put a prepared prompt where `Token2wav.set_stream_cache` looks for it (its per-path cache)."""
    lens = torch.tensor([prompt.tokens.shape[1]], dtype=torch.int32, device=prompt.tokens.device)
    mel_lens = torch.tensor([prompt.mel_frames], dtype=torch.int32, device=prompt.tokens.device)
    t2w.cache[prompt.key] = (prompt.tokens, lens, prompt.spk, prompt.mel, mel_lens)


# --- the duplex driver -------------------------------------------------------------------------
def to_pcm16(wave: np.ndarray) -> np.ndarray:
    """Stock int16 quantisation: clip to [-1, 1], scale by 32767, truncate (token2wav.py L278-279)."""
    return (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2")


def check_tokens(tokens, *, name: str = "tokens") -> list[int]:
    """Validate speech token ids: a sequence of ints in [0, 6561). Raises InputError naming the problem."""
    if (isinstance(tokens, (str, bytes, bytearray, memoryview, set, frozenset, dict))
            or not hasattr(tokens, "__iter__") or getattr(tokens, "ndim", 1) == 0):
        raise InputError(f"{name}: expected a sequence of ints in [0, {VOCAB_SIZE}), got {type(tokens).__name__}")
    out = []
    for i, t in enumerate(tokens):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise InputError(f"{name}[{i}]: expected an int token id, got {t!r} ({type(t).__name__})")
        if not 0 <= int(t) < VOCAB_SIZE:
            raise InputError(f"{name}[{i}]: token id {int(t)} outside [0, {VOCAB_SIZE})")
        out.append(int(t))
    return out


def check_final(final) -> bool:
    """speak()'s `final` flag: a bool (numpy bool too). Raises InputError naming it (a string such as "no"
    would otherwise flush and close the turn)."""
    if not isinstance(final, (bool, np.bool_)):
        raise InputError(f"final: expected a bool, got {final!r} ({type(final).__name__})")
    return bool(final)


@dataclass
class Call:
    """One `Token2wav.stream` call: tokens passed, last_chunk flag."""
    tokens: list[int]
    last_chunk: bool


def plan_calls(buffer: list[int], new_tokens: list[int], final: bool) -> tuple[list[Call], list[int]]:
    """The MiniCPM-o duplex token loop (unified L5446-5525, `force_flush` branch), on the host.

    buffer: tokens carried from the previous unit (starts as [4218]*3 each turn). Returns the stream
    calls this unit makes and the buffer left afterwards. Pure: the caller commits the buffer only
    after every call succeeded.
    """
    buf = list(buffer) + list(new_tokens)
    calls = []
    while len(buf) >= MIN_CALL_TOKENS:
        n = min(CHUNK_TOKENS + PRE_LOOKAHEAD, len(buf))
        calls.append(Call(buf[:n], False))
        buf = buf[min(CHUNK_TOKENS, n - PRE_LOOKAHEAD):]
    if final:
        calls.append(Call(buf, True))
        buf = []
    return calls, buf


def clone_recursive(obj):
    """`tensor.clone()` through dicts/lists/tuples, as the duplex loop's `torch_clone_recursive` does
    for the per-voice base caches and at every turn reset (unified L4398-4410). A clone of a view copies
    only the view's elements (the stock estimator cache is a view of a 2 GiB module buffer)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: clone_recursive(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_recursive(v) for v in obj)
    return obj


class StockSession:
    """One duplex session on the stock runtime, driven as MiniCPM-o 4.5's duplex loop drives Token2wav.

    `set_stream_cache` runs once per voice and the returned caches are deep-cloned as the session's base
    (unified L4398-4404); every turn starts from clones of the base and a [4218]*3 token buffer
    (L4406-4410); each SPEAK unit appends its tokens and makes the stream calls of `plan_calls`; a turn's
    final unit flushes with `last_chunk=True`.
    """

    #: What start_turn does to the state (duplex_session.turn_state): restores the voice's base state.
    turn_state = "reset"

    def __init__(self, t2w, prompt: Prompt):
        if getattr(t2w, "stock_buffers_released", False):
            raise RuntimeError("StockSession: this model's stock DiT cache buffers were released for a "
                               "cadence-only process (flow_hift_cadence.release_stock_buffers); build another "
                               "model for stock sessions")
        self.t2w = t2w
        self.prompt = prompt
        install_prompt(t2w, prompt)
        flow_cache, hift_cache = t2w.set_stream_cache(prompt.key)
        self._base = (clone_recursive(flow_cache), clone_recursive(hift_cache))
        self.buffer: list[int] | None = None   # None: no turn open
        self.turn = -1
        self._flow_cache = self._hift_cache = None

    @property
    def caches(self) -> dict:
        """This session's stock flow caches (Token2wav.stream_cache layout)."""
        return self._flow_cache

    def stats(self) -> dict:
        return {}

    def start_turn(self) -> None:
        """Restore clones of the base caches and the [4218]*3 buffer (unified L4406-4410)."""
        self._flow_cache = clone_recursive(self._base[0])
        self._hift_cache = clone_recursive(self._base[1])
        self.buffer = [SILENCE_TOKEN] * PRE_LOOKAHEAD
        self.turn += 1

    def speak(self, tokens, *, final: bool = False) -> UnitOutput:
        """One SPEAK unit. tokens: the <= 25 speech token ids the AR stage emitted this second.

        Returns the unit's float32 waveform and int16 PCM. Raises InputError for bad token ids, for a
        unit outside an open turn; state is untouched then.
        """
        if self.buffer is None:
            raise InputError("speak: no open turn (call start_turn first; a finalised turn is closed)")
        final = check_final(final)
        tokens = check_tokens(tokens)
        if len(tokens) > CHUNK_TOKENS + 1:
            raise InputError(f"tokens: at most {CHUNK_TOKENS + 1} per unit (generate_chunk max_new_token=26), "
                             f"got {len(tokens)}")
        calls, rest = plan_calls(self.buffer, tokens, final)
        # Several sessions may share one Token2wav instance: bind this session's caches for the unit.
        t2w = self.t2w
        t2w.stream_cache, t2w.hift_cache_dict, t2w._stream_prompt = self._flow_cache, self._hift_cache, self.prompt.key
        waves = []
        try:
            for call in calls:
                waves.append(t2w.stream(call.tokens, last_chunk=call.last_chunk, return_waveform=True))
        finally:
            self._flow_cache, self._hift_cache = t2w.stream_cache, t2w.hift_cache_dict
        self.buffer = None if final else rest
        wave = np.concatenate([w.reshape(-1) for w in waves]) if waves else np.zeros(0, np.float32)
        return UnitOutput(wave.astype(np.float32, copy=False), to_pcm16(wave),
                          {"calls": [len(c.tokens) for c in calls]})


# --- native clocks and regions (the runtime derives sizes and shapes from these alone) -----------
from fractions import Fraction  # noqa: E402

from duplexcadence import clocks as _clocks  # noqa: E402

CLOCKS = {
    "tokens": _clocks.Clock("tokens", Fraction(25), "S3 speech tokens"),
    "mel": _clocks.Clock("mel", Fraction(50), "mel frames (hop 480)"),
    "samples": _clocks.Clock("samples", Fraction(24000), "audio samples"),
    "vocoder_blocks": _clocks.Clock("vocoder_blocks", Fraction(50, 16), "BoundedVocoder 16-frame blocks"),
}
TAIL_FRAMES = 100      # Token2wav.CONFORMER_HISTORY_FRAMES and the estimator trim's -100 (L220-247)
MAX_CALL_TOKENS = CHUNK_TOKENS + PRE_LOOKAHEAD   # 28
POSITION_TABLE = 5000  # EspnetRelPositionalEncoding(max_len=5000): encoder positions per call (embedding.py)
NOISE_FRAMES = 30000   # rand_noise [1, 80, 50*600] (flow_matching.py L33): offset + chunk must fit


def mel_advance(n_tokens: int, last_chunk: bool) -> int:
    """Mel frames one flow call adds: 2(n-3) (lookahead dropped), or 2n for last_chunk (3 zero frames
    padded instead; upsample_encoder_v2.py forward_chunk)."""
    return 2 * n_tokens if last_chunk else 2 * (n_tokens - PRE_LOOKAHEAD)


def regions(prompt_frames: int) -> list:
    """The flow's streaming regions for a voice of P = `prompt_frames` mel frames (P even).

    conformer_att (10,1,8,L,128), oldest-first, token-rate layers stored as [cache, cache] along L;
    estimator_att (steps,16,2,8,L,128), newest-first. Both: L = P after set-up, +50 per 28-token call,
    kept to the newest P + the last 100 once longer than P + 100 (HeadTail; token2wav.py L220-247).
    Conv caches are fixed. Vocoder history is bounded by BoundedVocoder.limits (bounded_vocoder.py L68-84).
    """
    P = int(prompt_frames)
    if P % 2:
        raise ValueError(f"prompt_frames: expected an even mel-frame count (2 x tokens), got {P}")
    longest = P + TAIL_FRAMES + mel_advance(MAX_CALL_TOKENS, False)
    for what, limit in (("the conformer's relative-position table (EspnetRelPositionalEncoding max_len)",
                         POSITION_TABLE), ("the flow's noise table (CausalConditionalCFM.rand_noise)", NOISE_FRAMES)):
        if longest > limit:
            raise _clocks.ClockError(f"region 'conformer_att'/'estimator_att': a prompt of {P} mel frames "
                                     f"makes the caches reach {longest} frames, past {what} of {limit}; "
                                     f"use a prompt of at most {limit - TAIL_FRAMES - 50} frames")
    keep = _clocks.HeadTail(P, TAIL_FRAMES, mel_advance(MAX_CALL_TOKENS, False))
    return [
        _clocks.RegionSpec("conformer_att", "mel", P, keep, axis=3),
        _clocks.RegionSpec("estimator_att", "mel", P, keep, axis=4),
        _clocks.RegionSpec("conformer_cnn", "mel", 6, _clocks.Fixed(6), axis=2),
        _clocks.RegionSpec("estimator_cnn", "mel", 2, _clocks.Fixed(2), axis=4),
    ]


def turn_schedule(prompt_frames: int, calls: list) -> list:
    """Exact region lengths and phase of every flow call of a turn (`calls`: Call list, e.g. from
    `plan_calls` over a session script), without building or running the model."""
    specs = regions(prompt_frames)
    advances = [{"conformer_att": mel_advance(len(c.tokens), c.last_chunk),
                 "estimator_att": mel_advance(len(c.tokens), c.last_chunk)} for c in calls]
    return _clocks.schedule(specs, advances, [len(c.tokens) for c in calls], [c.last_chunk for c in calls])


# --- adapter contract (duplexcadence.runtime) ----------------------------------------------------
#: Workload spec variants this adapter runs besides MiniCPM-o's own path (suite.asv.common reads it).
VARIANTS = ("stepaudio2",)


@dataclass
class Model:
    """One stock Token2wav instance and its prepared voice prompt, shared by every session."""
    t2w: object
    prompt: Prompt
    spec: dict


def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0) -> Model:
    """spec: n_timesteps (5 or 10), voice_prompt (WAV path), prompt_seconds, checkpoint (optional dir).
    spec variant "stepaudio2": Step-Audio 2 mini's tail instead (adapters/stepaudio2.py)."""
    if spec.get("variant") == "stepaudio2":
        from duplexcadence.adapters import stepaudio2
        return stepaudio2.build_model(spec, device=device, depth=depth, seed=seed)
    if depth not in ("released", "reduced"):
        raise ValueError(f"depth: expected 'released' or 'reduced', got {depth!r}")
    t2w = build_token2wav(spec.get("checkpoint"), n_timesteps=int(spec.get("n_timesteps", 10)),
                          device=device, seed=seed, depth=RELEASED if depth == "released" else REDUCED)
    prompt = prepare_prompt(spec["voice_prompt"], seconds=spec.get("prompt_seconds", PROMPT_SECONDS_DEFAULT),
                            device=device)
    return Model(t2w, prompt, dict(spec))


def for_mode(model: Model, mode: str) -> dict:
    """Called by the suite after build_model in a process that runs sessions of one `mode` only: for
    "cadence", the stock 16-step module buffers are freed (flow_hift_cadence.release_stock_buffers), as
    a DuplexCadence deployment would (Step-Audio 2 too: its sessions run their set-up on their arena
    views). Step-Audio 2 also turns on the CUDA allocator's expandable segments: its conformer encoder still
    runs eagerly on a length that grows 50 frames every unit (`duplexcadence.runtime.use_expandable_segments`).
    Returns what was done (for the record)."""
    if mode != "cadence":
        return {}
    from duplexcadence.adapters.flow_hift_cadence import release_stock_buffers
    done = {"stock_buffers_released_bytes": release_stock_buffers(model.t2w)}
    if model.spec.get("variant") == "stepaudio2":
        from duplexcadence.runtime import use_expandable_segments
        done.update(use_expandable_segments(model.t2w.device))
    return done


def new_session(model: Model, mode: str, spec: dict | None = None):
    """mode: "stock" (StockSession) or "cadence" (flow_hift_cadence.CadenceSession)."""
    if model.spec.get("variant") == "stepaudio2":
        from duplexcadence.adapters import stepaudio2
        return stepaudio2.new_session(model, mode, spec)
    if mode == "stock":
        return StockSession(model.t2w, model.prompt)
    if mode == "cadence":
        from duplexcadence.adapters.flow_hift_cadence import CadenceSession
        return CadenceSession(model.t2w, model.prompt, **(spec or {}).get("cadence", {}))
    raise ValueError(f"mode: expected 'stock' or 'cadence', got {mode!r}")
