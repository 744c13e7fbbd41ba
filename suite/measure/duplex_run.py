"""One count of a duplex run: N sessions of one mode on the cadence, each with its own plan (`Plan`: its units,
its phase on the scheduler, where its script came from), the slack capture after every unit (suite.measure.slack),
and the run's record; `reference` runs one session's plan alone, back to back, for its bytes.

Plans (`plans`): "voxconverse" traffic gives session i the i-th arrival of `workloads.traffic.traffic(...)`
(its own recording, speaker or window, payloads from its own seed; the first `seconds` of its 60 units) at
phase = its join time (seconds into the run, a sub-second offset included); the arrivals of a seed are a
prefix family, so session i is the same in every count. "committed" traffic (comparison with older records)
tiles the workload's committed script for every session, ids of variant s mod variants shifted, phases
staggered over one period.
"""
from __future__ import annotations

import bisect
import contextlib
import copy
import gc
import pickle
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from duplexcadence import gate, graphs
from duplexcadence.errors import ConcurrencyError
from suite.measure import scheduler
from suite.measure.duplex_session import (PERIOD_S, Driver, PoolEntry, Progress, footprint, has_work,
                                          learned_graphs, metrics, oracle_signatures, session_units, storages,
                                          traffic_units)
from suite.measure.memory import MemoryProbe, release_cached
from suite.measure.session import open_session
from suite.measure.slack import SlackCapture
from suite.records import UNSEEN_TRAFFIC, jsonable
from workloads import traffic as traffic_mod
from workloads.common import FORMATS

TRAFFICS = (UNSEEN_TRAFFIC, "committed")
RECORDINGS = ("all", "serve")
LEARN_UNITS = 60                   # the learn recordings' windows, in units (seconds), for learned_signatures
_LEARNED: dict = {}
CADENCE_COUNTERS = ("captures", "replays", "eager_runs", "eager_fallbacks", "warmup_runs", "capture_failures")


@dataclass(frozen=True)
class Traffic:
    """How a run's sessions get their scripts. kind: "voxconverse" | "committed"; seed, join_within_s: for
    workloads.traffic.traffic; seconds: script seconds per session (60: the whole window); variants: committed
    payload variants."""
    kind: str = "voxconverse"
    seconds: float = 60.0
    seed: int = 0
    join_within_s: float = 10.0
    variants: int = 1
    units: int = 60
    recordings: str = "all"        # "serve": only workloads.traffic.split()'s serve half (the learn half is learned)

    def __post_init__(self):
        if self.kind not in TRAFFICS:
            raise ValueError(f"traffic: expected one of {TRAFFICS}, got {self.kind!r}")
        if self.recordings not in RECORDINGS:
            raise ValueError(f"recordings: expected one of {RECORDINGS}, got {self.recordings!r}")


@dataclass(frozen=True)
class Plan:
    """One session of a run: its units, phase (s) on the scheduler, its reference key (the same key, the same
    bytes alone) and its source (window name, join time, payload seed; or the committed variant)."""
    units: list
    phase_s: float
    key: object
    source: dict = field(default_factory=dict)


def payload_architecture(workload) -> str:
    """The workloads.common.FORMATS key of the workload's payload format (its architecture's, or the one a
    stand-in workload borrows)."""
    return next(a for a, f in FORMATS.items() if f == workload.payload_format)


def plans(workload, n: int, traffic: Traffic) -> list[Plan]:
    """The plans of sessions 0..n-1 (module docstring)."""
    if traffic.kind == "committed":
        phases = scheduler.staggered_phases(n, PERIOD_S)
        return [Plan(session_units(workload, traffic.seconds, s % traffic.variants), phases[s], s % traffic.variants,
                     {"script": str(getattr(workload, "script", "")), "variant": s % traffic.variants})
                for s in range(n)]
    out = []
    serve = traffic_mod.split()[1] if traffic.recordings == "serve" else None
    for a in traffic_mod.traffic(payload_architecture(workload), n, units=traffic.units, seed=traffic.seed,
                                 join_within_s=traffic.join_within_s, recordings_in=serve):
        units = traffic_units(a.script, traffic.seconds)
        out.append(Plan(units, a.join_s, a.session,
                        {"window": a.window.name, "join_s": a.join_s, "payload_seed": traffic.seed * 1000 + a.session,
                         "units": len(units), "speak_units": sum(u.kind == "SPEAK" for u in units)}))
    return out


def learned_signatures(workload, session, k: int) -> list:
    """The `k` signatures that the most sessions of the learn recordings (workloads.traffic.split) meet: every
    LEARN_UNITS-unit window of those recordings, payload seed 0, walked from a copy of `session`'s clocks
    (`oracle_signatures` of each script: each signature counted once per script); ties in order of first
    occurrence. Nothing of a serve recording is read. Cached per clocks (fresh sessions of one build share
    them)."""
    key = (payload_architecture(workload), pickle.dumps(session.clocks()), k)
    if key not in _LEARNED:
        learn = traffic_mod.split()[0]
        _LEARNED[key] = ranked(
            oracle_signatures(session, traffic_units(traffic_mod.session_script(key[0], w, 0), float(LEARN_UNITS)))
            for w in traffic_mod.windows(LEARN_UNITS) if w.recording in learn)[:k]
    return list(_LEARNED[key])


def ranked(scripts) -> list:
    """Signatures by how many of `scripts` (each an iterable of signatures) meet them, most first, each counted
    once per script; ties in order of first occurrence."""
    count, first = Counter(), {}
    for sigs in scripts:
        for sig in dict.fromkeys(sigs):
            count[sig] += 1
            first.setdefault(sig, len(first))
    return sorted(count, key=lambda sig: (-count[sig], first[sig]))


def open_entry(workload, mode, model, adapter, spec, ar, device, name, units, prepare) -> PoolEntry:
    """A session ready for the cadence: opened (on the shared instance, or a copy where the adapter refuses a
    second session there), `prepare(None)` (and the oracle's own-script signatures with prepare="oracle", or
    the `learned_signatures` with "learned:K"), warmed up on synthetic payloads. The session is closed if any
    of it raises."""
    t0 = time.perf_counter()
    try:
        session, instance, own = open_session(adapter, model, mode, spec), model, False
    except ConcurrencyError:
        instance = copy.deepcopy(model)
        session, own = open_session(adapter, instance, mode, spec), True
    drv = Driver(session, ar, device, name)
    try:
        how = prepare if mode != "stock" else "voice"
        k = learned_graphs(how)
        drv.prepare(units, how, learned_signatures(workload, session, k) if k else None)
        drv.warm_up(workload.payload_format)
        nbytes, how = footprint(session, mode, model, own)
    except BaseException:
        session.close()
        raise
    return PoolEntry(instance, drv, nbytes, how, time.perf_counter() - t0)


def reference(workload, mode, plan: Plan, model, adapter, spec, ar, device, prepare="voice") -> list:
    """The bytes of one session's plan run alone: a fresh session, prepared and warmed as a run's, its units back
    to back (no cadence: bytes do not depend on timing), each unit's slack job right after it. Returns
    [(index, sha256_f32, sha256_pcm16)] per unit with work that was not rejected. The session is closed."""
    entry = open_entry(workload, mode, model, adapter, spec, ar, device, f"reference/{plan.key}", plan.units, prepare)
    drv, out = entry.driver, []
    try:
        if mode != "stock":
            drv.slack = SlackCapture(drv.session)
            drv.slack.start()
        work = [u for u in plan.units if has_work(u)]
        for k, u in enumerate(work):
            rec = drv.run_unit(u)
            job = drv.after_unit(u)
            if job is not None and k + 1 < len(work):
                job(None)               # alone: no cadence, no bound on the slack
            if rec["sha256_f32"]:                # a rejected unit has no bytes (session_hashes leaves it out too)
                out.append((u.index, rec["sha256_f32"], rec["sha256_pcm16"]))
    finally:
        drv.session.close()
    return out


OPEN_AT = ("start", "join")


def run_sessions(workload, mode: str, session_plans: list[Plan], *, model, adapter, spec: dict, ar, device,
                 policy: str = "edf", slack: str = "idle", budget_bytes: int | None = None, clock=None,
                 probe: MemoryProbe | None = None, progress: bool = True, pool: list | None = None,
                 prepare: str = "voice", open_at: str = "start") -> dict:
    """N = len(session_plans) sessions of one mode on the cadence. Returns the run record (units, metrics,
    admission, memory, per-session capture figures). Raises AdmissionError if a session does not fit (the
    record is not made). Sessions built for this run only are closed however it ends; streams leased for it are
    given back. pool: a list the caller keeps across runs (committed traffic): prepared sessions whose
    start_turn restores the voice's base (turn_state "reset") are taken from it (the first n), new ones added;
    the caller closes them. slack: "idle" | "after" (edf; suite.measure.scheduler). open_at: "start" (every
    session opened and prepared before the cadence starts) or "join" ("threads" only, no pool: each session is
    opened and prepared on its own thread at its join time, while the sessions that joined before it speak;
    its units released meanwhile run late). Raises ValueError for an open_at the policy cannot run."""
    device, n = torch.device(device), len(session_plans)
    if open_at not in OPEN_AT or (open_at == "join" and (policy != "threads" or pool is not None)):
        raise ValueError(f"open_at: expected one of {OPEN_AT} ('join' with policy 'threads' and no pool), got "
                         f"{open_at!r} with policy {policy!r}{' and a pool' if pool is not None else ''}")
    if probe is not None:
        probe.begin_session()
    sched = scheduler.CadenceScheduler(period_s=PERIOD_S, policy=policy, clock=clock, budget_bytes=budget_bytes,
                                       slack=slack)
    kept = pool is not None
    pool = pool if kept else []
    locks: dict[int, threading.Lock] = {}
    entries, admission, fresh, streams, before, estimate = {}, {}, [], [], {}, [0]
    joined = threading.Lock()

    def ready(s: int, plan: Plan, entry: PoolEntry, reused: bool, opened_s: float | None) -> None:
        """A built session made ready for the cadence, its admission row written."""
        estimate[0], drv = entry.nbytes, entry.driver
        drv.turn = None                    # the run's first SPEAK unit opens a turn
        locked = policy == "threads" and not drv.session.capabilities.concurrent
        with joined:
            drv.tail_lock = (locks.setdefault(id(entry.instance), threading.Lock()) if locked
                             else contextlib.nullcontext())
        drv.slack = None
        if mode != "stock":
            drv.slack = SlackCapture(drv.session, lock=drv.tail_lock)
            drv.slack.start()
        with joined:
            entries[s], before[s] = entry, drv.session.stats()
            admission[s] = {"session": s, "footprint_bytes": entry.nbytes, "footprint_how": entry.how,
                            "phase_s": plan.phase_s, "reused": reused, "tail_lock": locked, "build_s": entry.build_s,
                            "opened_at_s": opened_s, "prepared": jsonable(drv.prepared), **jsonable(plan.source)}

    def build(s: int, plan: Plan) -> PoolEntry:
        name = f"{workload.name}/{mode}/{s}"
        if open_at == "join":                  # the slots hold no bytes yet: the sessions opened so far do
            with joined:
                used = sum(e.nbytes for e in entries.values())
            if budget_bytes is not None and used + estimate[0] > budget_bytes:
                raise scheduler.AdmissionError(
                    f"session {s} ({name!r}) needs {estimate[0] / 2**20:.1f} MiB at its join, but only "
                    f"{(budget_bytes - used) / 2**20:.1f} MiB of the {budget_bytes / 2**20:.1f} MiB budget is left")
        else:
            sched.check(name, estimate[0])     # before building: the bytes of the session built last
        entry = open_entry(workload, mode, model, adapter, spec, ar, device, name, plan.units, prepare)
        with joined:
            (pool if entry.driver.session.capabilities.turn_state == "reset" and open_at == "start"
             else fresh).append(entry)
        return entry

    try:
        for s, plan in enumerate(session_plans):
            name = f"{workload.name}/{mode}/{s}"
            stream = graphs.STREAMS.acquire(device) if (policy == "threads" and device.type == "cuda") else None
            if stream is not None:
                streams.append(stream)
            if open_at == "join":
                joining = _Joining(s, plan, build, ready, sched)
                sched.admit(scheduler.Slot(name, plan.units, joining.run_unit, has_work, estimate[0], plan.phase_s,
                                           stream, joining.after_unit, on_join=joining.open))
                continue
            reused = s < len(pool)
            entry = pool[s] if reused else build(s, plan)
            ready(s, plan, entry, reused, None)
            sched.admit(scheduler.Slot(name, plan.units, entry.driver.run_unit, has_work, entry.nbytes, plan.phase_s,
                                       stream, entry.driver.after_unit))
        if device.type == "cuda":
            gate.synchronize(device)
        total = sum(has_work(u) for slot in sched.slots for u in slot.units)
        seconds = max((p.phase_s + len(p.units) * PERIOD_S for p in session_plans), default=0.0)
        sched.on_unit = Progress(f"{workload.name} {mode} N={n}", total, seconds, progress)
        t0 = time.perf_counter()
        timings = sched.run()
        wall_s = time.perf_counter() - t0
        order = sorted(entries)
        entries, before, admission = ([d[s] for s in order] for d in (entries, before, admission))
        stats = [e.driver.session.stats() for e in entries]
        capture = [_capture_figures(e, st, mode, model) for e, st in zip(entries, stats)]
    finally:
        if streams:
            try:
                gate.synchronize(device)     # nothing queued on a stream handed back
            finally:
                for st in streams:
                    graphs.STREAMS.release(st)
        for e in fresh + ([] if kept else pool):
            e.driver.session.close()
    out = _record(mode, n, policy, slack, prepare, wall_s, admission, timings, sched, stats, before, capture, entries)
    if probe is not None:
        probe.observe()
        out["memory"] = {**probe.end_session(), "pooled_sessions_alive": len(pool) if kept else 0}
    del entries, fresh
    gc.collect()
    release_cached(device)
    if progress:
        m = out["metrics"]
        speak = (f"SPEAK mean {m['speak_ms_mean']:7.1f} ms, p99 {m['speak_ms_p99']:7.1f} ms"
                 if m["speak_units"] else "no SPEAK unit")
        print(f"  {workload.name} {mode:7s} N={n:3d}: {speak}, misses {m['misses']}/{m['units_run']}, captures in slack "
              f"{out['captures_during_cadence']} (inside units {out['captures_inside_timed_units']}), eager first "
              f"occurrences {out['eager_fallbacks_during_cadence'] + out['warmup_runs_during_cadence']}", flush=True)
    return out


class _Joining:
    """A session opened at its join time on its own scheduler thread (run_sessions, open_at "join"): `open` builds
    and readies it (the slot's on_join), then its units and slack go to its driver."""

    def __init__(self, s, plan, build, ready, sched):
        self.s, self.plan, self.build, self.ready, self.sched, self.driver = s, plan, build, ready, sched, None

    def open(self) -> None:
        at = self.sched.clock.now()
        entry = self.build(self.s, self.plan)
        self.ready(self.s, self.plan, entry, False, at)
        self.driver = entry.driver

    def run_unit(self, unit):
        return self.driver.run_unit(unit)

    def after_unit(self, unit):
        return self.driver.after_unit(unit)


def _capture_figures(entry, stats, mode, model) -> dict:
    """One session at the end of a run: its slack figures, graphs and graph bytes, arena bytes, footprint."""
    drv = entry.driver
    out = drv.slack.summary() if drv.slack is not None else {}
    nbytes, _ = footprint(drv.session, mode, model, entry.instance is not model)
    return {**out, "graphs_end": stats.graphs, "graph_bytes_end": stats.graph_bytes,
            "arena_bytes_reserved": stats.arena_bytes_reserved, "arena_bytes_mapped": stats.arena_bytes_mapped,
            "footprint_end_bytes": nbytes, "own_model_instance": entry.instance is not model,
            "per_unit": drv.slack.units if drv.slack is not None else []}


def _record(mode, n, policy, slack, prepare, wall_s, admission, timings, sched, stats, before, capture, entries) -> dict:
    """The run record from the scheduler's timings and slack jobs and the sessions' counters."""
    inside = {(s, u["index"]): u for s, c in enumerate(capture) for u in c.pop("per_unit")}
    index = {(t.session, t.position): t.index for t in timings}
    jobs = {(j.session, index[j.session, j.after]): j for j in sched.slack_timings}
    units = []
    for t in timings:
        rec = {"session": t.session, "index": t.index, "kind": t.kind, "release_ms": t.release_s * 1e3,
               "deadline_ms": t.deadline_s * 1e3, "start_ms": None if t.start_s is None else t.start_s * 1e3,
               "end_ms": None if t.end_s is None else t.end_s * 1e3,
               "service_ms": None if t.service_s is None else t.service_s * 1e3,
               "lateness_ms": None if t.lateness_s is None else t.lateness_s * 1e3, "miss": t.miss}
        rec.update(t.output or {})
        spoke = t.kind == "SPEAK" and t.output and not t.output.get("rejected")
        rec["speak_ms"] = rec["ar_ms"] + rec["tail_ms"] if spoke else None
        u = inside.get((t.session, t.index))
        if u is not None:
            rec.update(captures_in_unit=u["captures"], eager_fallbacks=u["eager_fallbacks"])
        j = jobs.get((t.session, t.index))
        if j is not None:
            rec.update(slack_where=j.where, slack_start_ms=j.start_s * 1e3, slack_ms=(j.end_s - j.start_s) * 1e3,
                       slack_overrun_ms=j.overrun_s * 1e3, slack_captures=(j.output or {}).get("captures"),
                       slack_deferred=(j.output or {}).get("deferred"))
        units.append(rec)
    cadence = [{k: getattr(a, k) - getattr(b, k) for k in CADENCE_COUNTERS} for a, b in zip(stats, before)]
    by_model: dict[str, int] = {}
    for s, (e, c) in enumerate(zip(entries, capture)):
        key = f"own instance of session {s}" if c["own_model_instance"] else "shared"
        by_model[key] = by_model.get(key, 0) + c["graph_bytes_end"]
    graph_bytes = [c["graph_bytes_end"] for c in capture]
    overlaps = _slack_overlaps(timings, sched.slack_timings, policy)
    return {"mode": mode, "sessions": n, "policy": policy, "slack": slack if policy == "edf" else "thread",
            "prepare": prepare if mode != "stock" else None, "wall_s": wall_s, "admission": admission,
            "metrics": metrics(units), "memory": {}, "session_stats": jsonable([st.to_dict() for st in stats]),
            "cadence_counters": cadence, "capture": jsonable(capture),
            "captures_during_cadence": sum(c.get("captures_during_cadence", 0) for c in capture),
            "captures_inside_timed_units": sum(c.get("captures_inside_timed_units", 0) for c in capture),
            "eager_fallbacks_during_cadence": sum(c["eager_fallbacks"] for c in cadence),
            "warmup_runs_during_cadence": sum(c["warmup_runs"] for c in cadence),   # a family's first run on a thread
            "slack_jobs": len(sched.slack_timings), "slack_jobs_dropped": sched.slack_dropped,
            "slack_overrun_ms_max": max((j.overrun_s * 1e3 for j in sched.slack_timings), default=0.0),
            "slack_jobs_overrun": sum(1 for j in sched.slack_timings if j.overrun_s > 0),
            "slack_signatures_deferred": sum(c.get("signatures_deferred", 0) for c in capture),
            "slack_overlapping_timed_units": overlaps, "graphs_end_total": sum(c["graphs_end"] for c in capture),
            "graph_bytes_end_total": sum(graph_bytes), "graph_bytes_per_model": by_model,
            "graph_bytes_per_session_max": max(graph_bytes, default=0),
            "arena_bytes_reserved_total": sum(c["arena_bytes_reserved"] for c in capture), "units": units}


def _slack_overlaps(timings, jobs, policy: str) -> int:
    """Slack jobs whose [start, end] overlaps a timed unit's (start..end of run_unit): of the same session under
    "threads" (other sessions' units run on their own threads), of any session under "edf" (one thread). The
    units of one thread run one after another, so their spans sorted by start are sorted by end too."""
    spans: dict = {}
    for t in timings:
        if t.start_s is not None:
            spans.setdefault(t.session if policy == "threads" else 0, []).append((t.start_s, t.end_s))
    starts, ends = {}, {}
    for k, v in spans.items():
        v.sort()
        starts[k], ends[k] = [a for a, _ in v], [b for _, b in v]
    count = 0
    for j in jobs:
        k = j.session if policy == "threads" else 0
        i = bisect.bisect_left(starts.get(k, []), j.end_s) - 1
        count += i >= 0 and ends[k][i] > j.start_s
    return count


def model_bytes(model) -> int:
    """Bytes of the distinct tensor storages the model instance holds (weights, buffers, tables)."""
    return sum(storages(model).values())
