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
signatures of a full-unit turn).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

import numpy as np

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def walk(clocks, units) -> list:
    """The distinct signatures of one script's SPEAK units (and of LISTEN units that carry a payload, which Moshi
    decodes), walked from a copy of `clocks`; ordered by first occurrence."""
    return list(dict.fromkeys(s for sigs in unit_signatures(clocks, units) for s in sigs))


def unit_signatures(clocks, units) -> list[tuple]:
    """Per unit with work (as `walk` walks them), the signatures of its steps."""
    from suite.measure.paired import payload_size

    c, out, turn = clocks.copy(), [], None
    for u in units:
        if u.kind != "SPEAK" and u.payload is None:
            continue
        if u.kind == "SPEAK" and u.turn != turn:
            c.start_turn()
            turn = u.turn
        out.append(tuple(c.unit(payload_size(u.payload), bool(u.kind == "SPEAK" and u.final))))
    return out


def eager_units(script: list[tuple], prepared: set) -> tuple[int, int]:
    """(units that meet a signature not captured yet, graphs held at the end) for one session that starts
    with `prepared` captured and captures every signature right after the unit that first meets it."""
    have, eager = set(prepared), 0
    for sigs in script:
        if not have.issuperset(sigs):
            eager += 1
            have.update(sigs)
    return eager, len(have)


def coverage(name: str, units: int, budgets: list[int]) -> dict:
    """The `--coverage` rows of one workload (module docstring)."""
    clocks = open_clocks(name)
    import workloads
    from workloads import traffic

    wl = workloads.get(name)
    by_rec: dict[str, list[list[tuple]]] = {}
    for w in traffic.windows(units):
        try:
            script = unit_signatures(clocks, traffic.session_script(wl.architecture, w, 0).units)
        except Exception:  # noqa: BLE001  (refused scripts are reported by workload_set)
            continue
        by_rec.setdefault(w.recording, []).append(script)
    from suite.measure.duplex_run import ranked as rank

    learn, serve = traffic.split()
    ranked = rank((s for sigs in sc for s in sigs) for rec in learn for sc in by_rec.get(rec, []))
    plans = {f"top {k}": set(ranked[:k]) for k in budgets}
    if wl.architecture == "flow_hift":
        from duplexcadence.adapters.flow_hift.plan import steady_signatures
        plans["prepare(None)"] = set(steady_signatures(clocks))
    rows = {}
    for label, prepared in plans.items():
        eager, work, shares, held = 0, 0, [], []
        for rec in serve:
            for sc in by_rec.get(rec, []):
                e, g = eager_units(sc, prepared)
                eager, work = eager + e, work + len(sc)
                shares.append(e / max(len(sc), 1))
                held.append(g)
        rows[label] = {"eager_share": eager / max(work, 1), "eager_share_per_session_median": float(np.median(shares)),
                       "eager_share_per_session_p90": float(np.percentile(shares, 90)),
                       "graphs_per_session_median": float(np.median(held)), "graphs_per_session_max": max(held),
                       "units_with_work": work}
    return {"workload": name, "units": units, "learn": list(learn), "serve": list(serve),
            "learned_signatures": len(ranked), "rows": rows}


def open_clocks(name: str):
    """A DuplexCadence session's clocks for workload `name` (reduced depth, CPU; the session is closed)."""
    import workloads
    from duplexcadence import runtime
    from suite.measure.session import make_spec

    wl = workloads.get(name)
    adapter = runtime.adapter(wl.architecture)
    model = adapter.build_model(make_spec(wl), device="cpu", depth="reduced", seed=0)
    session = adapter.new_session(model, "cadence", make_spec(wl))
    clocks = session.clocks()
    session.close()
    return clocks


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=60)
    ap.add_argument("--workload", action="append")
    ap.add_argument("--coverage", type=lambda v: [int(k) for k in v.split(",")], default=None,
                    help="comma-separated K: sessions capture the K signatures most frequent in other recordings")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import workloads
    names = args.workload or [w for w in workloads.names()]
    rows = [workload_set(n, args.units) for n in names]
    for r in rows:
        p = r["per_session"]
        print(f"{r['workload']:18s} windows {r['windows']:4d}  refused {len(r['refused']):3d}  graphs per session "
              f"min {p['min']:.0f} median {p['median']:.0f} p90 {p['p90']:.0f} max {p['max']:.0f}  "
              f"all sessions {r['all_sessions']}  by step {json.dumps({k: round(v, 1) for k, v in r['steps_per_session_mean'].items()})}")
    cover = [coverage(n, args.units, args.coverage) for n in names] if args.coverage is not None else []
    for c in cover:
        for label, r in c["rows"].items():
            print(f"{c['workload']:18s} {label:14s} eager units {100 * r['eager_share']:5.1f}% (per session median "
                  f"{100 * r['eager_share_per_session_median']:.1f}%, p90 {100 * r['eager_share_per_session_p90']:.1f}%)"
                  f"  graphs per session median {r['graphs_per_session_median']:.0f} max {r['graphs_per_session_max']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows, "coverage": cover}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
