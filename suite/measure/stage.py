"""One verify or memory stage of a reproduction, in a process of its own (suite.stages starts it).

    python -m suite.measure.stage verify|mode [--mode stock|cadence] --workload W --device D --out DIR
        [--depth released|reduced] [--steps N] [--seconds S] [--max-speak-units N] [--seed N] [--note TEXT]
        [--processes N] [--passes P] [--warmup-pairs W] [--aa-units K] [--prime-units Q] [--quiet]

`verify` runs suite.measure.verify (stock against DuplexCadence, paired, over --processes fresh processes,
each started as `python -m <this entry> verify-process`); `mode` runs ONE mode (the driver-level memory
figures are that mode's alone). Both write DIR/run.json and DIR/audio_<mode>.wav and print their progress,
then the summary. Exit status: 0 the record was written (whatever its verdict); 2 bad arguments;
EXIT_UNAVAILABLE (4) the adapter lacks the mode; anything else is a crash.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import workloads
from suite.measure import env
from suite.records import EXIT_UNAVAILABLE, write_run
from suite.records.paired import Protocol

DEFAULTS = Protocol()


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m suite.measure.stage",
                                 description="Run one reproduction stage (verify, or one mode) in this process.")
    ap.add_argument("harness", choices=("verify", "mode", "verify-process"))
    ap.add_argument("--workload", required=True)
    ap.add_argument("--mode", default=None, help="for `mode`: stock | cadence | another mode the adapter declares")
    ap.add_argument("--device", required=True, type=env.device_arg, help="cpu | cuda | cuda:N")
    ap.add_argument("--out", default=None, type=env.out_folder, help="the stage's folder (run.json goes there)")
    ap.add_argument("--depth", choices=("released", "reduced"), default="released")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--max-speak-units", type=int, default=None)
    ap.add_argument("--seed", type=env.seed_arg, default=None)
    ap.add_argument("--processes", type=int, default=DEFAULTS.processes,
                    help=f"verify: fresh processes, each building the model once (default {DEFAULTS.processes})")
    ap.add_argument("--passes", type=int, default=DEFAULTS.passes,
                    help=f"verify: walks of the script in the A/B run (default {DEFAULTS.passes})")
    ap.add_argument("--warmup-pairs", type=int, default=DEFAULTS.warmup_pairs,
                    help=f"verify: the A/B run's first SPEAK pairs, not measured (default {DEFAULTS.warmup_pairs})")
    ap.add_argument("--aa-units", type=int, default=DEFAULTS.aa_speak_units,
                    help=f"verify: SPEAK units of the A/A run, stock against stock (0: none; default "
                         f"{DEFAULTS.aa_speak_units}, the first {DEFAULTS.aa_warmup_pairs} not measured)")
    ap.add_argument("--prime-units", type=int, default=DEFAULTS.prime_speak_units,
                    help=f"verify: SPEAK units a throwaway stock session speaks at set-up, untimed (default "
                         f"{DEFAULTS.prime_speak_units})")
    ap.add_argument("--note", action="append", default=[], help="a note for the record (repeatable)")
    ap.add_argument("--quiet", action="store_true", help="no line per unit")
    # verify-process (started by verify): its place, where its result goes, the protocol as JSON
    ap.add_argument("--index", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--protocol", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.harness == "mode" and not args.mode:
        ap.error("harness `mode` needs --mode (stock | cadence | ...)")
    if args.harness != "verify-process" and not args.out:
        ap.error("--out: the stage's folder is required")
    if args.harness == "verify-process" and not (args.result and args.protocol):
        ap.error("verify-process: started by verify, with --result and --protocol")
    if args.harness == "verify":
        try:
            args.protocol = Protocol(processes=args.processes, passes=args.passes, warmup_pairs=args.warmup_pairs,
                                     aa_speak_units=args.aa_units, prime_speak_units=args.prime_units)
        except ValueError as exc:
            ap.error(f"verify: {exc}")
    return args


def main(argv: list[str] | None = None, *, entry: str = "suite.measure.stage") -> int:
    """The CLI. entry: the module the verify's processes run as (`python -m entry verify-process`): this
    one, or a test's stage entry that registers its fakes first."""
    try:
        args = parse_args(argv)
    except SystemExit as exc:                   # argparse: 2 for bad input, 0 for --help
        return int(exc.code or 0)
    command = [sys.executable, "-m", "suite.measure.stage", *(sys.argv[1:] if argv is None else argv)]
    try:
        workload = workloads.get(args.workload)
        env.check_steps_apply([args.workload], args.steps)
    except (KeyError, ValueError) as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    from suite.measure.session import ModeUnavailable
    kwargs = dict(depth=args.depth, seconds=args.seconds, max_speak_units=args.max_speak_units, steps=args.steps,
                  seed=args.seed, command=command)
    try:
        if args.harness == "verify-process":
            from suite.measure.verify_process import child
            return child(workload, args, command)
        if args.harness == "verify":
            from suite.measure.verify import verify
            result = verify(workload, args.device, protocol=args.protocol, entry=entry,
                            progress=not args.quiet, **kwargs)
        else:
            from suite.measure.session import run_workload
            result = run_workload(workload, args.mode, args.device, progress=not args.quiet, **kwargs)
    except ModeUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ValueError as exc:                    # a mode the adapter does not declare, a bad limit
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from suite.measure.verify import summary_text
    result.notes.extend(args.note)
    result.notes.append(f"stage process pid {os.getpid()} ({args.harness}"
                        + (f" {args.mode}" if args.harness == "mode" else "") + ")")
    record = result.to_dict()
    path = write_run(Path(args.out), record, result.audio())
    print(summary_text(record))
    print(f"stage record: {path} (verdict {record['verdict']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
