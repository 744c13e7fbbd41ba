"""Qwen3-Omni Code2Wav (transformers==5.17.0 `Qwen3OmniMoeCode2Wav`) on an exact chunk schedule.

Everything that computes audio is the stock module: `Qwen3OmniMoeCode2Wav.forward(codes [1, 16, T])`
(models/qwen3_omni_moe/modeling_qwen3_omni_moe.py L3728-3776): code embedding + 8-layer sliding-window
pre-transformer + 2 upsample stages + 4 decoder blocks -> float wav [1, 1, 1920*T - 555] @ 24 kHz. The
module keeps no state between calls; the caller keeps the left context (the last C code frames).

Stock streaming schedule (`plan_unit`). Stock transformers decodes once, at the end (`chunked_decode(codes,
300, 25)`, L3778-3789, called from generate L4137). Streaming servers call the same forward on windows of
[left context + new frames]: vllm-omni `talker2code2wav_async_chunk` (vllm_omni/model_executor/
stage_input_processors/qwen3_omni.py @019864f) builds each window with `torch.cat` from the last frames,
with `initial_codec_chunk_frames` (4 in vllm-omni#4828's "4/25/25"), `codec_chunk_frames` and
`codec_left_context_frames` = 25; its code2wav `chunked_decode_streaming` (models/qwen3_omni/
qwen3_omni_code2wav.py, the version before its tail refill) keeps `wav[..., context_size * total_upsample:]`,
as transformers' `chunked_decode` does. Here the chunk is one SPEAK unit (12 or 13 new frames: one second
at 12.5 Hz), so:

* the first unit of a turn is split as vllm-omni splits a request's start: an initial window of
  `min(4, N)` frames with no context, then (if N > 4) a window of [those 4 frames + the other N - 4];
* every later unit is one window [min(25, frames so far in this turn) + its N new frames];
* each call keeps `wav[..., ctx * 1920:]`: N*1920 - 555 samples. The 555 missing samples at every chunk
  boundary are stock behaviour (CausalTransConvNet trims kernel - stride at both ends, L3308-3320;
  8 -> 45 -> 184 -> 555) and a known upstream bug (sglang-omni#1354, vllm-omni#4828): matched, not fixed.

Modes (`new_session`):
* "stock": the transformers forward per window on a freshly `torch.cat`-ed code window, as the serving code.
* "cadence": the left context lives in an arena region at a stable address, shifted in place by a device
  copy; the forward runs on an arena view of exactly the window's shape (contiguous [1, 16, T], the strides
  torch.cat gives); on CUDA each distinct exact window (`Signature`) is captured once with GraphCache and
  replayed (no padding); on CPU the same code runs eagerly. Byte-identical to "stock".
* "cadence_seamless" (opt-in, NOT bit-exact to "stock"): keeps 555 more samples at the head of every call
  with left context (`wav[..., ctx * 1920 - 555:]`), refilling the previous call's missing tail from the
  re-decoded context: the slice newer vllm-omni keeps (qwen3_omni_code2wav.py @7374175 and @02952af,
  `start = left_context * total_upsample - tail`). A turn then has 1920*F - 555 samples, like one
  whole-utterance call; from sample 555 on, each call's bytes are the stock call's.

Capturability. The forward is capturable except for the mask: `Qwen3OmniMoeCode2WavTransformerModel.forward`
(L3596-3612) builds it with `create_sliding_window_causal_mask`, whose eager path reads the device every
call (`(packed_sequence_mask[:, -1] == 0).all()`, masking_utils.py L755, a host sync) and which, while a
CUDA stream captures, takes its `is_tracing` branches instead (import_utils.py L1812): it would return a
materialised boolean mask where eager returns None, and SDPA would run with `attn_mask` instead of
`is_causal=True`, another kernel (forcing `is_tracing` on the CPU gives a [1, 1, T, T] mask instead of
None). The cadence path calls the mask builders once per window length outside the graph, with the
arguments the stock forward passes, and hands their result to the pre-transformer as the prepared
`attention_mask` mapping it accepts (L3596: "It may already have been prepared"), through a forward
pre-hook installed only around cadence calls. For windows < 72 frames (the
sliding window) both masks are None, as in eager. No DynamicCache is made: the config has no `use_cache`.
Positions (`torch.arange`) and RoPE run inside the graph as in eager.
"""
from __future__ import annotations

import contextlib
import math
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from duplexcadence.adapters.flow_hift import to_pcm16
from duplexcadence.arena import Arena
from duplexcadence.clocks import Clock, HeadTail, RegionSpec
from duplexcadence.graphs import GraphCache
from duplexcadence.errors import InputError
from duplexcadence.session import UnitOutput

# --- model facts (cited) -----------------------------------------------------------------------
NUM_QUANTIZERS = 16          # Qwen3OmniMoeCode2WavConfig.num_quantizers (= released code2wav_config)
CODEBOOK_SIZE = 2048         # config.codebook_size; ids in [0, 2048) per codebook
SAMPLES_PER_FRAME = 1920     # total_upsample = prod((8, 5, 4, 3) + (2, 2)), modeling L3734
BOUNDARY_LOSS = 555          # forward returns 1920*T - 555 samples (stock_decoders.md 5.2)
SAMPLE_RATE = 24000
LEFT_CONTEXT = 25            # codec_left_context_frames (vllm-omni) = chunked_decode's left_context_size
INITIAL_FRAMES = 4           # initial_codec_chunk_frames, vllm-omni#4828 "4/25/25"
MAX_UNIT_FRAMES = 13         # one second at 12.5 Hz: 12 or 13 new frames per SPEAK unit
WHOLE_CHUNK = 300            # chunked_decode(chunk_size=300, left_context_size=25), generate L4137

CODEC = Clock("codec", Fraction(25, 2), "frames")        # 12.5 Hz codec frames, 1920 samples each
SAMPLES = Clock("samples", Fraction(SAMPLE_RATE), "samples")
MODES = ("stock", "cadence", "cadence_seamless")

#: Released depth = the config class defaults; reduced depth for fast CPU checks of the same classes.
RELEASED: dict = {}
REDUCED = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 4, "decoder_dim": 64}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
CHECKPOINT_PREFIX = "code2wav."   # the released checkpoint's names (vllm-omni hf_to_vllm_mapper)


class CheckpointError(ValueError):
    """A checkpoint does not match the Code2Wav layout: names missing / unexpected / mis-shaped keys."""


def codes_region(left_context: int = LEFT_CONTEXT) -> RegionSpec:
    """The one region: the turn's code frames, @ CODEC. Before a call it holds the left context (<= C
    frames), the call reads [context + new] (its peak: the window, <= C + 13) and keeps the newest C:
    `codes[..., start - context:end]` (chunked_decode L3784; vllm-omni `[-end_index:]`)."""
    return RegionSpec("codes", CODEC.name, 0, HeadTail(head=0, tail=left_context, max_advance=MAX_UNIT_FRAMES))


# --- model ---------------------------------------------------------------------------------------
def _hf():
    from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as cfg_mod
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as model_mod
    return cfg_mod.Qwen3OmniMoeCode2WavConfig, model_mod.Qwen3OmniMoeCode2Wav


def code2wav_config(depth: str = "released"):
    """`Qwen3OmniMoeCode2WavConfig` at the released defaults (configuration L515-560) or reduced depth."""
    if depth not in ("released", "reduced"):
        raise ValueError(f"depth: expected 'released' or 'reduced', got {depth!r}")
    config_cls, _ = _hf()
    return config_cls(**(RELEASED if depth == "released" else REDUCED))


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Seeded random weights at a scale that gives non-degenerate audio, drawn on the CPU in float32.

    The stock init (normal(0, 0.02) for every matrix) is scale-dependent: with the released widths the
    output has std ~0.38, at reduced width ~1e-6 (silence: equal hashes would prove nothing). So every
    matrix gets N(0, 1/fan_in) (transposed convs: fan_in = in * k / stride), the embedding N(0, 1), biases
    N(0, 0.02), SnakeBeta alpha/beta N(0, 0.1), LayerScale and ConvNeXt gamma 0.1, norm weights 1; the
    residual units' second conv and the output conv are scaled by 0.1 so activations stay O(1). Output
    std ~0.15 at both depths, nothing clipped, and changing the left context changes the kept samples.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            owner_name, leaf = name.rsplit(".", 1)
            owner = model.get_submodule(owner_name)
            if isinstance(owner, torch.nn.Embedding):
                value = torch.randn(p.shape, generator=gen)
            elif isinstance(owner, torch.nn.ConvTranspose1d) and leaf == "weight":
                value = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[0] * p.shape[2] / owner.stride[0])
            elif p.ndim >= 2:
                value = torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]))
            elif leaf == "bias":
                value = 0.02 * torch.randn(p.shape, generator=gen)
            elif leaf in ("alpha", "beta"):
                value = 0.1 * torch.randn(p.shape, generator=gen)
            elif leaf in ("scale", "gamma"):
                value = torch.full(p.shape, 0.1)
            else:                                   # RMSNorm / LayerNorm weights
                value = torch.ones(p.shape)
            if leaf == "weight" and (owner_name.endswith("conv2.conv") or name == _output_conv(model)):
                value = value * 0.1
            p.copy_(value)


def _output_conv(model) -> str:
    return f"decoder.{len(model.decoder) - 1}.conv.weight"


def _dtype(spec: dict) -> torch.dtype:
    name = spec.get("dtype", "bfloat16")
    if isinstance(name, torch.dtype):
        name = str(name).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"spec['dtype']: expected one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0):
    """The stock `Qwen3OmniMoeCode2Wav` (attn "sdpa"), eval mode, in spec["dtype"] (default bfloat16).

    Without spec["checkpoint"]: `_from_config(config, dtype=...)` (the class the released model uses),
    then `randomize_(model, seed)` on the CPU, then `.to(device)`, so every device gets the same weights.
    spec["checkpoint"]: a directory with `model.safetensors` (or a sharded index) in the released layout,
    names prefixed "code2wav." as in the released checkpoint (vllm-omni's hf_to_vllm_mapper), and optionally
    its config.json; loaded by transformers' own `from_pretrained(..., key_mapping={"^code2wav\\.": ""})`.
    Other submodules' keys ("thinker.", "talker.") are ignored. Raises ValueError for a bad depth / dtype,
    FileNotFoundError for a missing directory, CheckpointError naming missing / unexpected / mis-shaped keys.
    """
    config = code2wav_config(depth)
    dtype = _dtype(spec)
    _, model_cls = _hf()
    checkpoint = spec.get("checkpoint")
    if checkpoint is None:
        torch.manual_seed(seed)
        model = model_cls._from_config(config, attn_implementation="sdpa", dtype=dtype)
        randomize_(model, seed)
        return model.to(device).eval()
    path = Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(f"spec['checkpoint']: {path} is not a directory (expected model.safetensors "
                                f"[+ config.json] in the released layout)")
    kwargs = {} if (path / "config.json").is_file() else {"config": config}
    # ignore_mismatched_sizes: mis-shaped keys are reported in `info` (and raised below), not re-initialised
    model, info = model_cls.from_pretrained(
        str(path), dtype=dtype, attn_implementation="sdpa", key_mapping={r"^code2wav\.": ""},
        output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    unexpected = [k for k in info["unexpected_keys"] if not k.startswith(("thinker.", "talker."))]
    if info["missing_keys"] or unexpected or info["mismatched_keys"]:
        raise CheckpointError(f"spec['checkpoint']: {path} does not match the {depth} Code2Wav layout "
                              f"(transformers 5.17.0): missing {sorted(info['missing_keys'])}, unexpected "
                              f"{sorted(unexpected)}, mis-shaped {sorted(info['mismatched_keys'])}")
    return model.to(device).eval()


def state_manifest(model) -> dict:
    """{checkpoint name: [shape]} of every state-dict entry, in the released naming ("code2wav." + name)."""
    return {CHECKPOINT_PREFIX + k: list(v.shape) for k, v in model.state_dict().items()}


# --- payload -------------------------------------------------------------------------------------
def check_codes(codes) -> torch.Tensor:
    """Validate one unit's codes: 16 codebooks x N frames (1 <= N <= 13) of ids in [0, 2048).

    Accepts a list of 16 lists of ints, or an integer CPU torch tensor / numpy array [16, N]. Returns an
    int64 CPU tensor [16, N] (a copy). Raises InputError naming the argument, the expectation and what came.
    """
    want = f"{NUM_QUANTIZERS} codebooks x 1..{MAX_UNIT_FRAMES} frames of ids in [0, {CODEBOOK_SIZE})"
    if isinstance(codes, torch.Tensor) and codes.device.type != "cpu":
        raise InputError(f"codes: expected a CPU tensor (host payload), got one on {codes.device}")
    if isinstance(codes, (torch.Tensor, np.ndarray)):
        try:
            t = torch.as_tensor(codes)
        except (TypeError, ValueError, RuntimeError) as exc:      # e.g. a numpy object array
            raise InputError(f"codes: expected an integer array [{NUM_QUANTIZERS}, frames], got {exc}") from None
        if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
            raise InputError(f"codes: expected an integer tensor [{NUM_QUANTIZERS}, frames], got dtype {t.dtype}")
        if t.dim() != 2 or t.shape[0] != NUM_QUANTIZERS:
            raise InputError(f"codes: expected shape [{NUM_QUANTIZERS}, frames] ({want}), got {list(t.shape)}")
        t = t.detach().to(torch.int64, copy=True)
    else:
        if isinstance(codes, (str, bytes)) or not isinstance(codes, (list, tuple)):
            raise InputError(f"codes: expected {want} as a list of {NUM_QUANTIZERS} lists, "
                             f"got {type(codes).__name__}")
        if len(codes) != NUM_QUANTIZERS:
            raise InputError(f"codes: expected {NUM_QUANTIZERS} codebooks, got {len(codes)}")
        for q, row in enumerate(codes):
            if not isinstance(row, (list, tuple)):
                raise InputError(f"codes[{q}]: expected a list of ints, got {type(row).__name__}")
            for f, c in enumerate(row):
                if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)):
                    raise InputError(f"codes[{q}][{f}]: expected an int code id, got {c!r} ({type(c).__name__})")
        lengths = sorted({len(row) for row in codes})
        if len(lengths) != 1:
            raise InputError(f"codes: every codebook needs the same frame count, got lengths {lengths}")
        t = torch.tensor([[int(c) for c in row] for row in codes], dtype=torch.int64)
        t = t.reshape(NUM_QUANTIZERS, lengths[0])
    frames = int(t.shape[1])
    if not 1 <= frames <= MAX_UNIT_FRAMES:
        raise InputError(f"codes: expected 1..{MAX_UNIT_FRAMES} frames per unit (12.5 Hz), got {frames}")
    bad = (t < 0) | (t >= CODEBOOK_SIZE)
    if bool(bad.any()):
        q, f = (int(i) for i in bad.nonzero()[0])
        raise InputError(f"codes[{q}][{f}]: code id {int(t[q, f])} outside [0, {CODEBOOK_SIZE})")
    return t


# --- the schedule --------------------------------------------------------------------------------
class Signature(NamedTuple):
    """Exact lengths of one Code2Wav call; the CUDA-graph key. Never padded."""
    ctx: int     # left-context frames @ 12.5 Hz re-decoded (0 .. C)
    new: int     # new frames @ 12.5 Hz (1 .. 13)
    keep: int    # first output sample kept (ctx*1920; ctx*1920 - 555 in cadence_seamless)

    @property
    def window(self) -> tuple:
        return (1, NUM_QUANTIZERS, self.ctx + self.new)     # codes [batch, codebooks, frames]


class Call(NamedTuple):
    """One forward of a unit: its phase, context and new frames, and where its new frames start."""
    phase: str   # "initial" (no context) | "ramp" (context < C) | "steady" (context = C) | "final"
    ctx: int     # left-context frames
    new: int     # new frames
    offset: int  # first new frame's index in the unit's payload


def plan_unit(ctx: int, frames: int, final: bool, *, left_context: int = LEFT_CONTEXT,
              initial: int = INITIAL_FRAMES) -> tuple[list[Call], int]:
    """The calls of one unit and the context length after it, from the clocks alone (host ints).

    ctx: context frames before the unit (0 at a turn's start). A turn's first unit is split as vllm-omni
    splits a request's start (initial_codec_chunk_frames; `left_context_size = initial` for chunk 1); every
    other unit is one call. Every call of a final unit is labelled "final". Raises ClockError past C + 13.
    """
    region = codes_region(left_context)
    sizes = [frames]
    if ctx == 0 and 0 < initial < frames:
        sizes = [initial, frames - initial]
    calls, offset = [], 0
    for n in sizes:
        _, after = region.step(ctx, n)
        phase = "final" if final else "initial" if ctx == 0 else "ramp" if ctx < left_context else "steady"
        calls.append(Call(phase, ctx, n, offset))
        ctx, offset = after, offset + n
    return calls, ctx


def turn_schedule(unit_frames: list[int], *, left_context: int = LEFT_CONTEXT,
                  initial: int = INITIAL_FRAMES) -> list[list[Call]]:
    """Every call of a turn of units with these frame counts (the last unit final)."""
    out, ctx = [], 0
    for k, n in enumerate(unit_frames):
        calls, ctx = plan_unit(ctx, n, k == len(unit_frames) - 1, left_context=left_context, initial=initial)
        out.append(calls)
    return out


def keep_from(ctx: int, seamless: bool) -> int:
    """First output sample a call keeps: `wav[..., ctx * 1920:]` (stock), 555 earlier in seamless mode."""
    return max(0, ctx * SAMPLES_PER_FRAME - BOUNDARY_LOSS) if seamless and ctx else ctx * SAMPLES_PER_FRAME


def call_samples(call_or_sig) -> int:
    """Samples the stock call returns: 1920 * new - 555."""
    return call_or_sig.new * SAMPLES_PER_FRAME - BOUNDARY_LOSS


def _host_waveform(wave: torch.Tensor) -> np.ndarray:
    """The call's one device-to-host copy: float32 [samples], always a copy (the arena view is reused)."""
    return np.array(wave.reshape(-1).cpu().numpy(), dtype=np.float32, copy=True)


def _unit_output(waves: list[np.ndarray], frames: int, calls: list[dict]) -> UnitOutput:
    wave = np.concatenate(waves) if len(waves) > 1 else waves[0]
    return UnitOutput(wave, to_pcm16(wave), {"frames": frames, "calls": calls})


class _Turn:
    """Host clocks of one session: the turn's context length and frames so far; None when closed."""

    def __init__(self, spec: dict):
        self.left_context = int(spec.get("left_context", LEFT_CONTEXT))
        self.initial = int(spec.get("initial_frames", INITIAL_FRAMES))
        if not 1 <= self.left_context or not 0 <= self.initial <= MAX_UNIT_FRAMES:
            raise ValueError(f"spec: left_context >= 1 and 0 <= initial_frames <= {MAX_UNIT_FRAMES} expected, "
                             f"got {self.left_context}, {self.initial}")
        self.ctx: int | None = None       # None: no open turn
        self.frames = 0                   # frames decoded in this turn
        self.turn = -1
        self.units = 0

    def open(self) -> None:
        self.ctx, self.frames, self.turn = 0, 0, self.turn + 1

    def plan(self, codes, final: bool) -> tuple[torch.Tensor, list[Call], int]:
        """Validate before anything changes: raises InputError outside an open turn or for bad codes."""
        if self.ctx is None:
            raise InputError("speak: no open turn (call start_turn first; a turn closes after its final unit)")
        codes = check_codes(codes)
        calls, after = plan_unit(self.ctx, int(codes.shape[1]), final, left_context=self.left_context,
                                 initial=self.initial)
        return codes, calls, after

    def commit(self, frames: int, after: int, final: bool) -> None:
        self.frames += frames
        self.units += 1
        self.ctx = None if final else after

    def info(self, call: Call, samples: int, keep: int) -> dict:
        """Per-call record. timeline_start: the index, in the turn's whole-utterance decode, of the call's
        first sample (new frames start at start_frame * 1920; seamless calls start 555 earlier)."""
        start = self.frames + call.offset
        return {"phase": call.phase, "ctx": call.ctx, "new": call.new, "window": [1, NUM_QUANTIZERS,
                call.ctx + call.new], "start_frame": start, "samples": samples, "keep": keep,
                "timeline_start": start * SAMPLES_PER_FRAME - (call.ctx * SAMPLES_PER_FRAME - keep)}


# --- stock ---------------------------------------------------------------------------------------
class StockSession:
    """The transformers forward per window on a freshly concatenated code window, as vllm-omni's
    `talker2code2wav_async_chunk` builds it (`torch.cat(frames[-end_index:])`, then [1, 16, T] on the
    device) and its `chunked_decode_streaming` trims it (`wav[..., ctx * 1920:]`). The output is cast to
    float32 with `.float()` as transformers' generate does (L4145); bf16 -> float32 is exact."""

    #: What start_turn does to the state (duplex_session.turn_state): clears the left context.
    turn_state = "reset"

    def __init__(self, model, spec: dict | None = None):
        self.model = model
        self.device = next(model.parameters()).device
        self.clock = _Turn(spec or {})
        self.context = torch.zeros(NUM_QUANTIZERS, 0, dtype=torch.int64)   # host: the last <= C frames

    def start_turn(self) -> None:
        """A new turn: the left context is cleared (the serving code keys frames by request)."""
        self.clock.open()
        self.context = torch.zeros(NUM_QUANTIZERS, 0, dtype=torch.int64)

    def speak(self, codes, final: bool = False) -> UnitOutput:
        """One SPEAK unit: codes [16][N] (1 <= N <= 13) -> float32 [sum of 1920*n - 555 per call] @ 24 kHz.
        Raises InputError (bad codes, no open turn) before anything changes."""
        codes, calls, after = self.clock.plan(codes, final)
        context, waves, info = self.context, [], []
        for call in calls:
            window = torch.cat([context, codes[:, call.offset:call.offset + call.new]], dim=-1)
            assert window.shape[1] == call.ctx + call.new
            with torch.inference_mode():
                wav = self.model(window.reshape(1, NUM_QUANTIZERS, -1).to(self.device))
                wave = wav[..., call.ctx * SAMPLES_PER_FRAME:].float()
            waves.append(_host_waveform(wave))
            info.append(self.clock.info(call, waves[-1].size, call.ctx * SAMPLES_PER_FRAME))
            context = window[:, window.shape[1] - min(window.shape[1], self.clock.left_context):]
        self.context = context
        self.last_window = window.reshape(1, NUM_QUANTIZERS, -1)
        self.clock.commit(int(codes.shape[1]), after, final)
        return _unit_output(waves, int(codes.shape[1]), info)

    def state(self) -> dict:
        """Host clocks and the context bytes (tests compare these before / after a rejected unit)."""
        return {"ctx": self.clock.ctx, "frames": self.clock.frames, "units": self.clock.units,
                "turn": self.clock.turn, "context": self.context.numpy().tobytes()}

    def stats(self) -> dict:
        return {"mode": "stock", "units": self.clock.units, "turn": self.clock.turn}


# --- DuplexCadence -------------------------------------------------------------------------------
class _PreparedMasks:
    """The pre-transformer's mask mapping per window length, built by the stock builders outside any
    graph (their packed-sequence check reads the device), with the arguments the stock forward passes
    (L3590-3612: inputs_embeds [1, T, hidden], no mask, no cache, position_ids = arange(T)[None])."""

    def __init__(self, model):
        self.model = model
        self.by_length: dict[int, dict] = {}

    def mapping(self, frames: int) -> dict:
        if frames not in self.by_length:
            from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
            pt = self.model.pre_transformer
            weight = self.model.code_embedding.weight
            embeds = torch.zeros(1, frames, pt.config.hidden_size, dtype=weight.dtype, device=weight.device)
            kwargs = {"config": pt.config, "inputs_embeds": embeds, "attention_mask": None,
                      "past_key_values": None,
                      "position_ids": torch.arange(frames, device=weight.device).unsqueeze(0)}
            mapping = {"full_attention": hf.create_causal_mask(**kwargs)}
            if pt.has_sliding_layers:
                mapping["sliding_attention"] = hf.create_sliding_window_causal_mask(**kwargs)
            self.by_length[frames] = mapping
        return self.by_length[frames]

    @contextlib.contextmanager
    def installed(self, frames: int):
        """Hand the prepared mapping to the pre-transformer (its `attention_mask` argument) while inside."""
        mapping = self.mapping(frames)

        def hook(module, args, kwargs):
            kwargs["attention_mask"] = mapping
            return args, kwargs

        handle = self.model.pre_transformer.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield mapping
        finally:
            handle.remove()


class CadenceSession:
    """The stock forward on arena views: the left context in region "codes.context" [16, C], the window
    assembled in "codes.window" [1, 16, ctx + new] (contiguous, the strides torch.cat gives), the new frames
    staged in "io.new", the kept float32 samples written to "io.wave"; one graph per `Signature` on CUDA.
    After each call the newest min(ctx + new, C) frames are shifted into the context region in place.
    seamless: the opt-in, non-bit-exact "cadence_seamless" slice (see the module docstring).
    spec keys: left_context, initial_frames, graphs (bool; default on CUDA), arena_backend."""

    #: What start_turn does to the state (duplex_session.turn_state): clears the left context.
    turn_state = "reset"

    def __init__(self, model, spec: dict | None = None, *, seamless: bool = False):
        spec = spec or {}
        self.model = model
        self.device = next(model.parameters()).device
        self.clock = _Turn(spec)
        self.seamless = seamless
        c = self.clock.left_context
        default_backend = "cpu" if self.device.type == "cpu" else "prealloc"   # a few KiB: exact prealloc
        self.arena = Arena(self.device, backend=spec.get("arena_backend", default_backend), name="code2wav")
        self.arena.declare("codes.context", (NUM_QUANTIZERS, c), torch.int64)
        self.arena.declare("codes.window", (1, NUM_QUANTIZERS, c + MAX_UNIT_FRAMES), torch.int64)
        self.arena.declare("io.new", (NUM_QUANTIZERS, MAX_UNIT_FRAMES), torch.int64)
        self.arena.declare("io.wave", (1, 1, MAX_UNIT_FRAMES * SAMPLES_PER_FRAME), torch.float32)
        self.arena.allocate()
        self.graphs = GraphCache(self.device, arena=self.arena, enabled=spec.get("graphs"))
        self.masks = _PreparedMasks(model)
        pinned = self.device.type == "cuda"
        self._host_codes = torch.empty(NUM_QUANTIZERS * MAX_UNIT_FRAMES, dtype=torch.int64, pin_memory=pinned)
        self.pool_bytes_per_shape: dict[Signature, int] = {}
        self.calls_per_phase: dict[str, int] = {}
        self.last_window: torch.Tensor | None = None

    def region(self, name: str, shape) -> torch.Tensor:
        return self.arena[name].view(shape)

    def start_turn(self) -> None:
        """A new turn: the left context is cleared (zeroed; the clock says it holds 0 frames)."""
        self.clock.open()
        self.region("codes.context", (NUM_QUANTIZERS, self.clock.left_context)).zero_()

    # -- the step: stock forward on arena views (capturable; reads context + io.new only) -------------
    def _step(self, sig: Signature) -> torch.Tensor:
        window = self.region("codes.window", sig.window)
        if sig.ctx:
            window[0, :, :sig.ctx].copy_(self.region("codes.context", (NUM_QUANTIZERS, sig.ctx)))
        window[0, :, sig.ctx:].copy_(self.region("io.new", (NUM_QUANTIZERS, sig.new)))
        wav = self.model(window)
        out = self.region("io.wave", (1, 1, wav.shape[-1] - sig.keep))
        out.copy_(wav[..., sig.keep:])      # bf16 -> float32, exact: the same values as stock's .float()
        return out

    def _warm_up(self, sig: Signature) -> None:
        """One eager step on a side stream before capture (cuBLAS / cuDNN handles and workspaces, as
        torch.cuda.graphs recommends). The step is idempotent: it writes only the window and io.wave."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._step(sig)
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def _run(self, sig: Signature) -> torch.Tensor:
        pool_before, captures = self.graphs.pool_bytes, self.graphs.stats.captures
        with torch.inference_mode(), self.masks.installed(sig.ctx + sig.new):
            if self.graphs.enabled and sig not in self.graphs and sig not in self.graphs.eager_only:
                self._warm_up(sig)
            out = self.graphs.run(sig, lambda: self._step(sig))
        if self.graphs.stats.captures > captures:
            self.pool_bytes_per_shape[sig] = self.graphs.pool_bytes - pool_before
        return out

    def _stage(self, codes: torch.Tensor) -> None:
        """Host codes [16, n] -> "io.new" (through a pinned buffer on CUDA; the unit's one H2D copy)."""
        n = int(codes.shape[1])
        host = self._host_codes[:NUM_QUANTIZERS * n].view(NUM_QUANTIZERS, n)
        host.copy_(codes)
        self.region("io.new", (NUM_QUANTIZERS, n)).copy_(host, non_blocking=host.is_pinned())

    def _shift(self, sig: Signature, kept: int) -> None:
        """Context region <- the newest `kept` frames of the window (a device copy between two regions)."""
        frames = sig.ctx + sig.new
        window = self.region("codes.window", sig.window)
        self.region("codes.context", (NUM_QUANTIZERS, kept)).copy_(window[0, :, frames - kept:])

    def signature(self, call: Call) -> Signature:
        return Signature(call.ctx, call.new, keep_from(call.ctx, self.seamless))

    def prepare(self, signatures) -> None:
        """Capture these signatures ahead of time (a voice's shape family, from `turn_schedule`). Writes
        only the window and io.wave; the context and the clocks are untouched. No-op without graphs (CPU)."""
        if not self.graphs.enabled:
            return
        for sig in signatures:
            self._run(sig)

    def speak(self, codes, final: bool = False) -> UnitOutput:
        """One SPEAK unit, byte-identical to StockSession (default) over the same schedule. Raises
        InputError (bad codes, no open turn) before anything changes: arena and clocks stay as they were."""
        codes, calls, after = self.clock.plan(codes, final)
        region = codes_region(self.clock.left_context)
        waves, info = [], []
        for k, call in enumerate(calls):
            sig = self.signature(call)
            self._stage(codes[:, call.offset:call.offset + call.new])
            waves.append(_host_waveform(self._run(sig)))
            info.append(self.clock.info(call, waves[-1].size, sig.keep))
            if not (final and k == len(calls) - 1):
                self._shift(sig, region.step(call.ctx, call.new)[1])
            self.calls_per_phase[call.phase] = self.calls_per_phase.get(call.phase, 0) + 1
        self.last_window = self.region("codes.window", sig.window)
        self.clock.commit(int(codes.shape[1]), after, final)
        return _unit_output(waves, int(codes.shape[1]), info)

    def state(self) -> dict:
        """Host clocks and the context region's bytes (tests compare these before / after a rejected unit)."""
        ctx = self.region("codes.context", (NUM_QUANTIZERS, self.clock.left_context))
        return {"ctx": self.clock.ctx, "frames": self.clock.frames, "units": self.clock.units,
                "turn": self.clock.turn, "context": ctx.cpu().numpy().tobytes()}

    def stats(self) -> dict:
        return {"mode": "cadence_seamless" if self.seamless else "cadence", "units": self.clock.units,
                "graphs": self.graphs.stats.snapshot(), "graph_failures": list(self.graphs.stats.failures),
                "graph_signatures": [tuple(s) for s in self.graphs.entries],
                "graph_pool_bytes": self.graphs.pool_bytes,
                "graph_pool_bytes_per_shape": {str(tuple(s)): b for s, b in self.pool_bytes_per_shape.items()},
                "arena_backend": self.arena.backend, "arena_bytes_reserved": self.arena.bytes_reserved,
                "arena_bytes_mapped": self.arena.bytes_mapped, "calls_per_phase": dict(self.calls_per_phase)}


def new_session(model, mode: str, spec: dict | None = None):
    """mode "stock" (the reference), "cadence" (bit-exact) or "cadence_seamless" (opt-in, not bit-exact).
    spec keys read: left_context (25), initial_frames (4), graphs, arena_backend."""
    if mode == "stock":
        return StockSession(model, spec)
    if mode in ("cadence", "cadence_seamless"):
        return CadenceSession(model, spec, seamless=mode == "cadence_seamless")
    raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")


def whole_utterance(model, codes: torch.Tensor) -> np.ndarray:
    """The second reference row: stock `chunked_decode(codes, 300, 25)` over a whole turn, as transformers'
    generate calls it (L4137). codes: int64 [16, F] (host). Returns float32 [1920*F - 555*ceil(F/300)]."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        wav = model.chunked_decode(codes.reshape(1, NUM_QUANTIZERS, -1).to(device), chunk_size=WHOLE_CHUNK,
                                   left_context_size=LEFT_CONTEXT)
    return _host_waveform(wav.float())
