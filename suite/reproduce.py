"""`make reproduce`: the staged, resumable reproduction of every claim, merged into one REPORT.md.

    python -m suite.reproduce [--workload W|all] [--stages PATTERNS] [--device auto|cpu|cuda]
                              [--steps N] [--seconds S] [--max-speak-units N] [--depth released|reduced]
                              [--seed N] [--out results/] [--run-dir DIR] [--resume] [--budget-s S]
                              [--stage-budget-s S] [--gpus 0,1] [--compare REF ...] [--list]
    python -m suite.reproduce --run-dir DIR --join OTHER [--join OTHER ...]

Stages (suite.stages): `<workload>.verify` (speedup and bitwise equality, stock then cadence on one
model), `<workload>.memory_stock` / `.memory_cadence` (one process per mode: driver-level peak and
per-session increment), `<workload>.duplex_stock` / `.duplex_cadence` (suite.duplex, one mode each: SPEAK
time against the 1 s cadence and sessions per GPU; each fills one sitting, 560 s on CUDA). Every stage
runs in a process of its own with a time budget; state is kept in `<run dir>/stages.json` and the merged
report in `<run dir>/REPORT.md` (suite.claims: the two duplex modes joined into one table), rewritten
after every stage. `--list` also names legacy entries of stages.json (a harness an older version ran,
such as the single `duplex` stage): they are left as recorded.

Defaults: on CUDA every workload (`--workload all`) through every harness; on CPU the default workload
(minicpmo45), verify only, released config, the first `CPU_DEFAULT_SPEAK_UNITS` SPEAK units over 2 turns
(a few minutes on 2 cores). The run folder is `<out>/<UTC date>-<device>-reproduce` (a suffix -2, ... when
taken) or `--run-dir`. `--resume` continues a run folder: done stages are kept, failed and pending ones run
(the options must equal the recorded ones). `--budget-s` bounds this sitting: a stage starts only if what
is left covers what it is expected to need (suite.stages.estimate_s; the first stage of a sitting always
starts), and its timeout is cut to what is left; the rest stay pending. `--gpus 0,1` (CUDA, one host)
runs up to one stage per listed GPU at a time, still started in plan order and under the same budget
rule, each stage's process pinned with CUDA_VISIBLE_DEVICES (`gpu` in stages.json, the first line of its
log.txt, `env` in its record's provenance); the timed stages (verify, duplex) run alone
(suite.stages.TIMED_HARNESSES); without it, one stage at a time. `--gpus` is not a recorded
option: a run folder may be resumed with other GPUs or none. `--join OTHER` takes into `--run-dir` the stages
another folder of the same reproduction ran (same recorded options; on another machine, or on a lent machine
whose every call starts from a fresh copy) and rewrites the report (suite.stages.join).

Exit status: 0 when every selected stage is done or skipped and every record is byte-identical and VALID
(or INVALID only for too few units in a run cut short on purpose); 1 when a stage failed or a record is
not (a duplex stage's duplex.json as a verify stage's run.json: a session differing from itself alone, or a
dirty tree, fails); 2 for bad arguments or an unusable run folder; 3 when the budget ran out with stages pending
(rerun with --resume).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import re
import signal
import sys
import threading
from pathlib import Path

import torch

CPU_DEFAULT_SPEAK_UNITS = 4     # two turns (2 + first and final of the next); ~4 min on 2 idle cores
EXIT_PENDING = 3


def resolve_device(name: str) -> str:
    """'auto' -> 'cuda' if available else 'cpu'. Raises ValueError for 'cuda' without CUDA, or a name that
    is neither cpu nor cuda[:N]."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not (name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ValueError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (torch "
                         f"{torch.__version__}); use --device cpu or auto")
    return name


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value
    return parse


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m suite.reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default=None,
                    help="workload name (workloads.get), comma-separated names, or 'all' (default: all on "
                         "CUDA, minicpmo45 on CPU)")
    ap.add_argument("--stages", default=None,
                    help="comma-separated stage globs or names: 'minicpmo45.*', '*.memory_*', 'verify', "
                         "'memory', 'duplex', 'duplex_cadence' (default: every harness on CUDA, verify on CPU)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--steps", type=_positive(int), default=None, help="Euler steps (default: the workload's)")
    ap.add_argument("--seconds", type=_positive(float), default=None, help="only units starting before S seconds")
    ap.add_argument("--max-speak-units", type=_positive(int), default=None,
                    help=f"only the first N SPEAK units (CPU default {CPU_DEFAULT_SPEAK_UNITS})")
    ap.add_argument("--depth", choices=("released", "reduced"), default="released")
    ap.add_argument("--seed", type=int, default=None, help="weights seed (default: the workload's)")
    ap.add_argument("--out", default="results", help="results root for a new run folder (default results/)")
    ap.add_argument("--run-dir", default=None, help="the run folder (default <out>/<date>-<device>-reproduce)")
    ap.add_argument("--resume", action="store_true", help="continue --run-dir: keep done stages")
    ap.add_argument("--budget-s", type=_positive(float), default=None, help="wall-clock budget of this sitting")
    ap.add_argument("--stage-budget-s", type=_positive(float), default=None,
                    help="every stage's budget (default: suite.stages.BUDGET_S by harness and device)")
    ap.add_argument("--gpus", default=None, metavar="0,1",
                    help="CUDA only: run up to one stage per listed GPU at a time, each pinned with "
                         "CUDA_VISIBLE_DEVICES; verify and duplex stages run alone (default: one stage at a "
                         "time, unpinned)")
    ap.add_argument("--compare", action="append", default=None, metavar="REF",
                    help="a reference run folder to compare ratios with (repeatable), e.g. "
                         "results/2026-11-30-h200-minicpmo45")
    ap.add_argument("--join", action="append", default=None, metavar="DIR",
                    help="join into --run-dir the stages another run folder of the same reproduction ran (another "
                         "machine, or a fresh copy), repeatable; rewrites REPORT.md and runs nothing "
                         "(suite.stages.join)")
    ap.add_argument("--list", action="store_true", help="print the stages and their state, run nothing")
    ap.add_argument("--no-progress", action="store_true", help="(kept for compatibility; stages log to files)")
    return ap.parse_args(argv)


def tolerated(codes: list[str], limited: bool) -> bool:
    """True if every INVALID code is 'few_units' of a run cut short on purpose (and there is one).
    A duplex stage's codes (suite.duplex.invalid_codes) are never tolerated: "mismatch" is bytes,
    "dirty_tree" is not tolerated in verify either, and "short_run" is not cut on purpose, since a duplex
    stage runs suite.stages.DUPLEX_SECONDS per count whatever --seconds says."""
    return limited and bool(codes) and all(c == "few_units" for c in codes)


def parse_gpus(text: str | None, device: str) -> list[int] | None:
    """--gpus '0,1' -> [0, 1] (None when not given). Raises ValueError naming --gpus: not comma-separated
    non-negative ints, a repeat, a CPU device, a device other than plain `cuda` (each stage sees only its
    GPU, as cuda), or an index this machine does not have."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise ValueError(f"--gpus {text!r}: expected comma-separated GPU indices (non-negative ints), e.g. 0,1")
    gpus = [int(p) for p in parts]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {text!r}: expected each GPU once")
    if not device.startswith("cuda"):
        raise ValueError(f"--gpus {text}: the device is {device}; --gpus pins stages to CUDA GPUs (--device cuda)")
    if device != "cuda":
        raise ValueError(f"--gpus {text} with --device {device}: each stage sees only its own GPU, as cuda; "
                         f"pass --device cuda")
    count = torch.cuda.device_count()
    if max(gpus) >= count:
        raise ValueError(f"--gpus {text}: GPU {max(gpus)} is not there; this process sees {count} GPU(s)")
    return gpus


def _names(arg: str | None, device: str) -> list[str]:
    import workloads

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


def _device_slug(device: str) -> str:
    """'cpu', or the GPU's short name from nvidia-smi (no CUDA context in this process), else 'cuda'."""
    from suite import env

    if device == "cpu":
        return "cpu"
    index = int(device.split(":")[1]) if ":" in device else 0
    name = env.nvidia_smi(index).get("gpu_name_smi")
    return env.device_short_name({"gpu_name": name}) if name else "cuda"


def _run_dir(args, device: str) -> Path:
    if args.run_dir:
        return Path(args.run_dir)
    base = f"{_dt.datetime.now(_dt.timezone.utc).date().isoformat()}-{_device_slug(device)}-reproduce"
    folder, k = Path(args.out) / base, 1
    while (folder / "stages.json").exists():
        k += 1
        folder = Path(args.out) / f"{base}-{k}"
    return folder


def main(argv: list[str] | None = None, *, execute=None) -> int:
    """The CLI. execute: a suite.stages Executor (default: one subprocess per stage; tests pass
    `stages.inline_executor`)."""
    from suite import claims, env, stages

    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    command = [sys.executable, "-m", "suite.reproduce", *(sys.argv[1:] if argv is None else argv)]
    if args.join:
        if not args.run_dir:
            print("error: --join needs --run-dir (the folder to join into)", file=sys.stderr)
            return 2
        try:
            state = stages.join(Path(args.run_dir), [Path(d) for d in args.join])
        except stages.StateError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            report = claims.write(Path(args.run_dir), state.data.get("compare") or None)
        except (OSError, ValueError) as exc:        # FileNotFoundError: a reference that does not resolve
            print(f"joined {len(args.join)} folder(s) into {state.path}: {state.counts()}; error: REPORT.md not "
                  f"rewritten: {exc} (`python -m suite.report {args.run_dir}` from where its references resolve)",
                  file=sys.stderr)
            return 1
        print(f"joined {len(args.join)} folder(s) into {state.path}: {state.counts()}; report {report}")
        return 0
    try:
        device = resolve_device(args.device)
        gpus = parse_gpus(args.gpus, device)
        names = _names(args.workload, device)
        default_harnesses = stages.DEFAULT_HARNESSES[stages.device_type(device)]
        all_stages = stages.plan(names, list(stages.HARNESSES), stages.device_type(device),
                                 stage_budget_s=args.stage_budget_s)
        patterns = [p.strip() for p in args.stages.split(",") if p.strip()] if args.stages else None
        chosen = (stages.select(all_stages, patterns) if patterns else
                  [s for s in all_stages if s.harness in default_harnesses])
        if args.resume and not args.run_dir:
            raise ValueError("--resume needs --run-dir (the folder to continue)")
        for ref in args.compare or []:
            claims.load_reference(ref)          # fail now, not after an hour of stages
    except (ValueError, KeyError, FileNotFoundError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2

    limited = args.max_speak_units is not None or args.seconds is not None
    max_units, notes = args.max_speak_units, []
    if device == "cpu" and not limited:
        max_units, limited = CPU_DEFAULT_SPEAK_UNITS, True
        notes = [f"CPU default: a short run of the first {max_units} SPEAK units over >= 2 turns "
                 f"(suite.reproduce); too few units for statistics, a check of the pipeline and of "
                 f"bit-exactness only"]
    # what the run measures; --gpus is not in it (where the sitting runs: a run may resume on other GPUs)
    options = {"device": device, "steps": args.steps, "seconds": args.seconds, "max_speak_units": max_units,
               "depth": args.depth, "seed": args.seed, "notes": notes}
    run_dir = _run_dir(args, device)
    try:
        state = stages.State.open(run_dir, options, resume=args.resume)
    except (stages.StateError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.compare is not None:
        state.data["compare"] = list(args.compare)
    if args.list:
        for s in chosen:
            st = state.stages.get(s.name)
            gpu = f"gpu {st.gpu}  " if st and st.gpu is not None else ""
            print(f"{s.name:32s} {(st.status if st else 'new'):8s} budget {s.budget_s:5.0f} s  {gpu}"
                  f"{s.skip or (st.reason if st else '')}")
        for name, st in state.legacy().items():
            print(f"{name:32s} {st.status:8s} legacy: harness {st.harness!r} is not run by this version "
                  f"(kept as recorded)")
        return 0

    if notes:
        print(f"CPU: short run of the first {max_units} SPEAK units (over >= 2 turns); "
              f"pass --max-speak-units / --seconds to change it")
    prov = env.provenance(command, device="cpu")    # git and versions; the device facts are in each stage
    installed = threading.current_thread() is threading.main_thread()   # signals reach the main thread only
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm) if installed else None   # a `timeout` around it
    try:
        run = stages.run_plan(chosen, state, {**options, "command": command}, budget_s=args.budget_s,
                              execute=execute or stages.subprocess_executor, provenance=prov, gpus=gpus,
                              after=lambda: claims.write(run_dir))    # a killed sitting still has its report
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    report = claims.write(run_dir)
    print(f"results: {run_dir}/stages.json, {report}")
    return _status(state, chosen, run, limited)


def _stop_on_sigterm(signum, frame):
    """SIGTERM to the sitting (`timeout`, a lent machine's call limit): the stage processes, each in a
    session of its own, are killed with it instead of running on; their stages stay `running` in
    stages.json, so `--resume` reruns them as interrupted."""
    from suite import stages
    killed = stages.kill_live_stages()
    print(f"stopped by signal {signum}: killed {len(killed)} stage process group(s); rerun with --resume",
          file=sys.stderr)
    raise SystemExit(128 + signum)


def _status(state, chosen, sitting, limited: bool) -> int:
    """The exit status (module docstring). A duplex stage's INVALID record counts as a verify stage's:
    bytes that differ always fail, other codes unless `tolerated`."""
    from suite import stages

    bad = []
    for s in chosen:
        st = state.stages[s.name]
        differ = (f"{len(st.mismatched_units)} session(s) differ from the same session alone: "
                  f"{st.mismatched_units}" if stages.family(s.harness) == "duplex" else
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
