"""Paired measurement: two sessions of one model instance walk one session script, unit by unit, in
A B B A blocks, once per fresh process (`run_pairs`); the statistics over processes are
suite.records.paired's (`summarise`, `noise_floor`, `clears_floor`, `reproduces`, re-exported here).

Why pairs: the stock tails are host-bound and a lent host changes speed in blocks of seconds
(docs/measurement.md), so timing all of A and then all of B lets the host's states fall on one arm more
than the other. Alternating short blocks (A B, B A, A B, ...) puts both arms of a pair in the same few
hundred milliseconds. Graphs: a unit whose signature has no graph runs eagerly inside its timed call and
is counted; its signatures (the session's `signatures()` for that unit, computed before `speak`) are then
captured right after the call, outside the timer (`session.prepare(those signatures)`), so no capture
happens inside a timed unit and the next occurrence replays.

Pure host code (no torch): sessions, the timer, the host probe and the profiler are passed in, so the
measure layer gives CUDA-event timing and tests give fake clocks.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import numpy as np

from suite.records.paired import (MIN_PROCESSES, STATES, Pair, StateSummary, Summary, Verdict, bootstrap_median,
                                  clears_floor, noise_floor, pair_state, reproduces, split_states, summarise)

__all__ = ["MIN_PROCESSES", "STATES", "Pair", "StateSummary", "Summary", "Verdict", "bootstrap_median",
           "clears_floor", "noise_floor", "pair_state", "reproduces", "split_states", "summarise", "run_pairs",
           "first_speak_units", "payload_size"]


def _count(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")
    return int(value)


def _finite(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.floating)) and math.isfinite(value)


def payload_size(payload) -> int:
    """The size `signatures()` takes: tokens of a token payload (a sequence of ids), frames of a codec
    payload ([n_q][frames])."""
    first = payload[0] if len(payload) else None
    return len(first) if first is not None and hasattr(first, "__len__") else len(payload)


def first_speak_units(units: list, n: int) -> list:
    """The units of the script up to and including its n-th SPEAK unit (all of them if it has fewer)."""
    out, seen = [], 0
    for unit in units:
        if seen == n:
            break
        out.append(unit)
        seen += unit.kind == "SPEAK"
    return out


def _graph_counts(session) -> dict | None:
    """{eager_fallbacks, captures} of the session's stats() now (eager_fallbacks counting warm-up runs too: a
    family's first run on this host thread is an eager first occurrence as well); None for a session without
    stats()."""
    stats = getattr(session, "stats", None)
    if not callable(stats):
        return None
    s = stats()
    return {"eager_fallbacks": int(s.eager_fallbacks) + int(s.warmup_runs), "captures": int(s.captures)}


class _Walker:
    """One session's walk over the script, as the runner walks it: `start_turn()` before the first SPEAK
    unit of a turn (of each pass), `speak(payload, final=unit.final)` for a SPEAK unit, `speak(payload,
    final=False)` for a LISTEN unit that carries a payload (Moshi decodes every frame), nothing for a LISTEN
    unit without one. A session that declares graphs (`capabilities.graphs`) gets the unit's signatures
    before the call and, when the call ran a step eagerly, `prepare(those signatures)` after it."""

    def __init__(self, name: str, session, timer: Callable, profile: Callable | None, capture_after: bool):
        self.name, self.session, self.timer, self.profile = name, session, timer, profile
        self.graphs = capture_after and bool(getattr(getattr(session, "capabilities", None), "graphs", False))
        self.open_turn = None

    def walk(self, segment: list, profiled: set) -> list[dict]:
        done = []
        for walk, unit in segment:
            speak = unit.kind == "SPEAK"
            if not speak and unit.payload is None:
                continue
            if speak and (walk, unit.turn) != self.open_turn:
                self.session.start_turn()
                self.open_turn = (walk, unit.turn)
            final = bool(speak and unit.final)
            sigs = self.session.signatures(payload_size(unit.payload), final) if self.graphs else None
            before = _graph_counts(self.session)
            kernels = None
            if (walk, unit.index) in profiled:
                out, kernels = self.profile(self.session.speak, unit.payload, final=final)
                ms = kernels.get("wall_ms")
            else:
                timed = self.timer(self.session.speak, unit.payload, final=final)
                out, ms = timed[0], timed[1]
            if not (_finite(ms) and ms > 0):
                raise ValueError(f"timer: expected a positive finite time in ms for unit {unit.index} of "
                                 f"session {self.name}, got {ms!r}")
            step = {"walk": walk, "unit": unit, "out": out, "ms": float(ms), "kernels": kernels, "eager": 0,
                    "captures": 0, "captured": 0}
            if before is not None:
                after = _graph_counts(self.session)
                step["eager"] = after["eager_fallbacks"] - before["eager_fallbacks"]
                step["captures"] = after["captures"] - before["captures"]
                if step["eager"] and self.graphs:
                    step["captured"] = int((self.session.prepare(sigs) or {}).get("captures", 0))
            if final:
                self.open_turn = None
            done.append(step)
        return done


def _segments(seq: list, block: int) -> list[list]:
    """The walk cut into consecutive segments of `block` SPEAK units each (a segment ends right after its
    block-th SPEAK unit; LISTEN units go with the SPEAK unit after them; what trails the last one is a last
    segment of its own)."""
    out, cur, n = [], [], 0
    for item in seq:
        cur.append(item)
        n += item[1].kind == "SPEAK"
        if n == block:
            out.append(cur)
            cur, n = [], 0
    if cur:
        out.append(cur)
    return out


def _read(probe) -> float | None:
    if probe is None:
        return None
    value = probe()
    if not _finite(value):
        raise ValueError(f"probe: expected a finite number, got {value!r}")
    return float(value)


def run_pairs(a, b, units: Iterable, *, timer: Callable, probe: Callable | None = None, block: int = 1,
              warmup: int = 0, passes: int = 1, profile: Callable | None = None, profiled: int = 0,
              capture_after: bool = True, outputs: dict | None = None,
              progress: Callable[[Pair], None] | None = None) -> list[Pair]:
    """Walk the script `units` (workloads.common.Unit: index, kind "LISTEN" | "SPEAK", turn, final, payload)
    `passes` times with sessions `a` and `b` (duplexcadence.session.Session; two sessions of one model
    instance: stock and DuplexCadence, or two stock sessions for an A/A run), alternating blocks of `block`
    SPEAK units: A B, B A, A B, ... (blocks A B B A A B B A ...), across pass boundaries. Within a block
    one session runs its units in order; then the other runs the same units with the same payload objects.
    Every unit of both is hashed; graphs as the module docstring says (capture_after=False: never).

    timer(fn, *args, **kwargs): calls fn once and returns a tuple whose first two items are fn's result and
    its time in ms (more items are ignored, e.g. a wall time): CUDA events in the measure layer, a fake
    clock in tests. probe(): a number describing the host's speed now, higher = slower (microseconds per
    tiny kernel launch), read before, between and after each block pair. warmup: the first `warmup` SPEAK
    units of the walk are run and hashed but not measured. profiled: the last this-many SPEAK units of the
    walk run under profile(fn, *args, **kwargs) -> (result, kernels record with "wall_ms") instead of the
    timer, for both sessions, and are not measured. outputs: a dict to fill with each session's UnitOutput
    per (pass, unit index): {"a": {...}, "b": {...}}. progress(pair): after each pair. Returns one Pair per
    unit that ran, in walk order.

    Raises ValueError for `a is b`, a block, passes, warmup or profiled that is not an int >= 1 / >= 1 /
    >= 0 / >= 0, profiled units without `profile`, a unit kind other than LISTEN / SPEAK, a timer time
    that is not a positive finite number, or a probe value that is not finite; what the sessions raise
    (duplexcadence.errors.InputError) propagates."""
    if a is b:
        raise ValueError("a and b: expected two sessions (an A/A run opens a second stock session), got one "
                         "object twice")
    block, warmup = _count("block", block, 1), _count("warmup", warmup, 0)
    passes, profiled = _count("passes", passes, 1), _count("profiled", profiled, 0)
    if profiled and profile is None:
        raise ValueError(f"profiled: {profiled} units to profile, but no profile callable given")
    units = list(units)
    for unit in units:
        if unit.kind not in ("LISTEN", "SPEAK"):
            raise ValueError(f"unit {unit.index}: kind {unit.kind!r}, expected 'LISTEN' or 'SPEAK'")
    seq = [(w, u) for w in range(passes) for u in units]
    speak = [(w, u.index) for w, u in seq if u.kind == "SPEAK"]
    chosen = set(speak[len(speak) - profiled:]) if profiled else set()
    walkers = {k: _Walker(k, s, timer, profile, capture_after) for k, s in (("a", a), ("b", b))}
    pairs, n_speak = [], 0
    for g, segment in enumerate(_segments(seq, block)):
        order = "ab" if g % 2 == 0 else "ba"
        before = _read(probe)
        first = walkers[order[0]].walk(segment, chosen)
        between = _read(probe)
        second = walkers[order[1]].walk(segment, chosen)
        after = _read(probe)
        runs = {order[0]: first, order[1]: second}
        for sa, sb in zip(runs["a"], runs["b"]):
            unit, walk = sa["unit"], sa["walk"]
            is_speak = unit.kind == "SPEAK"
            ha, hb = tuple(sa["out"].sha256()), tuple(sb["out"].sha256())
            profiled_unit = (walk, unit.index) in chosen
            pair = Pair(index=int(unit.index), kind=unit.kind, a_ms=sa["ms"], b_ms=sb["ms"], order=order, block=g,
                        equal=ha == hb, sha256_a=ha, sha256_b=hb,
                        measured=is_speak and n_speak >= warmup and not profiled_unit, probe_before=before,
                        probe_between=between, probe_after=after, walk=walk,
                        samples=int(getattr(sa["out"], "samples", 0) or 0), a_eager=sa["eager"],
                        b_eager=sb["eager"], a_captures=sa["captures"], b_captures=sb["captures"],
                        a_captured=sa["captured"], b_captured=sb["captured"], profiled=profiled_unit,
                        a_kernels=sa["kernels"], b_kernels=sb["kernels"])
            pairs.append(pair)
            n_speak += is_speak
            if outputs is not None:
                outputs.setdefault("a", {})[(walk, pair.index)] = sa["out"]
                outputs.setdefault("b", {})[(walk, pair.index)] = sb["out"]
            if progress is not None:
                progress(pair)
    return pairs
