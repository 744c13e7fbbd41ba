"""Duplex traffic: many sessions, each speaking its own real turn-taking script, joining during the run.

A server's sessions do not share one script or start together. Here session i of a run gets its own window
of the VoxConverse timings (turn_taking/voxconverse_two_speaker_turns.csv: 27 real two-speaker recordings;
either speaker can be the model, so each recording gives two patterns), made into a session script by the
same rules as the committed scripts (`workloads.make_sessions`: SPEAK when the model's speaker talks for at
least 0.5 s of the second, turns, first/steady/final token counts, 12/13-frame codec units), with payloads
from its own seed. Sessions join at seeded times spread over `join_within_s`, each at its own offset into
the one-second period.

Windows (`windows`): for every recording and speaker, consecutive `units`-second windows from the speaker's
first speech on, kept when they hold at least `MIN_TURNS` turns and `MIN_SPEAK_UNITS` SPEAK units (a session
that never speaks measures nothing). `traffic` deals them out in a seeded order, so the sessions of a run
differ in recording, speaker or window as long as there are windows left, and repeat only beyond that.
Nothing here builds a model; a harness hands each session its script one unit at a time.
"""
from __future__ import annotations

import bisect
import functools
import random
from dataclasses import dataclass

from workloads import make_sessions
from workloads.common import FORMATS, SessionScript, script_from_rows

MIN_TURNS = 2
MIN_SPEAK_UNITS = 10
SPEAKERS = ("spk00", "spk01")


@dataclass(frozen=True)
class Window:
    """`units` seconds of `recording` from `start_ms`, with `speaker` as the model."""
    recording: str
    speaker: str
    start_ms: int
    units: int

    @property
    def name(self) -> str:
        return f"voxconverse:{self.recording}/{self.speaker}@{self.start_ms / 1000:g}s+{self.units}s"


@dataclass(frozen=True)
class Arrival:
    """One session of a run: its script, when it joins (seconds after the run starts) and its source."""
    session: int
    join_s: float
    window: Window
    script: SessionScript


def recordings() -> list[str]:
    """The recordings of the timing file, sorted."""
    return sorted({r["recording_id"] for r in make_sessions.timing_rows()})


def split() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(learn, serve): the recordings in name order dealt alternately, the first to `learn`. A harness that
    learns what to capture from traffic learns it on `learn` and runs its sessions on `serve` only, so no
    session's recording was seen before its units arrive."""
    names = recordings()
    return tuple(names[0::2]), tuple(names[1::2])


def speech_ms(recording: str, speaker: str, start_ms: int, units: int) -> list[int]:
    """make_sessions.speech_ms (ms of `speaker`'s speech in each one-second unit from `start_ms`), the same
    ints from the segments that overlap each unit only (bisect), so scanning every window stays fast."""
    merged = make_sessions.merged_segments(recording, speaker)
    ends = [e for _, e in merged]
    out = []
    for k in range(units):
        a = start_ms + k * make_sessions.UNIT_MS
        b = a + make_sessions.UNIT_MS
        total, i = 0, bisect.bisect_right(ends, a)
        while i < len(merged) and merged[i][0] < b:
            total += max(0, min(b, merged[i][1]) - max(a, merged[i][0]))
            i += 1
        out.append(total)
    return out


@functools.lru_cache(maxsize=8)
def _windows(units: int) -> tuple[Window, ...]:
    out = []
    for rec in recordings():
        for spk in SPEAKERS:
            segs = make_sessions.merged_segments(rec, spk)
            if not segs:
                continue
            start, end = segs[0][0], max(e for _, e in segs)
            while start + units * 1000 <= end + 1000 * units // 2:
                turns = make_sessions.turns_of(speech_ms(rec, spk, start, units))
                speak = [t for t in turns if t is not None]
                if speak and len(speak) >= MIN_SPEAK_UNITS and max(speak) + 1 >= MIN_TURNS:
                    out.append(Window(rec, spk, start, units))
                start += units * 1000
    return tuple(out)


def windows(units: int = 60) -> list[Window]:
    """Every usable window of `units` seconds (module docstring), in recording, speaker, time order.
    Raises ValueError for units < 1."""
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        raise ValueError(f"units: expected an int >= 1 seconds, got {units!r}")
    return list(_windows(units))


def session_script(architecture: str, window: Window, seed: int) -> SessionScript:
    """The session script of `window` for a payload format ("flow_hift", "mimi", "code2wav"), payloads
    from random.Random(seed). Raises KeyError for an unknown architecture."""
    fmt = FORMATS[architecture]
    rows = make_sessions.rows_for(architecture, seed, recording=window.recording, speaker=window.speaker,
                                  start_ms=window.start_ms, units=window.units)
    return script_from_rows(rows, fmt, window.name)


def traffic(architecture: str, sessions: int, *, units: int = 60, seed: int = 0,
            join_within_s: float = 30.0, recordings_in: tuple[str, ...] | None = None) -> list[Arrival]:
    """`sessions` arrivals: session i gets the i-th window of a seeded shuffle of `windows(units)` (only those
    of `recordings_in` when given; cycling when there are fewer windows than sessions) with payload seed
    `seed * 1000 + i`, and joins at a seeded time in [0, join_within_s) (session 0 at 0). Sorted by session
    number. Raises ValueError for sessions < 1, a negative join_within_s, or recordings_in with no window."""
    if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
        raise ValueError(f"sessions: expected an int >= 1, got {sessions!r}")
    if not isinstance(join_within_s, (int, float)) or isinstance(join_within_s, bool) or join_within_s < 0:
        raise ValueError(f"join_within_s: expected seconds >= 0, got {join_within_s!r}")
    if isinstance(recordings_in, str):
        raise ValueError(f"recordings_in: expected a collection of recording names, got the string {recordings_in!r}")
    pool = [w for w in windows(units) if recordings_in is None or w.recording in recordings_in]
    if not pool:
        raise ValueError(f"recordings_in: no {units}-unit window in {recordings_in!r}")
    rng = random.Random(seed)
    order = list(range(len(pool)))
    rng.shuffle(order)
    out = []
    for i in range(sessions):
        window = pool[order[i % len(order)]]
        join = 0.0 if i == 0 else rng.uniform(0.0, float(join_within_s))
        out.append(Arrival(i, join, window, session_script(architecture, window, seed * 1000 + i)))
    return out
