"""One stress session and the threads that run them (suite.measure.stress): `Target` (a workload's shared model
instance, its session scripts and the harness's lock), `SessionRecord`, `Stress` (each thread's loop: draw,
open, prepare, speak, close; exceptions recorded with their traceback; a memory sample after every close, and
with quiesce_every K every thread parked after its close once K more closes are done, until all have closed:
then a quiescent sample, with no session open),
`references` (each (workload, mode, script) that ran, run alone), `compare` and `by_kind`.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from duplexcadence import graphs
from duplexcadence.errors import ConcurrencyError
from suite.measure import trend
from suite.measure.session import open_session

RETRY_S = 0.2                  # a refused open is retried at least this often (and at every close)
PROGRESS_S = 10.0              # a progress line at most this often
HANG_S = 120.0                 # a thread still running this long after the deadline is hung
#: SessionStats counters read at close (graph captures ahead, replays, steps run eagerly for want of a graph,
#: captures that failed and run eagerly since)
GRAPH_COUNTERS = ("captures", "replays", "eager_fallbacks", "warmup_runs", "capture_failures")


@dataclass
class Target:
    """One workload's shared model instance and what its sessions need. build(): another instance, built the
    same way (--reference fresh). scripts: SessionScripts; work: per script, its units that carry work."""
    name: str
    architecture: str
    adapter: object
    spec: dict
    scripts: list
    build: object
    model: object = None
    lock: threading.Lock = field(default_factory=threading.Lock)      # non-concurrent sessions' calls
    closed: threading.Condition = field(default_factory=threading.Condition)   # notified at every close
    work: list = field(init=False, repr=False)

    def __post_init__(self):
        self.work = [[u for u in s.units if u.kind == "SPEAK" or u.payload is not None] for s in self.scripts]


@dataclass
class SessionRecord:
    """One session of the stress (or a reference run): what was drawn and what happened."""
    thread: int
    index: int
    workload: str
    mode: str
    script: int
    planned_units: int
    spoken_units: int = 0
    opened: bool = False
    refused_at_open: int = 0        # ConcurrencyErrors at open before it opened
    serialised: bool = False        # capabilities.concurrent False: its calls under the model's harness lock
    mid_turn: bool = False          # closed with a turn open
    cut_by_deadline: bool = False
    exception: int | None = None    # index into the run's exceptions
    graphs: dict = field(default_factory=dict)    # GRAPH_COUNTERS at close, and the first failed captures' messages
    hashes: list = field(default_factory=list, repr=False)    # (sha256_f32, sha256_pcm16) per unit spoken

    def row(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "hashes"}


class Stress:
    """The shared state of one stress run: targets, the deadline, open / in-call counts, memory samples,
    session records and exceptions. `worker(t)` is thread t's loop; `speak(...)` runs one session."""

    def __init__(self, targets, modes, *, threads, seconds, seed, max_units, device, progress=True, hang_s=HANG_S,
                 quiesce_every: int = 0):
        if isinstance(quiesce_every, bool) or not isinstance(quiesce_every, int) or quiesce_every < 0:
            raise ValueError(f"quiesce_every: expected an int >= 0 (closes between quiescent samples; 0: none), "
                             f"got {quiesce_every!r}")
        self.targets, self.modes, self.hang_s = list(targets), list(modes), hang_s
        self.threads, self.seconds, self.seed, self.max_units = threads, seconds, seed, max_units
        self.device = torch.device(device)
        self.sampler = trend.MemorySampler(self.device)
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.sessions: list[SessionRecord] = []
        self.exceptions: list[dict] = []
        self.deadline = None
        self.sampling = False           # memory samples at closes: during the stress only
        self.current: dict[int, SessionRecord] = {}     # thread -> the session it runs now
        self.high_water: dict[str, int] = {}            # "open:<workload>/cadence" -> most open at once so far
        self.hung = 0                   # threads still running hang_s after the deadline
        self.progress, self.last_print, self.t0 = progress, 0.0, 0.0
        # quiescence: once quiesce_every more closes are done, each thread parks at its next draw until every
        # live thread has parked (parked_s: thread-seconds spent so)
        self.quiesce_every, self.next_quiet = quiesce_every, quiesce_every
        self.draining, self.parked, self.live, self.parked_s = False, 0, 0, 0.0
        self.drain = threading.Condition()

    # --- bookkeeping ------------------------------------------------------------------------------------
    def count(self, key: str, delta: int) -> None:
        with self.lock:
            self.counts[key] += delta
            if delta > 0 and key.startswith("open:") and key.endswith("/cadence"):
                self._note_open_at_once(key, self.counts[key])

    def _note_open_at_once(self, key: str, now: int) -> None:
        # under self.lock: the most DuplexCadence sessions open at once so far, per workload and in all (the
        # driver keeps graph memory at the high-water of graphs alive at once: what RSS steps may follow)
        total = sum(v for k, v in self.counts.items() if k.startswith("open:") and k.endswith("/cadence"))
        for k, v in ((key, now), ("open:all/cadence", total)):
            self.high_water[k] = max(self.high_water.get(k, 0), v)

    @contextlib.contextmanager
    def calling(self, kind: str):
        """Counts a thread inside a session call of `kind` (a regressor of the memory samples)."""
        self.count(f"busy:{kind}", 1)
        try:
            yield
        finally:
            self.count(f"busy:{kind}", -1)

    def record_exception(self, rec: SessionRecord, stage: str, unit, exc: BaseException, stack=None) -> None:
        """One exception of `rec`'s session at `stage` (unit: its index among the session's units, or None),
        with its traceback (or `stack`, a hung thread's)."""
        tb = stack if stack is not None else "".join(traceback.format_exception(exc))
        with self.lock:
            rec.exception = rec.exception if rec.exception is not None else len(self.exceptions)
            self.exceptions.append({"thread": rec.thread, "session": rec.index, "workload": rec.workload,
                                    "mode": rec.mode, "script": rec.script, "stage": stage, "unit": unit,
                                    "type": type(exc).__name__, "message": str(exc)[:2000],
                                    "traceback": tb[-8000:]})

    def closed(self, target: Target, kind: str) -> None:
        """After a close: the open count drops, waiting openers wake, and before the deadline a memory sample (the
        closes after it drain the run: fewer sessions open each time, which is not what a server at load sees)."""
        with self.lock:
            self.counts[f"open:{kind}"] -= 1
            snapshot = dict(self.counts)
        with target.closed:
            target.closed.notify_all()
        if not self.sampling or self.past():
            return
        self.sampler.sample(snapshot)
        if self.quiesce_every:
            with self.drain:
                if not self.draining and len(self.sampler.rows) >= self.next_quiet:
                    self.draining = True
        now = time.perf_counter()
        if self.progress and now - self.last_print >= PROGRESS_S:
            self.last_print = now
            print(f"  stress: {now - self.t0:.0f} of {self.seconds:g} s, {len(self.sampler.rows)} closes, "
                  f"{sum(r.spoken_units for r in self.sessions)} units, {len(self.exceptions)} exceptions",
                  flush=True)

    def past(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def park(self) -> None:
        """Between two sessions of a thread: while a drain is on, wait until every live thread is parked (no
        session open), the last one in taking the quiescent sample; a drain the deadline overtakes ends
        without one."""
        t0 = time.perf_counter()
        with self.drain:
            if not self.draining:
                return
            self.parked += 1
            self._drained_if_all_parked()
            while self.draining and not self.past():
                self.drain.wait(RETRY_S)
            self.parked -= 1
            self.parked_s += time.perf_counter() - t0

    def leave(self) -> None:
        """A thread's loop ends: one live thread fewer, which may be the one a drain waited for."""
        with self.drain:
            self.live -= 1
            self._drained_if_all_parked()

    def _drained_if_all_parked(self) -> None:
        # called with self.drain held
        if not self.draining or self.parked < self.live:
            return
        if not self.past():
            with self.lock:
                open_now = sum(v for k, v in self.counts.items() if k.startswith("open:"))
                high_water = dict(self.high_water)
            closes = len(self.sampler.rows)
            self.sampler.sample_quiet(closes, open_now, high_water)
            self.next_quiet = closes + self.quiesce_every
            if self.progress:     # the samples in the log too, so that a run cut before its record still shows them
                row = self.sampler.quiet[-1]
                mib = ", ".join(f"{k} {row[k]:.1f}" for k in ("rss_mib", "alloc_mib", "reserved_mib",
                                                               "driver_used_mib") if row.get(k) is not None)
                host = row.get("host") or {}
                print(f"  quiet sample: {closes} closes, {open_now} open, {mib}" + "".join(
                    f", {k} {host[k]:.1f}" for k in ("heap_in_use_mib", "python_traced_mib") if k in host), flush=True)
        self.draining = False
        self.drain.notify_all()

    # --- one session --------------------------------------------------------------------------------------
    def open(self, target: Target, rec: SessionRecord, model=None):
        """The session on `model` (None: the shared instance, where a ConcurrencyError waits for a close and
        retries until the deadline, then gives None). Other exceptions propagate."""
        kind = f"{rec.workload}/{rec.mode}"
        while True:
            try:
                with self.calling(kind):
                    return open_session(target.adapter, target.model if model is None else model, rec.mode,
                                        target.spec)
            except ConcurrencyError:
                if model is not None:
                    raise
                rec.refused_at_open += 1
                if self.past():
                    return None
                with target.closed:
                    target.closed.wait(RETRY_S)

    def speak(self, target: Target, rec: SessionRecord, *, model=None) -> None:
        """Open, prepare, speak rec.planned_units units of work of its script, close; hashes into rec. model:
        the instance (default the target's shared one). Exceptions are recorded, never raised."""
        kind, stage, unit = f"{rec.workload}/{rec.mode}", "open", None
        session = None
        try:
            session = self.open(target, rec, model)
            if session is None:
                return
            rec.opened = True
            self.count(f"open:{kind}", 1)
            rec.serialised = not session.capabilities.concurrent
            lock = target.lock if rec.serialised else contextlib.nullcontext()
            stage = "prepare"
            with lock, self.calling(kind):
                session.prepare(None)
            turn = None
            for unit, u in enumerate(target.work[rec.script][:rec.planned_units]):
                if model is None and self.past():
                    rec.cut_by_deadline = True
                    break
                stage = "speak"
                with lock, self.calling(kind):
                    out, turn = play(session, u, turn)
                rec.hashes.append(out.sha256())
                rec.spoken_units += 1
            rec.mid_turn = turn is not None
            unit = None
        except Exception as exc:   # noqa: BLE001 - every exception is recorded and counted
            self.record_exception(rec, stage, unit, exc)
        finally:
            if session is not None:
                try:
                    with (target.lock if rec.serialised else contextlib.nullcontext()), self.calling(kind):
                        stats = session.stats()
                        rec.graphs = {k: getattr(stats, k) for k in GRAPH_COUNTERS}
                        if stats.detail.get("capture_failure_messages"):
                            rec.graphs["capture_failure_messages"] = stats.detail["capture_failure_messages"]
                        session.close()
                except Exception as exc:   # noqa: BLE001
                    self.record_exception(rec, "close", None, exc)
                self.closed(target, kind)

    def warm_up(self) -> dict:
        """Before the stress, on CUDA, where the run mixes in "cadence": per target, `threads` DuplexCadence
        sessions held open at once on this thread, each playing the first max_units units with work of script
        i % scripts (so it captures every graph a stress session of that script can), then all closed. The CUDA
        driver keeps the host and device memory of destroyed graph executables for later graphs, at the
        high-water of graph nodes instantiated at once in the process; this warm-up puts that high-water where
        `threads` sessions at once put it, so the memory rule judges growth per close, not the first time the
        random draws hold more graph sessions at once than before. No sample is taken; exceptions are recorded
        (stage "warm-up"). Returns {workload: {"sessions", "units", "graphs", "seconds"}} ({} off CUDA)."""
        if self.device.type != "cuda" or "cadence" not in self.modes:
            return {}
        out = {}
        for target in self.targets:
            t0, sessions, units, graph_count = time.perf_counter(), [], 0, 0
            rec = SessionRecord(-1, -1, target.name, "cadence", -1, 0)
            stage = "warm-up"
            try:
                for i in range(self.threads):
                    session = open_session(target.adapter, target.model, "cadence", target.spec)
                    sessions.append(session)
                    session.prepare(None)
                work = [target.work[i % len(target.scripts)][:self.max_units] for i in range(len(sessions))]
                turns = [None] * len(sessions)
                for step in range(max(map(len, work), default=0)):
                    for i, session in enumerate(sessions):
                        if step < len(work[i]):
                            _, turns[i] = play(session, work[i][step], turns[i])
                            units += 1
                graph_count = sum(s.stats().graphs for s in sessions)
            except Exception as exc:   # noqa: BLE001 - recorded and counted like the stress's own
                self.record_exception(rec, stage, None, exc)
            finally:
                for session in sessions:
                    try:
                        session.close()
                    except Exception as exc:   # noqa: BLE001
                        self.record_exception(rec, "warm-up close", None, exc)
            out[target.name] = {"sessions": len(sessions), "units": units, "graphs": graph_count,
                                "seconds": time.perf_counter() - t0}
            with self.lock:
                key = f"open:{target.name}/cadence"
                for k in (key, "open:all/cadence"):
                    self.high_water[k] = max(self.high_water.get(k, 0), len(sessions))
        gc.collect()
        return out

    def worker(self, t: int, start: threading.Barrier) -> None:
        """Thread t: sessions drawn from random.Random(f"{seed}/{t}") until the deadline, on a leased stream."""
        rng = random.Random(f"{self.seed}/{t}")
        start.wait()
        stream = None
        try:
            stream = graphs.STREAMS.acquire(self.device) if self.device.type == "cuda" else None
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                j = 0
                while not self.past():
                    self.park()
                    if self.past():
                        break
                    target = rng.choice(self.targets)
                    mode, k = rng.choice(self.modes), rng.randrange(len(target.scripts))
                    n = rng.randint(0, min(self.max_units, len(target.work[k])))
                    rec = SessionRecord(t, j, target.name, mode, k, n)
                    with self.lock:
                        self.sessions.append(rec)
                        self.current[t] = rec
                    self.speak(target, rec)
                    j += 1
                if stream is not None:
                    stream.synchronize()
        except Exception as exc:   # noqa: BLE001 - a harness failure is an exception of the run too
            self.record_exception(SessionRecord(t, -1, "-", "-", -1, 0), "thread", None, exc)
        finally:
            self.leave()
            if stream is not None:
                graphs.STREAMS.release(stream)

    def run(self) -> float:
        """The threads, until the deadline; returns the stress's wall seconds."""
        start = threading.Barrier(self.threads + 1)
        self.live = self.threads
        pool = [threading.Thread(target=self.worker, args=(t, start), name=f"stress-{t}", daemon=True)
                for t in range(self.threads)]
        for th in pool:
            th.start()
        self.t0 = self.last_print = time.perf_counter()
        self.deadline, self.sampling = self.t0 + self.seconds, True
        start.wait()
        for th in pool:
            th.join(max(0.0, self.deadline + self.hang_s - time.perf_counter()))
        wall = time.perf_counter() - self.t0
        frames = sys._current_frames()
        for t, th in enumerate(pool):
            if th.is_alive():           # recorded with its stack; a daemon, it cannot hold the process
                rec = self.current.get(t) or SessionRecord(t, -1, "-", "-", -1, 0)
                self.record_exception(rec, "hang", None, TimeoutError(
                    f"thread {t} still running {self.hang_s:g} s after the deadline"),
                    stack="".join(traceback.format_stack(frames.get(th.ident))) if th.ident in frames else "")
                self.hung += 1
        self.sampling = False
        return wall


def play(session, u, turn):
    """One unit `u` of a script on `session`: start_turn() at a SPEAK unit of a new turn, speak with `final` on a
    turn's last SPEAK unit. turn: the turn in progress (None: none). Returns (the unit's output, the turn in
    progress after it)."""
    if u.kind == "SPEAK" and u.turn != turn:
        session.start_turn()
        turn = u.turn
    out = session.speak(u.payload, final=bool(u.kind == "SPEAK" and u.final))
    return out, (None if u.kind == "SPEAK" and u.final else turn)


# --- references and comparison --------------------------------------------------------------------------
def every_combination(stress: Stress) -> dict[tuple, int]:
    """(workload, mode, script) -> units with work, for every combination a thread can draw (its most units:
    --max-units or the script's units with work, whichever is fewer)."""
    return {(t.name, mode, k): min(stress.max_units, len(t.work[k]))
            for t in stress.targets for mode in stress.modes for k in range(len(t.scripts))
            if min(stress.max_units, len(t.work[k]))}


def references(stress: Stress, fresh: bool = False, longest: dict[tuple, int] | None = None) -> dict:
    """(workload, mode, script) -> SessionRecord of each combination in `longest` (None: each that ran, up to its
    longest prefix), run alone, sequentially (per workload on a new instance when `fresh`), on a leased stream;
    {} when a thread hung (it may hold a lock a reference would wait for)."""
    if longest is None:
        longest = {}
        for r in stress.sessions:
            if r.spoken_units:
                key = (r.workload, r.mode, r.script)
                longest[key] = max(longest.get(key, 0), r.spoken_units)
    stress.deadline, stress.sampling = None, False
    out = {}
    if stress.hung:
        return out
    stream = graphs.STREAMS.acquire(stress.device) if stress.device.type == "cuda" else None
    try:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for target in stress.targets:
                keys = sorted(k for k in longest if k[0] == target.name)
                if not keys:
                    continue
                model = target.build() if fresh else target.model
                for (name, mode, k) in keys:
                    rec = SessionRecord(-1, len(out), name, mode, k, longest[name, mode, k])
                    stress.speak(target, rec, model=model)
                    out[name, mode, k] = rec
                del model
                if fresh:
                    gc.collect()
    finally:
        if stream is not None:
            stream.synchronize()
            graphs.STREAMS.release(stream)
    return out


def compare(sessions: list[SessionRecord], refs: dict) -> tuple[int, int, list[dict]]:
    """(units compared, units without a reference, differing units) of every session against its reference."""
    compared, missing, diffs = 0, 0, []
    for r in sessions:
        ref = refs.get((r.workload, r.mode, r.script))
        want = ref.hashes if ref is not None else []
        for i, got in enumerate(r.hashes):
            if i >= len(want):
                missing += 1
                continue
            compared += 1
            if got != want[i]:
                diffs.append({"thread": r.thread, "session": r.index, "workload": r.workload, "mode": r.mode,
                              "script": r.script, "unit": i, "sha256": list(got), "reference_sha256": list(want[i])})
    return compared, missing, diffs


COLUMNS = ("sessions", "opened", "serialised", "refused_at_open", "closed_mid_turn", "cut_by_deadline", "units",
           "differing_units", "exceptions", *GRAPH_COUNTERS)


def by_kind(sessions: list[SessionRecord], diffs: list[dict], exceptions: list[dict]) -> dict:
    """Per "workload/mode", the COLUMNS: sessions drawn, opened, serialised, refused at open at least once, closed
    mid-turn, cut by the deadline, units spoken, differing units, exceptions, and the GRAPH_COUNTERS summed."""
    out: dict[str, dict] = {}
    for r in sessions:
        row = out.setdefault(f"{r.workload}/{r.mode}", dict.fromkeys(COLUMNS, 0))
        for col, value in (("sessions", 1), ("opened", r.opened), ("serialised", r.serialised),
                           ("refused_at_open", r.refused_at_open > 0), ("closed_mid_turn", r.mid_turn),
                           ("cut_by_deadline", r.cut_by_deadline), ("units", r.spoken_units),
                           *((k, r.graphs.get(k, 0)) for k in GRAPH_COUNTERS)):
            row[col] += int(value)
    for col, items in (("differing_units", diffs), ("exceptions", exceptions)):
        for d in items:
            if f"{d['workload']}/{d['mode']}" in out:
                out[f"{d['workload']}/{d['mode']}"][col] += 1
    return dict(sorted(out.items()))
