"""Native clocks, regions and retention policies; the schedule of exact lengths they imply.

A model adapter declares, once, the clocks of its native time units (speech tokens @ 25 Hz, mel frames
@ 50 Hz, codec frames @ 12.5 Hz, samples @ 24 kHz, ...) and every region of streaming state: which
clock advances it, by how much per step, and what it keeps (its retention policy). From that alone the
runtime knows every region's exact length at every step, ahead of time, without running the model:
the arena is sized from it and each step's shape signature (the CUDA-graph key) comes from it.
Clocks advance on the host only (Python ints); nothing here reads the device.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Hashable, NamedTuple, Union

from duplexcadence.errors import LimitError


class ClockError(LimitError):
    """A declared bound would be crossed; the message names the region, the bound and the value.
    A `LimitError` (so an `InputError`): raised before anything runs, nothing changed."""


@contextmanager
def argument(name: str):
    """A ClockError raised inside names the caller's argument that carried the value first
    ("codes: region 'unit': ..."); its session_usable is kept."""
    try:
        yield
    except ClockError as exc:
        raise ClockError(f"{name}: {exc}", session_usable=exc.session_usable) from None


@dataclass(frozen=True)
class Clock:
    """A named counter of one native time unit. rate: units per second (exact)."""
    name: str
    rate: Fraction
    unit: str

    def per(self, other: "Clock") -> Fraction:
        """Exact ratio: how many of this clock's units per one unit of `other` (mel per token = 2)."""
        return Fraction(self.rate) / Fraction(other.rate)

    def units_in(self, seconds: Fraction) -> Fraction:
        return Fraction(self.rate) * Fraction(seconds)


# --- retention policies ------------------------------------------------------------------------
@dataclass(frozen=True)
class Fixed:
    """Always exactly `length` entries (a conv tail: kernel - stride)."""
    length: int

    def after(self, before: int, grown: int) -> int:
        return self.length

    def bound(self) -> int:
        return self.length


@dataclass(frozen=True)
class KeepAll:
    """Grows without trimming up to a hard model limit (e.g. the 5000-entry position table)."""
    limit: int

    def after(self, before: int, grown: int) -> int:
        return grown

    def bound(self) -> int:
        return self.limit


@dataclass(frozen=True)
class HeadTail:
    """Once longer than head + tail, keeps a head slice and a tail slice of the logical layout.

    token2wav.py L220-247 (minicpmo-utils 1.0.7): `cat(att[..., :P], att[..., -100:])` once L > P + 100.
    The longest the region gets is head + tail + the largest single advance (before the trim).
    """
    head: int
    tail: int
    max_advance: int

    def after(self, before: int, grown: int) -> int:
        return min(grown, self.head + self.tail)

    def bound(self) -> int:
        return self.head + self.tail + self.max_advance


@dataclass(frozen=True)
class Ring:
    """A ring buffer of fixed capacity (moshi RingKVCache, transformer.py L196-288)."""
    capacity: int

    def after(self, before: int, grown: int) -> int:
        return min(grown, self.capacity)

    def bound(self) -> int:
        return self.capacity


Policy = Union[Fixed, KeepAll, HeadTail, Ring]


@dataclass(frozen=True)
class RegionSpec:
    """One piece of streaming state: the clock that advances it, its length at the start of a turn and
    its retention policy. Lengths are in units of `clock` along `axis` of the stock tensor."""
    name: str
    clock: str
    initial: int
    policy: Policy
    axis: int = -1

    def step(self, before: int, advance: int) -> tuple[int, int]:
        """(length the step reads and grows to before retention, length kept after retention).

        Raises ClockError if the grown length crosses the policy's bound.
        """
        grown = before + advance
        if isinstance(self.policy, Ring):      # wraps: the ring never holds more than its capacity
            return min(grown, self.policy.capacity), min(grown, self.policy.capacity)
        if grown > self.policy.bound():
            raise ClockError(f"region {self.name!r}: a step of +{advance} {self.clock} from {before} "
                             f"reaches {grown}, past its declared bound {self.policy.bound()} "
                             f"({type(self.policy).__name__})")
        return grown, self.policy.after(before, grown)


class Step(NamedTuple):
    """One scheduled step: its phase, its input size in its clock's units, and every region's length
    before the step, at its grown peak and after retention."""
    index: int
    phase: str                 # "first" | "ramp" | "steady" | "final"
    size: int                  # input units this step (e.g. tokens incl. lookahead)
    before: dict               # region -> length read
    peak: dict                 # region -> length after growth, before retention
    after: dict                # region -> length kept


def schedule(regions: list[RegionSpec], advances: list[dict], sizes: list[int],
             finals: list[bool]) -> list[Step]:
    """Exact region lengths for each step of a turn, from the declarations alone.

    advances[k]: region name -> how far step k advances it (in the region's clock units).
    Phases: step 0 is "first"; a step whose lengths differ from the previous step's is "ramp"; one
    whose region lengths repeat is "steady"; a `finals[k]` step is "final".
    """
    lengths = {r.name: r.initial for r in regions}
    steps: list[Step] = []
    prev_key = None
    for k, (adv, size, final) in enumerate(zip(advances, sizes, finals)):
        before = dict(lengths)
        peak, after = {}, {}
        for r in regions:
            peak[r.name], after[r.name] = r.step(lengths[r.name], adv.get(r.name, 0))
        key = (size, tuple(sorted(before.items())))
        phase = "first" if k == 0 else "final" if final else "steady" if key == prev_key else "ramp"
        steps.append(Step(k, phase, size, before, peak, after))
        lengths = after
        prev_key = key
    return steps


class Signature(NamedTuple):
    """The exact shape of one step: the CUDA-graph key, computed from the clocks before the step runs.

    Never padded. `step` names the adapter's captured step ("flow", "vocoder", "decode", "window", ...);
    `size` is the input it consumes in its own clock's units (tokens, mel frames, codec frames); `lengths`
    holds (region, length read) pairs and `exact` the other exact values that select kernels or slices
    (last_chunk, offsets), both sorted by name so that equal shapes give equal keys. Build with `signature`.
    """
    step: str
    size: int
    lengths: tuple = ()
    exact: tuple = ()

    def get(self, name: str, default=None):
        """A region length or exact value by name."""
        for key, value in self.lengths + self.exact:
            if key == name:
                return value
        return default

    def __repr__(self) -> str:
        parts = [f"{k}={v}" for k, v in self.lengths + self.exact]
        return f"Signature({self.step}, size={self.size}{', ' if parts else ''}{', '.join(parts)})"


def signature(step: str, size: int, lengths: dict | None = None, **exact: Hashable) -> Signature:
    """The Signature of one step from the clocks: `lengths` maps region -> length the step reads (from
    `schedule` or a RegionSpec walk), `exact` names any other exact value the step's kernels depend on.
    Raises TypeError for an unhashable value (a list would make an unusable key)."""
    lengths = tuple(sorted((str(k), _whole(f"lengths[{k!r}]", v)) for k, v in (lengths or {}).items()))
    exact_items = tuple(sorted(exact.items()))
    for key, value in exact_items:
        hash(value)
    return Signature(str(step), _whole("size", size), lengths, exact_items)


def _whole(name: str, value) -> int:
    """An exact whole number of clock units (int, or a Fraction / numpy int equal to one) as an int.
    Raises ValueError for a fraction (a wrong clock) and TypeError for anything else (floats included)."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a whole number of clock units, got a bool")
    if isinstance(value, Fraction):
        if value.denominator != 1:
            raise ValueError(f"{name}: {value} is not a whole number of clock units")
        return int(value)
    if hasattr(value, "__index__"):
        return value.__index__()
    raise TypeError(f"{name}: expected a whole number of clock units, got {value!r} ({type(value).__name__})")


def bounds(regions: list[RegionSpec]) -> dict:
    """The most each region can ever hold: what the arena reserves for it."""
    return {r.name: r.policy.bound() for r in regions}
