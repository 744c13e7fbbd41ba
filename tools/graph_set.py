"""How many CUDA graphs a session holds, from the clocks alone: every real session script of `--units` units
(workloads.traffic: one per VoxConverse window) walked through a DuplexCadence session's clocks, counting the
distinct signatures its steps meet (each one graph when captured). Host only: the session is opened at reduced
depth on the CPU just to read its clocks (the signatures are lengths in frames and tokens, which the depth does
not change); nothing is spoken.

    PYTHONPATH=impl:. python tools/graph_set.py [--units 60] [--workload NAME ...] [--out FILE.json]

Prints, per workload: windows walked, refused scripts, and the distinct signatures per session (min, median,
p90, max) with the steps they belong to, and the signatures of all sessions together (what one model's
sessions could share).
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
    from suite.measure.paired import payload_size

    c, seen, turn = clocks.copy(), {}, None
    for u in units:
        if u.kind != "SPEAK" and u.payload is None:
            continue
        if u.kind == "SPEAK" and u.turn != turn:
            c.start_turn()
            turn = u.turn
        final = bool(u.kind == "SPEAK" and u.final)
        seen.update(dict.fromkeys(c.unit(payload_size(u.payload), final)))
    return list(seen)


def workload_set(name: str, units: int) -> dict:
    import workloads
    from duplexcadence import runtime
    from suite.measure.session import make_spec
    from workloads import traffic

    wl = workloads.get(name)
    adapter = runtime.adapter(wl.architecture)
    model = adapter.build_model(make_spec(wl), device="cpu", depth="reduced", seed=0)
    session = adapter.new_session(model, "cadence", make_spec(wl))
    clocks = session.clocks()
    session.close()
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
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
