"""Sessions that share a model stay independent under load: N host threads open, speak and close sessions of
mixed workloads on one device, and every unit's bytes are compared with the same session run alone.

    python -m suite.measure.stress --workloads minicpmo45,moshi,qwen3_omni,stepaudio2_mini --device cuda \
        --threads 16 --seconds 600 --seed 0 --out DIR

One model instance per workload (built as the other harnesses build it), shared by every session of that
workload, stock and cadence mixed. Until --seconds are up each thread draws, from its own seeded generator,
a workload, a mode, one of the workload's --scripts session scripts (`workloads.traffic`: real turn-taking
windows of --script-seconds, payloads from their own seeds) and a unit count n in [0, --max-units]; it opens
a session (`prepare(None)`: what a server captures for the voice), speaks the first n units of the script
that carry work (`start_turn()` at a turn's first SPEAK unit, `final` on its last), closes it, mid-turn or
not, and draws the next. Nothing is paced: the threads speak as fast as they can, so their steps interleave.

Before the threads start, on CUDA (--no-warm-up skips it): --threads DuplexCadence sessions of each workload
open at once, each speaking the first --max-units units of a script, then closed (Stress.warm_up). The CUDA
driver keeps the memory of destroyed graph executables for later graphs, at the high-water of graph nodes
instantiated at once; without the warm-up the memory samples step up whenever the random draws first hold
more graph sessions at once, which is a high-water, not growth per close.

Sessions an adapter refuses to share: a ConcurrencyError at open is retried whenever another session of the
model closes (counted: refused_at_open); a session whose `capabilities.concurrent` is False makes every call
under a lock of its model instance that the harness holds (counted: serialised), as suite.measure.duplex's
threads policy does. Every other exception is recorded with its traceback and counted; the session is
closed and the thread goes on.

Reference: after the stress, each (workload, mode, script) that ran is run alone, sequentially, in this
process, up to the longest prefix any of its sessions spoke, on the same instance (--reference shared) or
on one built the same way (fresh); with --reference shared-first, every combination a thread can draw is run
alone to --max-units before the warm-up instead, so that a run cut after its threads still compares its units
(the record written when the threads are done then holds the comparison). Every unit's sha256 (float32
waveform, int16 PCM) must equal its session's. The threads and sessions: suite.measure.stress_session; memory:
suite.measure.trend (a sample after every close, and the flatness rule). DIR/stress.json (schema STRESS_SCHEMA) is written when the
threads are done (verdict PARTIAL) and again at the end, with the references' wall seconds (a run that must
fit a time limit leaves them that: they grow with the (workload, mode, script) combinations that ran); a
short table is printed last. Exit status 0 only
with zero differing units, zero exceptions, flat memory and nothing left in force (bind patches, leased
capture streams); EXIT_INVALID (1) otherwise; 2 for bad arguments. The CUDA graphs still alive once every
session closed are counted (checks.cuda_graphs_alive_after), and so is the physical memory still mapped in
arenas' CUDA virtual ranges (checks.vmm_mapped_mib_after); neither is judged. Last, memory.residue: what torch
still holds allocated on the device (of it, the cuBLAS / cuBLASLt workspaces), with the allocation sites of those
blocks under --memory-sites (every allocation's Python stack recorded: slower).

Memory flatness is judged on a sample after every close, fitted with the counts of open sessions and in-call
threads (suite.measure.trend.RULE), or with --quiesce-every K on quiescent samples: once K more closes are done,
each thread parks at its next draw until every thread has, and the sample is taken with no session open
(trend.QUIET_RULE); the per-close samples and their fit stay in the record (memory.flatness_every_close), and
summary.parked_s says how many thread-seconds the drains cost. Each quiescent sample also reads the C heap
and torch's pinned host blocks (heap.host_heap_mib), fitted the same way into memory.host_flatness and the
table's "(not judged)" rows: whether an RSS that rises is memory still in use or memory malloc keeps; and the
entries of the libraries' per-shape caches (memory.library_caches: torch's cuFFT plans), which hold host memory
for every new shape met until they fill; and (memory.quiescent.high_water) the most DuplexCadence sessions of each
workload, and of all, open at once so far, which the driver's graph memory follows. With --trace-python N, Python's own allocations are traced while the
threads run (slower) and the N lines whose bytes grew most over the judged window are recorded
(memory.python_sites, trend.PythonSites), each quiescent sample's traced MiB among the host rows.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from tabulate import tabulate

import workloads
from duplexcadence import bind, gate, graphs, runtime, vmm
from suite.measure import env, memory, trend
from suite.measure.session import make_spec
from suite.measure.stress_session import HANG_S, COLUMNS, Stress, Target, by_kind, compare, every_combination, references
from suite.records import DIRTY_TREE, EXIT_INVALID, NOT_FINISHED, STRESS_SCHEMA, jsonable
from workloads import traffic

MODES = ("stock", "cadence")
REFERENCES = ("shared", "fresh", "shared-first")
KEPT_DIFFERENCES = 200         # differing units kept in the record (all are counted)


def build_targets(names, device, *, depth="released", steps=None, prompt_seconds=None, seed=0, scripts=4,
                  script_seconds=30) -> list[Target]:
    """A Target per workload name, its model built (seeded weights: the workload's seeds["weights"]) and its
    `scripts` session scripts from `workloads.traffic(architecture, scripts, units=script_seconds, seed=seed)`.
    steps / prompt_seconds: override Euler steps and voice-prompt seconds where the workload has them.
    Raises KeyError for an unknown workload."""
    out = []
    for name in names:
        wl = workloads.get(name)
        spec = make_spec(wl, steps if wl.euler_steps is not None else None)
        if prompt_seconds is not None and wl.voice_prompt is not None:
            spec["prompt_seconds"] = prompt_seconds
        adapter = runtime.adapter(wl.architecture)

        def build(adapter=adapter, spec=spec, wl=wl):
            return adapter.build_model(spec, device=device, depth=depth, seed=wl.seeds.get("weights", 0))
        arrivals = traffic.traffic(wl.architecture, scripts, units=script_seconds, seed=seed)
        target = Target(name, wl.architecture, adapter, spec, [a.script for a in arrivals], build)
        target.model = build()
        out.append(target)
    return out


# --- the run --------------------------------------------------------------------------------------------
def stress_run(targets, *, modes=MODES, threads=16, seconds=600.0, seed=0, max_units=12, device="cpu",
               window=trend.WINDOW, reference="shared", progress=True, hang_s=HANG_S, on_stress=None,
               memory_sites: bool = False, quiesce_every: int = 0, warm_up: bool = True,
               trace_python: int = 0, trim_heap: bool = False) -> dict:
    """The stress on built `targets` and its record (without provenance): parameters, summary, per-kind rows,
    sessions, differences, exceptions, references, memory (samples, flatness, start / end, and the residue once
    everything closed: suite.measure.memory.residue, with allocation sites when `memory_sites` recorded them),
    checks, reasons. on_stress(record): called once the threads are done, before the references run, with the
    record so far (no unit compared yet). quiesce_every: closes between quiescent samples, 0 for none (module
    docstring). warm_up: Stress.warm_up before the threads start (CUDA with "cadence" only). trace_python: with
    quiescent samples, trace Python's allocations from the threads' start to their end and record the lines
    whose bytes grew most over the judged window (trend.PythonSites; memory.python_sites, this many lines; 0:
    off). trim_heap: at each quiescent sample, after reading it, hand malloc's free pages back to the kernel
    and record RSS after (trend.MemorySampler.sample_quiet: host part "rss_trimmed_mib", not judged). Raises
    ValueError for an unknown mode or reference, or a quiesce_every that is no int >= 0, or a trace_python that
    is no int >= 0, or trace_python or trim_heap set without quiescent samples."""
    if isinstance(trace_python, bool) or not isinstance(trace_python, int) or trace_python < 0 \
            or (trace_python and not quiesce_every):
        raise ValueError(f"trace_python: expected an int >= 0 (0: off), and quiesce_every > 0 with it; got "
                         f"{trace_python!r} with quiesce_every {quiesce_every!r}")
    if not isinstance(trim_heap, bool) or (trim_heap and not quiesce_every):
        raise ValueError(f"trim_heap: expected a bool, and quiesce_every > 0 with True; got {trim_heap!r} with "
                         f"quiesce_every {quiesce_every!r}")
    if any(m not in MODES for m in modes) or reference not in REFERENCES:
        raise ValueError(f"modes: expected a subset of {MODES}, reference one of {REFERENCES}; got {modes}, "
                         f"{reference!r}")
    with memory.allocation_history(torch.device(device), enabled=memory_sites) as history:
        return _stress_run(targets, modes, threads, seconds, seed, max_units, device, window, reference, progress,
                           hang_s, on_stress, history if memory_sites else None, quiesce_every, warm_up,
                           trace_python, trim_heap)


def _stress_run(targets, modes, threads, seconds, seed, max_units, device, window, reference, progress, hang_s,
                on_stress, history, quiesce_every, warm_up, trace_python, trim_heap) -> dict:
    stress = Stress(targets, modes, threads=threads, seconds=seconds, seed=seed, max_units=max_units,
                    device=device, progress=progress, hang_s=hang_s, quiesce_every=quiesce_every)
    facts, refs = {}, None
    if reference == "shared-first":
        refs = _timed_references(stress, facts, progress, longest=every_combination(stress))
    facts["before_warm_up"] = stress.sampler.now()
    facts["warm_up"] = stress.warm_up() if warm_up else None
    if progress and facts["warm_up"]:
        print(f"  warm-up: {facts['warm_up']}", flush=True)
    before = len(stress.exceptions)
    stress.sampler.trim_heap = trim_heap
    sites = stress.sampler.python_sites = trend.PythonSites(trace_python) if trace_python else None
    if sites is not None:
        sites.start()
    try:
        facts.update(start=stress.sampler.now(), wall_s=stress.run())
    finally:
        if sites is not None:
            sites.stop()
    if stress.device.type == "cuda":
        gate.synchronize(stress.device)
    facts.update(end=stress.sampler.now(), in_stress=len(stress.exceptions) - before,
                 checks={"bind_patches_live_after": bind.live(), "streams_leased_after": graphs.STREAMS.leased(),
                         "cuda_graphs_alive_after": alive(torch.cuda.CUDAGraph), "vmm_mapped_mib_after": vmm_mapped_mib()})
    params = {"workloads": [t.name for t in targets], "modes": list(modes), "threads": threads, "seconds": seconds,
              "seed": seed, "max_units": max_units, "window": window, "quiesce_every": quiesce_every,
              "warm_up": warm_up, "trace_python": trace_python, "trim_heap": trim_heap,
              "hang_s": hang_s, "reference": reference,
              "device": str(device), "specs": {t.name: t.spec for t in targets},
              "scripts": {t.name: [str(s.path) for s in t.scripts] for t in targets}}
    if on_stress is not None:
        on_stress(judge(stress, refs, params, facts, finished=False))
    if progress:
        print(f"  stress done: {len(stress.sessions)} sessions in {facts['wall_s']:.0f} s", flush=True)
    if refs is None:
        refs = _timed_references(stress, facts, progress, fresh=reference == "fresh")
    facts["residue"] = memory.residue(stress.device, history)
    return judge(stress, refs, params, facts)


def _timed_references(stress: Stress, facts: dict, progress: bool, **kw) -> dict:
    """references(stress, **kw), its wall seconds in facts["references_s"], a progress line after."""
    t0 = time.perf_counter()
    refs = references(stress, **kw)
    facts["references_s"] = time.perf_counter() - t0
    if progress:
        print(f"  references done: {len(refs)} sessions alone in {facts['references_s']:.0f} s", flush=True)
    return refs


def alive(kind: type) -> int:
    """How many objects of `kind` the cycle collector reaches, after a collection (a closed session's CUDA graphs
    still referenced somewhere hold their graph exec, which torch's allocator does not count). Recorded, not
    judged: the memory rule judges what they cost."""
    return len(_collected(kind))


def vmm_mapped_mib() -> float:
    """MiB of physical memory still mapped in CUDA virtual ranges (duplexcadence.vmm.Reservation, the arenas'
    vmm backend) that the cycle collector reaches, after a collection: a closed session's arena that was never
    closed holds its granules at the driver, outside torch's allocator. Recorded, not judged: the memory rule
    judges what they cost."""
    return sum(o.mapped_bytes for o in _collected(vmm.Reservation)) / 2 ** 20


def _collected(kind: type) -> list:
    """The objects of `kind` the cycle collector tracks, after a collection. isinstance on every object touches
    torch's deprecated module attributes (torch.distributed.reduce_op), whose FutureWarning is kept out of the
    console."""
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return [o for o in gc.get_objects() if isinstance(o, kind)]


def judge(stress: Stress, refs: dict | None, params: dict, facts: dict, finished: bool = True) -> dict:
    """The record of the stress against `refs` (None: not run yet; the record then says so); `finished` False
    while the run has more to do (the references, or the residue once the references ran first)."""
    compared, missing, diffs = compare(stress.sessions, refs or {})
    series = stress.sampler.series()
    per_close = trend.judge(series, params["window"])
    quiet = stress.sampler.quiet_series() if stress.quiesce_every else None
    flat = trend.judge_quiet(quiet, params["window"]) if quiet is not None else per_close
    kinds = by_kind(stress.sessions, diffs, stress.exceptions)
    summary = {"wall_s": facts["wall_s"], "references_s": facts.get("references_s"),
               "cycles": len(series["memory"].get("rss_mib", [])),
               **{c: sum(k[c] for k in kinds.values()) for c in COLUMNS}, "units_compared": compared,
               "units_without_reference": missing, "exceptions": len(stress.exceptions),
               "quiescent_samples": len(quiet["closes"]) if quiet is not None else None,
               "parked_s": stress.parked_s if quiet is not None else None}
    reasons = [f"{len(diffs)} of {compared} units differ from the same session run alone"] if diffs else []
    if stress.exceptions:
        reasons.append(f"{len(stress.exceptions)} exceptions ({facts['in_stress']} in the stress, "
                       f"{len(stress.exceptions) - facts['in_stress']} in the references)")
    if stress.hung:
        reasons.append(f"{stress.hung} threads hung (still running {params['hang_s']:g} s after the deadline; "
                       f"their stacks are in the exceptions): no reference was run")
    if refs is None:
        reasons.append(f"{NOT_FINISHED}: the references have not run yet")
    elif not finished:
        reasons.append(f"{NOT_FINISHED}: what stays allocated after every session closed is not read yet")
    elif missing:
        reasons.append(f"{missing} units have no reference (its run alone failed or spoke less)")
    if refs is not None and not compared:
        reasons.append("no unit was compared")
    reasons += [f"memory {name} not flat: {f['reason']}" for name, f in flat.items() if not f["flat"]]
    if not flat:
        reasons.append(f"memory: no {'quiescent ' if quiet is not None else ''}sample taken ({summary['cycles']} "
                       f"closes): flatness not shown")
    checks = facts["checks"]
    if checks["bind_patches_live_after"]:
        reasons.append(f"{checks['bind_patches_live_after']} bind patches still in force after every session closed")
    if checks["streams_leased_after"]:
        reasons.append(f"{checks['streams_leased_after']} CUDA streams still leased after every session closed (a "
                       f"closed session's graph cache is alive)")
    return {"parameters": params, "summary": summary, "by_kind": kinds,
            "sessions": [r.row() for r in stress.sessions], "differences": diffs[:KEPT_DIFFERENCES],
            "exceptions": list(stress.exceptions),
            "references": {"/".join(map(str, k)): {"units": len(r.hashes), "sha256": r.hashes}
                           for k, r in (refs or {}).items()},
            "memory": {"rule": trend.QUIET_RULE if quiet is not None else trend.RULE, "window": params["window"],
                       "judged_on": "quiescent samples" if quiet is not None else "every close",
                       "driver_source": stress.sampler.driver_source,
                       "before_warm_up": facts.get("before_warm_up"), "warm_up": facts.get("warm_up"),
                       "start": facts["start"], "end": facts["end"], "residue": facts.get("residue"),
                       "flatness": flat, "samples": series,
                       "python_sites": (stress.sampler.python_sites.growth(params["window"])
                                        if stress.sampler.python_sites is not None else None),
                       **({"quiescent": quiet, "flatness_every_close": per_close,
                           "host_flatness": trend.judge_quiet(quiet, params["window"], part="host")}
                          if quiet is not None else {})},
            "checks": checks, "invalid_reasons": reasons, "finished": finished and refs is not None}


def table(record: dict) -> str:
    """The short summary table: per kind, then per memory series, then the verdict."""
    cols = ("sessions", "serialised", "refused_at_open", "closed_mid_turn", "units", "differing_units", "exceptions",
            "eager_fallbacks", "warmup_runs", "capture_failures")
    kinds = tabulate([[k, *(v[c] for c in cols)] for k, v in record["by_kind"].items()],
                     headers=["workload/mode", *(c.replace("_", " ") for c in cols)])
    mem = [[name, f["cycles"], f.get("slope_mib_per_cycle"), f.get("growth_pct"), f["flat"]]
           for name, f in record["memory"]["flatness"].items()]
    mem += [[f"{name} (not judged)", f["cycles"], f.get("slope_mib_per_cycle"), f.get("growth_pct"),
             "flat" if f["flat"] else "not flat"]
            for name, f in record["memory"].get("host_flatness", {}).items()]
    mem = tabulate(mem, headers=[f"memory ({record['memory'].get('judged_on', 'every close')})", "cycles",
                                 "slope MiB/cycle", "growth %", "flat"], floatfmt=".3f")
    reasons = record["invalid_reasons"]
    checks = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in record["checks"].items())
    caches = (record["memory"].get("quiescent") or {}).get("caches") or {}
    for name, values in caches.items():
        seen = [(c, v) for c, v in zip(record["memory"]["quiescent"]["closes"], values) if v is not None]
        if seen:
            checks += (f"\n{name.replace('_', ' ')} at quiescent samples: {seen[0][1]} after close {seen[0][0]}, "
                       f"{seen[-1][1]} after close {seen[-1][0]}")
    most = (record["memory"].get("quiescent") or {}).get("high_water") or {}
    if most:
        closes = record["memory"]["quiescent"]["closes"]
        checks += "\nDuplexCadence sessions open at once, the most so far at the first and last quiescent sample: " + \
            ", ".join(f"{k.removeprefix('open:').removesuffix('/cadence')} {v[0]} -> {v[-1]}" for k, v in most.items()
                      if v) + f" (closes {closes[0]} -> {closes[-1]})"
    res = record["memory"].get("residue") or {}
    if res:
        ws = res["cublas_workspaces_mib"]
        checks += (f"\nonce every session closed: torch allocated {res['allocated_mib']:.0f} MiB, reserved "
                   f"{res['reserved_mib']:.0f} MiB, of it cuBLAS workspaces {'?' if ws is None else f'{ws:.0f}'} MiB")
    return (f"{kinds}\n\n{mem}\n\n{checks}\n\nverdict {record['verdict']}"
            + (f": {'; '.join(reasons)}" if reasons else ""))


def run(args: argparse.Namespace, command: list[str] | None = None) -> dict:
    """The CLI's work: build the targets, run, write args.out/stress.json, print the table. Returns the record."""
    device = torch.device(args.device)
    prov = env.provenance(command, device=device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with env.deterministic() as det:
        if args.progress:
            print(f"stress: building {', '.join(args.workloads)} on {device} ({args.depth})", flush=True)
        targets = build_targets(args.workloads, device, depth=args.depth, steps=args.steps,
                                prompt_seconds=args.prompt_seconds, seed=args.seed, scripts=args.scripts,
                                script_seconds=args.script_seconds)

        def write(body: dict) -> dict:
            reasons = body.pop("invalid_reasons") + ([DIRTY_TREE] if prov.get("git_dirty") else [])
            verdict = ("INVALID" if reasons else "VALID") if body.pop("finished") else "PARTIAL"
            record = {"schema": STRESS_SCHEMA, "provenance": prov, "determinism": det, **body,
                      "verdict": verdict, "invalid_reasons": reasons}
            (out / "stress.json").write_text(json.dumps(jsonable(record), indent=1) + "\n")
            return record
        record = write(stress_run(targets, modes=args.modes, threads=args.threads, seconds=args.seconds,
                                  seed=args.seed, max_units=args.max_units, device=device, window=args.window,
                                  reference=args.reference, progress=args.progress, hang_s=args.hang_s,
                                  on_stress=write, memory_sites=args.memory_sites,
                                  quiesce_every=args.quiesce_every, warm_up=args.warm_up,
                                  trace_python=args.trace_python, trim_heap=args.trim_heap))
    if args.progress:
        print(f"wrote {out / 'stress.json'}")
    print(table(record), flush=True)
    return record


def _at_least(kind, low, strict: bool = False):
    """An argparse type: a finite `kind` >= low (> low when strict), else an error naming the bound."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not abs(value) < float("inf") or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"expected a finite {kind.__name__} {'>' if strict else '>='} {low}, "
                                             f"got {text!r}")
        return value
    return parse


def _names(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m suite.measure.stress", description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", type=_names, default=["minicpmo45", "moshi", "qwen3_omni", "stepaudio2_mini"],
                   help="workload names, comma-separated")
    p.add_argument("--modes", type=_names, default=list(MODES), help="modes to mix, comma-separated")
    p.add_argument("--device", type=env.device_arg, default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=_at_least(int, 1), default=16)
    p.add_argument("--seconds", type=_at_least(float, 0, strict=True), default=600.0, help="seconds of stress")
    p.add_argument("--seed", type=_at_least(int, 0), default=0)
    p.add_argument("--max-units", type=_at_least(int, 1), default=12,
                   help="most units with work a session speaks before it closes (each draws 0 to this many)")
    p.add_argument("--scripts", type=_at_least(int, 1), default=4, help="session scripts per workload")
    p.add_argument("--script-seconds", type=_at_least(int, 1), default=30,
                   help="length of each session script (seconds of turn timings)")
    p.add_argument("--window", type=_at_least(int, 2 * trend.QUARTERS), default=trend.WINDOW,
                   help="closes the memory rule is judged over (the last ones)")
    p.add_argument("--quiesce-every", type=_at_least(int, 0), default=0, metavar="K",
                   help="judge memory on samples with no session open, taken every K closes (0: a sample after "
                        "every close, fitted with the open counts)")
    p.add_argument("--reference", choices=REFERENCES, default="shared",
                   help="the sessions run alone after the threads on the stress's instances (shared) or on new ones "
                        "built the same way (fresh); shared-first: every combination a thread can draw, run alone "
                        "on the stress's instances to --max-units before the warm-up, so that a run cut after its "
                        "threads still compares every unit")
    p.add_argument("--hang-s", type=_at_least(float, 0, strict=True), default=HANG_S,
                   help="a thread still in a session this long after the deadline is recorded as hung")
    p.add_argument("--depth", default="released", choices=("released", "reduced"))
    p.add_argument("--steps", type=_at_least(int, 1), default=None, help="override the Euler steps")
    p.add_argument("--prompt-seconds", type=_at_least(float, 0, strict=True), default=None,
                   help="override the voice prompt's seconds")
    p.add_argument("--out", required=True, type=env.out_folder)
    p.add_argument("--memory-sites", action="store_true",
                   help="record every CUDA allocation's Python stack (slower) so the residue names its sites")
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                   help="skip the warm-up (threads DuplexCadence sessions of each workload open at once, then "
                        "closed) that sets the driver's graph-executable high-water before the threads start")
    p.add_argument("--trace-python", type=_at_least(int, 0), default=0, metavar="N",
                   help="with --quiesce-every: trace Python's allocations while the threads run (several times "
                        "slower: too few closes for a flatness verdict in a short run) and "
                        "record the N source lines whose bytes grew most over the judged window (0: off)")
    p.add_argument("--trim-heap", action="store_true",
                   help="with --quiesce-every: at each quiescent sample, after reading it, hand malloc's free pages "
                        "back to the kernel (glibc malloc_trim) and record RSS after (not judged); the judged RSS "
                        "then holds what malloc kept since the previous sample only")
    p.add_argument("--quiet", dest="progress", action="store_false")
    return p


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every flag's value, before any model is built: parser.error (exit status 2) naming the flag."""
    unknown = [n for n in args.workloads if n not in workloads.names()]
    if unknown or not args.workloads or len(set(args.workloads)) != len(args.workloads):
        parser.error(f"--workloads: expected distinct names of {workloads.names()}, got {args.workloads}")
    if not args.modes or any(m not in MODES for m in args.modes) or len(set(args.modes)) != len(args.modes):
        parser.error(f"--modes: expected distinct modes of {list(MODES)}, got {args.modes}")
    if args.trace_python and not args.quiesce_every:
        parser.error(f"--trace-python: needs --quiesce-every K > 0 (the lines are read at quiescent samples), got "
                     f"--trace-python {args.trace_python} with --quiesce-every {args.quiesce_every}")
    if args.trim_heap and not args.quiesce_every:
        parser.error("--trim-heap: needs --quiesce-every K > 0 (the heap is trimmed at quiescent samples)")
    flow = [n for n in args.workloads if workloads.get(n).euler_steps is not None]   # --steps applies to these
    if args.steps is not None and not flow:
        parser.error(f"--steps: none of {args.workloads} has Euler steps (codec decoders); leave it out")
    try:
        env.check_steps_apply(flow, args.steps)
    except ValueError as exc:
        parser.error(str(exc))
    from workloads import traffic
    if not traffic.windows(args.script_seconds):
        parser.error(f"--script-seconds: no usable window of {args.script_seconds} s in the recordings "
                     f"(workloads.traffic: a window needs {traffic.MIN_TURNS} turns and {traffic.MIN_SPEAK_UNITS} "
                     f"SPEAK units)")


def exit_status(record: dict) -> int:
    return 0 if record["verdict"] == "VALID" else EXIT_INVALID


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    return exit_status(run(args, ["python", "-m", "suite.measure.stress", *argv]))


if __name__ == "__main__":
    import faulthandler
    faulthandler.enable()
    sys.exit(main())
