"""One stage of a reproduction, in a process of its own (suite.stages starts it).

    python -m suite.stage_run verify --workload W --device D --out DIR [options]
    python -m suite.stage_run mode --mode stock|cadence --workload W --device D --out DIR [options]
    options: --depth released|reduced --steps N --seconds S --max-speak-units N --seed N --note TEXT --no-progress
             --rounds R (verify: timing rounds, suite.runner.verify; default 1)

`verify` calls `suite.runner.verify` (stock then cadence on one model instance, compared per unit). `mode`
calls `suite.runner.run_workload` for ONE mode: this process builds the model and opens one session, so
the driver-level figures of `suite.memory.MemoryProbe` are this mode's alone (VMM mappings, weights, graph
pools), and the per-session increment (`session_driver_mib` on CUDA, `session_rss_mib` on CPU) is the peak
with one session minus the sample with the model loaded and no session. Both write DIR/run.json and
DIR/REPORT.md (`suite.report.write_results`; DIR/audio_*.wav too).

Exit status: 0 when the record was written, whatever its verdict (the caller reads the verdict from
run.json); 2 for bad arguments; EXIT_UNAVAILABLE (4) when the adapter does not implement the mode; any
other status is a crash.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_UNAVAILABLE = 4


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m suite.stage_run",
                                 description="Run one reproduction stage (verify, or one mode) in this process.")
    ap.add_argument("harness", choices=("verify", "mode"))
    ap.add_argument("--workload", required=True)
    ap.add_argument("--mode", default=None, help="for `mode`: stock | cadence | another mode the adapter declares")
    ap.add_argument("--device", required=True, help="cpu | cuda | cuda:N")
    ap.add_argument("--out", required=True, help="the stage's folder (run.json goes there)")
    ap.add_argument("--depth", choices=("released", "reduced"), default="released")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--max-speak-units", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=1,
                    help="verify: timing rounds, each a fresh session per mode in alternating order (default 1)")
    ap.add_argument("--note", action="append", default=[], help="a note for the record (repeatable)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.harness == "mode" and not args.mode:
        ap.error("harness `mode` needs --mode (stock | cadence | ...)")
    if args.rounds < 1:
        ap.error(f"--rounds: expected an int >= 1, got {args.rounds}")
    if args.harness == "mode" and args.rounds != 1:
        ap.error(f"--rounds: only for `verify` (a `mode` stage runs one session), got {args.rounds}")
    import re
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        ap.error(f"--device: expected cpu, cuda or cuda:N, got {args.device!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:                   # argparse: 2 for bad input, 0 for --help
        return int(exc.code or 0)
    import workloads
    from suite import report, runner

    command = [sys.executable, "-m", "suite.stage_run", *(sys.argv[1:] if argv is None else argv)]
    try:
        workload = workloads.get(args.workload)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    kwargs = dict(depth=args.depth, seconds=args.seconds, max_speak_units=args.max_speak_units,
                  steps=args.steps, seed=args.seed, progress=not args.no_progress, command=command)
    try:
        if args.harness == "verify":
            result = runner.verify(workload, args.device, rounds=args.rounds, **kwargs)
        else:
            # a memory stage: no profiler (its buffers would count in the driver-level figures)
            result = runner.run_workload(workload, args.mode, args.device, profile_units=0, **kwargs)
    except runner.ModeUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ValueError as exc:                    # a mode the adapter does not declare, a bad limit
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result.notes.extend(args.note)
    result.notes.append(f"stage process pid {os.getpid()} ({args.harness}"
                        + (f" {args.mode}" if args.harness == "mode" else "") + ")")
    out = Path(args.out)
    folder = report.write_results(result, out.parent, name=out.name)
    if args.no_progress:                         # the runner printed its summary otherwise
        print(report.summary_text(result.to_dict()))
    print(f"stage record: {folder}/run.json (verdict {result.verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
