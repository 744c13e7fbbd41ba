"""The live duplex path: SPEAK time against the one-second cadence, and sessions per GPU.

    python -m suite.measure.duplex --workload minicpmo45 --device cuda --ar none|busy:30ms|standin \
        --modes cadence --sessions 1,2,4,8 --seconds 60 [--prepare voice|oracle] --out DIR

Per workload, mode and session count N: open N sessions, prepare and warm each, admit them (admission
from each session's arena + graph bytes), then run them together on the cadence with staggered phases.
Every SPEAK unit runs the AR stage, then the tail (`session.speak`); a LISTEN unit with a payload runs the
tail only. Per unit: SPEAK time (AR + tail), CUDA-event time, lateness, the miss flag; per run: mean and
p99 SPEAK time against the cadence, miss rate, the sessions' graph counters over the cadence, and every
session's bytes against the same session run alone; per mode: the largest N with zero misses.

`--prepare`: "voice" (default) is `session.prepare(None)`, what a server can do; "oracle" also captures
what each session's own script will meet (foreknowledge: recorded as such, never the headline).
Policies: "edf" (one thread, earliest deadline first) or "threads" (a thread and a CUDA stream per
session; sessions that are not `concurrent` hold their model instance's lock around the tail). Sessions
share one model instance; one the adapter refuses there (ConcurrencyError) gets its own copy. Session s
decodes the script, tiled to --seconds, with its ids shifted by 97 * (s mod variants). Writes
--out/duplex.json (checkpointed after every run, verdict PARTIAL until the end). Exit status: 0 VALID,
EXIT_INVALID (1) for a complete INVALID record, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import sys
import threading
import time
from pathlib import Path

import torch

import workloads
from duplexcadence import graphs, runtime
from duplexcadence.errors import ConcurrencyError
from suite.measure import env, scheduler
from suite.measure.ar_stage import ARSpecError, make_ar, parse_ar
from suite.measure.duplex_session import (PERIOD_S, PREPARES, Driver, PoolEntry, Progress, check_against_reference,
                                          footprint, has_work, metrics, next_bisect, parse_sessions, session_hashes,
                                          session_units)
from suite.measure.memory import MemoryProbe
from suite.measure.session import make_spec, open_session
from suite.records import (DIRTY_TREE, DUPLEX_SCHEMA, EXIT_INVALID, MIN_SECONDS, NOT_FINISHED, SHORT_RUN, jsonable,
                           max_zero_miss, write_duplex)

MODES = ("stock", "cadence")
CADENCE_COUNTERS = ("captures", "replays", "eager_runs", "eager_fallbacks", "capture_failures")


def _open(workload, mode, model, adapter, spec):
    """(session, its model instance, own instance?): on the shared instance, or on a copy where the adapter
    refuses a second session on it (ConcurrencyError)."""
    try:
        return open_session(adapter, model, mode, spec), model, False
    except ConcurrencyError:
        instance = copy.deepcopy(model)
        return open_session(adapter, instance, mode, spec), instance, True


def run_sessions(workload, mode: str, n: int, *, model, adapter, spec: dict, ar, device, seconds: float,
                 policy: str = "edf", variants: int = 1, budget_bytes: int | None = None, clock=None,
                 probe: MemoryProbe | None = None, progress: bool = True, pool: list | None = None,
                 prepare: str = "voice") -> dict:
    """N sessions of one mode on the cadence. Returns the run record (units, metrics, admission, memory,
    per-session graph counters over the cadence). Raises AdmissionError if a session does not fit (the
    record is not made). Sessions built for this run only are closed however it ends; streams leased for
    it are given back.

    pool: a list the caller keeps across runs of one mode: prepared and warmed sessions whose start_turn
    restores the voice's base state (turn_state "reset") are taken from it (the first n), new ones added;
    the caller closes them. Without one, every session closes with the run.
    prepare: "voice" | "oracle" (`Driver.prepare`)."""
    device = torch.device(device)
    if probe is not None:
        probe.begin_session()
    sched = scheduler.CadenceScheduler(period_s=PERIOD_S, policy=policy, clock=clock, budget_bytes=budget_bytes)
    phases = scheduler.staggered_phases(n, PERIOD_S)
    kept = pool is not None            # the caller keeps the pool: else its sessions close with the run
    pool = pool if kept else []
    locks: dict[int, threading.Lock] = {}
    drivers, admission, fresh, streams, before, estimate = [], [], [], [], [], 0
    try:
        for s in range(n):
            name = f"{workload.name}/{mode}/{s}"
            units = session_units(workload, seconds, s % variants)
            reused = s < len(pool)
            if reused:
                entry = pool[s]
            else:
                sched.check(name, estimate)    # before building: the bytes of the session built last
                session, instance, own = _open(workload, mode, model, adapter, spec)
                drv = Driver(session, ar, device, name)
                try:
                    drv.prepare(units, prepare if mode != "stock" else "voice")
                    drv.warm_up(units)
                    entry = PoolEntry(instance, drv, *footprint(session, mode, model, own))
                except BaseException:
                    session.close()            # not in fresh/pool yet
                    raise
                (pool if session.capabilities.turn_state == "reset" else fresh).append(entry)
            estimate, drv = entry.nbytes, entry.driver
            drv.turn = None                    # the run's first SPEAK unit opens a turn
            locked = policy == "threads" and not drv.session.capabilities.concurrent
            drv.tail_lock = (locks.setdefault(id(entry.instance), threading.Lock()) if locked
                             else contextlib.nullcontext())
            stream = graphs.STREAMS.acquire(device) if (policy == "threads" and device.type == "cuda") else None
            if stream is not None:
                streams.append(stream)
            sched.admit(scheduler.Slot(name, units, drv.run_unit, has_work, entry.nbytes, phases[s], stream))
            drivers.append(drv)
            before.append(drv.session.stats())
            admission.append({"session": s, "footprint_bytes": entry.nbytes, "footprint_how": entry.how,
                              "variant": s % variants, "phase_s": phases[s], "reused": reused, "tail_lock": locked,
                              "prepared": jsonable(drv.prepared)})
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        total = sum(has_work(u) for slot in sched.slots for u in slot.units)
        sched.on_unit = Progress(f"{workload.name} {mode} N={n}", total, seconds, progress)
        t0 = time.perf_counter()
        timings = sched.run()
        wall_s = time.perf_counter() - t0
        stats = [d.session.stats() for d in drivers]
    finally:
        if streams:
            try:
                torch.cuda.synchronize(device)     # nothing queued on a stream handed back
            finally:
                for st in streams:
                    graphs.STREAMS.release(st)
        for e in fresh + ([] if kept else pool):
            e.driver.session.close()
    units = []
    for t in timings:
        rec = {"session": t.session, "index": t.index, "kind": t.kind, "release_ms": t.release_s * 1e3,
               "deadline_ms": t.deadline_s * 1e3, "start_ms": None if t.start_s is None else t.start_s * 1e3,
               "end_ms": None if t.end_s is None else t.end_s * 1e3,
               "service_ms": None if t.service_s is None else t.service_s * 1e3,
               "lateness_ms": None if t.lateness_s is None else t.lateness_s * 1e3, "miss": t.miss}
        rec.update(t.output or {})
        rec["speak_ms"] = rec["ar_ms"] + rec["tail_ms"] if (t.kind == "SPEAK" and t.output) else None
        units.append(rec)
    memory = {}
    if probe is not None:
        probe.observe()
        memory = probe.end_session()
        memory["pooled_sessions_alive"] = len(pool)
    cadence = [{k: getattr(a, k) - getattr(b, k) for k in CADENCE_COUNTERS} for a, b in zip(stats, before)]
    del drivers, fresh
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    out = {"mode": mode, "sessions": n, "policy": policy, "prepare": prepare if mode != "stock" else None,
           "wall_s": wall_s, "admission": admission, "metrics": metrics(units), "memory": memory,
           "session_stats": jsonable([st.to_dict() for st in stats]), "cadence_counters": cadence,
           "captures_during_cadence": sum(c["captures"] for c in cadence),
           "eager_fallbacks_during_cadence": sum(c["eager_fallbacks"] for c in cadence), "units": units}
    if progress:
        m = out["metrics"]
        speak = (f"SPEAK mean {m['speak_ms_mean']:7.1f} ms, p99 {m['speak_ms_p99']:7.1f} ms"
                 if m["speak_units"] else "no SPEAK unit")
        print(f"  {workload.name} {mode:7s} N={n:3d}: {speak}, misses {m['misses']}/{m['units_run']}, captures "
              f"{out['captures_during_cadence']}, eager fallbacks {out['eager_fallbacks_during_cadence']}", flush=True)
    return out


def warm_process(workload, mode, model, adapter, spec, ar, device, units: int = 3) -> dict:
    """Before a mode's first run: the first `units` units with work of a throwaway session (prepared, then
    closed), so the process's lazy initialisations (CUDA context, cuBLAS/cuDNN handles, kernel loading) do
    not land on a measured session's first unit. Returns {"units": n, "ms": [...]}."""
    session, _, _ = _open(workload, mode, model, adapter, spec)
    try:
        drv = Driver(session, ar, device, f"warm/{mode}")
        drv.prepare([], "voice")
        done = []
        for u in session_units(workload, float(max(units, 1)) * 4, variant=1):
            if len(done) == units:
                break
            if has_work(u):
                t0 = time.perf_counter()
                drv.run_unit(u)
                done.append((time.perf_counter() - t0) * 1e3)
    finally:
        session.close()
    return {"units": len(done), "ms": done}


def solo_variant(workload, mode, v, model, adapter, spec, ar, device, seconds, prepare: str = "voice",
                 clock=None) -> dict:
    """One session of payload variant v alone on the cadence (run_sessions with N=1, variant v); clock: the
    scheduler's (default: the wall clock)."""
    units = session_units(workload, seconds, v)
    session, _, _ = _open(workload, mode, model, adapter, spec)
    try:
        drv = Driver(session, ar, device, f"solo/{v}")
        drv.prepare(units, prepare if mode != "stock" else "voice")
        drv.warm_up(units)
        sched = scheduler.CadenceScheduler(period_s=PERIOD_S, clock=clock)
        sched.admit(scheduler.Slot(drv.name, units, drv.run_unit, has_work))
        timings = sched.run()
    finally:
        session.close()
    return {"units": [{"session": 0, "index": t.index, **(t.output or {})} for t in timings]}


def measure_workload(workload, *, device, ar_spec: str, sessions: dict, seconds: float, modes=MODES,
                     policy: dict | str = "edf", variants: int = 1, depth: str = "released",
                     steps: int | None = None, budget_mib: float | None = None, seed: int = 0,
                     after_miss: int = 1, bisect: bool = False, progress: bool = True, on_run=None,
                     prepare: str = "voice") -> dict:
    """Every mode x N for one workload on one model build. Returns the workload's record.
    sessions: {mode: counts}; policy: a policy or {mode: policy}. after_miss: once a run of a mode misses,
    at most this many larger N (the miss-rate curve). bisect: then bisect to the exact largest N with zero
    misses. on_run(record so far): after every run (checkpoints)."""
    device = torch.device(device)
    adapter = runtime.adapter(workload.architecture)
    spec = make_spec(workload, steps)
    probe = MemoryProbe(device)
    model = adapter.build_model(spec, device=device, depth=depth, seed=workload.seeds.get("weights", seed))
    ar = make_ar(ar_spec, workload.name, device, depth=depth, seed=seed)
    probe.model_loaded()
    budget = int(budget_mib * 2 ** 20) if budget_mib is not None else (
        int(torch.cuda.mem_get_info(device)[0] * 0.9) if device.type == "cuda" else None)
    out = {"workload": workload.name, "architecture": workload.architecture, "euler_steps": spec.get("n_timesteps"),
           "ar": ar.describe(), "budget_bytes": budget, "modes": {}, "reference": {}, "invalid_reasons": [],
           "process_warm_up": {}}
    for mode in modes:
        counts = sessions[mode]
        mode_policy = policy[mode] if isinstance(policy, dict) else policy
        how = prepare if mode != "stock" else "voice"
        runs, refs, pool, missed = [], {}, [], None
        out["process_warm_up"][mode] = warm_process(workload, mode, model, adapter, spec, ar, device)
        for v in range(min(variants, max(counts))):
            if not (v == 0 and counts[0] == 1):     # the same session run alone, on the cadence
                refs[v] = session_hashes(solo_variant(workload, mode, v, model, adapter, spec, ar, device,
                                                      seconds, how))[0]

        def one(n: int) -> dict | None:
            """Run N sessions; append the run (or its refusal); None if refused."""
            try:
                run = run_sessions(workload, mode, n, model=model, adapter=adapter, spec=spec, ar=ar,
                                   device=device, seconds=seconds, variants=variants, policy=mode_policy,
                                   budget_bytes=budget, probe=probe, progress=progress, pool=pool, prepare=how)
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

        try:
            for n in counts:
                if missed is not None and sum(r["sessions"] > missed for r in runs) >= after_miss:
                    break
                run = one(n)
                if run is None:
                    break
                if run["metrics"]["misses"] and missed is None:
                    missed = n
            while bisect and (n := next_bisect(runs)) is not None:
                one(n)
        finally:
            for e in pool:
                e.driver.session.close()
            pool.clear()
            gc.collect()
        out["modes"][mode] = {"runs": runs, "max_zero_miss_sessions": max_zero_miss(runs), "prepare": how}
        out["reference"][mode] = {str(v): len(r) for v, r in refs.items()}
    return out


def run(args: argparse.Namespace, command: list[str] | None = None) -> dict:
    """The CLI's work: every workload, duplex.json in args.out (checkpointed). Returns the record."""
    names = workloads.names() if args.workload == "all" else [w.strip() for w in args.workload.split(",")]
    device = torch.device(args.device)
    sessions = {m: parse_sessions(args.stock_sessions if (m == "stock" and args.stock_sessions) else args.sessions)
                for m in args.modes}
    policies = {m: (args.stock_policy if (m == "stock" and args.stock_policy) else args.policy) for m in args.modes}
    prov = env.provenance(command, device=device)
    record = {"schema": DUPLEX_SCHEMA, "provenance": prov, "parameters": {
        "ar": args.ar, "sessions": sessions, "seconds": args.seconds, "policy": policies, "variants": args.variants,
        "depth": args.depth, "steps": args.steps, "period_s": PERIOD_S, "budget_mib": args.budget_mib,
        "modes": list(args.modes), "after_miss": args.after_miss, "bisect": args.bisect, "prepare": args.prepare},
        "workloads": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def checkpoint(partial: dict) -> None:
        snap = {**record, "workloads": {**record["workloads"], partial["workload"]: partial},
                "verdict": "PARTIAL", "invalid_reasons": [NOT_FINISHED]}
        write_duplex(out / "duplex.json", snap)

    with env.deterministic() as det:
        record["determinism"] = det
        for name in names:
            if args.progress:
                print(f"{name}: modes {','.join(args.modes)} ar={args.ar} sessions={sessions} seconds={args.seconds:g} "
                      f"prepare={args.prepare}", flush=True)
            record["workloads"][name] = measure_workload(
                workloads.get(name), device=device, ar_spec=args.ar, sessions=sessions, seconds=args.seconds,
                modes=args.modes, policy=policies, variants=args.variants, depth=args.depth, steps=args.steps,
                budget_mib=args.budget_mib, after_miss=args.after_miss, bisect=args.bisect, progress=args.progress,
                on_run=checkpoint, prepare=args.prepare)
    reasons = [r for w in record["workloads"].values() for r in w["invalid_reasons"]]
    if prov.get("git_dirty"):
        reasons.append(DIRTY_TREE)
    if args.seconds < MIN_SECONDS:
        reasons.append(f"{args.seconds:g} s < {MIN_SECONDS:g} s: {SHORT_RUN}")
    record["verdict"] = "INVALID" if reasons else "VALID"
    record["invalid_reasons"] = reasons
    write_duplex(out / "duplex.json", record)
    if args.progress:
        for name, w in record["workloads"].items():
            for mode, m in w["modes"].items():
                print(f"{name} {mode}: max sessions with zero misses = {m['max_zero_miss_sessions']}")
        print(f"verdict {record['verdict']}" + (f": {reasons}" if reasons else ""))
        print(f"wrote {out / 'duplex.json'}")
    return record


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str):
        raise usage_error(message, self.prog)


def usage_error(message: str, prog: str = "python -m suite.measure.duplex") -> SystemExit:
    """A bad flag: one line on stderr, exit status 2, no traceback. str() is the message."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    exc = SystemExit(message)
    exc.code = 2
    return exc


def number(kind, low, *, strict: bool):
    """An argparse type: a finite `kind` above (strict) or at least `low`, else one line naming the bound."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"expected a finite {kind.__name__} {'>' if strict else '>='} {low}, "
                                             f"got {text!r}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m suite.measure.duplex", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="minicpmo45", help="workload name(s), comma-separated, or 'all'")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ar", default="none", help="none | busy:<ms>ms | standin | standin:<name>")
    p.add_argument("--sessions", default="1,2,4", help="session counts to run, e.g. 1,2,4,8,16,24")
    p.add_argument("--stock-sessions", default=None, help="session counts for stock (default: --sessions)")
    p.add_argument("--seconds", type=number(float, 0, strict=True), default=60.0,
                   help="seconds of cadence per run (script tiled)")
    p.add_argument("--modes", default="stock,cadence", type=lambda s: [m.strip() for m in s.split(",")])
    p.add_argument("--policy", default="edf", choices=scheduler.POLICIES)
    p.add_argument("--stock-policy", default=None, choices=scheduler.POLICIES,
                   help="policy for stock sessions (default: --policy)")
    p.add_argument("--prepare", default="voice", choices=PREPARES,
                   help="cadence graphs before the cadence: voice (prepare(None), the real figure) or oracle "
                        "(also the session's own script: foreknowledge, labelled)")
    p.add_argument("--variants", type=number(int, 1, strict=False), default=1,
                   help="distinct payload variants across sessions")
    p.add_argument("--depth", default="released", choices=("released", "reduced"))
    p.add_argument("--steps", type=number(int, 1, strict=False), default=None, help="override the workload's Euler steps")
    p.add_argument("--budget-mib", type=number(float, 0, strict=False), default=None,
                   help="memory budget for admission (default: 90%% of free device memory on CUDA, none on CPU)")
    p.add_argument("--after-miss", type=number(int, 0, strict=False), default=1,
                   help="after a mode's first run with a miss, run at most this many larger session counts")
    p.add_argument("--bisect", action="store_true",
                   help="after the list, bisect to the exact largest session count with zero misses")
    p.add_argument("--out", required=True)
    p.add_argument("--quiet", dest="progress", action="store_false")
    return p


def check_args(args: argparse.Namespace) -> None:
    """Every flag's value, before any model is built. Raises SystemExit (status 2) naming the flag."""
    for m in args.modes:
        if m not in MODES:
            raise usage_error(f"--modes: expected a subset of {MODES}, got {m!r}")
    if len(set(args.modes)) != len(args.modes):
        raise usage_error(f"--modes: expected each mode once, got {','.join(args.modes)!r}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise usage_error(f"--out: expected a folder (new or existing), got the file {args.out!r}")
    names = workloads.names() if args.workload == "all" else [w.strip() for w in args.workload.split(",")]
    for name in names:
        if name not in workloads.names():
            raise usage_error(f"--workload: expected 'all' or some of {workloads.names()}, got {name!r}")
        if not any(u.kind == "SPEAK" for u in session_units(workloads.get(name), args.seconds)):
            raise usage_error(f"--seconds: the first {args.seconds:g} s of {name}'s script hold no SPEAK unit "
                              f"(nothing to measure); give more seconds")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise usage_error(f"--device: expected cpu, cuda or cuda:N, got {args.device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise usage_error(f"--device: expected cpu, cuda or cuda:N, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise usage_error(f"--device: {args.device!r} given, but there is no CUDA device here "
                          "(torch.cuda.is_available() is False)")
    try:
        parse_sessions(args.sessions)
        if args.stock_sessions:
            parse_sessions(args.stock_sessions, "--stock-sessions")
        parse_ar(args.ar)
    except (ValueError, ARSpecError) as exc:
        raise usage_error(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    record = run(args, ["python", "-m", "suite.measure.duplex", *argv])
    return 0 if record["verdict"] == "VALID" else EXIT_INVALID


if __name__ == "__main__":
    import faulthandler
    faulthandler.enable()          # a native crash prints its stacks
    sys.exit(main())
