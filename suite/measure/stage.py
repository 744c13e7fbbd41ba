"""One verify or memory stage of a reproduction, in a process of its own (suite.stages starts it).

    python -m suite.measure.stage verify|mode [--mode stock|cadence] --workload W --device D --out DIR
        [--depth released|reduced] [--steps N] [--seconds S] [--max-speak-units N] [--seed N] [--note TEXT]
        [--rounds R] [--quiet]

`verify` runs suite.measure.verify; `mode` runs ONE mode (the driver-level memory figures are that mode's
alone). Both write DIR/run.json and DIR/audio_<mode>.wav and print a line per unit, then the summary.
Exit status: 0 the record was written (whatever its verdict); 2 bad arguments; EXIT_UNAVAILABLE (4) the
adapter lacks the mode; anything else is a crash.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import workloads
from suite.measure.session import ModeUnavailable, run_workload
from suite.measure.verify import summary_text, verify
from suite.records import EXIT_UNAVAILABLE, write_run


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m suite.measure.stage",
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
    ap.add_argument("--quiet", action="store_true", help="no line per unit")
    args = ap.parse_args(argv)
    if args.harness == "mode" and not args.mode:
        ap.error("harness `mode` needs --mode (stock | cadence | ...)")
    if args.rounds < 1:
        ap.error(f"--rounds: expected an int >= 1, got {args.rounds}")
    if args.harness == "mode" and args.rounds != 1:
        ap.error(f"--rounds: only for `verify` (a `mode` stage runs one session), got {args.rounds}")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        ap.error(f"--device: expected cpu, cuda or cuda:N, got {args.device!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:                   # argparse: 2 for bad input, 0 for --help
        return int(exc.code or 0)
    command = [sys.executable, "-m", "suite.measure.stage", *(sys.argv[1:] if argv is None else argv)]
    try:
        workload = workloads.get(args.workload)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    kwargs = dict(depth=args.depth, seconds=args.seconds, max_speak_units=args.max_speak_units, steps=args.steps,
                  seed=args.seed, progress=not args.quiet, command=command)
    try:
        if args.harness == "verify":
            result = verify(workload, args.device, rounds=args.rounds, **kwargs)
        else:
            result = run_workload(workload, args.mode, args.device, **kwargs)
    except ModeUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ValueError as exc:                    # a mode the adapter does not declare, a bad limit
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result.notes.extend(args.note)
    result.notes.append(f"stage process pid {os.getpid()} ({args.harness}"
                        + (f" {args.mode}" if args.harness == "mode" else "") + ")")
    record = result.to_dict()
    path = write_run(Path(args.out), record, result.audio())
    print(summary_text(record))
    print(f"stage record: {path} (verdict {result.verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
