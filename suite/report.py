"""Write a run to results/<run_id>/ and render its REPORT.md from run.json alone.

Files of one run (run_id = `<UTC date>-<device short name>-<workload>`, e.g. 2026-11-30-h200-minicpmo45):

* `run.json`: the record `RunResult.to_dict()` / `VerifyResult.to_dict()` returns, plus `run_id` and
  `audio` (file, samples and sha256 of each mode's whole int16 PCM);
* `audio_<mode>.wav`: that mode's session, all SPEAK units concatenated, int16 PCM mono at the run's
  sample rate (24 kHz), written with soundfile (not committed: .gitignore);
* `REPORT.md`: what ran and where, a summary per mode beside the published figures, per-unit rows,
  the verdict, and "Parameters used" last.

`python -m suite.report results/<run_id> [...]` rebuilds REPORT.md from run.json; for a staged
reproduction (stages.json, suite.reproduce) it rebuilds the merged report (suite.claims), and `--compare
REF` (repeatable) records reference runs in its stages.json first (a second run of a tree against the first). At least one
folder must be named: with none it exits with status 2 and writes nothing (the committed results/*/REPORT.md
were rendered by the code of their day; rebuilding them all would silently rewrite them).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from suite.env import device_short_name

#: The published DuplexCadence figures a report puts beside ours (project brief; one H200, MiniCPM-o 4.5).
PUBLISHED = {
    "speedup_x": 2.85,                      # stock / DuplexCadence SPEAK-unit time
    "peak_memory_change_pct": -38.8,        # DuplexCadence peak memory vs stock
    "speak_vs_period_pct_stock": 14.0,      # stock SPEAK time is 14% over the 1 s cadence
    "speak_vs_period_pct_cadence": -2.0,    # DuplexCadence SPEAK time is 2% under it
}
DASH = "—"


def run_id(record: dict) -> str:
    """`<UTC date>-<device short name>-<workload>` of a record."""
    prov = record.get("provenance", {})
    date = str(prov.get("date_utc", "unknown-date"))[:10]
    return f"{date}-{device_short_name(prov.get('device', {}))}-{record['workload']['name']}"


def write_results(result, out_root: str | Path = "results", *, name: str | None = None) -> Path:
    """Write run.json, audio_<mode>.wav and REPORT.md of a RunResult / VerifyResult under
    out_root/<run_id>/ (a suffix -2, -3, ... when that folder already holds a run). Returns the folder."""
    import soundfile as sf

    record = result.to_dict()
    base = name or run_id(record)
    out_root = Path(out_root)
    folder, k = out_root / base, 1
    while (folder / "run.json").exists():
        k += 1
        folder = out_root / f"{base}-{k}"
    folder.mkdir(parents=True, exist_ok=True)
    record["run_id"] = folder.name
    record["audio"] = {}
    for mode, pcm in result.audio().items():
        pcm = np.ascontiguousarray(pcm, dtype="<i2").reshape(-1)
        file = f"audio_{mode}.wav"
        sf.write(folder / file, pcm, int(record["sample_rate"]), subtype="PCM_16")
        record["audio"][mode] = {"file": file, "samples": int(pcm.size),
                                 "sha256_pcm16": hashlib.sha256(pcm.tobytes()).hexdigest()}
    (folder / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    (folder / "REPORT.md").write_text(render(record))
    return folder


def _record_compare(folder: Path, compare: list[str]) -> None:
    """Set stages.json's `compare` list, atomically, touching nothing else in it (not suite.stages.State,
    whose open() would mark a stage of a live sitting interrupted)."""
    path = folder / "stages.json"
    data = json.loads(path.read_text())
    data["compare"] = list(dict.fromkeys(str(c) for c in compare))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def _prepare(folder: str | Path, compare: list[str] | None):
    """Check one folder's report can be rebuilt, writing nothing; returns the call that writes it. Raises
    as `rebuild`."""
    folder = Path(folder)
    if (folder / "stages.json").is_file():
        from suite import claims

        claims.prepare(folder, compare)                 # the run, its references, the render: all in memory

        def write() -> Path:
            if compare:
                _record_compare(folder, compare)
            return claims.write(folder)
        return write
    path = folder / "run.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: neither stages.json nor run.json there (expected a folder written by "
                                f"suite.reproduce or suite.stage_run)")
    if compare:
        raise ValueError(f"--compare {' '.join(compare)}: only for a staged reproduction (a folder with "
                         f"stages.json); {folder} holds a single run (run.json)")
    try:
        record = json.loads(path.read_text())
        text = render(record)
    except ValueError as exc:                           # JSONDecodeError
        raise ValueError(f"{path}: not JSON ({exc})") from None
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{path}: not a run record ({type(exc).__name__}: {exc})") from None

    def write() -> Path:
        (folder / "REPORT.md").write_text(text)
        return folder / "REPORT.md"
    return write


def rebuild(folder: str | Path, compare: list[str] | None = None) -> Path:
    """Re-render folder/REPORT.md from folder/run.json, or, for a staged reproduction (folder/stages.json),
    the merged report from its stages (suite.claims.write). compare: reference run folders for a staged
    reproduction (suite.reproduce --compare): checked, recorded in its stages.json (so later rebuilds keep
    them; none given keeps what is recorded), rendered beside it. Nothing is written unless the report
    renders. Raises FileNotFoundError naming the file or reference, ValueError for a malformed record or
    reference, or compare on a single run's folder (it has no reference section)."""
    return _prepare(folder, compare)()


# --- rendering -----------------------------------------------------------------------------------
def _f(value, spec: str = ".1f") -> str:
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _table(rows, headers) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="pipe", disable_numparse=True)


def _pct_change(new, old) -> float | None:
    return None if new is None or not old else 100.0 * (new - old) / old


def _headline(memory: dict) -> tuple[str, float | None]:
    from suite.memory import headline

    return headline(memory)


def what_ran(record: dict) -> str:
    w, prov = record["workload"], record["provenance"]
    dev = prov.get("device", {})
    if dev.get("gpu_name"):
        device = (f"{dev['gpu_name']} ({_f(dev.get('gpu_memory_mib'))} MiB, driver {dev.get('driver', DASH)}, "
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
    return _table([[k, _f(v)] for k, v in rows], ["", ""])


def summary(record: dict) -> str:
    rows = []
    for mode, run in record["modes"].items():
        m, mem = run["metrics"], run["memory"]
        key, mib = _headline(mem)
        rows.append([mode, _f(m.get("units_measured")), _f(m.get("tail_ms_p50")), _f(m.get("tail_ms_p90")),
                     _f(m.get("tail_ms_p99")), _f(m.get("rtf"), ".3f"),
                     _f(m.get("tail_vs_period_pct_p50"), "+.1f"), _f(m.get("deadline_misses")),
                     f"{_f(mib)} ({key})", _f(mem.get("peak_alloc_mib")), _f(mem.get("session_driver_mib",
                                                                                     mem.get("session_rss_mib"))),
                     run["verdict"]])
    return _table(rows, ["mode", "units measured", "tail ms p50", "p90", "p99", "RTF",
                         "tail vs 1 s period % (p50)", "deadline misses", "peak MiB over idle",
                         "peak alloc MiB", "session increment MiB", "verdict"])


def published_vs_ours(record: dict) -> str:
    modes = record["modes"]
    stock, cadence = modes.get("stock"), modes.get("cadence")
    comp = record.get("comparison") or {}
    ours_speed = comp.get("speedup_x")
    ours_mem = None
    if stock and cadence:
        ours_mem = _pct_change(_headline(cadence["memory"])[1], _headline(stock["memory"])[1])
    s_pct = stock["metrics"].get("tail_vs_period_pct_p50") if stock else None
    c_pct = cadence["metrics"].get("tail_vs_period_pct_p50") if cadence else None
    rows = [
        ["speedup (stock / cadence, median)", f"{PUBLISHED['speedup_x']:.2f}x",
         DASH if ours_speed is None else f"{ours_speed:.2f}x"],
        ["peak memory, cadence vs stock", f"{PUBLISHED['peak_memory_change_pct']:+.1f}%",
         DASH if ours_mem is None else f"{ours_mem:+.1f}%"],
        ["SPEAK time vs 1 s cadence: stock -> cadence",
         f"{PUBLISHED['speak_vs_period_pct_stock']:+.0f}% -> {PUBLISHED['speak_vs_period_pct_cadence']:+.0f}%",
         f"{_f(s_pct, '+.1f')}% -> {_f(c_pct, '+.1f')}% (tail only, p50)"],
    ]
    return _table(rows, ["figure", "published (H200)", f"ours ({record.get('device')})"])


def per_unit(record: dict) -> str:
    modes = record["modes"]
    names = list(modes)
    by_mode = {m: {u["index"]: u for u in modes[m]["units"]} for m in names}
    equal = {c["index"]: c["equal"] for c in (record.get("comparison") or {}).get("units", [])}
    rows = []
    for u in modes[names[0]]["units"]:
        i = u["index"]
        decoded = u["tail_ms"] is not None or bool(u.get("kernels"))
        row = [i, u["kind"], _f(u["turn"]) if u["turn"] is not None else "", "yes" if u["final"] else "",
               _f(u["payload_size"]) if decoded else "", _f(u["samples"]) if decoded else ""]
        for m in names:
            v = by_mode[m].get(i, {})
            warm = "" if v.get("measured") else " (warm-up)" if v.get("kind") == "SPEAK" else " (listen)"
            if v.get("kernels"):    # profiled (suite.kernels): wall time under the profiler, not a speed
                tail = f"profiled: {v['kernels']['kernel_launches']} launches, {v['kernels']['graph_launches']} graphs"
            else:
                tail = _f(v.get("tail_ms")) + warm if v.get("tail_ms") is not None else ""
            row += [tail,
                    (v.get("sha256_f32") or "")[:12], (v.get("sha256_pcm16") or "")[:12]]
        if len(names) > 1:
            row.append(_f(equal.get(i)) if i in equal else "")
        rows.append(row)
    headers = ["unit", "kind", "turn", "final", "tokens/frames", "samples"]
    for m in names:
        headers += [f"{m} tail ms", f"{m} sha256 f32", f"{m} sha256 i16"]
    if len(names) > 1:
        headers.append("equal")
    return _table(rows, headers)


def kernels_table(record: dict) -> str:
    """Per-unit medians over the profiled SPEAK units (suite.kernels), one row per mode."""
    rows = []
    for mode, run in record["modes"].items():
        m = run["metrics"]
        if not m.get("units_profiled"):
            continue
        rows.append([mode, _f(m.get("units_profiled")), _f(m.get("kernel_launches_per_unit_p50")),
                     _f(m.get("graph_launches_per_unit_p50")), _f(m.get("kernels_per_unit_p50")),
                     _f(m.get("kernel_busy_ms_per_unit_p50")), _f(m.get("tail_ms_p50")),
                     _f(m.get("tail_over_kernel_busy_x"), ".2f"), _f(m.get("graph_replays_per_unit_p50")),
                     f"{_f(m.get('graph_captures_measured_units'))} / {_f(m.get('eager_fallbacks_measured_units'))}"
                     f" / {_f(m.get('warmup_runs_measured_units'))}"])
    if not rows:
        return "No unit was profiled (CPU run)."
    return _table(rows, ["mode", "units profiled", "kernel launches / unit", "graph launches / unit",
                         "kernels run / unit", "GPU kernel-busy ms / unit", "tail ms p50 (timed units)",
                         "tail / kernel-busy", "graph replays / unit",
                         "captures / eager fallbacks / eager first runs in measured units"])


def memory_table(record: dict) -> str:
    modes = record["modes"]
    keys = sorted({k for run in modes.values() for k in run["memory"]})
    rows = [[k] + [_f(run["memory"].get(k)) for run in modes.values()] for k in keys]
    return _table(rows, ["memory"] + list(modes))


def _p(value) -> str:
    """A parameter as written (no rounding)."""
    return DASH if value is None else _f(value) if isinstance(value, bool) else str(value)


def parameters(record: dict) -> str:
    p = dict(record["parameters"])
    spec = p.pop("spec", {})
    rows = [[k, _p(v)] for k, v in p.items()]
    rows += [[f"spec.{k}", _p(v)] for k, v in spec.items()]
    rows += [[f"seed.{k}", _p(v)] for k, v in (record.get("seeds") or {}).items()]
    rows += [[f"determinism.{k}", _p(v)] for k, v in (record.get("determinism") or {}).get("set", {}).items()]
    rows += [["sample_rate", _p(record.get("sample_rate"))]]
    return _table(rows, ["parameter", "value"])


def render(record: dict) -> str:
    """REPORT.md text of a run record (run.json)."""
    rid = record.get("run_id") or run_id(record)
    parts = [f"# DuplexCadence run {rid}", "",
             f"**Verdict: {record['verdict']}**", ""]
    parts += [f"- {r}" for r in record.get("invalid_reasons", [])]
    parts += [f"- note: {n}" for n in record.get("notes", [])]
    comp = record.get("comparison")
    if comp:
        n_eq = comp["units_compared"] - len(comp["mismatched_units"])
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


def unit_host_text(per_mode: dict | None) -> str:
    """", per unit p50 stock / cadence: launch A / B us, CPU loop C / D us, SM E / F MHz" from a timing round's
    `unit_host_p50` ({mode: suite.runner.host_p50}); "" when the round has none (records before it)."""
    if not isinstance(per_mode, dict):
        return ""
    s, c = (v if isinstance(v, dict) else {} for v in (per_mode.get("stock"), per_mode.get("cadence")))
    parts = [f"{label} {_f(s.get(key), spec)} / {_f(c.get(key), spec)}{unit}"
             for label, key, spec, unit in (("launch", "host_op_us_p50", ".2f", " us"),
                                            ("CPU loop", "cpu_loop_us_p50", ".0f", " us"),
                                            ("SM", "sm_mhz_p50", ".0f", " MHz"))
             if s.get(key) is not None or c.get(key) is not None]
    return f", per unit p50 stock / cadence: {', '.join(parts)}" if parts else ""


def summary_text(record: dict) -> str:
    """A short plain-text summary of a record (what the runner prints at the end of a run)."""
    rows = []
    for mode, run in record["modes"].items():
        m = run["metrics"]
        key, mib = _headline(run["memory"])
        rows.append([mode, _f(m.get("units_measured")), _f(m.get("tail_ms_p50")), _f(m.get("tail_ms_p90")),
                     _f(m.get("tail_ms_p99")), _f(m.get("rtf"), ".3f"), f"{_f(mib)} ({key})", run["verdict"]])
    from tabulate import tabulate

    lines = [tabulate(rows, headers=["mode", "units measured", "tail ms p50", "p90", "p99", "RTF",
                                     "peak MiB over idle", "verdict"], disable_numparse=True)]
    comp = record.get("comparison")
    if comp:
        rounds = [r for r in comp.get("rounds") or [] if r.get("speedup_x")]
        if comp.get("speedup_x") and len(rounds) >= 2:
            xs = [r["speedup_x"] for r in rounds]
            lines.append(f"speedup (median of {len(xs)} timing rounds, stock p50 / cadence p50 each): "
                         f"{comp['speedup_x']:.3f}x [{min(xs):.3f}-{max(xs):.3f}]")
            for r in rounds:
                host = r.get("host_us_per_op") or {}
                lines.append(f"  round {r['round']} ({' then '.join(r['order'])}): {r['stock_tail_ms_p50']:.1f} / "
                             f"{r['cadence_tail_ms_p50']:.1f} ms = {r['speedup_x']:.3f}x, units equal "
                             f"{r['units_compared'] - len(r['mismatched_units'])}/{r['units_compared']}, "
                             f"host {_f(host.get('before'), '.2f')} -> {_f(host.get('after'), '.2f')} us/op"
                             + unit_host_text(r.get("unit_host_p50")))
        elif comp.get("speedup_x"):
            lines.append(f"speedup (stock p50 / cadence p50): {comp['speedup_x']:.3f}x"
                         + unit_host_text((rounds[0] if rounds else {}).get("unit_host_p50")))
        lines.append(f"units equal: {comp['units_compared'] - len(comp['mismatched_units'])}"
                     f"/{comp['units_compared']}")
    lines.append(f"verdict: {record['verdict']}")
    lines += [f"  - {r}" for r in record.get("invalid_reasons", [])]
    lines += [f"  note: {n}" for n in record.get("notes", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suite.report",
                                 description="Rebuild REPORT.md of result folders from their run.json.")
    ap.add_argument("folders", nargs="*", metavar="FOLDER",
                    help="results/<run_id> folders, single runs (run.json) or staged reproductions (stages.json); "
                         "at least one")
    ap.add_argument("--compare", action="append", default=None, metavar="REF",
                    help="a reference run folder (repeatable) for a staged reproduction: recorded in its "
                         "stages.json and reported beside it (the 'Between runs' noise), as suite.reproduce "
                         "--compare does")
    args = ap.parse_args(argv)
    if not args.folders:
        print("error: FOLDER: none given; expected one or more results folders holding run.json or stages.json, "
              "e.g. `make report ARGS=results/<run>` or `python -m suite.report results/<run>` "
              "(nothing was rebuilt)", file=sys.stderr)
        return 2
    writers = []
    for folder in args.folders:                          # every folder checked before any is written
        try:
            writers.append(_prepare(folder, args.compare))
        except (FileNotFoundError, ValueError) as exc:   # ValueError: suite.stages.StateError
            print(f"error: {exc} (nothing was rebuilt)", file=sys.stderr)
            return 1
    for write in writers:
        print(f"wrote {write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
