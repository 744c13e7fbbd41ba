"""`make reproduce`: the staged, resumable reproduction of every claim, merged into one REPORT.md.

    python -m suite.reproduce [--workload W|all] [--stages PATTERNS] [--device auto|cpu|cuda] [--steps N]
        [--seconds S] [--max-speak-units N] [--depth released|reduced] [--seed N] [--out results/]
        [--run-dir DIR] [--resume] [--budget-s S] [--stage-budget-s S] [--ray auto|local|ADDRESS]
        [--processes N] [--passes P] [--checkpoint [WORKLOAD=]PATH ...] [--compare REF ...] [--list]

Each stage (suite.stages.plan) runs in a process of its own with a time budget; state in
`<run dir>/stages.json`, records in `<run dir>/<stage>/`, the merged report `<run dir>/REPORT.md` rewritten
after every stage. Without --ray one stage at a time here; with --ray every stage is a Ray task
(suite.stages.on_ray: `auto` or an address joins a cluster, `local` starts an instance here), timed stages
alone on their host, a failed stage run once more. --ray is not recorded: a run resumes with or without it.
Defaults: CUDA, every workload through the default harnesses; CPU, the default workload's verify over its
first CPU_DEFAULT_SPEAK_UNITS SPEAK units (the pipeline and the bytes, no speed). `--resume` continues
--run-dir with the same options; `--budget-s` bounds the sitting. Exit status: 0 every selected stage done
or skipped and every record byte-identical and VALID (or INVALID for too few units of a run cut short on
purpose); 1 a stage failed or a record is not; 2 bad arguments or run folder; 3 budget spent, stages pending.
`--checkpoint W=PATH` builds workload W from real weights in its released layout (docs/weights.md): the stage
processes get it through their environment (suite.measure.env.CHECKPOINT_ENV); records say so (`weights`).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path

import torch

import workloads
from suite.measure import env
from suite.measure.session import select_units
from suite.records import DEFAULT_HARNESSES, HARNESSES, StateError, device_short_name, device_type, family
from suite.report import document, single
from suite.report.figures import load_reference
from suite.stages import plan as plans
from suite.stages.on_ray import run_plan_ray
from suite.stages.process import kill_live_stages
from suite.stages.run import bytes_clause, run_plan, subprocess_executor
from suite.stages.state import State

CPU_DEFAULT_SPEAK_UNITS = 4     # two turns (2 + first and final of the next)
EXIT_PENDING = 3
CPU_SPEED_NOTE = ("speed: not measured: a CPU run checks the pipeline and the bytes; its times are no speed "
                  "measurement (run on a GPU for the speed, memory and sessions-per-GPU claims)")


def resolve_device(name: str) -> str:
    """'auto' -> 'cuda' if available else 'cpu'. Raises ValueError for 'cuda' without CUDA, or a name that is
    neither cpu nor cuda[:N]."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not (name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ValueError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (torch {torch.__version__}); "
                         f"use --device cpu or auto")
    return name


def positive(kind):
    """An argparse type: a finite `kind` > 0, else one line naming what was expected and what came."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"expected a finite positive {kind.__name__}, got {text!r}")
        return value
    return parse


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m suite.reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default=None,
                    help="workload name, comma-separated names, or 'all' (default: all on CUDA, minicpmo45 on CPU)")
    ap.add_argument("--stages", default=None,
                    help="comma-separated stage globs or names: 'minicpmo45.*', '*.memory_*', 'verify', 'memory', "
                         "'duplex', 'duplex_cadence' (default: every default harness on CUDA, verify on CPU)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--steps", type=positive(int), default=None, help="Euler steps (default: the workload's)")
    ap.add_argument("--seconds", type=positive(float), default=None, help="only units starting before S seconds")
    ap.add_argument("--max-speak-units", type=positive(int), default=None,
                    help=f"only the first N SPEAK units (CPU default {CPU_DEFAULT_SPEAK_UNITS})")
    ap.add_argument("--depth", choices=("released", "reduced"), default="released")
    ap.add_argument("--seed", type=env.seed_arg, default=None, help="weights seed (default: the workload's)")
    ap.add_argument("--out", default="results", help="results root for a new run folder (default results/)")
    ap.add_argument("--run-dir", default=None, help="the run folder (default <out>/<date>-<device>-reproduce)")
    ap.add_argument("--resume", action="store_true", help="continue --run-dir: keep done stages")
    ap.add_argument("--budget-s", type=positive(float), default=None, help="wall-clock budget of this sitting")
    ap.add_argument("--stage-budget-s", type=positive(float), default=None,
                    help="every stage's budget (default: suite.stages.plan.BUDGET_S by harness and device)")
    ap.add_argument("--ray", default=None, metavar="auto|local|ADDRESS",
                    help="run the stages as Ray tasks: on the cluster at ADDRESS (auto: the one this machine is "
                         "part of), or on a Ray instance started here (local)")
    ap.add_argument("--processes", type=positive(int), default=None,
                    help="verify: fresh processes per workload (default 3 on CUDA, 1 on CPU: "
                         "suite.stages.plan.VERIFY_PROTOCOL)")
    ap.add_argument("--passes", type=positive(int), default=None,
                    help="verify: walks of the script in the paired run (default 1)")
    ap.add_argument("--checkpoint", action="append", default=None, metavar="[WORKLOAD=]PATH",
                    help="build WORKLOAD from the checkpoint at PATH (its released layout; repeatable; PATH alone "
                         "with one workload); default: seeded random weights")
    ap.add_argument("--compare", action="append", default=None, metavar="REF",
                    help="a reference run folder to compare ratios with (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the stages and their state, run nothing")
    return ap.parse_args(argv)


def tolerated(codes: list[str], limited: bool) -> bool:
    """True if every INVALID code is 'few_units' of a run cut short on purpose (and there is one). A duplex
    stage's codes are never tolerated: a duplex stage runs 60 s per count whatever --seconds says."""
    return limited and bool(codes) and all(c == "few_units" for c in codes)


def names_of(arg: str | None, device: str) -> list[str]:
    if arg is None:
        return workloads.names() if device.startswith("cuda") else [workloads.DEFAULT]
    if arg == "all":
        return workloads.names()
    names = [n.strip() for n in arg.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--workload {arg!r}: no workload named; expected 'all' or some of {workloads.names()}")
    unknown = [n for n in names if n not in workloads.names()]
    if unknown:
        raise ValueError(f"--workload {','.join(unknown)}: unknown workload; expected 'all' or some of "
                         f"{workloads.names()}")
    return names


def run_dir_of(args, device: str) -> Path:
    if args.run_dir:
        return Path(args.run_dir)
    slug = "cpu"
    if device != "cpu":
        smi = env.nvidia_smi(int(device.split(":")[1]) if ":" in device else 0).get("gpu_name_smi")
        slug = device_short_name({"gpu_name": smi}) if smi else "cuda"
    base = f"{_dt.datetime.now(_dt.timezone.utc).date().isoformat()}-{slug}-reproduce"
    folder, k = Path(args.out) / base, 1
    while (folder / "stages.json").exists():
        k += 1
        folder = Path(args.out) / f"{base}-{k}"
    return folder


def after_stage(run_dir: Path):
    """What runs after every stage: its own REPORT.md (a run.json stage), then the merged report (a killed
    sitting still has the report of what was done). A report that cannot be rendered (a reference run not
    on this machine, a malformed record) is said on stderr and the stages go on: the records are what a
    sitting exists for, and `make report` renders them later."""
    def after(name: str) -> None:
        if (run_dir / name / "run.json").is_file():
            try:
                single.write(run_dir / name)
            except ValueError as exc:
                print(f"  {name}: REPORT.md not written: {exc}", file=sys.stderr)
        write_report(run_dir, f"after {name}")
    return after


def write_report(run_dir: Path, when: str) -> Path | None:
    """document.write, or None with a line on stderr where the report cannot be rendered here."""
    try:
        return document.write(run_dir)
    except (ValueError, FileNotFoundError) as exc:
        print(f"  {run_dir}/REPORT.md not rewritten {when}: {exc}; `make report ARGS={run_dir}` renders it where "
              f"that is mended", file=sys.stderr)
        return None


def main(argv: list[str] | None = None, *, execute=None) -> int:
    """The CLI. execute: a suite.stages.run Executor for the local path (default: a process per stage)."""
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    command = [sys.executable, "-m", "suite.reproduce", *(sys.argv[1:] if argv is None else argv)]
    try:
        device = resolve_device(args.device)
        kind = device_type(device)
        names = names_of(args.workload, device)
        protocol = {k: v for k, v in (("processes", args.processes), ("passes", args.passes)) if v is not None}
        every = plans.plan(names, list(HARNESSES), kind, stage_budget_s=args.stage_budget_s,
                           options={**protocol, "seconds": args.seconds, "max_speak_units": args.max_speak_units})
        patterns = [p.strip() for p in args.stages.split(",") if p.strip()] if args.stages is not None else None
        if patterns == []:
            raise ValueError(f"--stages: expected comma-separated stage globs or names, got {args.stages!r}")
        chosen = plans.select(every, patterns) if patterns else [s for s in every if s.harness in DEFAULT_HARNESSES[kind]]
        for name in names:                       # a cut that leaves nothing to compare is refused now
            select_units(workloads.get(name), seconds=args.seconds, max_speak_units=args.max_speak_units)
        ckpts = env.parse_checkpoints(args.checkpoint, names)
        if args.resume and not args.run_dir:
            raise ValueError("--resume needs --run-dir (the folder to continue)")
        for ref in args.compare or []:
            load_reference(ref)                  # fail now, not after an hour of stages
    except (ValueError, KeyError, FileNotFoundError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    limited = args.max_speak_units is not None or args.seconds is not None
    max_units, notes = args.max_speak_units, []
    if device == "cpu" and not limited:
        max_units, limited = CPU_DEFAULT_SPEAK_UNITS, True
        notes = [f"CPU default: a short run of the first {max_units} SPEAK units over >= 2 turns (suite.reproduce); "
                 f"too few units for statistics, a check of the pipeline and of bit-exactness only"]
    options = {"device": device, "steps": args.steps, "seconds": args.seconds, "max_speak_units": max_units,
               "depth": args.depth, "seed": args.seed, "notes": notes, **protocol,
               **({"checkpoint": ckpts} if ckpts else {})}
    run_dir = run_dir_of(args, device)
    try:
        there = next(p for p in (run_dir, *run_dir.parents) if p.exists())
        if not there.is_dir():
            raise StateError(f"--run-dir / --out: {there} is a file, so {run_dir} cannot be a run folder")
        state = State.open(run_dir, options, resume=args.resume)
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:                          # a parent that is a file, a folder that cannot be made
        print(f"error: --run-dir / --out: cannot make the run folder {run_dir} ({exc.strerror or exc})",
              file=sys.stderr)
        return 2
    if args.compare is not None:
        state.data["compare"] = list(args.compare)
    if args.list:
        for s in chosen:
            st = state.stages.get(s.name)
            expected = "" if s.expected_s is None else f", expected {s.expected_s:4.0f} s"
            print(f"{s.name:32s} {(st.status if st else 'new'):8s} budget {s.budget_s:5.0f} s{expected}  "
                  f"{s.skip or (st.reason if st else '')}")
        for name, st in state.legacy().items():
            print(f"{name:32s} {st.status:8s} legacy: harness {st.harness!r} is not run by this version (kept as recorded)")
        return 0
    if notes:
        print(f"CPU: a short run of the first {max_units} SPEAK units (over >= 2 turns), a check of the bytes, not of "
              f"speed; pass --max-speak-units / --seconds to change it")
    if os.environ.pop(env.CHECKPOINT_ENV, None) and not ckpts:   # the options say what is in force
        print(f"note: {env.CHECKPOINT_ENV} ignored: reproduce takes checkpoints from --checkpoint", file=sys.stderr)
    if ckpts:                                         # for every stage process (and a local Ray instance)
        os.environ[env.CHECKPOINT_ENV] = json.dumps(ckpts, sort_keys=True)
    prov = env.provenance(command, device="cpu")      # git and versions; the device facts are in each stage
    installed = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm) if installed else None
    kw = dict(budget_s=args.budget_s, provenance=prov, after=after_stage(run_dir))
    try:
        if args.ray:
            sitting = run_plan_ray(chosen, state, {**options, "command": command}, address=args.ray, **kw)
        else:
            sitting = run_plan(chosen, state, {**options, "command": command},
                               execute=execute or subprocess_executor, **kw)
    except StateError as exc:                       # --ray without Ray, or without a node to run on
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    report = write_report(run_dir, "at the sitting's end")
    outcome(state, chosen, device)
    print(f"results: {run_dir}/stages.json" + (f", {report}, {run_dir}/claims.json" if report else ""))
    return status(state, chosen, sitting, limited)


def stop_on_sigterm(signum, frame):
    """SIGTERM to the sitting (`timeout`, a lent machine's call limit): its stage processes die with it; their
    stages stay `running` in stages.json, so `--resume` reruns them as interrupted."""
    killed = kill_live_stages()
    print(f"stopped by signal {signum}: killed {len(killed)} stage process group(s); rerun with --resume",
          file=sys.stderr)
    raise SystemExit(128 + signum)


def outcome(state: State, chosen, device: str) -> None:
    """The sitting's outcome, bytes first: per stage that compares bytes, whether every unit matched; on a
    CPU, that its times are no speed measurement."""
    lines = [f"  {s.name}: {clause}" for s in chosen if (clause := bytes_clause(state.stages[s.name]))]
    print("outcome:")
    for line in lines or ["  no stage compared bytes"]:
        print(line)
    if device_type(device) == "cpu":
        print(f"  {CPU_SPEED_NOTE}")


def status(state: State, chosen, sitting: dict, limited: bool) -> int:
    """The exit status (module docstring). A duplex stage's INVALID record counts as a verify stage's: bytes
    that differ always fail, other codes unless `tolerated`."""
    bad = []
    for s in chosen:
        st = state.stages[s.name]
        differ = (f"{len(st.mismatched_units)} session(s) differ from the same session alone: {st.mismatched_units}"
                  if family(s.harness) == "duplex" else
                  f"{len(st.mismatched_units)} unit(s) differ: {st.mismatched_units}")
        if st.status == "failed":
            bad.append(f"{s.name}: failed: {st.reason}" + (f"; before it, {differ}" if st.mismatched_units else ""))
        elif st.status == "done" and st.verdict == "INVALID":
            if st.mismatched_units:
                bad.append(f"{s.name}: {differ}")
            elif not tolerated(st.invalid_codes, limited):
                bad.append(f"{s.name}: verdict INVALID: {st.invalid_codes}")
    for line in bad:
        print(f"FAIL: {line}", file=sys.stderr)
    if bad:
        return 1
    if any(state.stages[s.name].status == "pending" for s in chosen):
        print(f"incomplete: {sitting['stopped']}", file=sys.stderr)
        return EXIT_PENDING
    return 0


if __name__ == "__main__":
    sys.exit(main())
