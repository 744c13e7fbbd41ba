"""The live duplex path: SPEAK time against the one-second cadence, and sessions per GPU by a search.

    python -m suite.measure.duplex --workload minicpmo45 --device cuda --modes cadence --policy threads \
        --start 24 --budget-s 240 [--seconds 60] [--prepare oracle] [--checkpoint [WORKLOAD=]PATH] --out DIR

Per workload and mode, a search (suite.measure.search) finds the largest session count N with zero missed
units over `--seconds` (60) of every session's own script: from `--start` it grows by `--grow` while runs are
clean, shrinks while they miss, then bisects, within `--budget-s` wall seconds (it stops with the bracket it
has). `--sessions LIST` runs a fixed list instead (comparison with older records). Each count's sessions
(suite.measure.duplex_run): their own VoxConverse scripts (`--traffic voxconverse`, workloads.traffic: seed
`--seed`, joins spread over `--join-within-s`), or the committed script tiled (`--traffic committed`). A
count is refused before anything is built when the sessions' bytes measured so far (arena + graphs at the end
of a run) times N do not fit the memory budget (the model is resident when it is read), or while building (a
session's own bytes); a refusal is an upper bound, recorded with its reason.

Graphs: each cadence session runs `prepare(None)` at open (the voice), then captures in its slack what its
units met without a graph and the likely next unit's signatures (suite.measure.slack), never inside a timed
unit; `--prepare learned:K` also captures, at open, the K signatures that the most sessions of the learn half of
the recordings meet (workloads.traffic.split), and then runs every session on the serve half only, so nothing of
a session's recording was seen; `--prepare oracle` also captures its own script's signatures at open
(foreknowledge: labelled, never the headline). Policies: "edf" (one thread; slack jobs in idle time, or
`--slack after`: right after the unit) or "threads" (a thread and a CUDA stream per session; sessions that are
not `concurrent` hold their model instance's lock around the tail and their slack captures). Every session's
bytes are compared with the same session run alone (the first `--reference-sessions`; all by default; with
`learned:K` the references capture `prepare(None)` only: graphs change no byte), run after the count, so that
no unit of a session's script runs in the process before that unit arrives on the cadence. Writes
--out/duplex.json (checkpointed after every count's cadence, its bytes pending, and again once they are
compared; verdict PARTIAL until the end). Exit status: 0 VALID, EXIT_INVALID (1) for a complete
INVALID record, 2 for bad arguments.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import workloads
from duplexcadence import runtime
from suite.measure import env, scheduler
from suite.measure.ar_stage import make_ar
from suite.measure.duplex_args import build_parser, check_args, counts_of, names_of
from suite.measure.duplex_run import Traffic, model_bytes, open_entry, plans, reference, run_sessions
from suite.measure.duplex_session import PERIOD_S, check_bytes, learned_graphs, synthetic_payload
from suite.measure.memory import MemoryProbe, release_cached
from suite.measure.search import FixedCounts, SessionSearch
from suite.measure.session import make_spec
from suite.records import (CAPTURE_IN_UNIT, DIRTY_TREE, DUPLEX_SCHEMA, EXIT_INVALID, MIN_SECONDS, NOT_FINISHED,
                           SHORT_RUN, jsonable, max_zero_miss, write_duplex)

MODES = ("stock", "cadence")


def warm_process(workload, mode, model, adapter, spec, ar, device, units: int = 3) -> dict:
    """Before a mode's first count: `units` units of synthetic payload (max_payload each; no session's script)
    on a throwaway session, prepared, then closed, so the process's lazy initialisations (CUDA context,
    cuBLAS/cuDNN handles, kernel loading) do not land on a measured session's first unit. Returns {"units",
    "ms": [...]}."""
    entry = open_entry(workload, mode, model, adapter, spec, ar, device, f"warm/{mode}", [], "voice")
    session, done = entry.driver.session, []
    try:
        caps = session.capabilities
        session.start_turn()
        for k in range(units):
            t0 = time.perf_counter()
            session.speak(synthetic_payload(workload.payload_format, caps.max_payload, seed=100 + k), final=False)
            done.append((time.perf_counter() - t0) * 1e3)
    finally:
        session.close()
    return {"units": len(done), "ms": done}


def _digest(rows: list) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


class ModeSearch:
    """One mode's counts on one model build: the search, the references, the pool (committed traffic), the
    record. `one(n)` runs (or refuses) a count and records it; `estimate_s(n)` is the search's time estimate."""

    def __init__(self, ctx: dict, mode: str, search: SessionSearch, *, policy: str, prepare: str):
        self.ctx, self.mode, self.search, self.policy, self.prepare = ctx, mode, search, policy, prepare
        self.runs, self.refs, self.pool, self.reasons, self.notes = [], {}, [], [], []
        self.per_session_bytes, self.build_s, self.ref_s = None, [], []
        # a learned graph set changes no byte, only what replays: references capture prepare(None) only, so
        # they cost a learned capture set less and compare its replays with mostly eager steps
        self.reference_prepare = "voice" if learned_graphs(prepare) else prepare

    def estimate_s(self, n: int) -> float:
        tr, c = self.ctx["traffic"], self.ctx
        run = tr.seconds + (tr.join_within_s if tr.kind == "voxconverse" else PERIOD_S) + 2 * PERIOD_S
        build = max(0, n - len(self.pool)) * (float(np.mean(self.build_s)) if self.build_s else 0.0)
        limit = n if c["reference_sessions"] is None else min(n, c["reference_sessions"])
        keys = {p.key for p in plans(c["workload"], limit, tr)} if limit else set()
        refs = len(keys - set(self.refs)) * (float(np.mean(self.ref_s)) if self.ref_s else 0.0)
        return run + build + refs

    def refuse(self, n: int, reason: str) -> None:
        self.runs.append({"mode": self.mode, "sessions": n, "refused": reason, "metrics": {"misses": None}})
        self.search.record(n, "refused", reason=reason)
        if self.ctx["progress"]:
            print(f"  {self.ctx['workload'].name} {self.mode} N={n}: refused: {reason}", flush=True)

    def one(self, n: int, checkpoint=None) -> None:
        """Run the count of `n` sessions, then each session alone (its reference, once per script) and compare
        their bytes. checkpoint(): called once the count's cadence has run, its bytes not yet compared (the
        run is in `self.runs` then, its "bytes" pending)."""
        c, t0 = self.ctx, time.monotonic()
        budget = c["budget_bytes"]
        if self.per_session_bytes and budget is not None and n * self.per_session_bytes > budget:
            per = self.per_session_bytes
            return self.refuse(n, f"admission: {n} sessions x {per} bytes (the most one session held at the end of "
                                  f"a run: arena + graphs + its other tensors) = {n * per} bytes > the {budget} bytes "
                                  f"left for sessions beside the model ({c['model_bytes']} bytes)")
        session_plans = plans(c["workload"], n, c["traffic"])
        try:
            run = run_sessions(c["workload"], self.mode, session_plans, model=c["model"], adapter=c["adapter"],
                               spec=c["spec"], ar=c["ar"], device=c["device"], policy=self.policy, slack=c["slack"],
                               budget_bytes=budget, probe=c["probe"], progress=c["progress"],
                               pool=self.pool if c["traffic"].kind == "committed" else None, prepare=self.prepare,
                               clock=c["clock"](), open_at=c["open_at"])
        except (scheduler.AdmissionError, torch.OutOfMemoryError) as exc:
            gc.collect()
            release_cached(c["device"])
            return self.refuse(n, f"{type(exc).__name__}: {exc}")
        run["bytes"] = {"pending": "the sessions alone run after the count"}
        self.runs.append(run)
        if checkpoint is not None:              # the count's cadence is kept even if its references are cut
            checkpoint()
        limit = n if c["reference_sessions"] is None else min(n, c["reference_sessions"])
        for p in session_plans[:limit]:         # after the count: nothing of a script runs before its units
            if p.key not in self.refs:
                t = time.monotonic()
                self.refs[p.key] = reference(c["workload"], self.mode, p, c["model"], c["adapter"], c["spec"],
                                             c["ar"], c["device"], self.reference_prepare)
                self.ref_s.append(time.monotonic() - t)
        run["bytes"] = check_bytes(run, self.refs, [p.key for p in session_plans])
        self.reasons += run["bytes"]["mismatches"]
        if run["captures_inside_timed_units"]:
            self.reasons.append(f"{self.mode} N={n}: {run['captures_inside_timed_units']} {CAPTURE_IN_UNIT}")
        if run["bytes"]["unchecked"]:
            self.notes.append(f"{self.mode} N={n}: {len(run['bytes']['unchecked'])} session(s) not compared with "
                              f"themselves alone (--reference-sessions {c['reference_sessions']})")
        self.build_s += [a["build_s"] for a in run["admission"] if not a["reused"]]
        ends = [s["footprint_end_bytes"] for s in run["capture"]]
        self.per_session_bytes = max([self.per_session_bytes or 0, *ends]) or None
        self.search.record(n, "missed" if run["metrics"]["misses"] else "clean", time.monotonic() - t0)

    def record(self, done: bool) -> dict:
        out = {"runs": self.runs, "max_zero_miss_sessions": max_zero_miss(self.runs), "prepare": self.prepare,
               "policy": self.policy, "search": self.search.to_dict(),
               "references": {"sessions": len(self.refs), "limit": self.ctx["reference_sessions"],
                              "prepare": self.reference_prepare,
                              "digests": {str(k): _digest(v) for k, v in self.refs.items()},
                              "first_session_units": self.refs.get(next(iter(self.refs), None))},
               "admission": {"budget_bytes": self.ctx["budget_bytes"], "model_bytes": self.ctx["model_bytes"],
                             "per_session_bytes_max": self.per_session_bytes}}
        if not done:
            out["partial"] = True
        return out

    def close(self) -> None:
        for e in self.pool:
            e.driver.session.close()
        self.pool.clear()
        gc.collect()


def measure_workload(workload, *, device, ar_spec: str, modes=MODES, policy: dict | str = "edf",
                     traffic: Traffic = Traffic(), counts: dict | None = None, start: dict | int = 1,
                     grow: float = 2.0, max_sessions: int | None = None, budget_s: float | None = None,
                     depth: str = "released", steps: int | None = None, budget_mib: float | None = None,
                     seed: int = 0, after_miss: int = 1, progress: bool = True, on_run=None, prepare: str = "voice",
                     slack: str = "idle", reference_sessions: int | None = None, clock=None,
                     search_clock=time.monotonic, open_at: str = "start") -> dict:
    """Every mode of one workload on one model build, each by its own search (or `counts[mode]`, a fixed list).
    policy, start: one value or {mode: value}. budget_s: wall seconds per mode's search. clock: a factory of the
    scheduler's Clock per run (None: the wall clock). on_run(record so far): after every count. open_at: when
    each session is opened (duplex_run.run_sessions). Returns the workload's record."""
    device = torch.device(device)
    adapter = runtime.adapter(workload.architecture)
    spec = make_spec(workload, steps)
    probe = MemoryProbe(device)
    model = adapter.build_model(spec, device=device, depth=depth, seed=workload.seeds.get("weights", seed))
    ar = make_ar(ar_spec, workload.name, device, depth=depth, seed=seed)
    probe.model_loaded()
    budget = int(budget_mib * 2 ** 20) if budget_mib is not None else (
        int(torch.cuda.mem_get_info(device)[0] * 0.9) if device.type == "cuda" else None)
    ctx = {"workload": workload, "device": device, "adapter": adapter, "spec": spec, "model": model, "ar": ar,
           "probe": probe, "budget_bytes": budget, "model_bytes": model_bytes(model), "traffic": traffic,
           "slack": slack, "reference_sessions": reference_sessions, "progress": progress,
           "clock": clock or (lambda: None), "open_at": open_at}
    out = {"workload": workload.name, "architecture": workload.architecture, "euler_steps": spec.get("n_timesteps"),
           "ar": ar.describe(), "budget_bytes": budget, "model_bytes": ctx["model_bytes"], "modes": {},
           "invalid_reasons": [], "notes": [], "process_warm_up": {}}
    for mode in modes:
        how = prepare if mode != "stock" else "voice"
        mode_policy = policy[mode] if isinstance(policy, dict) else policy
        first = start[mode] if isinstance(start, dict) else start
        search = (FixedCounts(counts[mode], after_miss=after_miss, budget_s=budget_s, clock=search_clock)
                  if counts and counts.get(mode) else
                  SessionSearch(first, grow=grow, max_sessions=max_sessions, budget_s=budget_s, clock=search_clock))
        ms = ModeSearch(ctx, mode, search, policy=mode_policy, prepare=how)
        out["process_warm_up"][mode] = warm_process(workload, mode, model, adapter, spec, ar, device)
        try:
            def checkpoint():
                out["modes"][mode] = ms.record(done=False)
                if on_run is not None:
                    on_run({**out, "invalid_reasons": out["invalid_reasons"] + ms.reasons})
            while (n := search.next(ms.estimate_s)) is not None:
                ms.one(n, checkpoint)
                checkpoint()
        finally:
            ms.close()
        out["modes"][mode] = ms.record(done=True)
        out["invalid_reasons"] += ms.reasons
        out["notes"] += ms.notes
        if progress:
            b = search.bracket()
            print(f"  {workload.name} {mode}: bracket lo={b.lo} hi={b.hi} ({'exact' if b.exact else 'not exact'}); "
                  f"stopped: {search.stopped}", flush=True)
    return out


def run(args, command: list[str] | None = None) -> dict:
    """The CLI's work: every workload, duplex.json in args.out (checkpointed). Returns the record."""
    names = names_of(args.workload)
    device = torch.device(args.device)
    counts = counts_of(args)
    policies = {m: (args.stock_policy if (m == "stock" and args.stock_policy) else args.policy) for m in args.modes}
    starts = {m: (args.stock_start if (m == "stock" and args.stock_start) else args.start) for m in args.modes}
    traffic = Traffic(args.traffic, args.seconds, args.seed, args.join_within_s, args.variants,
                      recordings=args.recordings or ("serve" if learned_graphs(args.prepare) else "all"))
    prov = env.provenance(command, device=device)
    record = {"schema": DUPLEX_SCHEMA, "provenance": prov, "parameters": {
        "ar": args.ar, "seconds": args.seconds, "policy": policies, "traffic": args.traffic, "seed": args.seed,
        "join_within_s": args.join_within_s, "variants": args.variants, "depth": args.depth, "steps": args.steps,
        "period_s": PERIOD_S, "budget_mib": args.budget_mib, "modes": list(args.modes), "prepare": args.prepare,
        "recordings": traffic.recordings,
        "slack": args.slack, "reference_sessions": args.reference_sessions, "open_at": args.open_at,
        "search": {"start": starts, "grow": args.grow, "max_sessions": args.max_sessions, "budget_s": args.budget_s},
        "sessions": counts, "after_miss": args.after_miss}, "workloads": {}}
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
                print(f"{name}: modes {','.join(args.modes)} ar={args.ar} traffic={args.traffic} seconds="
                      f"{args.seconds:g} start={starts} budget_s={args.budget_s} prepare={args.prepare}", flush=True)
            record["workloads"][name] = measure_workload(
                workloads.get(name), device=device, ar_spec=args.ar, modes=args.modes, policy=policies,
                traffic=traffic, counts=counts, start=starts, grow=args.grow, max_sessions=args.max_sessions,
                budget_s=args.budget_s, depth=args.depth, steps=args.steps, budget_mib=args.budget_mib,
                after_miss=args.after_miss, progress=args.progress, on_run=checkpoint, prepare=args.prepare,
                slack=args.slack, reference_sessions=args.reference_sessions, open_at=args.open_at)
    reasons = [r for w in record["workloads"].values() for r in w["invalid_reasons"]]
    if prov.get("git_dirty"):
        reasons.append(DIRTY_TREE)
    if args.seconds < MIN_SECONDS:
        reasons.append(f"{args.seconds:g} s < {MIN_SECONDS:g} s: {SHORT_RUN}")
    record["verdict"] = "INVALID" if reasons else "VALID"
    record["invalid_reasons"] = reasons
    write_duplex(out / "duplex.json", jsonable(record))
    if args.progress:
        for name, w in record["workloads"].items():
            for mode, m in w["modes"].items():
                b = m["search"]["bracket"]
                print(f"{name} {mode}: max sessions with zero misses = {m['max_zero_miss_sessions']} "
                      f"(bracket {b['lo']}..{b['hi']}, {'exact' if b['exact'] else 'not exact'})")
        print(f"verdict {record['verdict']}" + (f": {reasons}" if reasons else ""))
        print(f"wrote {out / 'duplex.json'}")
    return record


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    if args.checkpoints:                   # what make_spec reads; it names the weights in the record's provenance
        os.environ[env.CHECKPOINT_ENV] = json.dumps(args.checkpoints, sort_keys=True)
    record = run(args, ["python", "-m", "suite.measure.duplex", *argv])
    return 0 if record["verdict"] == "VALID" else EXIT_INVALID


if __name__ == "__main__":
    import faulthandler
    faulthandler.enable()          # a native crash prints its stacks
    sys.exit(main())
