"""Mimi decoder of Moshi (moshi==0.2.13): stock eager, moshi's own CUDA graphs, and DuplexCadence.

Everything that computes audio is the stock code: `MimiModel.decode` (models/compression.py L406-429):
`quantizer.decode` -> `upsample` (ConvTrUpsample1d, 12.5 -> 25 Hz) -> `decoder_transformer`
(ProjectedTransformer, 8 RingKVCache layers) -> `decoder` (SEANetDecoder). This module only

* builds the stock model through moshi's own loader (`loaders.get_mimi`, L323-363): seeded random weights
  (`randomize_` says why they are re-drawn) or a safetensors checkpoint in the released layout;
* drives it as moshi's server does (server.py L59-82): streaming at batch 1, one `decode` per 80 ms codec
  frame, codes [1, 8, 1] -> PCM [1, 1, 1920] @ 24 kHz (`StockSession`);
* declares the decode path's clocks (12.5 Hz codec frames, 25 Hz transformer positions, the SEANet
  rates, 24 kHz samples) and derives its regions from the modules (`declare_regions`); the DuplexCadence
  session over them is duplexcadence.adapters.mimi_cadence.CadenceSession (mode "cadence").

Sessions own their moshi streaming states and install them on the shared model only while they decode
(`_OwnStates`), so a stock and a cadence session can run interleaved over one model instance; the State
objects and tensors are the ones moshi's `streaming(1)` allocated, driven by the same calls.
shared/notes/stock_decoders.md section 4 has the details.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from fractions import Fraction
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch
from torch import nn

from duplexcadence import clocks
from duplexcadence.adapters.flow_hift import to_pcm16
from duplexcadence.clocks import Clock, Fixed, RegionSpec, Ring
from duplexcadence.errors import InputError
from duplexcadence.session import UnitOutput

# --- model facts (cited) -----------------------------------------------------------------------
MOSHI_VERSION = "0.2.13"
SAMPLE_RATE = 24000                  # loaders.py SAMPLE_RATE
FRAME_RATE = Fraction(25, 2)         # loaders.py FRAME_RATE = 12.5
SAMPLES_PER_FRAME = 1920             # MimiModel.frame_size = 24000 / 12.5
POSITIONS_PER_FRAME = 2              # ConvTrUpsample1d stride 2 (compression.py L211-217)
N_Q = 8                              # get_mimi(num_codebooks=8) for Moshi (loaders.py L282-291)
CARDINALITY = 2048                   # _quantizer_kwargs["bins"]
MAX_FRAMES_PER_UNIT = 13             # ceil(12.5): a one-second unit carries 12 or 13 frames
BATCH = 1                            # server.py L59: mimi.streaming_forever(1)
SEANET_RATIOS = (8, 6, 5, 4)         # _seanet_kwargs["ratios"]; the decoder upsamples in this order

# --- clocks: every native time unit of the decode path, exact --------------------------------------
FRAMES = Clock("frames", FRAME_RATE, "codec frame")                 # decode calls
POSITIONS = Clock("positions", Fraction(25), "transformer position")  # encoder_frame_rate = 24000/960
SEANET_CLOCKS = tuple(Clock(f"seanet{math.prod(SEANET_RATIOS[:i + 1])}x",
                            Fraction(25) * math.prod(SEANET_RATIOS[:i + 1]), "SEANet step")
                      for i in range(len(SEANET_RATIOS) - 1))      # 200, 1200, 6000 Hz
SAMPLES = Clock("samples", Fraction(SAMPLE_RATE), "sample")        # 25 * 8*6*5*4 = 24000
CLOCKS = {c.name: c for c in (FRAMES, POSITIONS, *SEANET_CLOCKS, SAMPLES)}
assert SAMPLES.per(FRAMES) == SAMPLES_PER_FRAME and POSITIONS.per(FRAMES) == POSITIONS_PER_FRAME

#: Top-level submodules on the decode path; the rest (encoder, encoder_transformer, downsample) is
#: encoder state, which a decode-only cadence session does not carry.
DECODE_PATH = ("decoder", "decoder_transformer", "upsample")

#: Region kinds: (moshi State class, attribute) -> what the attribute is, its policy and upstream source.
#: Every tensor a decoder-side State holds must be one of these, else `declare_regions` raises.
REGION_KINDS = {
    ("RingKVCache", "cache"): "ring KV [2, B, heads, context, head_dim], Ring(context) @ positions; "
                              "scatter_ in place (transformer.py L218-222, L236-288)",
    ("RingKVCache", "end_offset"): "int64 [B] write counter, +2 per frame (transformer.py L279-282)",
    ("_MHAState", "offset"): "int64 [B] RoPE/query position, +2 per frame (transformer.py L592-595)",
    ("_TransformerState", "offsets"): "int64 [B], +2 per frame (transformer.py L924-928)",
    ("_StreamingConv1dState", "previous"): "conv tail [B, C_in, K_eff - S], Fixed (conv.py L233-267)",
    ("_StreamingConv1dState", "first"): "bool [B]; rebound if pad_mode='replicate' (conv.py L268-273)",
    ("_StreamingConvTr1dState", "partial"): "overlap-add tail [B, C_out, K - S], Fixed (conv.py L330-361)",
    ("*", "exec_mask"): "bool [B], read by every update (streaming.py L34-42)",
}

#: Released config (loaders._mimi_config) and the reduced one CI uses: the same classes, built by the same
#: loader from its kwargs, with 2 transformer layers, 16 SEANet base filters and 8 quantizer levels (only 8
#: are decoded). The KV caches keep their released shape (8 heads x 64, context 250), so the ring wrap is
#: exercised. About 8x faster per frame on CPU.
REDUCED = {"transformer": {"num_layers": 2}, "seanet": {"n_filters": 16}, "quantizer": {"n_q": 8}}
DEPTHS = ("released", "reduced")
MODES = ("stock", "stock_graphs", "cadence")
CADENCE_GRAPHS = ("frame", "unit")
KV_BOOKKEEPING = ("host", "stock")


class CheckpointError(ValueError):
    """A checkpoint does not match the model layout (missing, unexpected or mis-shaped keys)."""


def _moshi():
    """moshi's loader and switches, after checking the pinned version (raises RuntimeError otherwise)."""
    try:
        have = version("moshi")
    except PackageNotFoundError as exc:
        raise RuntimeError(f"moshi=={MOSHI_VERSION} is not installed; run `make setup`") from exc
    if have != MOSHI_VERSION:
        raise RuntimeError(f"moshi: this adapter wraps {MOSHI_VERSION}, found {have}; results would not "
                           f"be comparable")
    from moshi.models import loaders
    from moshi.utils import compile as mcompile
    return loaders, mcompile


def mimi_config(depth: str) -> dict:
    """moshi's released Mimi config (loaders._mimi_config, L28-88), or the reduced one (`REDUCED`)."""
    if depth not in DEPTHS:
        raise ValueError(f"depth: expected one of {DEPTHS}, got {depth!r}")
    loaders, _ = _moshi()
    cfg = copy.deepcopy(loaders._mimi_config)
    if depth == "reduced":
        for section, overrides in REDUCED.items():
            cfg[section].update(overrides)
    return cfg


# --- building ------------------------------------------------------------------------------------
def randomize_(model: nn.Module, seed: int) -> None:
    """Seeded random weights that give non-degenerate audio.

    moshi's constructors leave every codebook's `embedding_sum` at zero (core_vq.py L157-159), so the
    quantizer decodes every code to the same zero latent and the output does not depend on the codes at
    all; with PyTorch's default init the signal also shrinks through the SEANet stack. Here: conv, conv
    transpose and linear weights N(0, 1/fan_in) (fan_in of a transposed conv: in/groups * K / stride),
    biases N(0, 0.02^2), codebook sums N(0, 1), LayerScale 0.2 * (1 + N(0, 0.1^2)), then the last SEANet
    conv scaled by 0.15 so the waveform sits near std 0.15 with no clipping (checked on both depths).
    Norm layers keep their constructed values. Draws come from a CPU generator, so the weights are the
    same on every device. The cached codebook `_embedding` (core_vq.py L179-186) is cleared.
    """
    gen = torch.Generator().manual_seed(seed)

    def draw(shape, scale):
        return torch.randn(tuple(shape), generator=gen) * scale

    with torch.no_grad():
        for _, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
            fan = None
            if isinstance(mod, nn.ConvTranspose1d):
                fan = mod.weight.shape[0] // mod.groups * mod.weight.shape[2] / mod.stride[0]
            elif isinstance(mod, nn.Conv1d):
                fan = mod.weight.shape[1] * mod.weight.shape[2]
            elif isinstance(mod, nn.Linear):
                fan = mod.weight.shape[1]
            if fan is not None:
                mod.weight.copy_(draw(mod.weight.shape, 1.0 / math.sqrt(fan)))
                if mod.bias is not None:
                    mod.bias.copy_(draw(mod.bias.shape, 0.02))
            if type(mod).__name__ == "EuclideanCodebook":
                mod.embedding_sum.copy_(draw(mod.embedding_sum.shape, 1.0))
                mod._embedding = None
            if type(mod).__name__ == "LayerScale":
                mod.scale.copy_(0.2 * (1 + draw(mod.scale.shape, 0.1)))
        last = model.decoder.model[-1].conv.conv
        last.weight.mul_(0.15)
        last.bias.mul_(0.15)


def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0):
    """The stock `MimiModel` from `loaders.get_mimi(filename, config, device, num_codebooks=8)`, eval mode.

    spec["checkpoint"]: a `.safetensors` file in the released layout (state-dict names as the model's;
    tests/data/mimi_manifest.json lists them), loaded by moshi's loader (strict load_state_dict). Without
    it: `torch.manual_seed(seed)`, the stock constructors, then `randomize_(model, seed + 1)`.
    depth: "released" or "reduced" (`REDUCED`). Raises ValueError for a bad depth, FileNotFoundError for a
    missing checkpoint, CheckpointError naming missing / unexpected / mis-shaped keys.
    """
    loaders, _ = _moshi()
    cfg = mimi_config(depth)
    device = torch.device(device)
    checkpoint = spec.get("checkpoint")
    torch.manual_seed(seed)
    if checkpoint is None:
        model = loaders.get_mimi(None, cfg, device=device, num_codebooks=N_Q)
        randomize_(model, seed + 1)
        return model.eval()
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"spec['checkpoint']: {path} does not exist")
    if path.suffix not in (".safetensors", ".sft", ".sfts"):
        raise CheckpointError(f"spec['checkpoint']: expected a .safetensors file (released layout), "
                              f"got {path}")
    try:
        model = loaders.get_mimi(str(path), cfg, device=device, num_codebooks=N_Q)
    except RuntimeError as exc:   # torch's load_state_dict(strict=True) names every bad key
        raise CheckpointError(f"spec['checkpoint']: {path} does not match the {depth} Mimi layout "
                              f"(moshi=={MOSHI_VERSION} get_mimi): {exc}") from exc
    return model.eval()


def state_manifest(model: nn.Module) -> dict:
    """{name: [shape]} of every state-dict entry: the checkpoint layout, in the manifest's format."""
    return {k: list(v.shape) for k, v in model.state_dict().items()}


# --- payload -------------------------------------------------------------------------------------
def check_codes(codes) -> torch.Tensor:
    """Validate one unit's codes: 8 codebooks x F frames (1 <= F <= 13) of ids in [0, 2048).

    Accepts a list of 8 lists of ints, or an integer torch / numpy array [8, F]. Returns an int64 CPU
    tensor [8, F]. Raises InputError naming the argument, what was expected and what came.
    """
    want = f"{N_Q} codebooks x 1..{MAX_FRAMES_PER_UNIT} frames of ids in [0, {CARDINALITY})"
    if isinstance(codes, (torch.Tensor, np.ndarray)):
        t = torch.as_tensor(codes)
        if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
            raise InputError(f"codes: expected an integer tensor [{N_Q}, frames], got dtype {t.dtype}")
        if t.dim() != 2 or t.shape[0] != N_Q:
            raise InputError(f"codes: expected shape [{N_Q}, frames] ({want}), got {list(t.shape)}")
        t = t.detach().to("cpu", torch.int64)
    else:
        if isinstance(codes, (str, bytes)) or not isinstance(codes, (list, tuple)):
            raise InputError(f"codes: expected {want} as a list of {N_Q} lists, got {type(codes).__name__}")
        if len(codes) != N_Q:
            raise InputError(f"codes: expected {N_Q} codebooks, got {len(codes)}")
        rows = []
        for q, row in enumerate(codes):
            if not isinstance(row, (list, tuple)):
                raise InputError(f"codes[{q}]: expected a list of ints, got {type(row).__name__}")
            for f, c in enumerate(row):
                if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)):
                    raise InputError(f"codes[{q}][{f}]: expected an int code id, "
                                     f"got {c!r} ({type(c).__name__})")
            rows.append([int(c) for c in row])
        lengths = sorted({len(r) for r in rows})
        if len(lengths) != 1:
            raise InputError(f"codes: every codebook needs the same frame count, got lengths {lengths}")
        t = torch.tensor(rows, dtype=torch.int64).reshape(N_Q, lengths[0])
    frames = int(t.shape[1])
    if not 1 <= frames <= MAX_FRAMES_PER_UNIT:
        raise InputError(f"codes: expected 1..{MAX_FRAMES_PER_UNIT} frames per unit (12.5 Hz), got {frames}")
    bad = (t < 0) | (t >= CARDINALITY)
    if bool(bad.any()):
        q, f = (int(i) for i in bad.nonzero()[0])
        raise InputError(f"codes[{q}][{f}]: code id {int(t[q, f])} outside [0, {CARDINALITY})")
    return t


# --- moshi streaming states, owned by a session -------------------------------------------------
def _on_decode_path(name: str) -> bool:
    return name == "" or name.split(".")[0] in DECODE_PATH


class _OwnStates:
    """A session's own moshi streaming states (from `model.streaming(1)`, streaming.py L110-137),
    installed with `set_streaming_state` only while the session decodes, then uninstalled (set to None),
    so sessions over one model never share state. decode_only: drop the encoder-side states."""

    def __init__(self, model, *, decode_only: bool):
        if model.is_streaming:
            raise RuntimeError("model is already streaming (e.g. streaming_forever); sessions install their "
                               "own states, so build sessions on a model that is not streaming")
        stack = model.streaming(BATCH)
        self.states = model.get_streaming_state()
        stack.close()                     # State.__exit__ is a no-op; the State objects stay alive here
        if decode_only:
            self.states = {k: (v if _on_decode_path(k) else None) for k, v in self.states.items()}
        self.model = model
        self._none = {k: None for k in self.states}

    def __enter__(self):
        self.model.set_streaming_state(self.states)
        return self.states

    def __exit__(self, *exc):
        self.model.set_streaming_state(self._none)


def _unit_output(wave: np.ndarray, frames: int, **info) -> UnitOutput:
    return UnitOutput(wave, to_pcm16(wave), {"frames": frames, **info})


class StockSession:
    """moshi's server loop over one session: `decode(codes[:, :, t:t+1])` per frame, then `.cpu()`
    (server.py L59-82; L151 calls it once per LM step). graphs=False: stock eager, the bit-exact reference,
    with moshi's CUDA graphs and torch.compile off through its own switches (`no_cuda_graph()`,
    `no_compile()`, utils/compile.py L25-34, L169-186). graphs=True: moshi's CUDAGraphed path as shipped
    (decoder transformer and SEANet graphed after one eager call, RoPE torch.compile'd on CUDA;
    compression.py L219-230, L415-429); on CPU it equals stock eager.
    """

    #: What start_turn does to the state (duplex_session.turn_state): nothing, one continuous stream.
    turn_state = "stream"

    def __init__(self, model, *, graphs: bool = False):
        self.model = model
        self.graphs = graphs
        self.device = next(model.parameters()).device
        self.own = _OwnStates(model, decode_only=False)
        self.frames = 0

    def start_turn(self) -> None:
        """No-op: Moshi streams continuously (server.py resets only per connection, L163-164)."""

    def speak(self, codes, final: bool = False) -> UnitOutput:
        """One unit: codes [8][F] (F <= 13) -> float32 waveform [F * 1920] @ 24 kHz and its int16 PCM.
        `final` changes nothing: Mimi has no flush call. Raises InputError; nothing changes then."""
        codes = check_codes(codes)
        frames = codes.shape[1]
        _, mc = _moshi()
        tokens = codes.to(self.device)[None]                         # [1, 8, F], one copy per unit
        pcm = []
        with self.own, torch.no_grad():
            if self.graphs:
                for t in range(frames):
                    pcm.append(self.model.decode(tokens[:, :, t:t + 1]).cpu())
            else:
                with mc.no_cuda_graph(), mc.no_compile():
                    for t in range(frames):
                        pcm.append(self.model.decode(tokens[:, :, t:t + 1]).cpu())
        self.frames += frames
        wave = torch.cat(pcm, dim=-1).reshape(-1).numpy()
        return _unit_output(wave, frames)

    def stats(self) -> dict:
        """Frames decoded and, for moshi's CUDAGraphed path, how many of its graphs are captured."""
        top = self.own.states[""]
        graphed = [getattr(top, f) for f in ("graphed_tr_dec", "graphed_decoder")]
        return {"mode": "stock_graphs" if self.graphs else "stock", "frames": self.frames,
                "moshi_graphs_captured": sum(g is not None and g._graph is not None for g in graphed)}


# --- regions: every decoder-side state tensor, declared from the modules ----------------------------
@dataclass
class Binding:
    """One region: its declaration, the stock object and attribute it replaces, and its arena view."""
    spec: RegionSpec
    owner: object
    attr: str
    kind: str
    view: torch.Tensor | None = None


def _seanet_rates(decoder) -> dict:
    """decoder.model index -> rate (Hz) of the samples that child produces; 25 Hz in, x stride per
    StreamingConvTranspose1d (seanet.py SEANetDecoder.__init__)."""
    from moshi.modules.conv import StreamingConvTranspose1d
    rate, out = Fraction(25), {}
    for i, child in enumerate(decoder.model):
        if isinstance(child, StreamingConvTranspose1d):
            rate *= child._stride
        out[i] = rate
    return out


def _clock_for(name: str, rates: dict) -> str:
    parts = name.split(".")
    if parts[0] == "decoder" and len(parts) > 2:
        rate = rates[int(parts[2])]
        for clock in CLOCKS.values():
            if clock.rate == rate:
                return clock.name
        raise ValueError(f"region {name!r}: no declared clock runs at {rate} Hz (SEANET_RATIOS changed?)")
    return POSITIONS.name if parts[0] in ("decoder_transformer", "upsample") else FRAMES.name


def declare_regions(model, states: dict) -> list[Binding]:
    """Every tensor of every decoder-side moshi State, as a region with its clock and policy.

    Lengths come from the modules (conv: K_eff - S; conv transpose: K - S; KV: attention context) and are
    checked against the tensors `streaming(1)` allocated: a mismatch raises ValueError naming the region.
    Zero-length conv tails (1x1 convs, [B, C, 0]) hold nothing and are never read (conv.py L260-263): no
    region. An unknown tensor attribute raises ValueError (a moshi change we would otherwise miss).
    """
    rates = _seanet_rates(model.decoder)
    out = []
    for name, state in states.items():
        if state is None or not _on_decode_path(name):
            continue
        mod = model.get_submodule(name) if name else model
        owners = [(type(state).__name__, state)]
        if getattr(state, "kv_cache", None) is not None:
            owners.append(("RingKVCache", state.kv_cache))
        clock = _clock_for(name, rates)
        for cls, owner in owners:
            for attr, value in vars(owner).items():
                if not isinstance(value, torch.Tensor):
                    continue
                key = (cls, attr) if (cls, attr) in REGION_KINDS else ("*", attr)
                if key not in REGION_KINDS:
                    raise ValueError(f"state {name!r}: unknown tensor {cls}.{attr} {list(value.shape)}; "
                                     f"declare it in REGION_KINDS")
                rname = f"{name}.{'kv_cache.' if cls == 'RingKVCache' else ''}{attr}".lstrip(".")
                if attr == "cache":
                    spec = RegionSpec(rname, POSITIONS.name, mod.context, Ring(mod.context), axis=-2)
                elif attr == "previous":
                    n = mod._effective_kernel_size - mod._stride
                    if n == 0:
                        continue
                    spec = RegionSpec(rname, clock, n, Fixed(n), axis=-1)
                elif attr == "partial":
                    n = mod._kernel_size - mod._stride
                    spec = RegionSpec(rname, clock, n, Fixed(n), axis=-1)
                else:
                    spec = RegionSpec(rname, POSITIONS.name if value.dtype == torch.int64 else FRAMES.name,
                                      BATCH, Fixed(BATCH), axis=0)
                have = value.shape[spec.axis]
                if have != spec.policy.bound():
                    raise ValueError(f"region {rname!r}: declared length {spec.policy.bound()} "
                                     f"({type(spec.policy).__name__}), moshi allocated {list(value.shape)}")
                out.append(Binding(spec, owner, attr, key[0] + "." + attr))
    return out


def session_schedule(bindings: list[Binding], unit_frames: list[int]) -> list[clocks.Step]:
    """clocks.schedule for a sequence of units (sizes: frames per unit). No region ever changes length: the
    ring keeps `context` slots and only the write counters' values advance, so every step reads the same
    lengths; the phases are clocks.schedule's (a unit size alternating 12 / 13 reads as "ramp").
    Note: the ring is declared with advance 0 in slots; RegionSpec.step raises for a Ring advanced past
    its capacity, since a Ring's length is its capacity from the first step on."""
    specs = [b.spec for b in bindings]
    return clocks.schedule(specs, [{} for _ in unit_frames], list(unit_frames), [False] * len(unit_frames))


def new_session(model, mode: str, spec: dict | None = None):
    """mode "stock" (bit-exact reference), "stock_graphs" (moshi's CUDAGraphed baseline) or "cadence".
    spec keys read: cadence_graphs ("frame" | "unit"), kv_bookkeeping ("host" | "stock": moshi's own
    RingKVCache on arena views), arena_backend, graphs (bool; default: on CUDA)."""
    if mode == "stock":
        return StockSession(model, graphs=False)
    if mode == "stock_graphs":
        return StockSession(model, graphs=True)
    if mode == "cadence":
        from duplexcadence.adapters.mimi_cadence import CadenceSession
        return CadenceSession(model, spec)
    raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")


def state_tensors(session) -> dict:
    """Every streaming-state tensor a session owns, by name (tests hash these), plus host counters."""
    out = {}
    for name, state in session.own.states.items():
        if state is None:
            continue
        for owner, prefix in ((state, name), (getattr(state, "kv_cache", None), f"{name}.kv_cache")):
            if owner is None:
                continue
            for attr, value in vars(owner).items():
                if isinstance(value, torch.Tensor):
                    out[f"{prefix}.{attr}".lstrip(".")] = value
                elif attr == "offset_cpu":
                    out[f"{prefix}.{attr}".lstrip(".")] = int(value)
    out["host.frames"] = session.frames
    return out
