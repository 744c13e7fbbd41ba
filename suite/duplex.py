"""The live duplex path: SPEAK time against the one-second cadence, and sessions per GPU (issue 7).

    python -m suite.duplex --workload minicpmo45 --device cuda --ar none|busy:30ms|standin \
        --sessions 1,2,4,8 --seconds 60 --out results/<dir>

For each workload, mode (stock, cadence) and session count N: build N sessions, warm each one up, admit
them (`duplexcadence.scheduler`, admission from each session's arena + graph bytes), then run them
together on the one-second cadence with staggered phases (session s starts at s/N seconds). Every SPEAK
unit runs the AR stage (`suite.ar_stage`) and then the tail (`session.speak`); LISTEN units that carry a
payload (Moshi decodes every frame) run the tail only. Per unit: SPEAK time (AR + tail, host wall clock
around both, each ending in a synchronisation), its AR and tail parts, CUDA-event time on CUDA
(`device_ms`, the unit's stream), service time on the scheduler's clock (`service_ms`: also the output
hashing, ~0.1 ms), the miss flag and lateness (end - deadline on the scheduler's clock). Per run: mean
and p99 SPEAK time as a fraction of the cadence, miss rate over the units that ran, and every session's
per-unit sha256 against the same session run alone (`reference`). Per mode: the largest N with zero
missed units up to the first N that missed (`max_zero_miss_sessions`; --bisect makes it exact between
the list's points; --after-miss K runs K larger counts after the first miss, for the curve).

Policies (`--policy`, and `--stock-policy` for stock when it differs): "edf" runs every session's units
on one thread and stream, earliest deadline first; "threads" gives each session a thread and a CUDA
stream, so kernels of different sessions may overlap (never batched). Sessions on one model instance hold
that instance's lock around the whole tail, because the stock modules' Python-level state is shared,
unless the session says it is `concurrent` (MiniCPM-o DuplexCadence after `rehearse(freeze=True)`: its
replays touch no shared state and its eager steps take the model's lock inside the session). On the
H200 (10 steps, 60 s): stock MiniCPM-o 2 sessions with zero misses under edf, 1 under threads (2-3 not
tried there), DuplexCadence 24 under threads (results/2026-11-30-h200-duplex-60s*).

Warm-up before the cadence: MiniCPM-o DuplexCadence sessions rehearse every turn shape of their script
(`Driver.warm_up` -> `CadenceSession.rehearse`: all graphs captured, then frozen); Step-Audio 2
DuplexCadence sessions rehearse their script's turns in order and restore a snapshot (its caches carry over
turns); other turn-based sessions run one warm-up turn; for sessions that cannot warm themselves (Moshi,
Step-Audio 2: a unit would advance their stream) a throwaway session's first units per mode warm the
process (`warm_process`).

Sessions: DuplexCadence sessions share one model instance (weights and construction-time tables) and own
an arena and a graph set each. Stock sessions run as a stock deployment would (`STOCK_SHARING`):
MiniCPM-o gets one model instance per session (a deep copy: the same weights and tables) because the
stock CFM writes every step's DiT KV into its module buffer and returns a view of it as the stream cache
(stepaudio2/cosyvoice2/flow/flow_matching.py L35-36 `att_cache_buffer` [16,16,2,8,1000,128], L165-169), so
until the trim's torch.cat copies it a session's cache is the instance's buffer, which another session's
unit on the same instance overwrites; Moshi sessions share one MimiModel, each with its own moshi streaming states installed
for its unit (moshi's `set_streaming_state`); Qwen3-Omni's Code2Wav is stateless and shared.

Payloads: session s decodes the workload's script (tiled to cover --seconds) with its token / code ids
shifted by 97 * (s mod variants), so sessions of different variants carry different data. The AR
stage's tokens are discarded (the tail decodes the script), so output bytes stay comparable.

Pieces of one session (units, AR stage + tail, warm-up, footprint) live in `suite.duplex_session`.

Outputs in --out: duplex.json (provenance, parameters, every unit, metrics, verdict; compact, each run's
units one table with each sha256 once per record: `pack_units`, read back with `read_record`) and, unless
--no-plots, <workload>_speak.png (per-unit SPEAK time vs the cadence line) and <workload>_miss_rate.png
(miss rate vs sessions), stock and DuplexCadence on the same axes (`suite.duplex_plot`).

Verdict: VALID, or INVALID with `invalid_reasons` (`invalid_codes` classifies them: a session's bytes
differing from the same session alone, a dirty tree, runs shorter than 60 s); PARTIAL in the checkpoints
written while the harness runs. Exit status: 0 for a VALID record, `EXIT_INVALID` (1) for a complete
INVALID one, 2 for bad arguments. A Python exception also exits 1 and a native crash dies of a signal,
both leaving the last checkpoint (or nothing): suite.stages takes exit 1 as the harness's end only beside a
complete INVALID record (so also an exception while plotting, after that record: its plots are missing).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from duplexcadence import graphs, runtime, scheduler
from suite import env
from suite.ar_stage import ARSpecError, make_ar
from suite.duplex_session import (PERIOD_S, WARMUP_TURN_UNITS, Driver, PoolEntry, footprint, release,
                                  reusable, session_units)
from suite.memory import MemoryProbe
from suite.runner import jsonable, make_spec, open_session

SCHEMA = "duplexcadence.duplex/2"           # /2: each run's units as one table (pack_units)
#: What the readers accept: /1 held each run's units as a list of objects (records written before the
#: schema change, e.g. results/2026-12-01-h200-reproduce-9's calls 1-7); `unpack_units` reads both.
READ_SCHEMAS = ("duplexcadence.duplex/1", SCHEMA)
MIN_SECONDS = 60.0             # issue 7: zero misses "over 60 s"
MODES = ("stock", "cadence")
EXIT_INVALID = 1               # main's exit status for a complete INVALID record
#: Invalid reasons that are not about bytes (`invalid_codes`); every other reason compares bytes.
NOT_FINISHED = "run not finished"          # a checkpoint's (verdict PARTIAL)
DIRTY_TREE = "dirty tree: uncommitted changes (see provenance.git_status)"    # suite.runner's wording
SHORT_RUN = "max zero-miss sessions is over a shorter run"                   # ends the reason

#: How stock runs N sessions, per architecture (module docstring says why).
STOCK_SHARING = {
    "flow_hift": "instance_per_session",   # Token2wav's DiT/CFM caches are module buffers
    "mimi": "shared_instance",             # per-session moshi streaming states, installed per unit
    "code2wav": "shared_instance",         # stateless decoder; the caller keeps the context
}


# --- one run of N sessions ------------------------------------------------------------------------------
def metrics(units: list[dict], period_s: float = PERIOD_S) -> dict:
    """Per-run statistics: SPEAK time (ms and fraction of the period: mean, p50, p99, max), miss rate and
    misses over the units that ran, lateness of the latest unit (ms)."""
    ran = [u for u in units if u["start_ms"] is not None]
    speak = np.array([u["speak_ms"] for u in ran if u["kind"] == "SPEAK"], dtype=np.float64)
    misses = sum(u["miss"] for u in ran)
    out = {"units_run": len(ran), "speak_units": int(speak.size), "misses": int(misses),
           "miss_rate": misses / len(ran) if ran else None,
           "speak_misses": int(sum(u["miss"] for u in ran if u["kind"] == "SPEAK")),
           "max_lateness_ms": max((u["lateness_ms"] for u in ran), default=None)}
    if speak.size:
        p = period_s * 1e3
        out.update({"speak_ms_mean": float(speak.mean()), "speak_ms_p50": float(np.percentile(speak, 50)),
                    "speak_ms_p99": float(np.percentile(speak, 99)), "speak_ms_max": float(speak.max()),
                    "speak_frac_mean": float(speak.mean() / p), "speak_frac_p99": float(np.percentile(speak, 99) / p)})
    return out


def run_sessions(workload, mode: str, n: int, *, model, adapter, spec: dict, ar, device, seconds: float,
                 policy: str = "edf", variants: int = 1, budget_bytes: int | None = None, clock=None,
                 probe: MemoryProbe | None = None, progress: bool = True, pool: list | None = None,
                 warmup_turns: int = 1) -> dict:
    """N sessions of one mode on the cadence. Returns the run record (units, metrics, admission,
    memory, hashes per session). Raises AdmissionError (the record is not made) if a session does not fit,
    and ValueError for policy "threads" with sessions that draw from the process's default generators
    (Driver.own_rng: Step-Audio 2), after releasing the sessions built for this run (known only once one is
    open). Streams leased for the run are given back either way.

    pool: a list kept by the caller across runs of one mode; reusable sessions built and warmed up for an
    earlier run are taken from it (the first n), new ones are added to it. Non-reusable sessions (Moshi)
    are built per run. warmup_turns: warm-up turns per new session (2 where graphs capture on the second
    occurrence of a signature)."""
    device = torch.device(device)
    sharing = "shared_instance" if mode != "stock" else STOCK_SHARING[workload.architecture]
    if probe is not None:
        probe.begin_session()
    sched = scheduler.CadenceScheduler(period_s=PERIOD_S, policy=policy, clock=clock, budget_bytes=budget_bytes)
    phases = scheduler.staggered_phases(n, PERIOD_S)
    pool = pool if pool is not None else []
    locks: dict[int, threading.Lock] = {}
    drivers, admission, estimate, fresh, streams = [], [], 0, [], []
    try:    # leased streams go back however the admission or the run ends (AdmissionError included)
        for s in range(n):
            name = f"{workload.name}/{mode}/{s}"
            units = session_units(workload, seconds, s % variants)
            reused = s < len(pool)
            if reused:
                entry = pool[s]
            else:
                sched.check(name, estimate)    # before building: the bytes of the session built last
                per_session = sharing == "instance_per_session" and s > 0
                instance = copy.deepcopy(model) if per_session else model    # same weights and tables
                session = open_session(adapter, instance, mode, spec)
                drv = Driver(session, ar, device, name)
                try:
                    for k in range(warmup_turns):
                        drv.warm_up(units, WARMUP_TURN_UNITS if k == 0 else 2)
                except BaseException:          # (an OOM is caught above and the search goes on)
                    release(session)           # not in fresh/pool yet: give its memory back here
                    raise
                entry = PoolEntry(instance, drv, *footprint(session, mode, instance, sharing))
                if reusable(session):
                    pool.append(entry)
                else:
                    fresh.append(entry)
            estimate = entry.nbytes
            drv = entry.driver
            if policy == "threads" and drv.own_rng:
                for e in fresh:                # built for this run only: give their device memory back
                    release(e.driver.session)
                raise ValueError(f"policy: 'threads' needs sessions that draw no noise from the process's default "
                                 f"generators; {workload.name} {mode} sessions do (Driver keeps each one's "
                                 f"generator state, which needs one host thread): use 'edf'")
            drv.turn = None                    # the run's first SPEAK unit opens a turn
            # Sessions on one model instance serialise their tails on its lock under "threads", unless the
            # session is safe to run beside them (flow_hift cadence: shared-state steps hold the model's lock
            # inside the session, replays touch none).
            shared = policy == "threads" and not getattr(drv.session, "concurrent", False)
            drv.tail_lock = locks.setdefault(id(entry.instance), threading.Lock()) if shared \
                else contextlib.nullcontext()
            # a stream no other live session holds (torch's own pool repeats after 32: graphs.StreamLeases)
            stream = graphs.STREAMS.acquire(device) if (policy == "threads" and device.type == "cuda") else None
            if stream is not None:
                streams.append(stream)
            sched.admit(scheduler.Slot(name, units, drv.run_unit, Driver.has_work, entry.nbytes, phases[s], stream))
            drivers.append(drv)
            admission.append({"session": s, "footprint_bytes": entry.nbytes, "footprint_how": entry.how,
                              "variant": s % variants, "phase_s": phases[s], "reused": reused,
                              "tail_lock": shared, "rehearsed": drv.rehearsed})
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        timings = sched.run()
        wall_s = time.perf_counter() - t0
    finally:
        if streams:
            try:
                torch.cuda.synchronize(device)     # nothing queued on a stream handed back
            finally:
                for st in streams:
                    graphs.STREAMS.release(st)
    units = []
    for t in timings:
        rec = {"session": t.session, "index": t.index, "kind": t.kind,
               "release_ms": t.release_s * 1e3, "deadline_ms": t.deadline_s * 1e3,
               "start_ms": None if t.start_s is None else t.start_s * 1e3,
               "end_ms": None if t.end_s is None else t.end_s * 1e3,
               "service_ms": None if t.service_s is None else t.service_s * 1e3,
               "lateness_ms": None if t.lateness_s is None else t.lateness_s * 1e3, "miss": t.miss}
        rec.update(t.output or {})
        # SPEAK time = AR + tail (perf_counter inside the unit); service_ms also counts the unit's hashing
        rec["speak_ms"] = rec["ar_ms"] + rec["tail_ms"] if (t.kind == "SPEAK" and t.output) else None
        units.append(rec)
    memory = {}
    if probe is not None:
        probe.observe()
        memory = probe.end_session()
        memory["pooled_sessions_alive"] = len(pool)
    stats = [d.session.stats() if callable(getattr(d.session, "stats", None)) else None for d in drivers]
    for e in fresh:
        release(e.driver.session)
    del drivers, fresh
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    out = {"mode": mode, "sessions": n, "policy": policy, "stock_sharing": sharing if mode == "stock" else None,
           "wall_s": wall_s, "admission": admission, "metrics": metrics(units), "memory": memory,
           "session_stats": jsonable(stats), "units": units}
    if progress:
        m = out["metrics"]
        speak = (f"SPEAK mean {m['speak_ms_mean']:7.1f} ms, p99 {m['speak_ms_p99']:7.1f} ms"
                 if m["speak_units"] else "no SPEAK unit")
        print(f"  {workload.name} {mode:7s} N={n:3d}: {speak}, misses {m['misses']}/{m['units_run']}",
              flush=True)
    return out


def session_hashes(run: dict) -> dict[int, list]:
    """session -> [(index, sha256_f32, sha256_pcm16)] of the units that ran."""
    out: dict[int, list] = {}
    for u in run["units"]:
        if u.get("sha256_f32"):
            out.setdefault(u["session"], []).append((u["index"], u["sha256_f32"], u["sha256_pcm16"]))
    return out


def check_against_reference(run: dict, refs: dict[int, list], variants: int) -> list[str]:
    """Mismatches of every session against the solo run of its variant (empty: all byte-identical)."""
    bad = []
    for s, rows in session_hashes(run).items():
        ref = refs.get(s % variants)
        if ref is None:
            bad.append(f"session {s}: no solo reference for variant {s % variants}")
            continue
        if rows != ref:
            first = next((a[0] for a, b in zip(rows, ref) if a != b), min(len(rows), len(ref)))
            bad.append(f"{run['mode']} N={run['sessions']} session {s}: unit {first} differs from the same "
                       f"session run alone")
    return bad


def record_reasons(record: dict) -> list[str]:
    """A record's invalid reasons: its top-level ones, plus, in a checkpoint (verdict PARTIAL, whose top level
    says only NOT_FINISHED), its workloads' reasons so far."""
    reasons = list(record.get("invalid_reasons") or [])
    if record.get("verdict") == "PARTIAL":
        reasons += [r for w in (record.get("workloads") or {}).values() for r in w.get("invalid_reasons") or []]
    return reasons


def invalid_codes(reasons: list[str]) -> list[str]:
    """One code per invalid reason, suite.runner's where they mean the same: "partial" (NOT_FINISHED),
    "dirty_tree", "short_run" (runs shorter than MIN_SECONDS), and "mismatch" for any other: a workload's
    reasons all compare bytes (a session against the same session alone, `check_against_reference`;
    cadence's one-session run against stock's), and an unknown reason is counted as one (it fails)."""
    def code(reason: str) -> str:
        if reason == NOT_FINISHED:
            return "partial"
        if reason == DIRTY_TREE:
            return "dirty_tree"
        return "short_run" if reason.endswith(SHORT_RUN) else "mismatch"
    return [code(r) for r in reasons]


def _runs(record: dict):
    """Every run dict of a record (workloads -> modes -> runs), skipping what is not shaped so."""
    for w in (record.get("workloads") or {}).values():
        for m in ((w or {}).get("modes") or {}).values() if isinstance(w, dict) else ():
            for run in (m or {}).get("runs") or () if isinstance(m, dict) else ():
                if isinstance(run, dict):
                    yield run


#: Per-unit columns that pack_units stores once per record (`unit_hashes`) and refers to by position: every
#: session of a multi-session run repeats the hashes of its variant's one-session run when it is byte-identical.
INTERNED_COLUMNS = ("sha256_f32", "sha256_pcm16")


def pack_units(record: dict) -> dict:
    """A copy of a record whose runs hold their per-unit rows as one table, {"columns": [key, ...], "rows":
    [[value, ...], ...], "interned": [...]}: the keys once per run instead of once per unit, and each distinct
    sha256 once per record, in its `unit_hashes` list, the rows holding its position (a row per unit per
    session, two sha256 each: Moshi's 1,16,32,48 sessions were 3.1 MB as a list of objects in
    results/2026-12-01-h200-reproduce-9). Columns: every key in first-seen order; a row lacking a key holds
    null there. `unpack_units` gives the rows back (a key a row lacked reads null). A run whose units are a
    table already is kept."""
    out = json.loads(json.dumps(jsonable(record)))
    hashes: dict[str, int] = {h: i for i, h in enumerate(out.get("unit_hashes") or [])}
    for run in _runs(out):
        units = run.get("units")
        if isinstance(units, list):
            cols = list(dict.fromkeys(k for u in units for k in u))
            interned = [c for c in cols if c in INTERNED_COLUMNS]
            rows = [[(hashes.setdefault(u[c], len(hashes)) if c in interned and u.get(c) is not None else u.get(c))
                     for c in cols] for u in units]
            run["units"] = {"columns": cols, "rows": rows, "interned": interned}
    if hashes:
        out["unit_hashes"] = list(hashes)
    return out


def unpack_units(record: dict) -> dict:
    """In place: every run's unit table (`pack_units`) back to a list of {column: value} rows (a key with
    null for a row that lacked it; interned columns resolved through the record's `unit_hashes`, which is
    then dropped); a list (schema /1, written before the table: results/ up to 2026-12-01-h200-reproduce-9's
    call 7) is kept. Returns the record. Raises ValueError naming the run for a table not shaped as pack_units writes
    it: columns distinct strings, `interned` a list of INTERNED_COLUMNS among them, rows of one value per
    column, an interned value a position (an int, not a bool) in `unit_hashes`, a list of strings."""
    hashes = record.get("unit_hashes", [])
    if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
        raise ValueError(f"'unit_hashes': expected a list of sha256 strings, got {json.dumps(hashes)[:60]}")
    for run in _runs(record):
        units = run.get("units")
        if units is None or isinstance(units, list):     # none: a refused run measured no unit
            continue
        where = f"run N={run.get('sessions')} {run.get('mode')}: 'units'"
        if not isinstance(units, dict):
            raise ValueError(f"{where}: expected a table {{'columns', 'rows', 'interned'}} or a list of rows, "
                             f"got {type(units).__name__}")
        cols, rows, interned = units.get("columns"), units.get("rows"), units.get("interned")
        if (not isinstance(cols, list) or not all(isinstance(c, str) for c in cols)
                or len(set(cols)) != len(cols)):
            raise ValueError(f"{where}: 'columns': expected distinct strings, got {json.dumps(cols)[:60]}")
        if (not isinstance(interned, list) or not all(isinstance(c, str) for c in interned)
                or not set(interned) <= set(cols) & set(INTERNED_COLUMNS)):
            raise ValueError(f"{where}: 'interned': expected a list of columns among {list(INTERNED_COLUMNS)}, "
                             f"got {json.dumps(interned)[:60]}")
        if not isinstance(rows, list) or any(not isinstance(r, list) or len(r) != len(cols) for r in rows):
            raise ValueError(f"{where}: expected {{'columns': [...], 'rows': [[one value per column], ...]}}")
        at = [i for i, c in enumerate(cols) if c in interned]
        out = []
        for r in rows:
            row = list(r)
            for i in at:
                if row[i] is not None:
                    if type(row[i]) is not int or not 0 <= row[i] < len(hashes):
                        span = f"0-{len(hashes) - 1}" if hashes else "none: unit_hashes is empty or missing"
                        raise ValueError(f"{where}: column {cols[i]!r} holds {row[i]!r}, expected a position in "
                                         f"unit_hashes ({span})")
                    row[i] = hashes[row[i]]
            out.append(dict(zip(cols, row)))
        run["units"] = out
    record.pop("unit_hashes", None)
    return record


def read_record(path: str | Path) -> dict:
    """A duplex.json as suite.duplex measured it (units as rows of objects: `unpack_units`). Raises
    OSError, ValueError (not JSON, or a mis-shaped unit table)."""
    return unpack_units(json.loads(Path(path).read_text()))


def write_record(path: Path, record: dict) -> None:
    """Write a duplex record to `path` atomically (a process killed at its time limit mid-write leaves the
    previous checkpoint), compact and with each run's units as one table (`pack_units`; REPORT.md is what
    people read). Raises OSError, and TypeError / ValueError / AttributeError for units not shaped as rows
    of objects (suite.duplex_merge reports them as a mis-shaped record)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(pack_units(record), separators=(",", ":")))
    tmp.replace(path)


# --- the whole measurement --------------------------------------------------------------------------
def parse_sessions(text: str, flag: str = "--sessions") -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, distinct). Raises ValueError naming `flag`."""
    try:
        ns = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated ints >= 1 (e.g. 1,2,4), got {text!r}") from None
    if not ns or ns[0] < 1:
        raise ValueError(f"{flag}: expected comma-separated ints >= 1 (e.g. 1,2,4), got {text!r}")
    return ns


def max_zero_miss(runs: list[dict]) -> int | None:
    """Largest N such that every run with N' <= N had zero misses (None if N = smallest already missed)."""
    best = None
    for r in sorted(runs, key=lambda r: r["sessions"]):
        if r.get("refused") or r["metrics"]["misses"]:
            break
        best = r["sessions"]
    return best


def next_bisect(runs: list[dict]) -> int | None:
    """The next N to try when bisecting between the largest N with zero misses and the smallest larger N
    that missed or was refused; None when they are adjacent (or either is missing)."""
    lo = max_zero_miss(runs)
    bad = [r["sessions"] for r in runs if r.get("refused") or r["metrics"]["misses"]]
    hi = min((b for b in bad if lo is None or b > lo), default=None)
    if lo is None or hi is None or hi - lo <= 1:
        return None
    return (lo + hi) // 2


def measure_workload(workload, *, device, ar_spec: str, sessions: list[int] | dict, seconds: float,
                     modes=MODES, policy: str = "edf", variants: int = 1, depth: str = "released",
                     steps: int | None = None, budget_mib: float | None = None, seed: int = 0,
                     after_miss: int = 1, bisect: bool = False, progress: bool = True,
                     on_run=None) -> dict:
    """Every mode x N for one workload on one model build. Returns the workload's record.
    after_miss: once a run of a mode misses a unit, run at most this many larger N for that mode (the
    miss-rate curve), then stop. Warmed-up reusable sessions are kept from one N to the next (`pool`).
    sessions: the session counts, or {mode: counts}; policy: a scheduler policy, or {mode: policy}. bisect: then bisect between the largest N with zero
    misses and the smallest N that missed, so `max_zero_miss_sessions` is exact (a search over N).
    on_run(record): called with the workload's record so far after every run (checkpointing: a run cut
    short by a time limit keeps what was measured)."""
    device = torch.device(device)
    adapter = runtime.adapter(workload.architecture)
    spec = make_spec(workload, steps)
    if workload.architecture == "flow_hift" and spec.get("variant") != "stepaudio2":
        # no synthetic turns at session open: Driver.warm_up rehearses the script's own turn shapes
        spec["cadence"] = {**spec.get("cadence", {}), "prepare_turns": 0}
    probe = MemoryProbe(device)
    model = adapter.build_model(spec, device=device, depth=depth, seed=workload.seeds.get("weights", seed))
    ar = make_ar(ar_spec, workload.name, device, depth=depth, seed=seed)
    probe.model_loaded()
    budget = None
    if budget_mib is not None:
        budget = int(budget_mib * 2 ** 20)
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * 0.9)
    out = {"workload": workload.name, "architecture": workload.architecture, "euler_steps": spec.get("n_timesteps"),
           "ar": ar.describe(), "budget_bytes": budget, "modes": {}, "reference": {}, "invalid_reasons": []}
    refs_by_mode = {}
    per_mode = sessions if isinstance(sessions, dict) else {m: sessions for m in modes}
    for mode in modes:
        sessions = per_mode[mode]
        runs, refs, pool, missed = [], {}, [], None
        turns = 2 if (mode != "stock" and device.type == "cuda") else 1   # graphs capture on a 2nd occurrence
        out.setdefault("process_warm_up", {})[mode] = warm_process(workload, mode, model, adapter, spec, ar, device)
        for v in range(min(variants, max(sessions))):
            solo_needed = not (v == 0 and sessions[0] == 1)
            if solo_needed:       # the same session run alone, on the cadence
                solo = _solo_variant(workload, mode, v, model, adapter, spec, ar, device, seconds, turns)
                refs[v] = session_hashes(solo)[0]
        def one(n: int) -> dict | None:
            """Run N sessions; append the run (or its refusal) to runs; None if refused."""
            try:
                run = run_sessions(workload, mode, n, model=model, adapter=adapter, spec=spec, ar=ar,
                                   device=device, seconds=seconds, variants=variants,
                                   policy=policy[mode] if isinstance(policy, dict) else policy,
                                   budget_bytes=budget, probe=probe, progress=progress, pool=pool,
                                   warmup_turns=turns)
            except (scheduler.AdmissionError, torch.OutOfMemoryError) as exc:
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                runs.append({"mode": mode, "sessions": n, "refused": f"{type(exc).__name__}: {exc}",
                             "metrics": {"misses": None}})
                if progress:
                    print(f"  {workload.name} {mode} N={n}: refused: {exc}", flush=True)
                return None
            if n == 1 and 0 not in refs:
                refs[0] = session_hashes(run)[0]
            run["mismatches"] = check_against_reference(run, refs, variants)
            out["invalid_reasons"] += run["mismatches"]
            runs.append(run)
            out["modes"][mode] = {"runs": runs, "max_zero_miss_sessions": max_zero_miss(runs), "partial": True}
            if on_run is not None:
                on_run(out)
            return run

        for n in sessions:
            if missed is not None and sum(r["sessions"] > missed for r in runs) >= after_miss:
                break
            run = one(n)
            if run is None:
                break
            if run["metrics"]["misses"] and missed is None:
                missed = n
        while bisect and (n := next_bisect(runs)) is not None:
            one(n)
        for e in pool:
            release(e.driver.session)
        del pool
        gc.collect()
        out["modes"][mode] = {"runs": runs, "max_zero_miss_sessions": max_zero_miss(runs),
                              "stock_sharing": STOCK_SHARING[workload.architecture] if mode == "stock" else
                              "shared_instance (one arena + graph set per session)"}
        refs_by_mode[mode] = refs
        out["reference"][mode] = {str(v): len(r) for v, r in refs.items()}
    if "stock" in refs_by_mode and "cadence" in refs_by_mode:
        same = refs_by_mode["stock"].get(0) == refs_by_mode["cadence"].get(0)
        out["cadence_equals_stock"] = same
        if not same:
            out["invalid_reasons"].append("cadence solo run differs from the stock solo run")
    return out


def warm_process(workload, mode, model, adapter, spec, ar, device, units: int = 3) -> dict | None:
    """Before a mode's first run, for sessions that cannot warm themselves up with a turn (not turn-based:
    Moshi, Step-Audio 2): the first `units` units with work of a throwaway session, then
    released, so the process's lazy initialisations (CUDA context, cuBLAS/cuDNN handles, kernel loading)
    do not land on a measured session's first unit (seen: stock Moshi's first unit, 1430 ms, at 60 s in
    results/2026-11-30-h200-duplex-60s-c). Returns {"units": n, "ms": [...]} or None when not needed."""
    from suite.duplex_session import _turn_based
    session = open_session(adapter, model, mode, spec)
    if _turn_based(session):               # warmed by Driver.warm_up (a turn, or rehearse)
        release(session)
        return None
    drv = Driver(session, ar, device, f"warm/{mode}")
    done = []
    for u in session_units(workload, float(max(units, 1)) * 4):
        if len(done) == units:
            break
        if Driver.has_work(u):
            t0 = time.perf_counter()
            drv.run_unit(u)
            done.append((time.perf_counter() - t0) * 1e3)
    release(session)
    return {"units": len(done), "ms": done}


def _solo_variant(workload, mode, v, model, adapter, spec, ar, device, seconds, warmup_turns: int = 1) -> dict:
    """A run of one session of payload variant v alone (same as run_sessions with N=1, variant v)."""
    units = session_units(workload, seconds, v)
    session = open_session(adapter, model, mode, spec)
    drv = Driver(session, ar, device, f"solo/{v}")
    try:
        for k in range(warmup_turns):
            drv.warm_up(units, WARMUP_TURN_UNITS if k == 0 else 2)
        sched = scheduler.CadenceScheduler(period_s=PERIOD_S)
        sched.admit(scheduler.Slot(drv.name, units, drv.run_unit, Driver.has_work))
        timings = sched.run()
    finally:
        release(session)
    return {"units": [{"session": 0, "index": t.index, **(t.output or {})} for t in timings]}


def run(args: argparse.Namespace, command: list[str] | None = None) -> dict:
    """The CLI's work: every workload, JSON and plots in args.out. Returns the record."""
    import workloads

    names = workloads.names() if args.workload == "all" else [w.strip() for w in args.workload.split(",")]
    wls = [workloads.get(n) for n in names]
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    sessions = {m: parse_sessions(args.stock_sessions if (m == "stock" and args.stock_sessions) else args.sessions)
                for m in args.modes}
    policies = {m: (args.stock_policy if (m == "stock" and args.stock_policy) else args.policy) for m in args.modes}
    prov = env.provenance(command, device=device)
    record = {"schema": SCHEMA, "provenance": prov, "parameters": {
        "ar": args.ar, "sessions": sessions, "seconds": args.seconds, "policy": policies,
        "variants": args.variants, "depth": args.depth, "steps": args.steps, "period_s": PERIOD_S,
        "budget_mib": args.budget_mib, "modes": list(args.modes), "after_miss": args.after_miss,
        "bisect": args.bisect}, "workloads": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def checkpoint(partial: dict) -> None:
        """After every run: duplex.json with what was measured so far (verdict PARTIAL until the end)."""
        snap = {**record, "workloads": {**record["workloads"], partial["workload"]: partial},
                "verdict": "PARTIAL", "invalid_reasons": [NOT_FINISHED]}
        write_record(out / "duplex.json", snap)

    with env.deterministic() as det:
        record["determinism"] = det
        for wl in wls:
            if args.progress:
                print(f"{wl.name}: ar={args.ar} sessions={sessions} seconds={args.seconds}", flush=True)
            record["workloads"][wl.name] = measure_workload(
                wl, device=device, ar_spec=args.ar, sessions=sessions, seconds=args.seconds, modes=args.modes,
                policy=policies, variants=args.variants, depth=args.depth, steps=args.steps,
                budget_mib=args.budget_mib, after_miss=args.after_miss, bisect=args.bisect,
                progress=args.progress, on_run=checkpoint)
    reasons = [r for w in record["workloads"].values() for r in w["invalid_reasons"]]
    if prov.get("git_dirty"):
        reasons.append(DIRTY_TREE)
    if args.seconds < MIN_SECONDS:
        reasons.append(f"{args.seconds:g} s < {MIN_SECONDS:g} s: {SHORT_RUN}")
    record["verdict"] = "INVALID" if reasons else "VALID"
    record["invalid_reasons"] = reasons
    write_record(out / "duplex.json", record)
    if not args.no_plots:
        from suite.duplex_plot import plot_all
        record["plots"] = plot_all(record, out)
        write_record(out / "duplex.json", record)
    if args.progress:
        for name, w in record["workloads"].items():
            for mode, m in w["modes"].items():
                print(f"{name} {mode}: max sessions with zero misses = {m['max_zero_miss_sessions']}")
        print(f"verdict {record['verdict']}" + (f": {reasons}" if reasons else ""))
        print(f"wrote {out / 'duplex.json'}")
    return record


class OneLineParser(argparse.ArgumentParser):
    """argparse with its own errors (a bad choice, a non-number, a missing argument) as one line on stderr
    and exit status 2, as check_args' errors (no usage block)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        exc = SystemExit(message)      # str() is the message, as _usage_error's
        exc.code = 2
        raise exc


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m suite.duplex", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="minicpmo45", help="workload name(s), comma-separated, or 'all'")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ar", default="none", help="none | busy:<ms>ms | standin | standin:<name>")
    p.add_argument("--sessions", default="1,2,4", help="session counts to run, e.g. 1,2,4,8,16,24")
    p.add_argument("--stock-sessions", default=None, help="session counts for stock (default: --sessions)")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of cadence per run (script tiled)")
    p.add_argument("--modes", default="stock,cadence", type=lambda s: [m.strip() for m in s.split(",")])
    p.add_argument("--policy", default="edf", choices=scheduler.POLICIES)
    p.add_argument("--stock-policy", default=None, choices=scheduler.POLICIES,
                   help="policy for stock sessions (default: --policy); on the H200 stock MiniCPM-o serves more "
                        "sessions under edf, DuplexCadence under threads (results/README.md)")
    p.add_argument("--variants", type=int, default=1, help="distinct payload variants across sessions")
    p.add_argument("--depth", default="released", choices=("released", "reduced"))
    p.add_argument("--steps", type=int, default=None, help="override the workload's Euler steps")
    p.add_argument("--budget-mib", type=float, default=None,
                   help="memory budget for admission (default: 90%% of free device memory on CUDA, none on CPU)")
    p.add_argument("--after-miss", type=int, default=1,
                   help="after a mode's first run with a miss, run at most this many larger session counts")
    p.add_argument("--bisect", action="store_true",
                   help="after the list, bisect to the exact largest session count with zero misses")
    p.add_argument("--out", required=True)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", dest="progress", action="store_false")
    return p


def _usage_error(message: str) -> SystemExit:
    """A bad flag: one line on stderr, exit status 2 (as argparse), no traceback. str() is the message."""
    print(f"python -m suite.duplex: error: {message}", file=sys.stderr)
    exc = SystemExit(message)
    exc.code = 2
    return exc


def check_args(args: argparse.Namespace) -> None:
    """Every flag's value, before any model is built. Raises SystemExit (status 2) naming the flag."""
    import math

    import workloads

    for m in args.modes:
        if m not in MODES:
            raise _usage_error(f"--modes: expected a subset of {MODES}, got {m!r}")
    if len(set(args.modes)) != len(args.modes):
        raise _usage_error(f"--modes: expected each mode once, got {','.join(args.modes)!r}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise _usage_error(f"--out: expected a folder (new or existing), got the file {args.out!r}")
    if args.variants < 1:
        raise _usage_error(f"--variants: expected an int >= 1, got {args.variants}")
    if not math.isfinite(args.seconds) or args.seconds <= 0:
        raise _usage_error(f"--seconds: expected a finite number > 0, got {args.seconds}")
    if args.steps is not None and args.steps < 1:
        raise _usage_error(f"--steps: expected an int >= 1 (Euler steps), got {args.steps}")
    if args.budget_mib is not None and (not math.isfinite(args.budget_mib) or args.budget_mib < 0):
        raise _usage_error(f"--budget-mib: expected a finite number >= 0, got {args.budget_mib}")
    if args.after_miss < 0:
        raise _usage_error(f"--after-miss: expected an int >= 0, got {args.after_miss}")
    if args.workload != "all":
        for name in (w.strip() for w in args.workload.split(",")):
            if name not in workloads.names():
                raise _usage_error(f"--workload: expected 'all' or some of {workloads.names()}, got {name!r}")
    from suite.duplex_session import session_units
    for name in (workloads.names() if args.workload == "all" else [w.strip() for w in args.workload.split(",")]):
        if not any(u.kind == "SPEAK" for u in session_units(workloads.get(name), args.seconds)):
            raise _usage_error(f"--seconds: the first {args.seconds:g} s of {name}'s script hold no SPEAK unit "
                               f"(nothing to measure); give more seconds")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise _usage_error(f"--device: expected cpu, cuda or cuda:N, got {args.device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise _usage_error(f"--device: expected cpu, cuda or cuda:N, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise _usage_error(f"--device: {args.device!r} given, but there is no CUDA device here "
                           "(torch.cuda.is_available() is False)")
    try:
        parse_sessions(args.sessions)
        if args.stock_sessions:
            parse_sessions(args.stock_sessions, "--stock-sessions")
        from suite.ar_stage import parse_ar
        parse_ar(args.ar)
    except (ValueError, ARSpecError) as exc:
        raise _usage_error(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    record = run(args, ["python", "-m", "suite.duplex", *argv])
    return 0 if record["verdict"] == "VALID" else EXIT_INVALID


if __name__ == "__main__":
    import faulthandler
    faulthandler.enable()          # a native crash (seen once at 32 threaded sessions) prints its stacks
    sys.exit(main())
