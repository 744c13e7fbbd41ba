"""The tables of a staged run's REPORT.md about the run itself: against reference runs, the noise between
runs, the latest GPU verification, provenance, and the stages (where each ran). A reference measured on
another GPU type is never compared with or pooled into ours."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from suite.records import HARNESSES, git, headline, read_json
from suite.report.figures import (beside, finite, gpu_name, memory_figures, profiled_before_rounds, speedup,
                                  timing_rounds)
from suite.report.text import DASH, fmt, pct_change, table


def ref_list(refs: dict) -> dict[str, list[tuple[str, dict]]]:
    """refs as workload -> [(label, record), ...]: accepts workload -> record (labelled by its run_id) or
    workload -> list of (label, record) pairs."""
    return {w: [(str(v.get("run_id", DASH)), v)] if isinstance(v, dict) else list(v) for w, v in (refs or {}).items()}


def compare_table(data: dict, refs: dict) -> str:
    """Speedup and peak-memory change of ours vs each reference record, per workload found in both (a row per
    reference run)."""
    rows = []
    by_workload = ref_list(refs)
    for w, e, label, ref in [(w, e, label, ref) for w, e in data["workloads"].items()
                             for label, ref in by_workload.get(w, [])]:
        rec = e.get("verify", {}).get("record")
        ours, theirs = speedup(rec), speedup(ref)
        if ours and theirs and gpu_name(rec) != gpu_name(ref):
            sp = f"not comparable: ours on {gpu_name(rec)}, the reference on {gpu_name(ref)}"
        elif ours and theirs:
            inside = theirs["lo"] <= ours["x"] <= theirs["hi"]
            verdict = "within the reference's noise" if inside else "OUTSIDE the reference's noise"
            sp = (f"{ours['x']:.2f}x [{ours['lo']:.2f}-{ours['hi']:.2f}] ({ours['band']}) vs {theirs['x']:.2f}x "
                  f"[{theirs['lo']:.2f}-{theirs['hi']:.2f}] ({theirs['band']}): {verdict}")
        else:
            sp = "not comparable (a side without both modes measured)"
        m = memory_figures(e)
        ref_mem = {k: headline(v["memory"])[1] for k, v in ref.get("modes", {}).items()}
        ours_pct = pct_change(m.get("cadence", {}).get("peak"), m.get("stock", {}).get("peak"))
        ref_pct = pct_change(ref_mem.get("cadence"), ref_mem.get("stock"))
        mem = (DASH if ours_pct is None or ref_pct is None else
               f"{ours_pct:+.1f}% vs {ref_pct:+.1f}% ({ours_pct - ref_pct:+.1f} points; one sample per run, no spread)")
        rows.append([w, label, sp, mem])
    if not rows:
        return "No workload of this run is in the reference run(s)."
    return table(rows, ["workload", "reference run", "speedup: ours [band] vs reference [band]",
                        "peak memory change: ours vs reference"])


def between_runs_table(data: dict, refs: dict) -> str:
    """Per workload, this run's verify rounds beside the reference runs' of the same impl/ tree on the same GPU
    type: each run's median speedup, the references' pooled round band, whether ours lies in it, and how far
    stock's and cadence's round p50s moved over all these runs. References of another or an unknown impl/ tree
    or another GPU are counted out and named; of a run whose rounds 2+ ran after the profiler, only round 1
    counts. Returns a sentence when no workload has a reference with timing rounds."""
    rows = []
    for w, e in data["workloads"].items():
        ours = e.get("verify", {}).get("record")
        mine = timing_rounds(ours)
        if not mine:
            continue
        ours_cut = profiled_before_rounds(ours)
        if ours_cut:
            mine = mine[:1]
        tree, gpu = (ours.get("provenance") or {}).get("impl_tree"), gpu_name(ours)
        same, other, other_gpu, cut = [], [], [], []
        for label, ref in ref_list(refs).get(w, []):
            rr = timing_rounds(ref)
            if profiled_before_rounds(ref):
                rr, _ = rr[:1], cut.append(label)
            if not rr:
                continue
            theirs = (ref.get("provenance") or {}).get("impl_tree")
            if gpu_name(ref) != gpu:
                other_gpu.append(label)
            elif tree and theirs and str(theirs) == str(tree):     # an unknown tree is never "the same"
                same.append((label, rr))
            else:
                other.append(label)
        gpu_note = "" if not other_gpu else "; other GPUs counted out: " + ", ".join(other_gpu)
        if not same:
            if other or other_gpu:
                rows.append([w, DASH, DASH, DASH, DASH, DASH, "no reference of this impl/ tree"
                             + (f" (other trees: {', '.join(other)})" if other else "") + gpu_note])
            continue
        pooled = [float(r["speedup_x"]) for _, rr in same for r in rr]
        lo, hi = min(pooled), max(pooled)
        x = float(np.median([float(r["speedup_x"]) for r in mine]))
        everything = [mine] + [rr for _, rr in same]
        stock, cad = ([float(r[k]) for rr in everything for r in rr if finite(r.get(k)) and r[k] > 0]
                      for k in ("stock_tail_ms_p50", "cadence_tail_ms_p50"))
        medians = ", ".join(f"{np.median([float(r['speedup_x']) for r in rr]):.2f}x" for _, rr in same)
        note = ("" if not other else "; other impl/ trees counted out: " + ", ".join(other)) + gpu_note
        cut = (["ours"] if ours_cut else []) + cut
        note += "" if not cut else "; round 1 only (rounds 2+ timed after the profiler): " + ", ".join(cut)
        moved = ", ".join(f"{name} x{max(v) / min(v):.2f} ({min(v):.1f}-{max(v):.1f} ms)"
                          for name, v in (("stock", stock), ("cadence", cad)) if v) or DASH
        rows.append([w, str(len(same)), medians, f"{x:.2f}x",
                     f"[{lo:.2f}-{hi:.2f}] ({len(pooled)} round{'s' if len(pooled) != 1 else ''})",
                     "yes" if lo <= x <= hi else "NO", f"{moved}{note}"])
    if not rows:
        return "No reference run with timing rounds for a workload of this run."
    return table(rows, ["workload", "reference runs (same impl/ tree)", "their medians (round 1 where cut)",
                        "ours (median)", "their rounds pooled [min-max]", "ours inside",
                        "round p50 moved, over all these runs"])


def records(data: dict) -> list[dict]:
    return [h["record"] for e in data["workloads"].values() for h in e.values() if h.get("record")]


def gpu_coverage(data: dict, results_root: Path | None = None) -> str:
    """Which impl/ tree the latest GPU verification (a CUDA verify record here or under results_root) covers,
    and whether it is HEAD's (`git rev-parse HEAD:impl`, where git is available)."""
    cands = [(r, "this run") for r in records(data) if r.get("comparison") is not None]
    if results_root is not None and results_root.is_dir():
        for p in sorted(results_root.glob("*/run.json")) + sorted(results_root.glob("*/*/run.json")):
            rec = read_json(p)
            if rec and rec.get("comparison") is not None:
                cands.append((rec, str(p.parent)))
    cuda = [(r, src) for r, src in cands if str(r.get("device", "")).startswith("cuda")]
    if not cuda:
        return "No GPU verification in this run or under results/."
    head = git("rev-parse", "HEAD:impl")
    rec, src = max(cuda, key=lambda rs: str(rs[0]["provenance"].get("date_utc")))
    tree = str(rec["provenance"].get("impl_tree"))
    if head is None:
        same = "HEAD is unknown here (no git)"
    elif tree != "NA" and (head.startswith(tree) or tree.startswith(head)):
        same = f"it is HEAD's impl/ tree ({head[:12]})"
    else:
        same = f"it is NOT HEAD's impl/ tree (HEAD: {head[:12]}); rerun the GPU stages to cover HEAD"
    return (f"Latest GPU verification: `{rec.get('run_id', src)}` ({src}), {rec['provenance'].get('date_utc')}, "
            f"{rec['workload']['name']}, commit {str(rec['provenance'].get('git_rev'))[:12]}, impl/ tree "
            f"{tree[:12]}: {same}.")


def provenance_table(data: dict) -> str:
    recs, state = records(data), data["state"]

    def distinct(fn) -> str:
        vals = []
        for r in recs:
            try:
                v = fn(r)
            except (KeyError, TypeError):
                continue
            if v not in vals:
                vals.append(v)
        return "; ".join(str(v) for v in vals) or DASH

    def dev(r):
        return r["provenance"]["device"]
    rows = [
        ["GPU", distinct(lambda r: dev(r).get("gpu_name") or f"CPU: {dev(r).get('cpu_model')}")],
        ["driver", distinct(lambda r: dev(r).get("driver") or DASH)],
        ["torch / CUDA / cuDNN", distinct(lambda r: f"{r['provenance']['torch']} / {r['provenance']['cuda']} / "
                                                    f"{r['provenance']['cudnn']}")],
        ["packages", distinct(lambda r: ", ".join(f"{k}=={v}" for k, v in r["provenance"]["packages"].items()))],
        ["commit (per stage record)", distinct(lambda r: str(r["provenance"]["git_rev"])[:12]
                                               + (" (dirty)" if r["provenance"].get("git_dirty") else ""))],
        ["impl/ tree (per stage record)", distinct(lambda r: str(r["provenance"]["impl_tree"])[:12])],
        ["stage commands", distinct(lambda r: " ".join(r["provenance"]["command"][1:]))],
        ["seeds", distinct(lambda r: json.dumps(r.get("seeds"), sort_keys=True))],
        ["env", distinct(lambda r: json.dumps(r["provenance"].get("env"), sort_keys=True))],
        ["stage records dated (UTC)", distinct(lambda r: r["provenance"]["date_utc"])],
    ]
    for i, s in enumerate(state.get("sittings", []), 1):
        rows.append([f"sitting {i} command", " ".join(s.get("command") or [])])
        rows.append([f"sitting {i}", f"{s.get('started_utc')} -> {s.get('ended_utc', 'unfinished')}, budget "
                     f"{fmt(s.get('budget_s'))} s"
                     + (f", GPUs {','.join(map(str, s['gpus']))}" if s.get("gpus") else "")
                     + (f", on Ray ({s['ray']})" if s.get("ray") else "")
                     + f", git {str(s.get('git_rev'))[:12]}, impl/ tree "
                     f"{str(s.get('impl_tree'))[:12]}; ran {len(s.get('ran', []))}, kept {len(s.get('kept', []))}"
                     + (f"; stopped: {s['stopped']}" if s.get("stopped") else "")])
    trees = {str(r["provenance"].get("impl_tree")) for r in recs}
    if len(trees) > 1:
        rows.append(["WARNING", f"stage records come from {len(trees)} impl/ trees: {sorted(trees)}; ratios "
                                f"mix code versions"])
    return table(rows, ["", ""])


def ran_on(name: str, st: dict, data: dict) -> str:
    """Where a stage ran: its node (a Ray node; none named: the sitting's own host), its GPU index there and
    the device its record names."""
    entry = data["workloads"].get(st["workload"], {}).get(st["harness"], {})
    record = entry.get("record") or (entry.get("duplex") or {}).get("record")
    device = st.get("gpu_name") or gpu_name(record)
    parts = [st.get("node"), None if st.get("gpu") is None else f"GPU {st['gpu']}", device]
    return ", ".join(str(p) for p in parts if p) or DASH


def stages_table(data: dict) -> str:
    rows = []
    for name, st in data["state"].get("stages", {}).items():
        legacy = "" if st["harness"] in HARNESSES else "legacy (a harness this version does not run; kept as recorded)"
        rows.append([name, st["status"], fmt(st.get("seconds")), fmt(st.get("budget_s"), ".0f"),
                     str(st.get("attempts", 0)), ran_on(name, st, data), st.get("verdict") or DASH,
                     ", ".join(dict.fromkeys(st.get("invalid_codes") or [])) or DASH,
                     ", ".join(beside(name, data["state"]["stages"])) or DASH,
                     "; ".join(x for x in (legacy, st.get("reason") or "") if x)])
    return table(rows, ["stage", "status", "seconds", "budget s", "attempts", "ran on (node, GPU)", "verdict",
                        "invalid codes", "ran beside", "reason"])
