"""How many CUDA graphs a session holds, from the clocks alone: every real session script of `--units` units
(workloads.traffic: one per VoxConverse window) walked through a DuplexCadence session's clocks, counting the
distinct signatures its steps meet (each one graph when captured). Host only: the session is opened at reduced
depth on the CPU just to read its clocks (the signatures are lengths in frames and tokens, which the depth does
not change); nothing is spoken.

    PYTHONPATH=impl:. python tools/graph_set.py [--units 60] [--workload NAME ...] [--coverage K,K,...]
        [--out FILE.json]

Prints, per workload: windows walked, refused scripts, and the distinct signatures per session (min, median,
p90, max) with the steps they belong to, and the signatures of all sessions together (what one model's
sessions could share).

`--coverage`: how many units a session would run eagerly (a unit with a signature its session has no graph
for yet; captured after it, as the duplex harness's slack does) when each session first captures the K
signatures that the most scripts of the learn recordings meet (workloads.traffic.split; the ranking of
`suite.measure.duplex --prepare learned:K`), counted over the scripts of the serve recordings only, for each
K; K = 0 captures nothing ahead. Per K: the share of units with
work that run eagerly (all sessions together, and the median and p90 per session) and the graphs a session
holds at its end (median, max). Flow-matching workloads also get the row of `prepare(None)` (the steady
signatures of a full-unit turn), and every workload the row "turns" (`turn_family`: every signature the clocks
say a turn of full units between a first and a last unit of any size meets: `suite.measure.slack.turn_family`,
what `suite.measure.duplex --prepare turns` captures at open). Each row comes twice: as above, and "+ slack": the session also captures,
after every unit, the next unit's signatures the duplex harness's slack predicts from the clocks
(`suite.measure.slack.next_signatures`: a full unit, in a new turn where none is open). Each row says where its
eager units stand (POSITIONS: a turn's first unit, its final one, a shorter unit inside a turn, a full one).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def walk(clocks, units) -> list:
    """The distinct signatures of one script's SPEAK units (and of LISTEN units that carry a payload, which Moshi
    decodes), walked from a copy of `clocks`; ordered by first occurrence."""
    return list(dict.fromkeys(s for sigs in unit_signatures(clocks, units) for s in sigs))


def unit_signatures(clocks, units) -> list[tuple]:
    """Per unit with work (as `walk` walks them), the signatures of its steps."""
    return [u.signatures for u in slack_walk(clocks, units)]


class Walked(NamedTuple):
    """One unit with work of a script walked through the clocks: its steps' signatures, the next unit's
    signatures the duplex harness's slack asks for after it (`suite.measure.slack.next_signatures`; () without
    capabilities), and where it stands (POSITIONS)."""
    signatures: tuple
    predicted: tuple
    position: str


#: Where a unit with work stands: the first SPEAK unit of a turn, the last (final), a SPEAK unit carrying less
#: than the session's max_payload that is neither, any other SPEAK unit, a LISTEN unit with a payload (Moshi).
POSITIONS = ("turn_start", "final", "short", "full", "listen")


def slack_walk(clocks, units, capabilities=None) -> list[Walked]:
    """The units with work of one script, walked from a copy of `clocks` as the duplex harness runs them: a turn
    opened at each SPEAK unit of a new turn, closed after its final unit; with `capabilities` (the session's),
    also each unit's predicted next signatures, from a copy of the clocks after it."""
    from suite.measure.paired import payload_size
    from suite.measure.slack import next_signatures

    c, out, turn = clocks.copy(), [], None
    for u in units:
        if u.kind != "SPEAK" and u.payload is None:
            continue
        size, final, position = payload_size(u.payload), bool(u.kind == "SPEAK" and u.final), "listen"
        if u.kind == "SPEAK":
            position = "turn_start" if u.turn != turn else ("final" if final else "full")
            if u.turn != turn:
                c.start_turn()
                turn = u.turn
        sigs = tuple(c.unit(size, final))
        if position == "full" and capabilities is not None and size < capabilities.max_payload:
            position = "short"
        if final:
            turn = None
        predicted = () if capabilities is None else tuple(next_signatures(c.copy(), capabilities, turn is not None))
        out.append(Walked(sigs, predicted, position))
    return out


def eager_units(script: list[tuple], prepared: set, predicted: list[tuple] | None = None,
                positions: list[str] | None = None) -> tuple:
    """(units that meet a signature not captured yet, graphs held at the end) for one session that starts
    with `prepared` captured and captures every signature right after the unit that first meets it and, with
    `predicted` (one tuple per unit), the next unit's predicted signatures after each unit, as the duplex
    harness's slack does. With `positions` (one per unit), a third item: {position: eager units there}."""
    have, eager, where = set(prepared), 0, Counter()
    for i, sigs in enumerate(script):
        if not have.issuperset(sigs):
            eager += 1
            if positions is not None:
                where[positions[i]] += 1
        have.update(sigs)
        if predicted is not None:
            have.update(predicted[i])
    return (eager, len(have)) if positions is None else (eager, len(have), dict(where))


def coverage(name: str, units: int, budgets: list[int]) -> dict:
    """The `--coverage` rows of one workload (module docstring)."""
    clocks, capabilities = open_clocks(name, capabilities=True)
    import workloads
    from workloads import traffic

    wl = workloads.get(name)
    by_rec: dict[str, list[list[Walked]]] = {}
    for w in traffic.windows(units):
        try:
            script = slack_walk(clocks, traffic.session_script(wl.architecture, w, 0).units, capabilities)
        except Exception:  # noqa: BLE001  (refused scripts are reported by workload_set)
            continue
        by_rec.setdefault(w.recording, []).append(script)
    from suite.measure.duplex_run import ranked as rank
    from suite.measure.slack import turn_family

    learn, serve = traffic.split()
    ranked = rank((s for u in sc for s in u.signatures) for rec in learn for sc in by_rec.get(rec, []))
    plans = {f"top {k}": set(ranked[:k]) for k in budgets}
    if wl.architecture == "flow_hift":
        from duplexcadence.adapters.flow_hift.plan import steady_signatures
        plans["prepare(None)"] = set(steady_signatures(clocks))
    plans["turns"] = set(turn_family(clocks, capabilities))
    rows = {}
    for label, prepared in plans.items():
        for slack in (False, True):
            eager, work, shares, held, where = 0, 0, [], [], Counter()
            for rec in serve:
                for sc in by_rec.get(rec, []):
                    e, g, at = eager_units([u.signatures for u in sc], prepared,
                                           [u.predicted for u in sc] if slack else None, [u.position for u in sc])
                    eager, work = eager + e, work + len(sc)
                    shares.append(e / max(len(sc), 1))
                    held.append(g)
                    where.update(at)
            rows[label + (" + slack" if slack else "")] = {
                "eager_share": eager / max(work, 1), "eager_share_per_session_median": float(np.median(shares)),
                "eager_share_per_session_p90": float(np.percentile(shares, 90)),
                "graphs_per_session_median": float(np.median(held)), "graphs_per_session_max": max(held),
                "units_with_work": work, "eager_units": eager,
                "eager_by_position": {k: where.get(k, 0) for k in POSITIONS}}
    return {"workload": name, "units": units, "learn": list(learn), "serve": list(serve),
            "learned_signatures": len(ranked), "rows": rows}


def open_clocks(name: str, capabilities: bool = False):
    """A DuplexCadence session's clocks for workload `name` (reduced depth, CPU; the session is closed); with
    `capabilities`, (clocks, the session's Capabilities)."""
    import workloads
    from duplexcadence import runtime
    from suite.measure.session import make_spec

    wl = workloads.get(name)
    adapter = runtime.adapter(wl.architecture)
    model = adapter.build_model(make_spec(wl), device="cpu", depth="reduced", seed=0)
    session = adapter.new_session(model, "cadence", make_spec(wl))
    clocks, caps = session.clocks(), session.capabilities
    session.close()
    return (clocks, caps) if capabilities else clocks


def workload_set(name: str, units: int) -> dict:
    import workloads
    from workloads import traffic

    wl = workloads.get(name)
    clocks = open_clocks(name)
    per, refused, union, steps = [], [], set(), Counter()
    for w in traffic.windows(units):
        script = traffic.session_script(wl.architecture, w, 0)
        try:
            sigs = walk(clocks, script.units)
        except Exception as exc:  # noqa: BLE001  (a script the session refuses: reported, not counted)
            refused.append(f"{w.name}: {type(exc).__name__}: {exc}")
            continue
        per.append(len(sigs))
        union.update(sigs)
        steps.update(s.step for s in sigs)
    q = np.percentile(per, [0, 50, 90, 100]).tolist() if per else [None] * 4
    return {"workload": name, "units": units, "windows": len(per) + len(refused), "refused": refused,
            "per_session": dict(zip(("min", "median", "p90", "max"), q)),
            "steps_per_session_mean": {k: v / max(len(per), 1) for k, v in sorted(steps.items())},
            "all_sessions": len(union)}


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=_count, default=60, help="units per session script (a window of the recordings)")
    ap.add_argument("--workload", action="append")
    ap.add_argument("--coverage", type=lambda v: [_count(k) for k in v.split(",")], default=None,
                    help="comma-separated K: sessions capture the K signatures most frequent in other recordings")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import workloads
    from workloads import traffic
    names = args.workload or [w for w in workloads.names()]
    unknown = [n for n in names if n not in workloads.names()]
    if unknown:
        ap.error(f"--workload: expected some of {workloads.names()}, got {unknown}")
    if not traffic.windows(args.units):
        ap.error(f"--units: no usable window of {args.units} s in the recordings (workloads.traffic: a window needs {traffic.MIN_TURNS} turns and {traffic.MIN_SPEAK_UNITS} SPEAK units); give more")
    if args.out and (Path(args.out).is_dir() or not Path(args.out).resolve().parent.is_dir()):
        ap.error(f"--out: expected a file in an existing folder, got {args.out!r}")
    rows = [workload_set(n, args.units) for n in names]
    for r in rows:
        p = r["per_session"]
        print(f"{r['workload']:18s} windows {r['windows']:4d}  refused {len(r['refused']):3d}  graphs per session "
              f"min {p['min']:.0f} median {p['median']:.0f} p90 {p['p90']:.0f} max {p['max']:.0f}  "
              f"all sessions {r['all_sessions']}  by step {json.dumps({k: round(v, 1) for k, v in r['steps_per_session_mean'].items()})}")
    cover = [coverage(n, args.units, args.coverage) for n in names] if args.coverage is not None else []
    for c in cover:
        for label, r in c["rows"].items():
            at = ", ".join(f"{k} {v}" for k, v in r["eager_by_position"].items() if v)
            print(f"{c['workload']:18s} {label:22s} eager units {100 * r['eager_share']:5.1f}% (per session median "
                  f"{100 * r['eager_share_per_session_median']:.1f}%, p90 {100 * r['eager_share_per_session_p90']:.1f}%)"
                  f"  graphs per session median {r['graphs_per_session_median']:.0f} max {r['graphs_per_session_max']}"
                  f"  eager at: {at or 'none'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows, "coverage": cover}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
