"""The parts of a staged run's REPORT.md about the run itself: the reproducibility bars against reference
runs, the latest GPU verification, the stages (where each ran) and provenance, as compact lists. A reference
measured on another GPU type is never compared with ours."""
from __future__ import annotations

import json
from pathlib import Path

from suite.records import HARNESSES, git, read_json, verify_protocol
from suite.records.host_speed import PROBE_REFERENCE_US
from suite.records.paired import MIN_STATE_PAIRS, Summary, reproduces, reproduces_at_reference
from suite.report.claims import ordered
from suite.report.figures import beside, gpu_name, paired_summary, speedup
from suite.report.text import DASH, fmt, interval


def ref_list(refs: dict) -> dict[str, list[tuple[str, dict]]]:
    """refs as workload -> [(label, record), ...]: accepts workload -> record (labelled by its run_id) or
    workload -> list of (label, record) pairs."""
    return {w: [(str(v.get("run_id", DASH)), v)] if isinstance(v, dict) else list(v) for w, v in (refs or {}).items()}


def bar(ours: dict | None, ref: dict | None, name: str) -> tuple[str, list[str]]:
    """The reproducibility bar for one workload, this run (second) against a reference (first): (verdict,
    reasons). "met" / "not met" by suite.records.paired.reproduces on the two paired summaries; "open" where
    either record is of the older protocol, either lacks the workload, or they ran on different GPU types."""
    unjudged = not_judged(ours, ref, name)
    if unjudged:
        return unjudged
    v = reproduces({name: Summary.from_dict(ref["paired"]["speedup"])}, {name: Summary.from_dict(ours["paired"]["speedup"])})
    return ("met" if v.ok else "not met"), v.reasons + [arms(ours, ref)]


def bar_at_reference(ours: dict | None, ref: dict | None, name: str) -> tuple[str, list[str]]:
    """The bar at the reference host speed for one workload, as `bar` but by
    suite.records.paired.reproduces_at_reference (each record's fit, `paired_summary`)."""
    unjudged = not_judged(ours, ref, name)
    if unjudged:
        return unjudged
    v = reproduces_at_reference({name: paired_summary(ref)}, {name: paired_summary(ours)})
    return ("met" if v.ok else "not met"), v.reasons


def not_judged(ours: dict | None, ref: dict | None, name: str) -> tuple[str, list[str]] | None:
    """("open", reasons) where the two records cannot be judged by a bar (module docstring, `bar`), else None."""
    if not ours or not ref:
        return "open", [f"{name}: not in {'this run' if not ours else 'the reference'}"]
    if gpu_name(ours) != gpu_name(ref):
        return "open", [f"{name}: not comparable: ours on {gpu_name(ours)}, the reference on {gpu_name(ref)}"]
    kinds = {"this run": verify_protocol(ours), "the reference": verify_protocol(ref)}
    older = [k for k, v in kinds.items() if v != "paired"]
    if older:
        a, b = speedup(ours), speedup(ref)
        seen = "" if not (a and b) else (f" (ours {interval(a['x'], a['lo'], a['hi'])}, the reference's "
                                         f"{interval(b['x'], b['lo'], b['hi'])}, {b['band']})")
        return "open", [f"{name}: not judged: {' and '.join(older)} of the older protocol (no paired interval){seen}"]
    return None


def arms(ours: dict, ref: dict) -> str:
    """Which arm moved between the two runs: each arm's median ms per unit, the reference's -> ours, and whether
    the two runs ran the same impl/ tree (the bar is for a second run of the same tree)."""
    a, b = ours["paired"]["speedup"], ref["paired"]["speedup"]

    def move(key: str) -> str:
        x, y = b.get(key), a.get(key)
        if not (isinstance(x, (int, float)) and isinstance(y, (int, float)) and x > 0):
            return DASH
        return f"{x:.1f} -> {y:.1f} ms ({(y - x) / x:+.1%})"
    trees = [(r.get("provenance") or {}).get("impl_tree") for r in (ref, ours)]
    same = ("impl/ tree not recorded in both" if not all(trees) else
            "the same impl/ tree" if trees[0] == trees[1] else f"impl/ trees {trees[0][:7]} and {trees[1][:7]}")
    return f"median per unit, the reference's -> ours: stock {move('a_ms_median')}, DuplexCadence {move('b_ms_median')}; {same}"


def compare_lines(data: dict, refs: dict) -> list[str]:
    """The "Against the reference run" section's lines: per reference, per workload of this run, both bars'
    verdicts with their reasons (`bar`, `bar_at_reference`)."""
    lines = [f"The judged bar: per workload, this run's median paired ratio lies inside the reference's 95% "
             f"interval; where both runs saw the same host state (at least {MIN_STATE_PAIRS} pairs each), it is "
             f"judged per state instead, for every such state (suite.records.paired.reproduces). Beside it, not "
             f"judged: the bar at the reference host speed ({PROBE_REFERENCE_US:.1f} us per launch, pairs with "
             f"audio and no eager step): this run's ratio there, from the line log(stock / DuplexCadence) against "
             f"the launch probe, lies inside the reference's interval there "
             f"(suite.records.paired.reproduces_at_reference); it was chosen after two H200 runs had been seen, so "
             f"later pairs of runs test it (docs/measurement.md). Older records (timing rounds) are not judged.", ""]
    by_ref: dict[str, dict] = {}
    for w, pairs in ref_list(refs).items():
        for label, rec in pairs:
            by_ref.setdefault(label, {})[w] = rec
    if not by_ref:
        return lines + ["No workload of this run is in the reference run(s)."]
    for label, recs in by_ref.items():
        verdicts, at_ref = {}, {}
        for w, e in ordered(data):
            if "verify" in e:
                verdicts[w] = bar((e.get("verify") or {}).get("record"), recs.get(w), w)
                at_ref[w] = bar_at_reference((e.get("verify") or {}).get("record"), recs.get(w), w)
        lines += [f"Against `{label}`: the judged bar **{overall(verdicts)}** ({met(verdicts)}); at the reference "
                  f"host speed, not judged: {overall(at_ref)} ({met(at_ref)})", ""]
        for w, (v, reasons) in verdicts.items():
            lines += [f"- {w}: **{v}**: " + "; ".join(reasons),
                      f"  - at the reference host speed: **{at_ref[w][0]}**: " + "; ".join(at_ref[w][1])]
        lines += ["", f"Bytes against `{label}` (each unit's sha256 in both runs, same seeds):", ""]
        lines += [f"- {w}: " + same_bytes((e.get("verify") or {}).get("record"), recs.get(w))
                  for w, e in ordered(data) if "verify" in e]
        lines.append("")
    return lines


def met(verdicts: dict) -> str:
    """"K of N workloads met" for {workload: (verdict, reasons)}."""
    return f"{sum(v == 'met' for v, _ in verdicts.values())} of {len(verdicts)} workloads met"


def overall(verdicts: dict) -> str:
    """One verdict for a bar over the workloads: met only if every one is met."""
    return ("met" if verdicts and all(v == "met" for v, _ in verdicts.values()) else
            "not met" if any(v == "not met" for v, _ in verdicts.values()) else "open")


def unit_hashes(rec: dict | None) -> dict[str, dict[int, tuple]]:
    """mode -> unit index -> (sha256_f32, sha256_pcm16) of a verify record's hashed units."""
    return {m: {u["index"]: (u["sha256_f32"], u.get("sha256_pcm16")) for u in body.get("units", [])
                if u.get("sha256_f32")}
            for m, body in ((rec or {}).get("modes") or {}).items()}


def host_threads(rec: dict) -> str:
    prov = rec.get("provenance") or {}
    return (f"torch threads {(prov.get('device') or {}).get('torch_threads', DASH)}, OMP_NUM_THREADS "
            f"{(prov.get('env') or {}).get('OMP_NUM_THREADS', 'unset')}")


def same_bytes(ours: dict | None, ref: dict | None) -> str:
    """Whether this run's units carry the reference's bytes, per mode (units of the same index in both), with
    the host threads of each where they differ (the voice prompt's host features depend on them)."""
    a, b = unit_hashes(ours), unit_hashes(ref)
    modes = [m for m in a if m in b and a[m] and b[m]]
    if not modes:
        return "not compared (no unit hashes of one mode in both runs)"
    counts = {m: (sum(a[m][i] == b[m][i] for i in set(a[m]) & set(b[m])), len(set(a[m]) & set(b[m]))) for m in modes}
    text = ", ".join(f"{m} {eq}/{n}" for m, (eq, n) in counts.items())
    if all(eq == n for eq, n in counts.values()):
        return f"same bytes: {text} units equal"
    ta, tb = host_threads(ours), host_threads(ref)
    why = f"; host threads: ours {ta}, the reference's {tb}" if ta != tb else ""
    return f"**other bytes**: {text} units equal{why}"


def records(data: dict) -> list[dict]:
    """Every stage record of the run: a timed stage's run.json, a duplex stage's duplex.json."""
    return [r for e in data["workloads"].values() for h in e.values()
            if (r := h.get("record") or (h.get("duplex") or {}).get("record"))]


def gpu_coverage(data: dict, results_root: Path | None = None) -> str:
    """Which impl/ tree the latest GPU verification (a CUDA verify record here or under results_root) covers,
    and whether it is HEAD's (`git rev-parse HEAD:impl`, where git is available) when the report is rendered."""
    cands = [(r, "this run") for r in records(data) if r.get("comparison") is not None]
    if results_root is not None and results_root.is_dir():
        for p in sorted(results_root.glob("*/run.json")) + sorted(results_root.glob("*/*/run.json")):
            rec = read_json(p)
            if rec and rec.get("comparison") is not None:
                cands.append((rec, str(p.parent.relative_to(results_root.parent))))
    cuda = [(r, src) for r, src in cands if str(r.get("device", "")).startswith("cuda")]
    if not cuda:
        return "No GPU verification in this run or under results/."
    head = git("rev-parse", "HEAD:impl")
    rec, src = max(cuda, key=lambda rs: str(rs[0]["provenance"].get("date_utc")))
    tree = str(rec["provenance"].get("impl_tree"))
    if head is None:
        same = "HEAD is unknown here (no git)"
    elif tree != "NA" and (head.startswith(tree) or tree.startswith(head)):
        same = f"it is HEAD's impl/ tree ({head[:12]}) as this report is rendered"
    else:
        same = (f"it is NOT HEAD's impl/ tree as this report is rendered (HEAD: {head[:12]}); rerun the GPU stages "
                f"to cover HEAD")
    return (f"Latest GPU verification: `{rec.get('run_id', src)}` ({src}), {rec['provenance'].get('date_utc')}, "
            f"{rec['workload']['name']}, commit {str(rec['provenance'].get('git_rev'))[:12]}, impl/ tree "
            f"{tree[:12]}: {same}.")


def _distinct(recs: list[dict], fn) -> list:
    vals = []
    for r in recs:
        try:
            v = fn(r)
        except (KeyError, TypeError):
            continue
        if v not in vals:
            vals.append(v)
    return vals


def provenance_list(data: dict) -> list[str]:
    """Provenance as a compact list: one line per fact, each distinct value once."""
    recs, state = records(data), data["state"]

    def dev(r):
        return r["provenance"]["device"]

    def one(label: str, fn) -> str:
        return f"- {label}: " + ("; ".join(str(v) for v in _distinct(recs, fn)) or DASH)
    dates = sorted(str(d) for d in _distinct(recs, lambda r: r["provenance"]["date_utc"]))
    lines = [one("device", lambda r: f"GPU: {dev(r)['gpu_name']}" if dev(r).get("gpu_name") else
                 f"CPU only: {dev(r).get('cpu_model')}"),
             one("driver", lambda r: dev(r).get("driver") or DASH),
             one("torch / CUDA / cuDNN", lambda r: f"{r['provenance']['torch']} / {r['provenance']['cuda']} / "
                                                    f"{r['provenance']['cudnn']}"),
             one("packages", lambda r: ", ".join(f"{k}=={v}" for k, v in r["provenance"]["packages"].items())),
             one("commit", lambda r: str(r["provenance"]["git_rev"])[:12]
                 + (" (dirty)" if r["provenance"].get("git_dirty") else "")),
             one("impl/ tree", lambda r: str(r["provenance"]["impl_tree"])[:12]),
             one("seeds", lambda r: json.dumps(r.get("seeds"), sort_keys=True)),
             one("env", lambda r: json.dumps(r["provenance"].get("env"), sort_keys=True)),
             f"- stage records dated: {dates[0]} to {dates[-1]}" if dates else "- stage records dated: " + DASH,
             "- stage commands: each record's provenance.command and stages.json"]
    for i, s in enumerate(state.get("sittings", []), 1):
        lines.append(f"- sitting {i}: {s.get('started_utc')} -> {s.get('ended_utc', 'unfinished')}, "
                     + (f"budget {fmt(s['budget_s'])} s" if s.get("budget_s") is not None else "no budget")
                     + (f", on Ray ({s['ray']})" if s.get("ray") else "")
                     + f", commit {str(s.get('git_rev'))[:12]}, impl/ tree {str(s.get('impl_tree'))[:12]}; ran "
                     f"{len(s.get('ran', []))}, kept {len(s.get('kept', []))}"
                     + (f"; stopped: {s['stopped']}" if s.get("stopped") else "")
                     + (f": `{' '.join((s.get('command') or [])[2:])}`" if s.get("command") else ""))
    trees = {str(r["provenance"].get("impl_tree")) for r in recs}
    if len(trees) > 1:
        lines.append(f"- WARNING: stage records come from {len(trees)} impl/ trees: {sorted(trees)}; ratios mix "
                     f"code versions")
    return lines


def ran_on(name: str, st: dict, data: dict) -> str:
    """Where a stage ran: its node (a Ray node; none named: the sitting's own host), its GPU index there and
    the device its record names."""
    entry = data["workloads"].get(st["workload"], {}).get(st["harness"], {})
    record = entry.get("record") or (entry.get("duplex") or {}).get("record")
    device = st.get("gpu_name") or gpu_name(record)
    parts = [st.get("node"), None if st.get("gpu") is None else f"GPU {st['gpu']}", device]
    return ", ".join(str(p) for p in parts if p) or DASH


def stages_list(data: dict) -> list[str]:
    """One line per stage: status, seconds, budget, attempts, where, verdict and codes, what ran beside it,
    its reason."""
    lines = []
    for name, st in data["state"].get("stages", {}).items():
        legacy = st["harness"] not in HARNESSES
        codes = ", ".join(dict.fromkeys(st.get("invalid_codes") or []))
        near = ", ".join(beside(name, data["state"]["stages"]))
        lines.append(f"- `{name}`: {st['status']}" + (f" in {st['seconds']:.1f} s" if st.get("seconds") else "")
                     + f" (budget {fmt(st.get('budget_s'), '.0f')} s, {st.get('attempts', 0)} attempt(s), "
                     f"{ran_on(name, st, data)})" + (f", {st['verdict']}" if st.get("verdict") else "")
                     + (f" ({codes})" if codes else "") + (f"; beside {near}" if near else "")
                     + ("; legacy: a harness this version does not run, kept as recorded" if legacy else "")
                     + (f"; {st['reason']}" if st.get("reason") else ""))
    return lines
