"""The one session protocol every adapter implements, stock and DuplexCadence alike.

A session is one caller's stream of speech on one model instance: ``start_turn()``, then
``speak(payload, final=...)`` once per one-second SPEAK unit, the last unit of a turn with ``final=True``;
``prepare(signatures)`` captures graphs ahead of time; ``state()`` reads the streaming state; ``stats()``
returns the same `SessionStats` fields for every adapter; ``close()`` frees the session's memory at once.
What a session can do is declared in `Capabilities`, never discovered.

Payloads (what the AR stage emitted during the unit): speech token ids ``list[int]`` @ 25 Hz for the
flow-matching decoders (MiniCPM-o 4.5, Step-Audio 2), codec frames ``[n_q][frames]`` @ 12.5 Hz for Mimi
(Moshi, n_q = 8) and Code2Wav (Qwen3-Omni, n_q = 16). Every error a session raises is an
`duplexcadence.errors.InputError` and leaves the session's state and clocks exactly as they were.
"""
from __future__ import annotations

import abc
import copy
import functools
import hashlib
import threading
from dataclasses import asdict, dataclass, field
from typing import Iterable

import numpy as np
import torch

from duplexcadence.clocks import Signature
from duplexcadence.errors import ClosedError, ConcurrencyError, InputError, LimitError
from duplexcadence.payload import check_int, check_signatures, shown

TURN_STATES = ("reset", "carried", "stream")
PAYLOADS = ("tokens", "frames")


@dataclass(frozen=True)
class Capabilities:
    """What a session does, declared by its class.

    turn_state: what start_turn does to the streaming state: "reset" (back to the voice's base state),
    "carried" (caches carry over turns, as Step-Audio 2's upstream driver does) or "stream" (one continuous
    stream; start_turn is a no-op, Moshi). concurrent: the session may speak on its own host thread while
    other sessions of the same model instance speak on theirs (False: the caller must serialise, and the
    runtime raises ConcurrencyError where it can tell). graphs: captures CUDA graphs (on CUDA).
    payload: "tokens" or "frames"; max_payload: the most tokens / frames one unit may carry.
    """
    turn_state: str
    concurrent: bool
    graphs: bool
    payload: str
    max_payload: int

    def __post_init__(self):
        if self.turn_state not in TURN_STATES:
            raise ValueError(f"turn_state: expected one of {TURN_STATES}, got {self.turn_state!r}")
        if self.payload not in PAYLOADS:
            raise ValueError(f"payload: expected one of {PAYLOADS}, got {self.payload!r}")


@dataclass
class SessionStats:
    """The same counters for every adapter and mode (zeros where a mode has none: stock captures nothing).

    units: SPEAK units spoken; captures / replays / eager_runs: graph captures, replays and eager steps
    (graphs off, or a signature kept eager); warmup_runs: eager first occurrences before a capture;
    eager_fallbacks: steps that ran eagerly because their signature was not captured (after the graph set
    was closed, or a failed capture); capture_failures; graphs: graphs held; graph_bytes: their pool bytes
    (torch allocator reserve growth during capture); arena_bytes_reserved / arena_bytes_mapped: the
    session's arena (address space / physical memory). detail: adapter-specific facts, JSON-safe.
    """
    units: int = 0
    captures: int = 0
    replays: int = 0
    eager_runs: int = 0
    warmup_runs: int = 0
    eager_fallbacks: int = 0
    capture_failures: int = 0
    graphs: int = 0
    graph_bytes: int = 0
    arena_bytes_reserved: int = 0
    arena_bytes_mapped: int = 0
    detail: dict = field(default_factory=dict)

    COUNTERS = ("captures", "replays", "eager_runs", "warmup_runs", "eager_fallbacks", "capture_failures")

    @classmethod
    def of(cls, *, units: int, graphs=None, arena=None, **detail) -> "SessionStats":
        """From a session's GraphCache (duplexcadence.graphs) and Arena (duplexcadence.arena), either None."""
        out = cls(units=units, detail=detail)
        if graphs is not None:
            for name in cls.COUNTERS:
                setattr(out, name, getattr(graphs.stats, name))
            out.graphs, out.graph_bytes = len(graphs.entries), graphs.pool_bytes
            if graphs.stats.failures:
                out.detail["capture_failure_messages"] = [f[:300] for f in graphs.stats.failures[:3]]
        if arena is not None:
            out.arena_bytes_reserved, out.arena_bytes_mapped = arena.bytes_reserved, arena.bytes_mapped
        return out

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class UnitOutput:
    """One SPEAK unit's audio: float32 [samples] @ 24 kHz (the stock call's waveform before int16
    quantisation, concatenated over the unit's calls) and the stock int16 PCM of the same samples."""
    waveform: np.ndarray
    pcm16: np.ndarray
    info: dict = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return int(self.waveform.shape[-1])

    def sha256(self) -> tuple[str, str]:
        """(sha256 of the float32 little-endian bytes, sha256 of the int16 little-endian bytes)."""
        f32 = np.ascontiguousarray(self.waveform, dtype="<f4").tobytes()
        i16 = np.ascontiguousarray(self.pcm16, dtype="<i2").tobytes()
        return hashlib.sha256(f32).hexdigest(), hashlib.sha256(i16).hexdigest()


def to_pcm16(wave: np.ndarray) -> np.ndarray:
    """Stock int16 quantisation, shared by every released driver: clip to [-1, 1], scale by 32767, truncate
    (stepaudio2 token2wav.py L278-279; Step-Audio2 token2wav.py L164-167; moshi and Qwen3-Omni servers)."""
    return (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2")


def host_waveform(wave: torch.Tensor) -> np.ndarray:
    """A device waveform (any shape) as a fresh float32 numpy array [samples]: the unit's one device-to-host
    copy. Always a copy: on CPU `.cpu()` returns the tensor itself, which may be an arena view."""
    return np.array(wave.detach().reshape(-1).cpu().numpy(), dtype=np.float32, copy=True)


def unit_output(waves: Iterable[np.ndarray], **info) -> UnitOutput:
    """UnitOutput of a unit's calls: their float32 waveforms concatenated (empty: no samples) and its PCM."""
    parts = [np.asarray(w, dtype=np.float32).reshape(-1) for w in waves]
    wave = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return UnitOutput(wave, to_pcm16(wave), info)


class ClockState(abc.ABC):
    """A copy of one session's host clocks (token buffer, region lengths, offsets): advance it to learn,
    from the clocks alone, the signatures of the steps later units would run. Nothing runs, no tensor is
    touched, and the session itself does not move. The session's own `speak` computes its signatures with
    the same code, so a prediction is what the step will use."""

    @abc.abstractmethod
    def start_turn(self) -> None:
        """Advance as the session's start_turn would."""

    @abc.abstractmethod
    def unit(self, size: int, final: bool = False) -> list[Signature]:
        """Advance by one SPEAK unit of `size` tokens / frames; return the signatures of its steps, in order.
        Raises what speak would raise for that size (InputError, naming `size` for a size no unit can have;
        LimitError past a bound)."""

    def copy(self) -> "ClockState":
        return copy.deepcopy(self)

    def host(self) -> dict:
        """Every host clock now (ints, bools, None) and the options that move them, by name: what equality and
        repr read. The default: the instance's attributes; adapters whose attributes hold more name theirs."""
        return dict(vars(self))

    def __eq__(self, other) -> bool:
        """Equal: the same class and the same `host()` (two copies that advanced alike)."""
        return type(other) is type(self) and other.host() == self.host()

    __hash__ = None                 # advances in place: not a dict key

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.host().items())})"


class _Caller:
    """Which thread is inside one session's ONE_CALLER methods now (a session is one caller's stream), in which
    method, and the implementations of it entered so far (the class's own, then its bases' through super())."""

    def __init__(self):
        self.lock, self.owner, self.what, self.entered = threading.Lock(), None, "", []


def _one_caller(fn, name: str):
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        caller = self.__dict__.get("_caller") or self.__dict__.setdefault("_caller", _Caller())
        me = threading.get_ident()
        if caller.owner == me:
            if name != caller.what or fn in caller.entered:     # not super(): a payload's iterator, a callback
                raise ConcurrencyError(f"{name}: called from inside this session's {caller.what}() on the same "
                                       f"thread (from a payload's iterator or a callback?); call it once "
                                       f"{caller.what}() has returned")
            caller.entered.append(fn)                # super(): a base class's implementation of the same method
            try:
                return fn(self, *args, **kwargs)
            finally:
                caller.entered.pop()
        if not caller.lock.acquire(blocking=False):
            raise ConcurrencyError(f"{name}: another thread is inside this session's {caller.what}(); a session "
                                   f"is one stream: call it from one thread at a time")
        caller.owner, caller.what, caller.entered = me, name, [fn]
        try:
            return fn(self, *args, **kwargs)
        finally:
            caller.owner, caller.what, caller.entered = None, "", []
            caller.lock.release()
    call.one_caller = True
    return call


class Session(abc.ABC):
    """Base of every session (module docstring). Subclasses set `capabilities` and implement the
    abstract methods; `close()` must free the session's device and host memory without waiting for the
    cycle collector, after which every method raises ClosedError. The methods that change a session
    (ONE_CALLER) refuse a second thread while one is inside any of them, and any of them called from inside
    another on the same thread (a payload's iterator, a callback), except an implementation's super() call of
    its own method (ConcurrencyError, nothing changed): sessions of one model may run on their own threads
    (Capabilities.concurrent), one session may not."""

    ONE_CALLER = ("start_turn", "speak", "prepare", "close")
    capabilities: Capabilities
    closed: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.ONE_CALLER:
            fn = cls.__dict__.get(name)
            if fn is not None and not getattr(fn, "one_caller", False):
                setattr(cls, name, _one_caller(fn, name))

    @abc.abstractmethod
    def start_turn(self) -> None:
        """Open a turn (Capabilities.turn_state says what it does to the state). Raises ClosedError."""

    @abc.abstractmethod
    def speak(self, payload, *, final: bool = False) -> UnitOutput:
        """One SPEAK unit: payload -> float32 waveform @ 24 kHz and its int16 PCM. `final` ends the turn
        (flushes the stream where the model has a flush). Raises InputError (LimitError past a bound)
        before anything changes."""

    @abc.abstractmethod
    def clocks(self) -> ClockState:
        """A copy of the session's host clocks now (ClockState). Raises ClosedError."""

    def signatures(self, size: int, final: bool = False) -> list[Signature]:
        """The signatures of every step the next unit would run with a payload of `size` tokens / frames,
        computed from the clocks alone (nothing runs, nothing changes). Raises ClosedError, InputError naming
        `size` for a size the session would refuse (or `final` for one that is not a bool), LimitError (a
        ClockError) naming `size` past a bound."""
        self.check_open("signatures")
        size, final = check_int("size", size, low=0), check_final(final)
        clocks = self.clocks()
        try:
            return clocks.unit(size, final)
        except LimitError as exc:                   # a bound the payload size would cross
            raise type(exc)(f"size: {exc}", session_usable=exc.session_usable) from None
        except InputError as exc:                   # ClockState.unit names `size`, or words its errors as speak's
            what = str(exc)
            if what.startswith("size:"):
                raise
            if what.startswith(f"{self.capabilities.payload}:"):
                raise InputError(f"size: {what}") from None
            raise InputError(f"signatures: {what.removeprefix('speak: ')}") from None

    def prepare(self, signatures: Iterable[Signature] | None = None) -> dict:
        """Capture graphs ahead of time, changing neither state nor clocks: `signatures` (from
        `signatures()`), or None for what the clocks say every turn of this voice needs. Returns the
        counters' change. A no-op (zeros) where the session captures nothing (stock, CPU). Raises ClosedError,
        InputError for anything but Signatures."""
        self.check_open("prepare")
        if signatures is not None:
            check_signatures(signatures)
        return {k: 0 for k in SessionStats.COUNTERS}

    @abc.abstractmethod
    def state(self) -> dict:
        """The streaming state now: region name -> tensor (a view of the logical contents; clone to keep)
        and host clocks -> ints / bools. Tests compare it before and after a rejected unit."""

    @abc.abstractmethod
    def stats(self) -> SessionStats:
        """The counters (SessionStats)."""

    def close(self) -> None:
        """Free the session's memory now. Further calls raise ClosedError; a second close() does nothing."""
        self.closed = True

    def check_open(self, what: str) -> None:
        if self.closed:
            raise ClosedError(f"{what}: the session is closed; open another")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


for _name in ("prepare", "close"):                  # the base's own defaults, which subclasses may keep
    setattr(Session, _name, _one_caller(Session.__dict__[_name], _name))


def check_final(final) -> bool:
    """speak()'s `final` flag: a bool (numpy bool too). Raises InputError naming it (a string such as "no"
    would otherwise end the turn)."""
    if not isinstance(final, (bool, np.bool_)):
        raise InputError(f"final: expected a bool, got {shown(final)} ({type(final).__name__})")
    return bool(final)
