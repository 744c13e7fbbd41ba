"""Qwen3-Omni Code2Wav (transformers==5.17.0): cited facts, its clock and region, and the chunk schedule that
gives every window's `clocks.Signature` from host ints alone.

`Qwen3OmniMoeCode2Wav.forward(codes [1, 16, T])` (models/qwen3_omni_moe/modeling_qwen3_omni_moe.py L3728-3776)
returns float wav [1, 1, 1920*T - 555] @ 24 kHz and keeps no state: the caller keeps the left context.
Stock transformers decodes once, at the end (`chunked_decode(codes, 300, 25)`, L3778-3789, from generate
L4137); streaming servers call the same forward on windows [left context + new frames]: vllm-omni
`talker2code2wav_async_chunk` (vllm_omni/model_executor/stage_input_processors/qwen3_omni.py @019864f)
`torch.cat`s each window with `initial_codec_chunk_frames` (4 in vllm-omni#4828's "4/25/25"),
`codec_chunk_frames` and `codec_left_context_frames` = 25, and its `chunked_decode_streaming`
(models/qwen3_omni/qwen3_omni_code2wav.py, before its tail refill) keeps `wav[..., context_size *
total_upsample:]`, as `chunked_decode` does. Here a chunk is one SPEAK unit (12 or 13 frames), so
(`plan_unit`): a turn's first unit is an initial window of `min(4, N)` frames, then (if N > 4) [those 4 +
the other N - 4]; every later unit is one window [min(25, frames so far in the turn) + N]; each call keeps
N*1920 - 555 samples. The 555 samples missing at every chunk boundary are stock behaviour
(CausalTransConvNet trims kernel - stride at both ends, L3308-3320; 8 -> 45 -> 184 -> 555) and a known
upstream bug (sglang-omni#1354, vllm-omni#4828): matched, not fixed. Positions are `arange(T)` with RoPE
computed per call (no position table): a window's only bound is the schedule's, C + 13 frames.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

from duplexcadence.clocks import Clock, HeadTail, KeepAll, RegionSpec, signature
from duplexcadence.errors import InputError
from duplexcadence.payload import check_int
from duplexcadence.session import ClockState

NUM_QUANTIZERS = 16          # Qwen3OmniMoeCode2WavConfig.num_quantizers (= released code2wav_config)
CODEBOOK_SIZE = 2048         # config.codebook_size; ids in [0, 2048) per codebook
SAMPLES_PER_FRAME = 1920     # total_upsample = prod((8, 5, 4, 3) + (2, 2)), modeling L3734
BOUNDARY_LOSS = 555          # forward returns 1920*T - 555 samples (stock_decoders.md 5.2)
SAMPLE_RATE = 24000
LEFT_CONTEXT = 25            # codec_left_context_frames (vllm-omni) = chunked_decode's left_context_size
INITIAL_FRAMES = 4           # initial_codec_chunk_frames, vllm-omni#4828 "4/25/25"
WHOLE_CHUNK = 300            # chunked_decode(chunk_size=300, left_context_size=25), generate L4137

CODEC = Clock("codec", Fraction(25, 2), "frames")        # 12.5 Hz codec frames, 1920 samples each
SAMPLES = Clock("samples", Fraction(SAMPLE_RATE), "samples")
#: The new frames one one-second unit carries on the 12.5 Hz clock (floor and ceil of 12.5); the most is
#: the bound of the unit's staging region.
UNIT_SIZES = (math.floor(CODEC.rate), math.ceil(CODEC.rate))
UNIT = RegionSpec("unit", CODEC.name, 0, KeepAll(max(UNIT_SIZES)))


def codes_region(left_context: int = LEFT_CONTEXT) -> RegionSpec:
    """The turn's code frames @ CODEC: the left context (<= C) before a call, the window [context + new] (<= C +
    13) at its peak, the newest C kept: `codes[..., start - context:end]` (L3784; vllm-omni `[-end_index:]`)."""
    return RegionSpec("codes", CODEC.name, 0, HeadTail(head=0, tail=left_context, max_advance=UNIT.policy.bound()))


class Call(NamedTuple):
    """One forward of a unit: its phase, context and new frames, and where its new frames start."""
    phase: str   # "initial" (no context) | "ramp" (context < C) | "steady" (context = C) | "final"
    ctx: int     # left-context frames
    new: int     # new frames
    offset: int  # first new frame's index in the unit's payload


def plan_unit(ctx: int, frames: int, final: bool, *, left_context: int = LEFT_CONTEXT,
              initial: int = INITIAL_FRAMES) -> tuple[list[Call], int]:
    """The calls of one unit and the context after it, from host ints. ctx: context frames before the unit (0
    at a turn's start, split as vllm-omni splits a request's start: initial_codec_chunk_frames, then left
    context = initial). A final unit's calls are "final". Raises ClockError past C + 13."""
    region = codes_region(left_context)
    sizes = [initial, frames - initial] if ctx == 0 and 0 < initial < frames else [frames]
    calls, offset = [], 0
    for n in sizes:
        _, after = region.step(ctx, n)
        phase = "final" if final else "initial" if ctx == 0 else "ramp" if ctx < left_context else "steady"
        calls.append(Call(phase, ctx, n, offset))
        ctx, offset = after, offset + n
    return calls, ctx


def keep_from(ctx: int, seamless: bool) -> int:
    """First output sample a call keeps: `wav[..., ctx * 1920:]` (stock), 555 earlier in seamless mode."""
    return max(0, ctx * SAMPLES_PER_FRAME - BOUNDARY_LOSS) if seamless and ctx else ctx * SAMPLES_PER_FRAME


def window(sig) -> tuple:
    """The codes tensor shape of a window signature: [batch 1, codebooks 16, context + new frames]."""
    return (1, NUM_QUANTIZERS, sig.get("context") + sig.size)


class Turn(ClockState):
    """Host clocks of one Code2Wav session: the turn's context length (None: no open turn), frames, units and
    turns, and the options (left context C, initial frames, seamless). max_frames: the longest window the model
    takes (its config's max_position_embeddings), which bounds C + the largest unit. A window's Signature: step "window",
    size = new frames, lengths {"context": ctx}, exact keep (the first output sample kept)."""

    def __init__(self, spec: dict, seamless: bool = False, *, max_frames: int | None = None):
        high = None if max_frames is None else max_frames - UNIT.policy.bound()
        self.left_context = check_int("spec['left_context']", spec.get("left_context", LEFT_CONTEXT), low=1,
                                      high=high)
        self.initial = check_int("spec['initial_frames']", spec.get("initial_frames", INITIAL_FRAMES), low=0,
                                 high=UNIT.policy.bound())
        self.seamless = seamless
        self.ctx: int | None = None
        self.frames, self.turn, self.units = 0, -1, 0

    def start_turn(self) -> None:
        self.ctx, self.frames, self.turn = 0, 0, self.turn + 1

    def calls(self, size: int, final: bool = False) -> list[Call]:
        """Advance by one unit of `size` new frames; return its calls. Raises InputError outside an open
        turn (a turn closes after its final unit) or for a size below 1, LimitError past 13 frames."""
        if self.ctx is None:
            raise InputError("speak: no open turn (call start_turn first; a turn closes after its final unit)")
        size = check_int("size", size, low=1)
        UNIT.step(0, size)
        calls, after = plan_unit(self.ctx, size, final, left_context=self.left_context, initial=self.initial)
        self.frames, self.units, self.ctx = self.frames + size, self.units + 1, None if final else after
        return calls

    def signature(self, call: Call):
        return signature("window", call.new, {"context": call.ctx}, keep=keep_from(call.ctx, self.seamless))

    def unit(self, size: int, final: bool = False) -> list:
        return [self.signature(c) for c in self.calls(size, final)]

    def turn_signatures(self, sizes=UNIT_SIZES) -> list:
        """Every window signature a turn can run with units of `sizes` frames in any order, final or not:
        a walk of the clock from a turn's start over every reachable context length."""
        start = self.copy()
        start.start_turn()
        found, seen, frontier = set(), {0}, [start]
        while frontier:
            clock = frontier.pop()
            for n in sizes:
                for final in (False, True):
                    nxt = clock.copy()
                    found.update(nxt.unit(n, final))
                    if nxt.ctx is not None and nxt.ctx not in seen:
                        seen.add(nxt.ctx)
                        frontier.append(nxt)
        return sorted(found)

    def info(self, call: Call, samples: int) -> dict:
        """Per-call record (`self` before the unit). timeline_start: the call's first sample's index in the
        turn's whole-utterance decode."""
        start, keep = self.frames + call.offset, keep_from(call.ctx, self.seamless)
        return {"phase": call.phase, "ctx": call.ctx, "new": call.new, "window": [1, NUM_QUANTIZERS,
                call.ctx + call.new], "start_frame": start, "samples": samples, "keep": keep,
                "timeline_start": start * SAMPLES_PER_FRAME - (call.ctx * SAMPLES_PER_FRAME - keep)}
