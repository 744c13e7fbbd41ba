"""The command line of suite.measure.duplex: flags, their checks before any model is built (one line on stderr,
exit status 2, naming the flag), and what they select."""
from __future__ import annotations

import argparse
import math
import sys

import torch

import workloads
from suite.measure import env, scheduler
from suite.measure.ar_stage import ARSpecError, parse_ar
from suite.measure.duplex_run import OPEN_AT, RECORDINGS, TRAFFICS
from suite.measure.duplex_session import PREPARES, learned_graphs, parse_sessions, session_units

MODES = ("stock", "cadence")
PROG = "python -m suite.measure.duplex"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str):
        raise usage_error(message, self.prog)


def usage_error(message: str, prog: str = PROG) -> SystemExit:
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
    p = OneLineParser(prog=PROG, description="SPEAK time against the one-second cadence, and sessions per GPU by "
                                             "a search (suite.measure.duplex).")
    p.add_argument("--workload", default="minicpmo45", help="workload name(s), comma-separated, or 'all'")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ar", default="none", help="none | busy:<ms>ms | standin | standin:<name>")
    p.add_argument("--modes", default="stock,cadence", type=lambda s: [m.strip() for m in s.split(",")])
    p.add_argument("--traffic", default="voxconverse", choices=TRAFFICS,
                   help="voxconverse: every session its own real script, joining during the run (workloads.traffic); "
                        "committed: the committed script tiled for every session (comparison with older records)")
    p.add_argument("--seconds", type=number(float, 0, strict=True), default=60.0,
                   help="seconds of script per session (60: the whole window; shorter only for tests)")
    p.add_argument("--seed", type=number(int, 0, strict=False), default=0, help="traffic seed (windows, joins, payloads)")
    p.add_argument("--join-within-s", type=number(float, 0, strict=False), default=10.0,
                   help="sessions join at seeded times in [0, this) seconds (session 0 at 0)")
    p.add_argument("--start", type=number(int, 1, strict=False), default=1, help="the search's first session count")
    p.add_argument("--stock-start", type=number(int, 1, strict=False), default=None,
                   help="the first count for stock (default: --start)")
    p.add_argument("--grow", type=number(float, 1, strict=True), default=2.0,
                   help="the search grows N by this factor while clean, shrinks by it while missing")
    p.add_argument("--max-sessions", type=number(int, 1, strict=False), default=None,
                   help="the largest count the search may try")
    p.add_argument("--budget-s", type=number(float, 0, strict=True), default=None,
                   help="wall seconds for each mode's search; it stops with the bracket it has (the first count "
                        "always runs)")
    p.add_argument("--sessions", default=None, help="a fixed list of counts instead of the search, e.g. 1,2,4")
    p.add_argument("--stock-sessions", default=None, help="a fixed list for stock (default: --sessions)")
    p.add_argument("--after-miss", type=number(int, 0, strict=False), default=1,
                   help="with --sessions: after the first count that missed, at most this many larger counts")
    p.add_argument("--policy", default="edf", choices=scheduler.POLICIES)
    p.add_argument("--stock-policy", default=None, choices=scheduler.POLICIES,
                   help="policy for stock sessions (default: --policy)")
    p.add_argument("--slack", default="idle", choices=scheduler.SLACKS,
                   help="edf: slack captures in the scheduler's idle time (idle) or right after the unit (after)")
    p.add_argument("--prepare", default="voice", type=prepare_arg, metavar="|".join(PREPARES),
                   help="graphs before the cadence: voice (prepare(None)), turns (also every signature the clocks "
                        "say a turn of full units between a first and a last unit of any size meets: "
                        "suite.measure.slack.turn_family), learned:K (also the K signatures most "
                        "sessions of the learn half of the recordings meet; sessions then run on the serve half "
                        "only: workloads.traffic.split) or oracle (also the session's own script: foreknowledge, "
                        "labelled)")
    p.add_argument("--recordings", default=None, choices=RECORDINGS,
                   help="voxconverse traffic: windows of every recording (all) or of workloads.traffic.split()'s "
                        "serve half only (serve; what learned:K needs, and the default with it): stock on the "
                        "serve half plays the traffic a learned cadence run plays")
    p.add_argument("--open-at", choices=OPEN_AT, default="start",
                   help="start: every session opened and prepared before the cadence starts (a warm pool); join: "
                        "each opened and prepared on its own thread at its join time while the others speak "
                        "(--policy threads, voxconverse traffic)")
    p.add_argument("--reference-sessions", type=number(int, 0, strict=False), default=None,
                   help="compare the first K sessions with themselves run alone (default: every session)")
    p.add_argument("--variants", type=number(int, 1, strict=False), default=1,
                   help="committed traffic: distinct payload variants across sessions")
    p.add_argument("--depth", default="released", choices=("released", "reduced"))
    p.add_argument("--steps", type=number(int, 1, strict=False), default=None, help="override the workload's Euler steps")
    p.add_argument("--budget-mib", type=number(float, 0, strict=False), default=None,
                   help="memory for sessions (default: 90%% of free device memory with the model built; none on CPU)")
    p.add_argument("--checkpoint", action="append", default=None, metavar="[WORKLOAD=]PATH",
                   help="build WORKLOAD from the checkpoint at PATH (its released layout, docs/weights.md; repeatable; "
                        "PATH alone with one workload); default: seeded random weights")
    p.add_argument("--out", required=True, type=env.out_folder)
    p.add_argument("--quiet", dest="progress", action="store_false")
    return p


def names_of(text: str) -> list[str]:
    return workloads.names() if text == "all" else [w.strip() for w in text.split(",")]


def counts_of(args) -> dict | None:
    """{mode: fixed counts} where --sessions / --stock-sessions give them, else None (the search)."""
    out = {}
    for m in args.modes:
        flag = "--stock-sessions" if (m == "stock" and args.stock_sessions) else "--sessions"
        text = args.stock_sessions if flag == "--stock-sessions" else args.sessions
        if text:
            out[m] = parse_sessions(text, flag)
    return out or None


def prepare_arg(text: str) -> str:
    """An argparse type for --prepare: one of PREPARES (K an int >= 1), else one line."""
    try:
        learned_graphs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("prepare: ")) from None
    return text


def check_args(args: argparse.Namespace) -> None:
    """Every flag's value, before any model is built. Raises SystemExit (status 2) naming the flag. Sets
    args.checkpoints: {workload: absolute path} from --checkpoint ({} without it)."""
    for m in args.modes:
        if m not in MODES:
            raise usage_error(f"--modes: expected a subset of {MODES}, got {m!r}")
    if len(set(args.modes)) != len(args.modes):
        raise usage_error(f"--modes: expected each mode once, got {','.join(args.modes)!r}")
    if learned_graphs(args.prepare) and args.traffic != "voxconverse":
        raise usage_error(f"--prepare {args.prepare}: learns from the recordings, so it needs --traffic voxconverse, "
                          f"got {args.traffic!r}")
    if args.recordings is not None and args.traffic != "voxconverse":
        raise usage_error(f"--recordings {args.recordings}: chooses VoxConverse recordings, so it needs --traffic "
                          f"voxconverse, got {args.traffic!r}")
    if learned_graphs(args.prepare) and args.recordings == "all":
        raise usage_error(f"--recordings all: --prepare {args.prepare} learns from the learn half, so its sessions "
                          "play the serve half only (--recordings serve, the default with it)")
    if args.open_at == "join":
        used = {m: (args.stock_policy if (m == "stock" and args.stock_policy) else args.policy) for m in args.modes}
        if any(p != "threads" for p in used.values()) or args.traffic != "voxconverse":
            raise usage_error(f"--open-at join: opens each session on its own thread while the others speak, so it "
                              f"needs --policy threads for every mode and --traffic voxconverse; got policies {used} "
                              f"and --traffic {args.traffic}")
    if args.max_sessions is not None and max(args.start, args.stock_start or 1) > args.max_sessions:
        raise usage_error(f"--max-sessions: {args.max_sessions} is below the start count")
    if len(set(names_of(args.workload))) != len(names_of(args.workload)):
        raise usage_error(f"--workload: expected each workload once, got {args.workload!r}")
    for name in names_of(args.workload):
        if name not in workloads.names():
            raise usage_error(f"--workload: expected 'all' or some of {workloads.names()}, got {name!r}")
        if args.traffic == "committed" and not any(u.kind == "SPEAK" for u in
                                                   session_units(workloads.get(name), args.seconds)):
            raise usage_error(f"--seconds: the first {args.seconds:g} s of {name}'s script hold no SPEAK unit "
                              f"(nothing to measure); give more seconds")
    try:                                        # checked here, not at parsing: a stage's argv parses anywhere
        env.device_arg(args.device)
    except argparse.ArgumentTypeError as exc:
        raise usage_error(f"--device: {exc}") from None
    try:
        args.checkpoints = env.parse_checkpoints(args.checkpoint, names_of(args.workload))
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    try:
        if args.sessions:
            parse_sessions(args.sessions)
        if args.stock_sessions:
            parse_sessions(args.stock_sessions, "--stock-sessions")
        parse_ar(args.ar)
    except (ValueError, ARSpecError) as exc:
        raise usage_error(str(exc)) from None
