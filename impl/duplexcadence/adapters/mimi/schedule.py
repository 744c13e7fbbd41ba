"""Moshi's Mimi decoder (moshi==0.2.13): cited facts, clocks, regions, and the clock that gives every decode
step's `clocks.Signature` from host ints alone.

`MimiModel.decode` (models/compression.py L406-429): `quantizer.decode` -> `upsample` (ConvTrUpsample1d,
12.5 -> 25 Hz) -> `decoder_transformer` (RingKVCache layers) -> `decoder` (SEANet). moshi's server decodes
one 80 ms frame per call at batch 1 (server.py L59-82): codes [1, 8, 1] -> PCM [1, 1, 1920] @ 24 kHz.
`streaming(1)` allocates every region once (streaming.py L110-137) and moshi writes them in place, so no
region changes length: one shape per session.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from duplexcadence.clocks import Clock, Fixed, KeepAll, RegionSpec, Ring, signature
from duplexcadence.errors import LimitError
from duplexcadence.payload import check_int
from duplexcadence.session import ClockState

SAMPLES_PER_FRAME = 1920             # MimiModel.frame_size = SAMPLE_RATE 24000 / FRAME_RATE 12.5 (loaders.py)
POSITIONS_PER_FRAME = 2              # ConvTrUpsample1d stride 2 (compression.py L211-217)
N_Q = 8                              # get_mimi(num_codebooks=8) for Moshi (loaders.py L282-291)
CARDINALITY = 2048                   # _quantizer_kwargs["bins"]
BATCH = 1                            # server.py L59: mimi.streaming_forever(1)
SEANET_RATIOS = (8, 6, 5, 4)         # _seanet_kwargs["ratios"]; the decoder upsamples in this order

FRAMES = Clock("frames", Fraction(25, 2), "codec frame")               # loaders.py FRAME_RATE = 12.5
POSITIONS = Clock("positions", Fraction(25), "transformer position")  # encoder_frame_rate = 24000/960
SEANET_STEPS = tuple(math.prod(SEANET_RATIOS[:i]) for i in (1, 2, 3))  # SEANet rate / 25 Hz: 8, 48, 240
CLOCKS = {c.name: c for c in (FRAMES, POSITIONS, Clock("samples", Fraction(24000), "sample"),
                              *(Clock(f"seanet{r}x", Fraction(25 * r), "SEANet step") for r in SEANET_STEPS))}
assert CLOCKS["samples"].per(FRAMES) == SAMPLES_PER_FRAME and POSITIONS.per(FRAMES) == POSITIONS_PER_FRAME

#: Frames one one-second unit carries on the 12.5 Hz clock (floor and ceil); the most bounds the unit region.
UNIT_SIZES = (math.floor(FRAMES.rate), math.ceil(FRAMES.rate))
UNIT = RegionSpec("unit", FRAMES.name, 0, KeepAll(max(UNIT_SIZES)))
#: Top-level submodules `decode` runs; the encoder's states are never read by it.
DECODE_PATH = ("decoder", "decoder_transformer", "upsample")
#: (moshi State class, attribute) -> what it is. Any other tensor in a decoder-side State is an error.
REGION_KINDS = {
    ("RingKVCache", "cache"): "ring KV [2, B, heads, context, head_dim], Ring(context) @ positions; "
                              "scatter_ in place (transformer.py L218-222, L236-288)",
    ("RingKVCache", "end_offset"): "int64 [B] write counter, +2 per frame (transformer.py L279-282)",
    ("_MHAState", "offset"): "int64 [B] RoPE/query position, +2 per frame (transformer.py L592-595)",
    ("_TransformerState", "offsets"): "int64 [B], +2 per frame (transformer.py L924-928)",
    ("_StreamingConv1dState", "previous"): "conv tail [B, C_in, K_eff - S], Fixed (conv.py L233-267)",
    ("_StreamingConv1dState", "first"): "bool [B]; rebound only if pad_mode='replicate' (conv.py L268-273)",
    ("_StreamingConvTr1dState", "partial"): "overlap-add tail [B, C_out, K - S], Fixed (conv.py L330-361)",
    ("*", "exec_mask"): "bool [B], read by every update (streaming.py L34-42)",
}


def on_decode_path(name: str) -> bool:
    """Whether the streaming module `name` (a key of `get_streaming_state()`) runs in `decode`."""
    return name == "" or name.split(".")[0] in DECODE_PATH


@dataclass
class Binding:
    """One region: its declaration, the moshi State object and attribute holding it, (cadence) its view."""
    spec: RegionSpec
    owner: object
    attr: str
    kind: str       # "<State class>.<attribute>", a key of REGION_KINDS
    view: torch.Tensor | None = None


def _clock_for(name: str, decoder) -> str:
    """The clock a module's input runs at: 25 Hz into SEANet, times each StreamingConvTranspose1d's stride
    before it (seanet.py SEANetDecoder.__init__)."""
    parts = name.split(".")
    if parts[0] != "decoder" or len(parts) < 3:
        return POSITIONS.name if parts[0] in ("decoder_transformer", "upsample") else FRAMES.name
    rate = Fraction(25) * math.prod(c._stride for c in list(decoder.model)[:int(parts[2]) + 1]
                                    if type(c).__name__ == "StreamingConvTranspose1d")
    return next(c.name for c in CLOCKS.values() if c.rate == rate)


def declare_regions(model, states: dict) -> list[Binding]:
    """Every tensor of every decoder-side moshi State in `states` (name -> State), as a region. Lengths come
    from the modules (conv: K_eff - S; conv transpose: K - S; KV: attention context) and are checked against
    the tensors `streaming(1)` allocated (ValueError naming the region). Zero-length conv tails (1x1 convs)
    are never read (conv.py L260-263): no region. An unknown tensor raises ValueError (a moshi change)."""
    out = []
    for name, state in states.items():
        if state is None or not on_decode_path(name):
            continue
        mod, clock = model.get_submodule(name) if name else model, _clock_for(name, model.decoder)
        kv = getattr(state, "kv_cache", None)
        for cls, owner in [(type(state).__name__, state)] + ([("RingKVCache", kv)] if kv is not None else []):
            for attr, value in [(a, v) for a, v in vars(owner).items() if isinstance(v, torch.Tensor)]:
                key = (cls, attr) if (cls, attr) in REGION_KINDS else ("*", attr)
                if key not in REGION_KINDS:
                    raise ValueError(f"state {name!r}: unknown tensor {cls}.{attr} {list(value.shape)}; "
                                     f"declare it in REGION_KINDS")
                rname = f"{name}.{'kv_cache.' if cls == 'RingKVCache' else ''}{attr}".lstrip(".")
                if attr == "cache":
                    spec = RegionSpec(rname, POSITIONS.name, mod.context, Ring(mod.context), axis=-2)
                elif attr in ("previous", "partial"):
                    n = (mod._effective_kernel_size if attr == "previous" else mod._kernel_size) - mod._stride
                    if n == 0:
                        continue
                    spec = RegionSpec(rname, clock, n, Fixed(n), axis=-1)
                else:
                    spec = RegionSpec(rname, POSITIONS.name if value.dtype == torch.int64 else FRAMES.name,
                                      BATCH, Fixed(BATCH), axis=0)
                if value.shape[spec.axis] != spec.policy.bound():
                    raise ValueError(f"region {rname!r}: declared length {spec.policy.bound()} "
                                     f"({type(spec.policy).__name__}), moshi allocated {list(value.shape)}")
                out.append(Binding(spec, owner, attr, f"{key[0]}.{attr}"))
    return out


def ring_rows(positions: int, frames: int, capacity: int) -> torch.Tensor:
    """The ring KV bookkeeping of `frames` decode calls from the host clock: int64 [frames, 2 + capacity],
    row t = the 2 slots call t writes, then the position of every slot after it (-1: not yet written).
    positions: clock POSITIONS before the first call (every layer's `end_offset`). The integer arithmetic
    of RingKVCache.complete (transformer.py L240-242, L258-286), on the host, for B = 1 and exec_mask True."""
    t = POSITIONS_PER_FRAME
    end = torch.arange(frames, dtype=torch.int64) * t + positions                  # end_offset before call
    write = (torch.arange(t, dtype=torch.int64) + end[:, None]) % capacity          # L240-242
    slots = torch.arange(capacity, dtype=torch.int64)
    last = end[:, None] + t - 1                                                      # L263
    delta = slots - last % capacity                                                  # L264-265
    pos = torch.where(delta <= 0, last + delta, last + delta - capacity)             # L273-277
    pos = torch.where(slots >= end[:, None] + t, torch.full_like(pos, -1), pos)      # L279-286
    return torch.cat([write, pos], dim=1)


class MimiClock(ClockState):
    """Host clocks of one Mimi session: FRAMES decoded (POSITIONS = 2 per frame) and the declared regions.
    step "frame": a unit of F frames is F steps of size 1 (one decode call each); "unit": one step of size F.
    A Signature holds every time-axis region's read length (rings: capacity; conv tails: K - S) and the batch."""

    def __init__(self, regions: tuple, step: str, frames: int = 0):
        self.regions, self.step, self.frames = tuple(regions), step, frames

    @property
    def positions(self) -> int:
        return self.frames * POSITIONS_PER_FRAME

    def copy(self) -> "MimiClock":
        return MimiClock(self.regions, self.step, self.frames)

    def host(self) -> dict:
        return {"step": self.step, "frames": self.frames, "positions": self.positions}

    def start_turn(self) -> None:
        """Nothing: Moshi streams continuously (server.py resets only per connection, L163-164)."""

    def unit(self, size: int, final: bool = False) -> list:
        """The steps of a unit of `size` frames (`final` changes nothing: Mimi has no flush). Raises
        InputError for a size below 1, LimitError past the unit bound (13 frames), or past a ring that holds
        fewer positions than a decode call writes (RingKVCache.complete needs T <= capacity)."""
        UNIT.step(0, check_int("size", size, low=1))
        lengths = {}
        for r in (r for r in self.regions if r.axis != 0):
            advance = POSITIONS_PER_FRAME if isinstance(r.policy, Ring) else 0
            if advance > r.policy.bound():
                raise LimitError(f"region {r.name!r}: a decode call writes {advance} positions, the ring "
                                 f"holds {r.policy.bound()}", session_usable=False)
            lengths[r.name] = r.step(r.initial, advance)[0]
        self.frames += size
        if self.step == "unit":
            return [signature("unit", size, lengths, batch=BATCH)]
        return [signature("frame", 1, lengths, batch=BATCH)] * size
