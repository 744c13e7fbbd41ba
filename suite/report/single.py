"""REPORT.md of one run record (run.json: a verify or one-mode stage): what ran and where, a summary per
mode beside the published figures, kernel counts, memory, one row per unit with both modes' hashes, the
verdict, and "Parameters used" last. Rendered from run.json alone."""
from __future__ import annotations

from pathlib import Path

from suite.records import (PUBLISHED, RUN_SCHEMA, VERIFY_SCHEMA, device_short_name, headline, published_for,
                           read_json)
from suite.report.text import DASH, fmt, interval, pct_change, table


def write(folder: Path) -> Path:
    """Render folder/run.json into folder/REPORT.md. Raises FileNotFoundError without run.json, ValueError for
    a record of the wrong shape."""
    text = render_file(Path(folder) / "run.json")
    path = Path(folder) / "REPORT.md"
    path.write_text(text)
    return path


def render_file(path: Path) -> str:
    """REPORT.md text of a run.json. Raises FileNotFoundError, ValueError (not JSON, not a run record)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path.parent}: neither stages.json nor run.json there (expected a folder written by "
                                f"suite.reproduce or suite.measure.stage)")
    record = read_json(path)
    if record is None:
        raise ValueError(f"{path}: not JSON")
    if record.get("schema") not in (RUN_SCHEMA, VERIFY_SCHEMA):
        raise ValueError(f"{path}: schema {record.get('schema')!r}, expected {RUN_SCHEMA!r} or {VERIFY_SCHEMA!r}")
    if record.get("verdict") not in ("VALID", "INVALID"):
        raise ValueError(f"{path}: verdict {record.get('verdict')!r}, expected 'VALID' or 'INVALID'")
    try:
        return render(record)
    except (TypeError, KeyError, AttributeError, IndexError, ValueError) as exc:
        raise ValueError(f"{path}: not a run record ({type(exc).__name__}: {exc})") from None


def what_ran(record: dict) -> str:
    w, prov = record["workload"], record["provenance"]
    dev = prov.get("device", {})
    if dev.get("gpu_name"):
        device = (f"{dev['gpu_name']} ({fmt(dev.get('gpu_memory_mib'))} MiB, driver {dev.get('driver', DASH)}, "
                  f"SM clock max {dev.get('clock_sm_max_mhz', DASH)} MHz)")
    else:
        device = f"CPU: {dev.get('cpu_model', DASH)}, {dev.get('cpu_cores_usable', DASH)} cores usable"
    pk = prov.get("packages", {})
    rows = [
        ["workload", w.get("name")], ["model", w.get("model")], ["architecture", w.get("architecture")],
        ["stock package", w.get("stock_package")], ["dtype", w.get("dtype")],
        ["Euler steps", record["parameters"].get("euler_steps")], ["depth", record.get("depth")],
        ["modes", ", ".join(record["modes"])], ["device", f"{record.get('device')}: {device}"],
        ["torch / CUDA / cuDNN", f"{prov.get('torch')} / {prov.get('cuda')} / {prov.get('cudnn')}"],
        ["packages", ", ".join(f"{k}=={v}" for k, v in pk.items())],
        ["git", f"{str(prov.get('git_rev'))[:12]}{' (dirty)' if prov.get('git_dirty') else ''}; "
                f"impl tree {str(prov.get('impl_tree'))[:12]}{' (dirty)' if prov.get('impl_dirty') else ''}"],
        ["command", " ".join(prov.get("command", []))], ["date (UTC)", prov.get("date_utc")],
    ]
    return table([[k, fmt(v)] for k, v in rows], ["", ""])


def summary(record: dict) -> str:
    rows = []
    for mode, run in record["modes"].items():
        m, mem = run["metrics"], run["memory"]
        key, mib = headline(mem)
        rows.append([mode, fmt(m.get("units_measured")), fmt(m.get("tail_ms_p50")), fmt(m.get("tail_ms_p90")),
                     fmt(m.get("tail_ms_p99")), fmt(m.get("rtf"), ".3f"),
                     fmt(m.get("tail_vs_period_pct_p50"), "+.1f"), fmt(m.get("deadline_misses")),
                     f"{fmt(mib)} ({key})", fmt(mem.get("peak_alloc_mib")), fmt(mem.get("session_driver_mib",
                                                                                     mem.get("session_rss_mib"))),
                     run["verdict"] if m.get("units_measured") else "— (no unit measured)"])
    return table(rows, ["mode", "units measured", "tail ms p50", "p90", "p99", "RTF",
                         "tail vs 1 s period % (p50)", "deadline misses", "peak MiB over idle",
                         "peak alloc MiB", "session increment MiB", "the mode's own checks"])


def published_vs_ours(record: dict) -> str:
    """The published figures beside ours, for the configuration they were measured on only."""
    if not published_for(record.get("workload"), record["parameters"].get("euler_steps")):
        return "None for this workload: the paper published figures for MiniCPM-o 4.5 at 10 Euler steps only."
    modes = record["modes"]
    stock, cadence = modes.get("stock"), modes.get("cadence")
    comp = record.get("comparison") or {}
    ours_speed = comp.get("speedup_x")
    ours_mem = None
    if stock and cadence:
        ours_mem = pct_change(headline(cadence["memory"])[1], headline(stock["memory"])[1])
    s_pct = stock["metrics"].get("tail_vs_period_pct_p50") if stock else None
    c_pct = cadence["metrics"].get("tail_vs_period_pct_p50") if cadence else None
    rows = [
        ["speedup (stock / cadence, median)", f"{PUBLISHED['speedup_x']:.2f}x",
         DASH if ours_speed is None else interval(ours_speed, comp.get("ci_low"), comp.get("ci_high"))],
        ["peak memory, cadence vs stock", f"{PUBLISHED['peak_memory_change_pct']:+.1f}%",
         DASH if ours_mem is None else f"{ours_mem:+.1f}%"],
        ["SPEAK time vs 1 s cadence: stock -> cadence",
         f"{PUBLISHED['speak_vs_period_pct_stock']:+.0f}% -> {PUBLISHED['speak_vs_period_pct_cadence']:+.0f}%",
         f"{fmt(s_pct, '+.1f')}% -> {fmt(c_pct, '+.1f')}% (tail only, p50)"],
    ]
    return table(rows, ["figure", "published (H200)", f"ours ({record.get('device')})"])


def paired_summary(record: dict) -> list[str]:
    """A paired verify's figures: the speedup with its interval, per host state, the A/A floor, and a line
    per process ([] for an older record)."""
    paired = record.get("paired")
    if not paired:
        return []
    sp, fl = paired.get("speedup") or {}, paired.get("floor") or {}
    lines = ["## Paired speedup", "",
             f"- speedup (median stock / cadence per pair): {interval(sp.get('speedup'), sp.get('ci_low'), sp.get('ci_high'), '.3f')}"
             f", {sp.get('processes')} processes, {sp.get('pairs')} measured pairs" + "".join(f"; {f}" for f in sp.get("flags") or [])]
    lines += [f"- {name} host ({fmt(st.get('probe_median'), '.2f')} us per launch): "
              f"{interval(st['speedup'], st['ci_low'], st['ci_high'], '.3f')}, {st['pairs']} pairs"
              for name, st in (sp.get("states") or {}).items()]
    hs = sp.get("host_speed")
    if hs and hs.get("speedup") is not None:
        lines.append(f"- at the reference host speed ({hs['reference_us']:.1f} us per launch; {hs['pairs']} pairs "
                     f"without an eager step): {interval(hs['speedup'], hs['ci_low'], hs['ci_high'], '.3f')}; slope of "
                     f"log time per us: stock {hs['stock_slope']:+.3f}, cadence {hs['cadence_slope']:+.3f}"
                     + "".join(f"; {f}" for f in hs.get("flags") or []))
    if fl.get("speedup") is not None:
        lines.append(f"- A/A floor (stock / stock): {interval(fl['speedup'], fl['ci_low'], fl['ci_high'], '.3f')}, "
                     f"{fl['pairs']} pairs; the speedup {'clears' if paired.get('clears_floor') else 'does not clear'} it")
    for p in paired.get("processes") or []:
        sec = p.get("seconds") or {}
        lines.append(f"- process {p['index']} (pid {p.get('pid')}): {p.get('measured_pairs')} measured pairs, "
                     f"set-up {fmt(sec.get('set_up'))} s, A/A {fmt(sec.get('aa'))} s, A/B {fmt(sec.get('ab'))} s; "
                     f"DuplexCadence first occurrences {p.get('cadence_eager_first')} (captured after: "
                     f"{p.get('cadence_captured_after')})" + ("; A/A second session on a model copy" if p.get("aa_copy") else "")
                     + ("; profiled its last units" if p.get("profiled") else ""))
    return lines + [""]


def per_unit(record: dict) -> str:
    modes = record["modes"]
    names = list(modes)
    by_mode = {m: {u["index"]: u for u in modes[m]["units"]} for m in names}
    comp = record.get("comparison") or {}
    equal = {c["index"]: c["equal"] for c in comp.get("units", [])}
    if comp.get("protocol") == "paired" and len(names) > 1:      # the first walk of process 1, by its hashes
        a, b = by_mode[names[0]], by_mode[names[1]]
        equal = {i: (a[i].get("sha256_f32"), a[i].get("sha256_pcm16")) == (b[i].get("sha256_f32"), b[i].get("sha256_pcm16"))
                 for i in a if i in b}
    rows = []
    for u in modes[names[0]]["units"]:
        i = u["index"]
        decoded = u["tail_ms"] is not None or bool(u.get("kernels"))
        row = [i, u["kind"], fmt(u["turn"]) if u["turn"] is not None else "", "yes" if u["final"] else "",
               fmt(u["payload_size"]) if decoded else "", fmt(u["samples"]) if decoded else ""]
        for m in names:
            v = by_mode[m].get(i, {})
            warm = "" if v.get("measured") else " (warm-up)" if v.get("kind") == "SPEAK" else " (listen)"
            if v.get("kernels"):    # profiled (suite.measure.kernels): wall time under the profiler, not a speed
                tail = f"profiled: {v['kernels']['kernel_launches']} launches, {v['kernels']['graph_launches']} graphs"
            else:
                tail = fmt(v.get("tail_ms")) + warm if v.get("tail_ms") is not None else ""
            row += [tail, (v.get("sha256_f32") or "")[:12], (v.get("sha256_pcm16") or "")[:12]]
        if len(names) > 1:
            row.append(fmt(equal.get(i)) if i in equal else "")
        rows.append(row)
    headers = ["unit", "kind", "turn", "final", "tokens/frames", "samples"]
    for m in names:
        headers += [f"{m} tail ms", f"{m} sha256 f32", f"{m} sha256 i16"]
    if len(names) > 1:
        headers.append("equal")
    return table(rows, headers)


def kernels_table(record: dict) -> str:
    """Per-unit medians over the profiled SPEAK units (suite.measure.kernels), one row per mode."""
    rows = []
    for mode, run in record["modes"].items():
        m = run["metrics"]
        if not m.get("units_profiled"):
            continue
        rows.append([mode, fmt(m.get("units_profiled")), fmt(m.get("kernel_launches_per_unit_p50")),
                     fmt(m.get("graph_launches_per_unit_p50")), fmt(m.get("kernels_per_unit_p50")),
                     fmt(m.get("kernel_busy_ms_per_unit_p50")), fmt(m.get("tail_ms_p50")),
                     fmt(m.get("tail_over_kernel_busy_x"), ".2f"), fmt(m.get("graph_replays_per_unit_p50")),
                     f"{fmt(m.get('graph_captures_measured_units'))} / {fmt(m.get('eager_fallbacks_measured_units'))}"
                     f" / {fmt(m.get('warmup_runs_measured_units'))}"])
    if not rows:
        return "No unit was profiled (CPU run)."
    return table(rows, ["mode", "units profiled", "kernel launches / unit", "graph launches / unit",
                         "kernels run / unit", "GPU kernel-busy ms / unit", "tail ms p50 (timed units)",
                         "tail / kernel-busy", "graph replays / unit",
                         "captures / eager fallbacks / eager first runs in measured units"])


def memory_table(record: dict) -> str:
    modes = record["modes"]
    keys = sorted({k for run in modes.values() for k in run["memory"]})
    if not keys:
        return "Not measured in this run (the memory stages measure it, one process per mode)."
    rows = [[k] + [fmt(run["memory"].get(k)) for run in modes.values()] for k in keys]
    return table(rows, ["memory"] + list(modes))


def _p(value) -> str:
    """A parameter as written (no rounding)."""
    return DASH if value is None else fmt(value) if isinstance(value, bool) else str(value)


def parameters(record: dict) -> str:
    p = dict(record["parameters"])
    spec = p.pop("spec", {})
    rows = [[k, _p(v)] for k, v in p.items()]
    rows += [[f"spec.{k}", _p(v)] for k, v in spec.items()]
    rows += [[f"seed.{k}", _p(v)] for k, v in (record.get("seeds") or {}).items()]
    rows += [[f"determinism.{k}", _p(v)] for k, v in (record.get("determinism") or {}).get("set", {}).items()]
    rows += [["sample_rate", _p(record.get("sample_rate"))]]
    return table(rows, ["parameter", "value"])


def render(record: dict) -> str:
    """REPORT.md text of a run record (run.json); named by its run_id, else `<UTC date>-<device>-<workload>`."""
    prov = record.get("provenance", {})
    rid = record.get("run_id") or (f"{str(prov.get('date_utc', 'unknown-date'))[:10]}-"
                                   f"{device_short_name(prov.get('device', {}))}-{record['workload']['name']}")
    parts = [f"# DuplexCadence run {rid}", "",
             f"**Verdict: {record['verdict']}**", ""]
    parts += [f"- {r}" for r in record.get("invalid_reasons", [])]
    parts += [f"- note: {n}" for n in record.get("notes", [])]
    comp = record.get("comparison")
    if comp:
        n_eq = comp["units_compared"] - len(comp.get("mismatches") or comp["mismatched_units"])
        parts += ["", f"Bit-exactness: {n_eq}/{comp['units_compared']} SPEAK units byte-identical "
                      f"(float32 waveform and int16 PCM)"
                  + (f"; differing units: {comp['mismatched_units']}" if comp["mismatched_units"] else ".")]
    elif "cadence" not in record["modes"]:
        parts += ["", "Stock only: no cadence session ran, so nothing was compared."]
    parts += ["", "## What ran", "", what_ran(record), "",
              "## Summary", "",
              f"Statistics over the measured SPEAK units (after {record['parameters'].get('warmup_speak_units')} "
              f"warm-up units). Tail time is the whole `speak()` call (CUDA events + synchronize on CUDA, "
              f"perf_counter on CPU); RTF = tail time / audio time.", "",
              summary(record), "",
              *paired_summary(record),
              "### Published figures beside ours", "",
              published_vs_ours(record), "",
              "Published figures are one H200 with the released weights and include the whole SPEAK unit; "
              "ours are this run's tail time only (token-to-audio), seeded random weights, on the device "
              "named above. Compare ratios, not absolute times.", "",
              "### Kernel launches and GPU kernel-busy time (CUDA profiler, last SPEAK units, untimed)", "",
              kernels_table(record), "",
              "### Memory (MiB)", "", memory_table(record), "",
              "## Per unit", "", per_unit(record), ""]
    audio = record.get("audio") or {}
    if audio:
        parts += ["Audio: " + ", ".join(f"`{a['file']}` ({a['samples']} samples, sha256 "
                                        f"{a['sha256_pcm16'][:12]})" for a in audio.values()), ""]
    parts += ["## Parameters used", "", parameters(record), ""]
    return "\n".join(parts)
