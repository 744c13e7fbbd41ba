"""`make reproduce`: run a workload stock and DuplexCadence on one model instance, write results/<run_id>/.

    python -m suite.reproduce [--workload minicpmo45] [--device auto|cpu|cuda] [--steps 5|10]
                              [--seconds S] [--max-speak-units N] [--depth released|reduced] [--out results/]

--device auto takes CUDA when available, else CPU. On CUDA the default is the whole session script. On CPU
the default is a short run (released config, the first `CPU_DEFAULT_SPEAK_UNITS` SPEAK units over at least
2 turns) that finishes in a few minutes on 2 cores; its verdict is INVALID for too few units, which is
reported but does not fail the command. Runs `suite.runner.verify` (stock, then cadence, compared per
unit); where the adapter has no cadence mode it runs stock only and the report says so.

Exit status: 0 when every compared unit is byte-identical and the verdict is VALID, or INVALID only for
too few units in a run cut short on purpose (the CPU default, or --seconds / --max-speak-units given);
1 otherwise; 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import sys

import torch

CPU_DEFAULT_SPEAK_UNITS = 4     # two turns (2 + first and final of the next); ~4 min on 2 idle cores


def resolve_device(name: str) -> str:
    """'auto' -> 'cuda' if available else 'cpu'. Raises ValueError for 'cuda' without CUDA."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (torch "
                         f"{torch.__version__}); use --device cpu or auto")
    return name


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m suite.reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="minicpmo45", help="workload name (workloads.get), or 'all'")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--steps", type=int, default=None, help="Euler steps (default: the workload's)")
    ap.add_argument("--seconds", type=float, default=None, help="only units starting before S seconds")
    ap.add_argument("--max-speak-units", type=int, default=None,
                    help=f"only the first N SPEAK units (CPU default {CPU_DEFAULT_SPEAK_UNITS})")
    ap.add_argument("--depth", choices=("released", "reduced"), default="released")
    ap.add_argument("--seed", type=int, default=None, help="weights seed (default: the workload's)")
    ap.add_argument("--out", default="results", help="results root (default results/)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap.parse_args(argv)


def tolerated(codes: list[str], limited: bool) -> bool:
    """True if every INVALID code is 'few_units' of a run cut short on purpose."""
    return limited and all(c == "few_units" for c in codes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = [sys.executable, "-m", "suite.reproduce", *(sys.argv[1:] if argv is None else argv)]
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import workloads
    from suite import report, runner

    names = ([n for n in workloads.names() if workloads.get(n).architecture in GPU_ALL]
             if args.workload == "all" else [args.workload])
    status = 0
    for name in names:
        status = max(status, run_one(workloads.get(name), device, args, command, runner, report))
    return status


#: What `--workload all` runs: every workload whose adapter has a cadence mode (stepaudio2_mini goes through
#: flow_hift, which hands its spec variant "stepaudio2" to adapters/stepaudio2.py: issue 4).
GPU_ALL = ("flow_hift", "mimi", "code2wav")


def run_one(workload, device, args, command, runner, report) -> int:
    max_units, limited = args.max_speak_units, args.max_speak_units is not None or args.seconds is not None
    if device == "cpu" and not limited:
        max_units, limited = CPU_DEFAULT_SPEAK_UNITS, True
        print(f"CPU: short run of the first {max_units} SPEAK units (over >= 2 turns); "
              f"pass --max-speak-units / --seconds to change it")
    result = runner.verify(workload, device, depth=args.depth, seconds=args.seconds,
                           max_speak_units=max_units, steps=args.steps, seed=args.seed,
                           progress=not args.no_progress, command=command)
    if device == "cpu" and args.max_speak_units is None and args.seconds is None:
        result.notes.append(f"CPU default: a short run of the first {max_units} SPEAK units over >= 2 turns "
                            f"(suite.reproduce); too few units for statistics, a check of the pipeline and of "
                            f"bit-exactness only")
    folder = report.write_results(result, args.out)
    print(f"results: {folder}/run.json, {folder}/REPORT.md, "
          + ", ".join(f"{folder}/audio_{m}.wav" for m in result.modes))
    if result.mismatches:
        print(f"FAIL: {len(result.mismatches)} unit(s) differ: {result.mismatches}", file=sys.stderr)
        return 1
    if result.verdict == "INVALID" and not tolerated(result.invalid_codes, limited):
        print("FAIL: verdict INVALID: " + "; ".join(result.invalid_reasons), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
