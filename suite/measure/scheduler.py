"""Many duplex sessions on one device, each on a one-second wall-clock cadence, with admission control.

Unit k of a session (`Slot`) is released at `phase_s + k * period_s` and due one period later; a
session's units run in order, so one released while the previous still runs starts late and its lateness
counts. Units without work are recorded, not run. Policies (never batched): "edf", one thread, the
released unit with the earliest deadline first; "threads", a thread (and on CUDA a stream) per session.
`admit` refuses a slot whose `footprint_bytes` do not fit what is left of `budget_bytes`. The clock is
injectable, so tests drive misses exactly.

Slack work (`Slot.after_unit`): right after a unit's end and lateness are recorded (never inside its timed
window, start..end of `run_unit`), the scheduler calls `after_unit(unit)` on the thread that ran the unit; it
returns a job or None. A job is called as `job(left)`, `left()` the seconds before its slack ends: the
session's next release on the period grid ("threads"; a server knows when the next unit arrives, not what it
holds) or the earliest release of any unit not started ("edf"); the job should not start what does not fit.
It runs in the session's slack, recorded as a `SlackTiming`:
"threads": at once on the session's own thread, before it sleeps to its next release ("thread"); "edf" with
slack="idle": in the scheduler's idle time, when no released unit is waiting, oldest first ("idle"; a job
still queued when the same session queues another is dropped, counted in `slack_dropped`: the later one
supersedes it); "edf" with slack="after": at once after the unit, before any other unit ("after_unit"). A job
after a session's last unit with work is not run (nothing follows it).
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

POLICIES = ("edf", "threads")
SLACKS = ("idle", "after")          # when edf runs slack jobs


def _finite(x) -> bool:
    """A real number (not a bool), finite."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _count(x) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


class AdmissionError(ValueError):
    """A session's bytes do not fit in the scheduler's memory budget; nothing was admitted."""


class ScheduleError(ValueError):
    """Bad scheduler input (policy, period, phase, a unit list out of order); names the argument."""


class Clock(Protocol):
    def now(self) -> float: ...
    def sleep_until(self, t: float) -> None: ...


class MonotonicClock:
    """Seconds from `time.perf_counter`, relative to construction. sleep_until sleeps (never spins)."""

    def __init__(self):
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            time.sleep(dt)


@dataclass
class Slot:
    """One session as the scheduler sees it.

    units: the session's units in order, each with `.kind` ("LISTEN" | "SPEAK"); unit i is released at
    `phase_s + i * period_s` (a unit's own `index` is kept in the records, not used for timing).
    run_unit(unit) -> output: the unit's whole work (AR stage + tail for SPEAK), returning when done.
    has_work(unit) -> bool: False for a unit that runs nothing (recorded with no run).
    footprint_bytes: device bytes this session adds (arena + graph pool, or a stock instance).
    stream: the CUDA stream this session's thread runs on under "threads" (None: the current stream).
    after_unit(unit) -> job | None: called after each unit with work, outside its timed window (module
    docstring); None: no slack work.
    on_join() -> None: "threads" only: run on the session's thread (and stream) at `phase_s`, before its first
    unit (opening the session when it joins); units released meanwhile start late. None: nothing.
    """
    name: str
    units: Sequence[Any]
    run_unit: Callable[[Any], Any]
    has_work: Callable[[Any], bool]
    footprint_bytes: int = 0
    phase_s: float = 0.0
    stream: Any = None
    after_unit: Callable[[Any], Callable[[], Any] | None] | None = None
    on_join: Callable[[], None] | None = None


@dataclass
class SlackTiming:
    """One slack job as it ran (scheduler clock, seconds from run start). where: "thread" | "idle" |
    "after_unit" (module docstring); after: the position of the unit it follows in its session's list;
    next_release_s: the release it had to end before (threads: the session's next unit; edf: the earliest
    release of any unit not started yet; None: none left); overrun_s: how far it ran past that release."""
    session: int
    after: int
    where: str
    queued_s: float
    start_s: float
    end_s: float
    next_release_s: float | None
    output: Any = field(default=None, repr=False)

    @property
    def overrun_s(self) -> float:
        return 0.0 if self.next_release_s is None else max(0.0, self.end_s - self.next_release_s)


@dataclass
class UnitTiming:
    """One unit of one session as it ran. Times in seconds on the scheduler's clock from run start;
    lateness_s = end - deadline (negative: early; None for a unit without work); miss = lateness > 0."""
    session: int
    position: int            # place in the session's unit list
    index: int               # the unit's own index (script row)
    kind: str
    release_s: float
    deadline_s: float
    start_s: float | None = None
    end_s: float | None = None
    lateness_s: float | None = None
    miss: bool = False
    output: Any = field(default=None, repr=False)

    @property
    def service_s(self) -> float | None:
        """Time the unit's work took (end - start): the SPEAK time for a SPEAK unit."""
        return None if self.start_s is None else self.end_s - self.start_s


class CadenceScheduler:
    """Admit sessions, then run all of them on the cadence.

    period_s: the unit period (1.0: one unit per second); policy: "edf" | "threads"; clock: a `Clock`
    (default MonotonicClock, started at `run`); budget_bytes: device bytes sessions may take together
    (None: no limit). Raises ScheduleError for a bad argument.
    """

    def __init__(self, *, period_s: float = 1.0, policy: str = "edf", clock: Clock | None = None,
                 budget_bytes: int | None = None, slack: str = "idle"):
        if not _finite(period_s) or period_s <= 0:
            raise ScheduleError(f"period_s: expected a positive number of seconds, got {period_s!r}")
        if policy not in POLICIES:
            raise ScheduleError(f"policy: expected one of {POLICIES}, got {policy!r}")
        if slack not in SLACKS:
            raise ScheduleError(f"slack: expected one of {SLACKS}, got {slack!r}")
        if budget_bytes is not None and (not _count(budget_bytes) or budget_bytes < 0):
            raise ScheduleError(f"budget_bytes: expected an int >= 0 or None, got {budget_bytes!r}")
        self.period_s = float(period_s)
        self.policy = policy
        self.clock = clock
        self.budget_bytes = budget_bytes
        self.slack = slack
        self.slots: list[Slot] = []
        self.on_unit: Callable[[UnitTiming], None] | None = None   # called after each unit with work ends
        self.slack_timings: list[SlackTiming] = []
        self.slack_dropped = 0
        self._slack_lock = threading.Lock()
        self.join_timings: list = []         # (session, start_s, end_s) of each on_join, "threads"

    @property
    def admitted_bytes(self) -> int:
        return sum(s.footprint_bytes for s in self.slots)

    def check(self, name: str, nbytes: int) -> None:
        """Raise AdmissionError if a session of `nbytes` would not fit in the budget left (admits nothing;
        call it with an estimate before building a session, then `admit` with the measured bytes)."""
        if not _count(nbytes) or nbytes < 0:
            raise ScheduleError(f"session {name!r}: footprint_bytes: expected an int >= 0, got {nbytes!r}")
        if self.budget_bytes is None:
            return
        left = self.budget_bytes - self.admitted_bytes
        if nbytes > left:
            mib = 2 ** 20
            raise AdmissionError(
                f"session {len(self.slots)} ({name!r}) needs {nbytes / mib:.1f} MiB (its arena + graph "
                f"bytes), but only {left / mib:.1f} MiB of the {self.budget_bytes / mib:.1f} MiB budget is "
                f"left after {len(self.slots)} session(s); run fewer sessions or raise the budget")

    def admit(self, slot: Slot) -> int:
        """Add a session; returns its session number. Raises AdmissionError if its footprint does not
        fit in the budget left, ScheduleError for a negative phase or footprint."""
        if not _finite(slot.phase_s) or slot.phase_s < 0:
            raise ScheduleError(f"slot {slot.name!r}: phase_s: expected >= 0 seconds, got {slot.phase_s!r}")
        if slot.after_unit is not None and not callable(slot.after_unit):
            raise ScheduleError(f"slot {slot.name!r}: after_unit: expected a callable or None, got {slot.after_unit!r}")
        if slot.on_join is not None and (not callable(slot.on_join) or self.policy != "threads"):
            raise ScheduleError(f"slot {slot.name!r}: on_join: expected a callable under policy 'threads' (it runs "
                                f"on the session's own thread), got {slot.on_join!r} under {self.policy!r}")
        for attr in ("run_unit", "has_work"):
            if not callable(getattr(slot, attr)):
                raise ScheduleError(f"slot {slot.name!r}: {attr}: expected a callable, got {getattr(slot, attr)!r}")
        for i, unit in enumerate(slot.units):
            if not hasattr(unit, "kind"):
                raise ScheduleError(f"slot {slot.name!r}: units[{i}]: expected a unit with .kind, got {unit!r}")
        self.check(slot.name, slot.footprint_bytes)
        self.slots.append(slot)
        return len(self.slots) - 1

    def timeline(self) -> list[UnitTiming]:
        """Every unit's release and deadline, before anything runs (ordered by session, then unit)."""
        out = []
        for s, slot in enumerate(self.slots):
            for i, unit in enumerate(slot.units):
                release = slot.phase_s + i * self.period_s
                out.append(UnitTiming(s, i, int(getattr(unit, "index", i)), str(unit.kind), release,
                                      release + self.period_s))
        return out

    def run(self) -> list[UnitTiming]:
        """Run every admitted session on the cadence; returns one UnitTiming per unit (timeline order).
        An exception in a unit stops the run and propagates (threads: re-raised after all threads end)."""
        if self.clock is None:
            self.clock = MonotonicClock()
        records = self.timeline()
        by_session: list[list[UnitTiming]] = [[] for _ in self.slots]
        for rec in records:
            by_session[rec.session].append(rec)
        self._last_work = [max((i for i, u in enumerate(slot.units) if slot.has_work(u)), default=-1)
                           for slot in self.slots]
        self.slack_timings, self.slack_dropped, self.join_timings = [], 0, []
        if self.policy == "edf":
            self._run_edf(by_session)
        else:
            self._run_threads(by_session)
        return records

    # --- one unit and its slack ----------------------------------------------------------------------
    def _run_one(self, slot: Slot, rec: UnitTiming):
        """Run one unit (timed: start_s..end_s), then its `after_unit` bookkeeping; returns its slack job or None."""
        unit = slot.units[rec.position]
        if not slot.has_work(unit):
            return None
        rec.start_s = self.clock.now()
        rec.output = slot.run_unit(unit)
        rec.end_s = self.clock.now()
        rec.lateness_s = rec.end_s - rec.deadline_s
        rec.miss = rec.lateness_s > 0
        if self.on_unit is not None:
            self.on_unit(rec)
        if slot.after_unit is None:
            return None
        job = slot.after_unit(unit)
        return job if job is not None and rec.position < self._last_work[rec.session] else None

    def _run_job(self, s: int, after: int, job, where: str, queued_s: float, next_release_s, until_s) -> None:
        """Run one slack job, `left()` counting down to `until_s` (None: no bound); record its timing."""
        start = self.clock.now()
        out = job(None if until_s is None else (lambda: until_s - self.clock.now()))
        timing = SlackTiming(s, after, where, queued_s, start, self.clock.now(), next_release_s, out)
        with self._slack_lock:
            self.slack_timings.append(timing)

    # --- earliest deadline first, one thread ---------------------------------------------------------
    def _run_edf(self, by_session: list[list[UnitTiming]]) -> None:
        nxt = [0] * len(by_session)
        jobs: dict[int, tuple] = {}                  # session -> (queued_s, after, job), oldest first
        while True:
            pending = [(q[nxt[s]].deadline_s, s) for s, q in enumerate(by_session) if nxt[s] < len(q)]
            if not pending:
                self.slack_dropped += len(jobs)      # stale: their sessions' units all ran meanwhile
                return
            now = self.clock.now()
            ready = [(d, s) for d, s in pending if by_session[s][nxt[s]].release_s <= now]
            next_release = min(by_session[s][nxt[s]].release_s for _, s in pending)
            if ready:
                _, s = min(ready)
                rec = by_session[s][nxt[s]]
                job = self._run_one(self.slots[s], rec)
                nxt[s] += 1
                if job is None:
                    continue
                if self.slack == "after":
                    later = [by_session[k][nxt[k]].release_s for k in range(len(by_session)) if nxt[k] < len(by_session[k])]
                    until = min(later, default=None)
                    self._run_job(s, rec.position, job, "after_unit", self.clock.now(), until, until)
                else:
                    if s in jobs:
                        self.slack_dropped += 1
                        del jobs[s]
                    jobs[s] = (self.clock.now(), rec.position, job)
                continue
            if jobs:
                s = next(iter(jobs))
                queued, after, job = jobs.pop(s)
                self._run_job(s, after, job, "idle", queued, next_release, next_release)
                continue
            self.clock.sleep_until(next_release)

    # --- one thread (and stream) per session -------------------------------------------------------------
    def _run_threads(self, by_session: list[list[UnitTiming]]) -> None:
        errors: list[BaseException] = []
        stop = threading.Event()

        def worker(s: int) -> None:
            slot, recs = self.slots[s], by_session[s]
            try:
                ctx = _stream_context(slot.stream)
                with ctx:
                    if slot.on_join is not None:
                        self.clock.sleep_until(slot.phase_s)
                        start = self.clock.now()
                        slot.on_join()
                        with self._slack_lock:
                            self.join_timings.append((s, start, self.clock.now()))
                    for i, rec in enumerate(recs):
                        if stop.is_set():
                            return
                        self.clock.sleep_until(rec.release_s)
                        job = self._run_one(slot, rec)
                        if job is not None:
                            nxt = next((r.release_s for r in recs[i + 1:] if slot.has_work(slot.units[r.position])),
                                       None)
                            self._run_job(s, rec.position, job, "thread", self.clock.now(), nxt,
                                          rec.release_s + self.period_s)
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=worker, args=(s,), name=f"session-{s}", daemon=True)
                   for s in range(len(self.slots))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


def _stream_context(stream):
    """`torch.cuda.stream(stream)` for a CUDA stream, else a no-op context."""
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)


def staggered_phases(n: int, period_s: float = 1.0) -> list[float]:
    """Phases of n sessions spread evenly over one period: s * period / n. Raises ScheduleError for n < 1."""
    if not _count(n) or n < 1:
        raise ScheduleError(f"n: expected an int >= 1 sessions, got {n!r}")
    if not _finite(period_s) or period_s <= 0:
        raise ScheduleError(f"period_s: expected a positive number of seconds, got {period_s!r}")
    return [s * period_s / n for s in range(n)]
