"""The one REPORT.md of a staged reproduction: a table per claim, plots, provenance, comparison.

`write(run_dir)` reads `<run dir>/stages.json` and every stage's output (suite.stages) and writes
`<run dir>/REPORT.md` plus `speedup.png`, `memory.png`, `tail_per_unit.png` (matplotlib; left out, with
a note, where it is missing). It runs again after every stage (and from `python -m suite.report
<run dir>`), so an unfinished reproduction has a report of what is done so far.

Claims, each beside the published figure (`report.PUBLISHED`, one H200, MiniCPM-o 4.5) and the stock
baseline of the same run: speedup (stock / cadence tail time, p50 with a p10-p90 band), peak memory
over idle (one process per mode when the memory stages ran; else verify's one-process figures, labelled),
per-session increment, SPEAK time vs the 1 s cadence and sessions per GPU (the `duplex_stock` and
`duplex_cadence` stages, one mode each, joined by `suite.duplex_merge.merge`; one mode and the other's
status while only one is done; tail-only figures from verify while neither is, labelled), bitwise
equality. Times in ms, memory in MiB. A duplex stage that failed after checkpointing (a crash or its time
limit after some session counts) still gives the runs it measured, marked PARTIAL with the counts and the
stage's failure reason; a done stage's INVALID record is marked with its codes.

Timed alone or not: a speed (verify) or duplex figure whose stage ran while another stage ran (on the
host's other GPU, `--gpus`) is marked in its row, "timed beside <stages> on another GPU": the stage's
recorded `overlapped`, or for a stages.json written before that field, the same derived from the stages'
recorded started_utc / ended_utc (`suite.stages.overlapping`). The cadence tail is host-bound and runs
slower beside another stage (suite.stages.TIMED_HARNESSES); memory figures are per GPU and not marked.

Noise: where a verify record has several timing rounds (suite.runner.verify(rounds=R); R =
suite.stages.VERIFY_ROUNDS on CUDA), its speedup is the median of the rounds' speedups and its band their
min-max: the spread between fresh sessions of one process, in alternating order. An older record (one
round) keeps the band [stock p10 / cadence p90, stock p90 / cadence p10] over its measured units, much
wider. The speedup table gives the host probe (`suite.env.host_op_us`, microseconds per eager op) of the
rounds beside it: the stock tails are host-bound, so a slower host moves stock and the ratio with it.
`--compare REF` puts a reference run's ratios beside ours and says whether ours lies in the reference's
band ("within the noise the reference reports").
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from suite.duplex import max_zero_miss
from suite.duplex_merge import merge as merge_duplex
from suite.report import DASH, PUBLISHED, _f, _table
from suite.stages import HARNESSES, TIMED_HARNESSES, check_data, device_type, family, overlapping, unselected

FLOW_HIFT = "flow_hift"        # the architecture the published figures were measured on (MiniCPM-o 4.5)
PLOTS = ("speedup.png", "memory.png", "tail_per_unit.png")
#: Under the speedup table when a speed or duplex figure was timed beside another stage.
TIMED_NOTE = ("A figure marked \"timed beside\" comes from a stage that ran while other stages ran (stages.json's "
              "started_utc / ended_utc): the cadence tail is host-bound (kernel launches, Python) and runs slower "
              "beside a stage on the host's other GPU (suite.stages.TIMED_HARNESSES gives the H200 figures); "
              "`suite.reproduce --gpus` now runs these stages alone.")


# --- reading -------------------------------------------------------------------------------------
def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load(run_dir: str | Path) -> dict:
    """{"state": stages.json, "workloads": {name: {harness: {"state", "record", "duplex", "timed"}}}}; "duplex":
    a done duplex stage's {"file" (relative to the run dir), "record"} (`_duplex_record`), or a failed or
    pending per-mode one's whose folder holds its last attempt's checkpoint; "timed": how its last attempt
    was timed (`timed_beside`).
    Raises FileNotFoundError naming the missing stages.json, StateError (a ValueError) naming a mis-shaped one."""
    run_dir = Path(run_dir)
    state = _json(run_dir / "stages.json")
    if state is None:
        raise FileNotFoundError(f"{run_dir}/stages.json: missing or unreadable (a folder written by "
                                f"python -m suite.reproduce)")
    check_data(state, run_dir / "stages.json")
    out: dict = {}
    for name, st in state.get("stages", {}).items():
        folder = run_dir / (st.get("dir") or name)
        entry = {"state": st, "record": None, "duplex": None, "timed": timed_beside(name, state["stages"])}
        if st.get("status") == "done":
            entry["record"] = _json(folder / "run.json")
            if family(st["harness"]) == "duplex":           # duplex_stock, duplex_cadence, legacy duplex
                entry["duplex"] = _duplex_record(folder, run_dir)
        elif st.get("status") in ("failed", "pending") and st["harness"] in DUPLEX_STAGES.values():
            entry["duplex"] = _duplex_record(folder, run_dir)   # what a crash or a time limit left (PARTIAL)
        out.setdefault(st["workload"], {})[st["harness"]] = entry
    return {"state": state, "workloads": out, "run_dir": run_dir}


def beside(name: str, stages: dict) -> list[str]:
    """The stages that ran at the same time as stage `name`'s last attempt: its recorded `overlapped`, or,
    where stages.json has none (written before the field, or the stage has not ended), derived from the
    recorded started_utc / ended_utc (`suite.stages.overlapping`)."""
    recorded = stages[name].get("overlapped")
    return list(recorded) if recorded is not None else overlapping(name, stages)


def timed_beside(name: str, stages: dict) -> str | None:
    """How stage `name` was timed: None when it never started (no started_utc), "" when it ran alone, else
    "timed beside A, B" plus " on another GPU" when each of them had a --gpus index other than its own."""
    st = stages[name]
    if not st.get("started_utc"):
        return None
    names = beside(name, stages)
    if not names:
        return ""
    gpus = {(stages.get(n) or {}).get("gpu") for n in names}
    other = st.get("gpu") is not None and None not in gpus and st["gpu"] not in gpus
    return f"timed beside {', '.join(names)}" + (" on another GPU" if other else "")


def _timed_note(entries: dict, harnesses, sep: str | None = None) -> str:
    """'; <harness> timed beside ...' for each of these stages that ran beside another ('' if none did);
    sep given: '<sep>timed beside ...' (one harness, named already)."""
    harnesses = [harnesses] if isinstance(harnesses, str) else harnesses
    return "".join((f"; {h} " if sep is None else sep) + e["timed"]
                   for h in harnesses if (e := entries.get(h)) and e.get("timed"))


def _duplex_record(folder: Path, run_dir: Path) -> dict | None:
    """{"file", "record"}: the first suite.duplex record (schema duplexcadence.duplex/...) in a stage folder."""
    for path in sorted(folder.rglob("*.json")):
        data = _json(path)
        if (isinstance(data, dict) and str(data.get("schema", "")).startswith("duplexcadence.duplex/")
                and data.get("workloads")):
            from suite.duplex import unpack_units

            return {"file": str(path.relative_to(run_dir)), "record": unpack_units(data)}
    return None


DUPLEX_STAGES = {"stock": "duplex_stock", "cadence": "duplex_cadence"}   # mode -> its stage's harness


def duplex_figures(entries: dict, workload: str | None = None) -> dict | None:
    """A workload's duplex figures, from its duplex stages' records (`load`: done, or a failed stage's
    checkpoint): the two per-mode records joined by `suite.duplex_merge.merge` (stock == cadence recomputed
    from the one-session runs), the one record while only one is there, or a legacy both-mode `duplex`
    stage's record when neither is. Per mode: the one-session run's mean and p99 SPEAK time as a percentage
    over (+) or under (-) the 1 s cadence, its miss rate, and the largest session count with zero misses.
    None when no duplex stage has a record.
    Returns {"modes", "files", "cadence_equals_stock" (None unless both modes), "verdict", "error",
    "marks"}; marks: mode -> what a reader must know of that mode's record (`_duplex_mark`), for the modes
    whose record is not a done stage's VALID one."""
    parts, marks = [], {}
    for mode, h in DUPLEX_STAGES.items():
        if (e := entries.get(h)) and e.get("duplex"):
            parts.append(e["duplex"])
            if (mark := _duplex_mark(e, mode, workload)) is not None:
                marks[mode] = mark
    if not parts and (entries.get("duplex") or {}).get("duplex"):
        parts = [entries["duplex"]["duplex"]]
    if not parts:
        return None
    files = [p["file"] for p in parts]
    try:
        record = merge_duplex([p["record"] for p in parts]) if len(parts) > 1 else parts[0]["record"]
    except (ValueError, KeyError) as exc:
        return {"modes": {}, "files": files, "cadence_equals_stock": None, "verdict": None,
                "error": f"the duplex records cannot be joined: {exc}", "marks": marks}
    w = record["workloads"].get(workload) or next(iter(record["workloads"].values()))
    pct = (lambda f: None if f is None else 100.0 * (f - 1.0))  # noqa: E731
    modes = {}
    for mode, m in w.get("modes", {}).items():
        runs = [r for r in m.get("runs") or [] if isinstance(r, dict) and type(r.get("sessions")) is int]
        solo = next((r for r in runs if r["sessions"] == 1 and not r.get("refused")), None)
        met = (solo or {}).get("metrics") or {}
        # derived from the runs as suite.duplex derives it (`max_zero_miss`), not read from the record's
        # stored copy (every committed record agrees; an edited one need not); runs without a miss count
        # (not run to the end of their 60 s) are left out
        best = max_zero_miss([r for r in runs if r.get("refused")
                              or isinstance((r.get("metrics") or {}).get("misses"), int)])
        # the first count above the best that missed a unit or was refused (admission: not enough memory)
        missed = sorted((r for r in runs if r["sessions"] > (best or 0)
                         and (r.get("refused") or (r.get("metrics") or {}).get("misses"))),
                        key=lambda r: r["sessions"])
        modes[mode] = {"speak_vs_period_pct_mean": pct(met.get("speak_frac_mean")),
                       "speak_vs_period_pct_p99": pct(met.get("speak_frac_p99")),
                       "miss_rate": met.get("miss_rate"),
                       "max_sessions_zero_miss": best,
                       "first_missed": ({"sessions": missed[0]["sessions"], "refused": bool(missed[0].get("refused")),
                                         "misses": (missed[0].get("metrics") or {}).get("misses"),
                                         "units": (missed[0].get("metrics") or {}).get("units_run")}
                                        if missed else None),
                       "seconds": record.get("parameters", {}).get("seconds"), "ar": w.get("ar")}
    return {"modes": modes, "files": files, "cadence_equals_stock": w.get("cadence_equals_stock"),
            "verdict": record.get("verdict"), "error": None, "marks": marks}


def _duplex_mark(entry: dict, mode: str, workload: str | None) -> str | None:
    """What a per-mode duplex stage's record is, when it is not a done stage's VALID one: "PARTIAL, N=1,24
    measured (failed: <reason>)" for the checkpoint a crashed or timed-out stage left (the counts whose runs
    it holds), "INVALID (<codes>)" for a done stage's; None for a done stage's VALID record."""
    from suite.duplex import invalid_codes, record_reasons

    st, rec = entry["state"], entry["duplex"]["record"]
    verdict = rec.get("verdict")
    if st.get("status") == "done":
        if verdict == "VALID":
            return None
        return f"{verdict} ({', '.join(dict.fromkeys(invalid_codes(record_reasons(rec))))})"
    w = rec["workloads"].get(workload) or next(iter(rec["workloads"].values()), {})
    counts = [str(r.get("sessions")) for r in w.get("modes", {}).get(mode, {}).get("runs", [])
              if not r.get("refused")]
    label = "PARTIAL" if verdict == "PARTIAL" else f"verdict {verdict}"
    return f"{label}, N={','.join(counts) or 'none'} measured ({st['status']}: {st.get('reason') or 'no reason'})"


def load_reference(path: str | Path) -> dict[str, dict]:
    """Workload name -> verify-style run record, from a staged run folder (its `<w>.verify` stages) or a
    single-run folder (run.json, e.g. results/2026-11-30-h200-minicpmo45). Raises FileNotFoundError."""
    path = Path(path)
    if (path / "stages.json").is_file():
        data = load(path)
        unread = [f"{w}.verify" for w, h in data["workloads"].items()
                  if h.get("verify", {}).get("state", {}).get("status") == "done" and not h["verify"].get("record")]
        if unread:
            raise ValueError(f"reference run {path}: stage {unread[0]} is done but its run.json is missing or "
                             f"not JSON")
        return {w: h["verify"]["record"] for w, h in data["workloads"].items()
                if h.get("verify", {}).get("record")}
    rec = _json(path / "run.json")
    if rec is None:
        what = "not JSON" if (path / "run.json").is_file() else "neither stages.json nor run.json there"
        raise FileNotFoundError(f"reference run {path}: {what}")
    name = (rec.get("workload") or {}).get("name") if isinstance(rec, dict) else None
    if not isinstance(name, str) or not isinstance(rec.get("modes"), dict):
        raise ValueError(f"reference run {path}/run.json: expected a run record (workload.name, modes), got "
                         f"{json.dumps(rec)[:80]}")
    return {name: rec}


def resolve_reference(ref: str | Path, run_dir: Path) -> Path:
    """A recorded reference folder as a path that exists: as given (relative to the working directory, as
    `make reproduce` records it, e.g. results/2026-12-01-h200-reproduce-9), else the folder of that name beside
    run_dir (a report rebuilt from another directory, or a copied results tree); as given when neither is
    there (load_reference then names it)."""
    path = Path(ref)
    if path.exists():
        return path
    beside = Path(run_dir).parent / path.name
    return beside if path.name and beside.exists() else path


# --- figures from records ------------------------------------------------------------------------
def measured_tails(record: dict | None, mode: str) -> np.ndarray:
    """Tail ms of the measured SPEAK units of one mode of a record ([] if absent)."""
    if not record or mode not in record.get("modes", {}):
        return np.zeros(0)
    return np.array([u["tail_ms"] for u in record["modes"][mode]["units"]
                     if u.get("measured") and u.get("tail_ms") is not None], dtype=np.float64)


def spread(tails: np.ndarray) -> tuple[float, float, float] | None:
    """(p10, p50, p90) of tail times; None if empty."""
    if tails.size == 0:
        return None
    p10, p50, p90 = np.percentile(tails, [10, 50, 90])
    return float(p10), float(p50), float(p90)


def timing_rounds(record: dict | None) -> list[dict]:
    """The verify record's timing rounds that have a speedup ([] for an older record or one round)."""
    rounds = ((record or {}).get("comparison") or {}).get("rounds") or []
    return [r for r in rounds if isinstance(r, dict) and _finite(r.get("speedup_x")) and r["speedup_x"] > 0]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def speedup(record: dict | None) -> dict | None:
    """{x, lo, hi, band, stock, cadence, units, host}: None without both modes measured.
    With two or more timing rounds: x the median of the rounds' speedups, [lo, hi] their min and max,
    band "N rounds"; else x = stock p50 / cadence p50 of the one session per mode, [lo, hi] = [stock p10 /
    cadence p90, stock p90 / cadence p10] over the measured units, band "units". stock, cadence: (p10, p50,
    p90) tail ms of round 1. host: (min, max) of the rounds' host probes in microseconds per eager op, or
    None."""
    s, c = spread(measured_tails(record, "stock")), spread(measured_tails(record, "cadence"))
    if s is None or c is None:
        return None
    out = {"x": s[1] / c[1], "lo": s[0] / c[2], "hi": s[2] / c[0], "band": "units", "stock": s, "cadence": c,
           "units": int(measured_tails(record, "cadence").size), "host": None}
    rounds = timing_rounds(record)
    probes = [v for r in rounds for v in (r.get("host_us_per_op") or {}).values() if isinstance(v, (int, float))]
    if probes:
        out["host"] = (min(probes), max(probes))
    if len(rounds) >= 2:
        xs = [float(r["speedup_x"]) for r in rounds]
        out.update(x=float(np.median(xs)), lo=min(xs), hi=max(xs), band=f"{len(xs)} rounds")
        if profiled_before_rounds(record):
            out["band"] += "; rounds 2+ timed after the profiler"
    return out


def profiled_before_rounds(record: dict | None) -> bool:
    """A verify record of the first rounds version: round 1 ended in profiled units (no profile pass), so
    rounds 2+ ran with CUPTI attached (suite.runner.verify: slower eager launches, stock slowed most)."""
    comp = (record or {}).get("comparison") or {}
    if comp.get("profile_pass") is not None or len(comp.get("rounds") or []) < 2:
        return False
    return any(u.get("kernels") for m in (record.get("modes") or {}).values() for u in m.get("units", []))


PER_MODE = "one process per mode"
BOTH_MODES = "one process, both modes (verify)"


def memory_figures(entries: dict) -> dict:
    """Per mode {peak, session, how}, both modes from one source: the one-process-per-mode memory stages
    where both are done, else the verify record (one process for both modes; the runner subtracts what the
    first mode left, which is not the same measure: results/2026-12-01-h200-reproduce-9 gave Step-Audio 2's
    cadence session 2230 MiB there against 1210 MiB from the memory stages of -5). One memory stage alone
    is not paired with the other mode's verify figure."""
    from suite.memory import headline

    staged = {mode: entries.get(f"memory_{mode}", {}).get("record") for mode in ("stock", "cadence")}
    if all(rec and mode in rec.get("modes", {}) for mode, rec in staged.items()):
        recs, how = staged, PER_MODE
    else:
        rec = entries.get("verify", {}).get("record")
        recs, how = {"stock": rec, "cadence": rec}, BOTH_MODES
    out = {}
    for mode, rec in recs.items():
        if not rec or mode not in rec.get("modes", {}):
            continue
        mem = rec["modes"][mode]["memory"]
        stats = rec["modes"][mode].get("session_stats") or {}
        key, peak = headline(mem)
        session = mem.get("session_driver_mib", mem.get("session_rss_mib"))
        level = "driver" if "driver" in key else "RSS" if "rss" in key else key
        src = mem.get("driver_source")
        out[mode] = {"peak": peak, "session": session, "how": f"{how}; {level}" + (f" ({src})" if src else ""),
                     "alloc": mem.get("peak_over_idle_alloc_mib"),
                     "arena": _mib(stats.get("arena_bytes_mapped")), "pool": _mib(stats.get("graph_pool_bytes"))}
    return out


def _mib(nbytes) -> float | None:
    return None if nbytes is None else nbytes / 2**20


def _pct(new, old):
    return None if new is None or not old else 100.0 * (new - old) / old


def _paper(workload: str, wl_entries: dict, text: str) -> str:
    """`text` (the published figure) for MiniCPM-o's architecture, else a dash saying why. The architecture
    comes from the workload's records, or from the registry (workloads.get) when this run has none of it."""
    rec = _any_record(wl_entries)
    arch = (rec or {}).get("workload", {}).get("architecture")
    if arch is None:
        try:
            import workloads
            arch = workloads.get(workload).architecture
        except (ImportError, KeyError):      # away from the checkout (as `_registered`), or not registered
            arch = None
    return text if arch == FLOW_HIFT else f"{DASH} (published for MiniCPM-o only)"


def _is_flow_hift(entries: dict, steps: int | None = None) -> bool:
    """The workload's records are MiniCPM-o's architecture (and run `steps` Euler steps, if given)."""
    rec = _any_record(entries) or {}
    return (rec.get("workload", {}).get("architecture") == FLOW_HIFT
            and (steps is None or rec.get("parameters", {}).get("euler_steps") == steps))


def _any_record(entries: dict) -> dict | None:
    for e in entries.values():
        if e.get("record"):
            return e["record"]
    return None


def _status(entries: dict, harness: str) -> str:
    e = entries.get(harness)
    if e is None:
        return "not in this run"
    st = e["state"]
    return st["status"] + (f": {st['reason']}" if st.get("reason") and st["status"] != "done" else "")


# --- the claim tables ----------------------------------------------------------------------------
def speedup_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        rec = e.get("verify", {}).get("record")
        sp = speedup(rec)
        steps = (rec or {}).get("parameters", {}).get("euler_steps")
        if sp is None:
            rows.append([w, _f(steps), _paper(w, e, f"{PUBLISHED['speedup_x']:.2f}x"), DASH, DASH,
                         f"not measured ({_status(e, 'verify')})", DASH, DASH, DASH, DASH, DASH, DASH])
            continue
        timed = e["verify"].get("timed")
        s, c = sp["stock"], sp["cadence"]
        ms, mc = (rec["modes"][m]["metrics"] for m in ("stock", "cadence"))
        rows.append([w, _f(steps), _paper(w, e, f"{PUBLISHED['speedup_x']:.2f}x"),
                     f"{s[1]:.1f} [{s[0]:.1f}-{s[2]:.1f}]", f"{c[1]:.1f} [{c[0]:.1f}-{c[2]:.1f}]",
                     f"{sp['x']:.2f}x [{sp['lo']:.2f}-{sp['hi']:.2f}] ({sp['band']})", str(sp["units"]),
                     f"{_f(ms.get('kernel_launches_per_unit_p50'), '.0f')} -> "
                     f"{_f(mc.get('kernel_launches_per_unit_p50'), '.0f')}",
                     _f(mc.get("tail_over_kernel_busy_x"), ".2f"),
                     DASH if sp["host"] is None else f"{sp['host'][0]:.1f}-{sp['host'][1]:.1f}",
                     unit_host_cell(ms, mc),
                     DASH if timed is None else timed or "alone"])
    return _table(rows, ["workload", "Euler steps", "paper", "stock tail ms p50 [p10-p90]",
                         "cadence tail ms p50 [p10-p90]", "ours: speedup [band]", "units measured",
                         "kernel launches / unit, stock -> cadence", "cadence tail / kernel-busy",
                         "host us / eager op", "per unit p50, stock / cadence (round 1)",
                         "timed (stages running at the same time)"])


def unit_host_cell(ms: dict, mc: dict) -> str:
    """"A / B us launch, C / D MHz SM" from two modes' metrics (suite.runner.host_p50: the per-unit host
    samples); a dash for records made before the samples existed."""
    parts = []
    for key, spec, label in (("host_op_us_p50", ".1f", "us launch"), ("sm_mhz_p50", ".0f", "MHz SM")):
        if ms.get(key) is not None or mc.get(key) is not None:
            parts.append(f"{_f(ms.get(key), spec)} / {_f(mc.get(key), spec)} {label}")
    return ", ".join(parts) if parts else DASH


def rank_corr(x, y) -> float | None:
    """Spearman rank correlation of two equal-length 1-d sequences of numbers (average ranks for ties; scipy's
    spearmanr), over the pairs where both are finite; None for fewer than 3 such pairs or a constant
    sequence. Raises ValueError for sequences of different lengths or not 1-d."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.size != y.size:
        raise ValueError(f"x, y: expected two 1-d sequences of one length, got shapes {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def _number(value) -> float | None:
    """A finite int or float of a JSON record as float; None for anything else (null, NaN, a bool, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        return None
    return float(value)


#: Per-unit host samples (suite.runner.UnitRecord.host) the host-state table reads: key, label, format.
HOST_SAMPLES = (("op_us", "launch us", ".2f"), ("cpu_loop_us", "CPU loop us", ".0f"), ("sm_mhz", "SM MHz", ".0f"))


def host_state_rows(record: dict | None, mode: str) -> list | None:
    """One row of the host-state table: per sample kind, p50 [p10-p90] over the mode's measured SPEAK
    units of round 1 and the rank correlation of that sample with the unit's tail time; None when no
    measured unit carries samples (records made before suite.env.UnitHostSampler)."""
    units = []
    for u in ((record or {}).get("modes", {}).get(mode) or {}).get("units", []):
        if not (u.get("measured") and _number(u.get("tail_ms")) is not None and u.get("host") is not None):
            continue
        if not isinstance(u["host"], dict):
            raise ValueError(f"{mode} unit {u.get('index')}: host: expected an object of per-unit samples "
                             f"({', '.join(k for k, _l, _s in HOST_SAMPLES)}) or null, got {type(u['host']).__name__}")
        units.append(u)
    if not units:
        return None
    row = [str(len(units))]
    for key, _label, spec in HOST_SAMPLES:
        pairs = [(_number(u["host"].get(key)), _number(u["tail_ms"])) for u in units]
        pairs = [p for p in pairs if p[0] is not None]
        if not pairs:
            row += [DASH, DASH]
            continue
        v = np.array([p[0] for p in pairs], dtype=np.float64)
        p10, p50, p90 = np.percentile(v, [10, 50, 90])
        row += [f"{p50:{spec}} [{p10:{spec}}-{p90:{spec}}]", _f(rank_corr(v, [p[1] for p in pairs]), "+.2f")]
    return row


def host_state_table(data: dict) -> str | None:
    """Per workload and mode: the per-unit host samples of verify's round 1 and how each tracks the tail
    time (Spearman rho). A stock tail that follows `launch us` but not `SM MHz` is held up by the host; one
    that follows `SM MHz` by the GPU's clock. None when no record carries samples."""
    rows = []
    for w, e in data["workloads"].items():
        rec = e.get("verify", {}).get("record")
        for mode in ("stock", "cadence"):
            try:
                row = host_state_rows(rec, mode)
            except ValueError as exc:
                raise ValueError(f"{w}.verify/run.json: {exc}") from None
            if row is not None:
                rows.append([w, mode, *row])
    if not rows:
        return None
    heads = ["workload", "mode", "units"]
    for _key, label, _spec in HOST_SAMPLES:
        heads += [f"{label} p50 [p10-p90]", f"rho({label}, tail)"]
    return _table(rows, heads)


def memory_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        m = memory_figures(e)
        s, c = m.get("stock", {}), m.get("cadence", {})
        change = _pct(c.get("peak"), s.get("peak"))
        rows.append([w, _paper(w, e, f"{PUBLISHED['peak_memory_change_pct']:+.1f}%"), _f(s.get("peak")),
                     _f(c.get("peak")), DASH if change is None else f"{change:+.1f}%",
                     f"{_f(s.get('alloc'))} / {_f(c.get('alloc'))}", f"{_f(c.get('arena'))} / {_f(c.get('pool'))}",
                     "; ".join(sorted({x["how"] for x in m.values()})) or
                     f"not measured ({_status(e, 'memory_stock')})"])
    return _table(rows, ["workload", "paper", "stock peak over idle MiB", "cadence peak over idle MiB",
                         "ours: change", "torch allocator over idle MiB, stock / cadence",
                         "cadence arena / graph pool MiB", "measured as"])


def session_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        m = memory_figures(e)
        s, c = m.get("stock", {}).get("session"), m.get("cadence", {}).get("session")
        ratio = c / s if s and c is not None else None
        target = _is_flow_hift(e)                       # issue 3's target is MiniCPM-o's
        judged = all(x["how"].startswith(PER_MODE) for x in m.values())
        verdict = ("" if ratio is None or not target else
                   f" ({'met' if ratio <= 0.5 else 'missed'})" if judged else " (not judged: needs both memory stages)")
        rows.append([w, DASH, "cadence <= 1/2 stock" if target else DASH, _f(s), _f(c),
                     DASH if ratio is None else f"{ratio:.2f} of stock{verdict}",
                     "; ".join(sorted({x["how"] for x in m.values()})) or "not measured"])
    return _table(rows, ["workload", "paper", "target (issue 3, MiniCPM-o)", "stock MiB", "cadence MiB", "ours",
                         "measured as (peak with one session - model loaded, no session)"])


def _duplex_status(e: dict) -> str:
    """The duplex stages' statuses, one clause ("duplex: <status>" when both say the same)."""
    st = {h: _status(e, h) for h in DUPLEX_STAGES.values()}
    if len(set(st.values())) == 1:
        return f"duplex: {next(iter(st.values()))}"
    return "; ".join(f"{h}: {v}" for h, v in st.items())


def _duplex_source(e: dict, d: dict) -> str:
    """The duplex figures' files, the status of each mode they lack, and stock == cadence when both are in."""
    text = f"duplex ({', '.join(d['files'])})"
    text += "".join(f"; {mode}: {mark}" for mode, mark in d.get("marks", {}).items())
    text += "".join(f"; {mode}: {_status(e, h)}" for mode, h in DUPLEX_STAGES.items() if mode not in d["modes"])
    if d["cadence_equals_stock"] is not None:
        text += f"; one session alone, cadence == stock: {'yes' if d['cadence_equals_stock'] else 'NO'}"
    text += _timed_note(e, DUPLEX_STAGES.values()) if d["modes"] else ""
    return text + (f"; {d['error']}" if d["error"] else "")


def _pct_text(value) -> str:
    return DASH if value is None else f"{value:+.1f}%"


def speak_table(data: dict) -> str:
    paper = f"{PUBLISHED['speak_vs_period_pct_stock']:+.0f}% -> {PUBLISHED['speak_vs_period_pct_cadence']:+.0f}%"
    rows = []
    for w, e in data["workloads"].items():
        d = duplex_figures(e, w)
        if d and d["modes"]:
            s, c = d["modes"].get("stock", {}), d["modes"].get("cadence", {})
            rows.append([w, _paper(w, e, paper), _pct_text(s.get("speak_vs_period_pct_mean")),
                         _pct_text(c.get("speak_vs_period_pct_mean")),
                         " / ".join(_pct_text(m.get("speak_vs_period_pct_p99")) for m in (s, c)),
                         f"{_f(s.get('miss_rate'), '.3f')} / {_f(c.get('miss_rate'), '.3f')}",
                         _duplex_source(e, d)])
            continue
        rec = e.get("verify", {}).get("record")
        ms = (rec or {}).get("modes", {})
        s = ms.get("stock", {}).get("metrics", {}).get("tail_vs_period_pct_p50")
        c = ms.get("cadence", {}).get("metrics", {}).get("tail_vs_period_pct_p50")
        rows.append([w, _paper(w, e, paper), _pct_text(s), _pct_text(c), DASH, DASH,
                     f"tail only, p50, no AR stage (verify{_timed_note(e, 'verify', ', ')}); "
                     f"{_duplex_source(e, d) if d else _duplex_status(e)}"])
    return _table(rows, ["workload", "paper (mean SPEAK vs 1 s)", "ours stock", "ours cadence",
                         "p99 stock / cadence", "miss rate stock / cadence", "source"])


def session_limit(fig: dict | None) -> tuple[int | None, int | None]:
    """(lo, hi): the bracket a mode's duplex runs put on its session limit. lo: the largest count tried with
    zero misses; hi: one less than the first larger count that missed, None where no larger count missed
    (the limit was not found). lo == hi: the limit itself (the counts were consecutive there)."""
    fig = fig or {}
    lo, first = fig.get("max_sessions_zero_miss"), fig.get("first_missed")
    if lo is None and first and first["sessions"] == 1:
        lo = 0                                          # one session alone already missed
    return lo, (first["sessions"] - 1 if first else None)


def _limit_cell(fig: dict | None) -> str:
    """'2 (3 missed 12/180)', '1 (26 missed 46/1066: limit 1-25)', '32 (largest tried)'."""
    lo, hi = session_limit(fig)
    if lo is None:
        return DASH
    first = (fig or {}).get("first_missed")
    if not first:
        return f"{lo} (largest tried)"
    miss = (f"{first['sessions']} refused (memory)" if first.get("refused") else
            f"{first['sessions']} missed {first['misses']}/{first['units'] if first['units'] is not None else '?'}")
    return f"{lo} ({miss})" if hi == lo else f"{lo} ({miss}: limit {lo}-{hi})"


def session_ratio(stock: dict | None, cadence: dict | None) -> str:
    """The cadence / stock session-limit ratio from the two brackets (`session_limit`): exact where both
    limits are, else its range ('0.5-12.5x'), a bound ('>= 4.0x'), or a dash where neither limit was found
    (two lower bounds bound no ratio)."""
    (s_lo, s_hi), (c_lo, c_hi) = session_limit(stock), session_limit(cadence)
    if not s_lo or c_lo is None:
        return DASH
    if s_lo == s_hi and c_lo == c_hi:
        return f"{c_lo / s_lo:.1f}x"
    # a bound is rounded outwards (8/3 is ">= 2.6x", not 2.7), so the printed range holds the true one
    low = math.floor(10 * c_lo / s_hi + 1e-9) / 10 if s_hi else None
    high = math.ceil(10 * c_hi / s_lo - 1e-9) / 10 if c_hi is not None else None
    if low is not None and high is not None:
        return f"{low:.1f}-{high:.1f}x"
    if low is not None:
        return f">= {low:.1f}x"
    if high is not None:
        return f"<= {high:.1f}x"
    return f"{DASH} (both limits above the counts tried: >= {c_lo} vs >= {s_lo})"


def sessions_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        d = duplex_figures(e, w)
        fs = fc = None
        if d:
            fs, fc = d["modes"].get("stock"), d["modes"].get("cadence")
        ratio = session_ratio(fs, fc)
        target = ">= 24 and >= 4x stock (tail only)" if _is_flow_hift(e, 10) else DASH
        cut = {m for m, mark in (d or {}).get("marks", {}).items() if mark.startswith("PARTIAL")}
        counts = [_limit_cell(f) + (" (PARTIAL)" if m in cut and f else "")    # a lower bound, cut short
                  for m, f in (("stock", fs), ("cadence", fc))]
        rows.append([w, _paper(w, e, "more per GPU (no figure)"), target, *counts, ratio,
                     _duplex_source(e, d) if d else f"not measured ({_duplex_status(e)})"])
    return _table(rows, ["workload", "paper", "target (issue 7, MiniCPM-o 10 steps)",
                         "stock sessions, 0 misses in 60 s", "cadence sessions",
                         "ours: ratio", "source"])


def bitwise_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        rec = e.get("verify", {}).get("record")
        comp = (rec or {}).get("comparison")
        if not comp:
            rows.append([w, "every unit", DASH, DASH, DASH, f"not compared ({_status(e, 'verify')})"])
            continue
        n, bad = comp["units_compared"], comp["mismatched_units"]
        again = [r for r in (comp.get("rounds") or [])[1:] if isinstance(r, dict)]
        if comp.get("profile_pass"):
            again.append({**comp["profile_pass"], "round": "profile pass"})
        n2 = sum(int(r.get("units_compared") or 0) for r in again)
        bad2 = [f"{r['round']}: {r['mismatched_units']}" for r in again if r.get("mismatched_units")]
        rows.append([w, "every unit", str(n), str(n - len(bad)), str(bad) if bad else "none",
                     f"{n2 - sum(len(r.get('mismatched_units') or []) for r in again)}/{n2}"
                     + (f" (differ: {'; '.join(bad2)})" if bad2 else "") if again else DASH, rec["verdict"]])
    return _table(rows, ["workload", "paper", "units compared", "byte-identical (f32 and int16)",
                         "differing units", "again in later rounds / profile pass: identical", "stage verdict"])


# --- comparison with a reference run -------------------------------------------------------------
def _ref_list(refs: dict) -> dict[str, list[tuple[str, dict]]]:
    """refs as workload -> [(label, record), ...]: accepts workload -> record (labelled by its run_id) or
    workload -> list of (label, record) pairs (`write` with several --compare folders)."""
    out = {}
    for w, v in (refs or {}).items():
        out[w] = [(str(v.get("run_id", DASH)), v)] if isinstance(v, dict) else list(v)
    return out


def compare_table(data: dict, refs: dict) -> str:
    """Speedup and peak-memory change of ours vs each reference record, per workload found in both (a row
    per reference run). refs: see `_ref_list`."""
    from suite.memory import headline

    rows = []
    by_workload = _ref_list(refs)
    for w, e, label, ref in [(w, e, label, ref) for w, e in data["workloads"].items()
                             for label, ref in by_workload.get(w, [])]:
        ours, theirs = speedup(e.get("verify", {}).get("record")), speedup(ref)
        if ours and theirs:
            inside = theirs["lo"] <= ours["x"] <= theirs["hi"]
            verdict = "within the reference's noise" if inside else "OUTSIDE the reference's noise"
            sp = (f"{ours['x']:.2f}x [{ours['lo']:.2f}-{ours['hi']:.2f}] ({ours['band']}) vs {theirs['x']:.2f}x "
                  f"[{theirs['lo']:.2f}-{theirs['hi']:.2f}] ({theirs['band']}): {verdict}")
        else:
            sp = "not comparable (a side without both modes measured)"
        m = memory_figures(e)
        ref_mem = {k: headline(v["memory"])[1] for k, v in ref.get("modes", {}).items()}
        ours_pct = _pct(m.get("cadence", {}).get("peak"), m.get("stock", {}).get("peak"))
        ref_pct = _pct(ref_mem.get("cadence"), ref_mem.get("stock"))
        mem = (DASH if ours_pct is None or ref_pct is None else
               f"{ours_pct:+.1f}% vs {ref_pct:+.1f}% ({ours_pct - ref_pct:+.1f} points; one sample per run, "
               f"no spread)")
        rows.append([w, label, sp, mem])
    if not rows:
        return "No workload of this run is in the reference run(s)."
    return _table(rows, ["workload", "reference run", "speedup: ours [band] vs reference [band]",
                         "peak memory change: ours vs reference"])


def between_runs_table(data: dict, refs: dict) -> str:
    """Per workload, this run's verify rounds beside the reference runs' of the same impl/ tree: each run's
    median speedup, the references' pooled round band (the noise between processes and sittings, which one
    run's rounds cannot show), whether ours lies in it, and how far stock's and cadence's round p50s moved
    over all these runs (max / min). References of another or an unknown impl/ tree (no provenance) are
    counted out and named; of a run (ours or a reference) whose rounds 2+ ran after the profiler
    (`profiled_before_rounds`), only round 1 counts. Rounds without a finite speedup are left out
    (`timing_rounds`), as are non-finite or non-positive tail p50s from the "moved" column.
    refs: see `_ref_list`. Returns a sentence when no workload has a reference with timing rounds."""
    rows = []
    for w, e in data["workloads"].items():
        ours = e.get("verify", {}).get("record")
        mine = timing_rounds(ours)
        if not mine:
            continue
        ours_cut = profiled_before_rounds(ours)      # the same rule for ours as for the references
        if ours_cut:
            mine = mine[:1]
        tree = (ours.get("provenance") or {}).get("impl_tree")
        same, other, cut = [], [], []
        for label, ref in _ref_list(refs).get(w, []):
            rr = timing_rounds(ref)
            if profiled_before_rounds(ref):      # rounds 2+ ran with CUPTI attached: a known slowdown
                rr, _ = rr[:1], cut.append(label)
            if not rr:
                continue
            theirs = (ref.get("provenance") or {}).get("impl_tree")
            # an unknown tree (no provenance) is never "the same", not even as another unknown one
            (same if tree and theirs and str(theirs) == str(tree) else other).append((label, rr))
        if not same:
            if other:
                rows.append([w, DASH, DASH, DASH, DASH, DASH,
                             "no reference of this impl/ tree (other trees: " + ", ".join(l for l, _ in other) + ")"])
            continue
        pooled = [float(r["speedup_x"]) for _, rr in same for r in rr]
        lo, hi = min(pooled), max(pooled)
        x = float(np.median([float(r["speedup_x"]) for r in mine]))
        everything = [mine] + [rr for _, rr in same]
        stock, cad = ([float(r[k]) for rr in everything for r in rr if _finite(r.get(k)) and r[k] > 0]
                      for k in ("stock_tail_ms_p50", "cadence_tail_ms_p50"))
        medians = ", ".join(f"{np.median([float(r['speedup_x']) for r in rr]):.2f}x" for _, rr in same)
        note = ("" if not other else "; other impl/ trees counted out: " + ", ".join(l for l, _ in other))
        cut = (["ours"] if ours_cut else []) + cut
        note += ("" if not cut else "; round 1 only (rounds 2+ timed after the profiler): " + ", ".join(cut))
        moved = ", ".join(f"{name} x{max(v) / min(v):.2f} ({min(v):.1f}-{max(v):.1f} ms)"
                          for name, v in (("stock", stock), ("cadence", cad)) if v) or DASH
        rows.append([w, str(len(same)), medians, f"{x:.2f}x",
                     f"[{lo:.2f}-{hi:.2f}] ({len(pooled)} round{'s' if len(pooled) != 1 else ''})",
                     "yes" if lo <= x <= hi else "NO", f"{moved}{note}"])
    if not rows:
        return "No reference run with timing rounds for a workload of this run."
    return _table(rows, ["workload", "reference runs (same impl/ tree)", "their medians (round 1 where cut)", "ours (median)",
                         "their rounds pooled [min-max]", "ours inside", "round p50 moved, over all these runs"])


# --- GPU coverage and provenance -----------------------------------------------------------------
def _records(data: dict) -> list[dict]:
    return [h["record"] for e in data["workloads"].values() for h in e.values() if h.get("record")]


def gpu_coverage(data: dict, results_root: Path | None = None) -> str:
    """Which impl/ tree the latest GPU verification (a CUDA verify record here or under results_root)
    covers, and whether it is HEAD's (`git rev-parse HEAD:impl`, where git is available)."""
    from suite import env

    cands = [(r, "this run") for r in _records(data) if r.get("comparison") is not None]
    if results_root is not None and results_root.is_dir():
        for p in sorted(results_root.glob("*/run.json")) + sorted(results_root.glob("*/*/run.json")):
            rec = _json(p)
            if rec and rec.get("comparison") is not None:
                cands.append((rec, str(p.parent)))
    cuda = [(r, src) for r, src in cands if str(r.get("device", "")).startswith("cuda")]
    head = env._git("rev-parse", "HEAD:impl")
    if not cuda:
        return "No GPU verification in this run or under results/."
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
    recs = _records(data)
    state = data["state"]

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

    dev = lambda r: r["provenance"]["device"]  # noqa: E731
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
                     f"{_f(s.get('budget_s'))} s"
                     + (f", GPUs {','.join(map(str, s['gpus']))}" if s.get("gpus") else "")
                     + f", git {str(s.get('git_rev'))[:12]}, impl/ tree "
                     f"{str(s.get('impl_tree'))[:12]}; ran {len(s.get('ran', []))}, kept {len(s.get('kept', []))}"
                     + (f"; stopped: {s['stopped']}" if s.get("stopped") else "")])
    trees = {str(r["provenance"].get("impl_tree")) for r in recs}
    if len(trees) > 1:
        rows.append(["WARNING", f"stage records come from {len(trees)} impl/ trees: {sorted(trees)}; ratios "
                                f"mix code versions"])
    return _table(rows, ["", ""])


def stages_table(data: dict) -> str:
    rows = []
    for name, st in data["state"].get("stages", {}).items():
        legacy = "" if st["harness"] in HARNESSES else "legacy (a harness this version does not run; kept as recorded)"
        rows.append([name, st["status"], _f(st.get("seconds")), _f(st.get("budget_s"), ".0f"),
                     str(st.get("attempts", 0)), _f(st.get("gpu")), st.get("verdict") or DASH,
                     ", ".join(dict.fromkeys(st.get("invalid_codes") or [])) or DASH,
                     ", ".join(beside(name, data["state"]["stages"])) or DASH,
                     "; ".join(x for x in (legacy, st.get("reason") or "") if x)])
    return _table(rows, ["stage", "status", "seconds", "budget s", "attempts", "GPU (--gpus)", "verdict",
                         "invalid codes", "ran beside", "reason"])


# --- plots -----------------------------------------------------------------------------------------
def plots(data: dict, run_dir: Path) -> list[str]:
    """Write the PNGs; returns the file names written ([] without matplotlib or without figures)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    names = [w for w, e in data["workloads"].items() if speedup(e.get("verify", {}).get("record"))]
    if names:
        fig, ax = plt.subplots(figsize=(1.6 * len(names) + 3, 3.5))
        x = np.arange(len(names))
        for k, mode in enumerate(("stock", "cadence")):
            sp = [spread(measured_tails(data["workloads"][w]["verify"]["record"], mode)) for w in names]
            mid = np.array([s[1] for s in sp])
            err = np.array([[s[1] - s[0] for s in sp], [s[2] - s[1] for s in sp]])
            ax.bar(x + (k - 0.5) * 0.38, mid, 0.38, yerr=err, capsize=3, label=mode)
        ax.set_xticks(x, names)
        ax.set_ylabel("tail ms per SPEAK unit (p50, p10-p90)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(run_dir / "speedup.png", dpi=110)
        plt.close(fig)
        written.append("speedup.png")
        fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * len(names)), squeeze=False)
        for ax, w in zip(axes[:, 0], names):
            rec = data["workloads"][w]["verify"]["record"]
            for mode in ("stock", "cadence"):
                us = [u for u in rec["modes"][mode]["units"] if u.get("tail_ms") is not None]
                ax.plot([u["index"] for u in us], [u["tail_ms"] for u in us], ".-", label=mode)
            ax.axhline(1000.0, color="k", lw=0.8, ls="--", label="1 s cadence")
            ax.set_title(w, fontsize=9)
            ax.set_ylabel("tail ms")
        axes[0, 0].legend(fontsize=8)
        axes[-1, 0].set_xlabel("unit index")
        fig.tight_layout()
        fig.savefig(run_dir / "tail_per_unit.png", dpi=110)
        plt.close(fig)
        written.append("tail_per_unit.png")
    mem = {w: memory_figures(e) for w, e in data["workloads"].items()}
    mem = {w: m for w, m in mem.items() if "stock" in m and "cadence" in m}
    if mem:
        fig, axes = plt.subplots(1, 2, figsize=(2.4 * len(mem) + 4, 3.5))
        x = np.arange(len(mem))
        for ax, key, label in zip(axes, ("peak", "session"), ("peak over idle MiB", "per-session MiB")):
            for k, mode in enumerate(("stock", "cadence")):
                ax.bar(x + (k - 0.5) * 0.38, [m[mode][key] or 0 for m in mem.values()], 0.38, label=mode)
            ax.set_xticks(x, list(mem))
            ax.set_ylabel(label)
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(run_dir / "memory.png", dpi=110)
        plt.close(fig)
        written.append("memory.png")
    return written


# --- the report ------------------------------------------------------------------------------------
def _registered() -> list[str]:
    """The registered workloads' names (a CUDA run's default plan covers them all); [] where the
    workloads package cannot be imported (a report rebuilt away from the checkout)."""
    try:
        import workloads
    except ImportError:
        return []
    return list(workloads.names())


def render(data: dict, refs: dict[str, dict] | None = None, written: list[str] | None = None,
           results_root: Path | None = None) -> str:
    """REPORT.md text of a loaded staged run (`load`); refs: workload -> reference record."""
    state = data["state"]
    counts = {s: 0 for s in ("done", "failed", "skipped", "pending", "running")}
    legacy = 0
    for st in state.get("stages", {}).values():
        if st["harness"] not in HARNESSES:              # an older version's stage: listed, not counted
            legacy += 1
            continue
        counts[st["status"]] = counts.get(st["status"], 0) + 1
    opts = state.get("options", {})
    missing = unselected(state, _registered() if device_type(opts.get("device", "cpu")) == "cuda" else None)
    complete = counts["failed"] == counts["pending"] == counts["running"] == 0 and not missing
    rerun = [] if counts["failed"] == counts["pending"] == counts["running"] == 0 else [
        "rerun the same command with `--resume` to run the failed and pending stages (done stages are kept)"]
    if missing:
        rerun.append(f"{len(missing)} stage(s) of the default plan never selected in a sitting: "
                     f"{', '.join(missing)} (`--resume --stages {','.join(missing)}`)")
    parts = [f"# DuplexCadence reproduction {data['run_dir'].name}", "",
             f"**{'Complete' if complete else 'Incomplete'}**: " + ", ".join(f"{v} {k}" for k, v in counts.items()
                                                                             if v or k != "running")
             + (f" (and {legacy} legacy entries of an older version, listed under Stages)" if legacy else "")
             + ("; " + "; ".join(rerun) + "." if rerun else ""), "",
             _verdicts(state), "",
             gpu_coverage(data, results_root), "",
             "Published figures: one H200, released MiniCPM-o 4.5 weights, whole SPEAK unit. Ours: seeded "
             "random weights, the token-to-audio tail unless a row says otherwise, on the device below. "
             "Compare ratios, not absolute times. Tail-time bands are p10-p90 over the measured units of round 1; "
             "a speedup's band is the min-max of the stage's timing rounds (\"N rounds\": fresh sessions of "
             "one process, alternating order) or, for a record of one round, [stock p10 / cadence p90, stock "
             "p90 / cadence p10] (\"units\"). Host us / eager op: suite.env.host_op_us around each round (the "
             "stock tails are host-bound).", "",
             "## Speedup (stock / cadence tail time per SPEAK unit)", "", speedup_table(data), "",
             *([TIMED_NOTE, ""] if any(h.get("timed") and h["state"].get("harness") in TIMED_HARNESSES
                                       for e in data["workloads"].values() for h in e.values()) else []),
             *host_state_section(data),
             "## Peak memory (over the idle baseline)", "", memory_table(data), "",
             "## Per-session increment", "", session_table(data), "",
             "## SPEAK time against the 1 s cadence", "", speak_table(data), "",
             "## Sessions per GPU", "", sessions_table(data), "",
             "Session counts are the largest count tried with zero missed units (suite.stages.DUPLEX_SESSIONS "
             "per mode and workload), then the first larger count that missed (its misses / units): together "
             "a bracket on the limit, the limit itself only where the two counts are consecutive (`python -m "
             "suite.duplex --bisect` finds it); \"largest tried\": no count missed, a lower bound. The ratio "
             "comes from the two brackets (a range or a bound where a limit is not exact).", "",
             "## Bitwise equality (per unit sha256, stock vs cadence)", "", bitwise_table(data), ""]
    if written:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in written] + [""]
    else:
        parts += ["## Plots", "", "None: no stage with both modes measured yet, or matplotlib missing.", ""]
    if refs:
        parts += ["## Against the reference run", "",
                  "Ours is within the reference's noise when our speedup lies in the reference's band (its "
                  "rounds' min-max, or its unit band for a record of one round). The reference's memory may come from one process for both modes (its runner subtracts "
                  "what the first mode left); ours from one process per mode where the memory stages ran.", "",
                  compare_table(data, refs), "",
                  "## Between runs (the noise between processes and sittings)", "",
                  "One run's timing rounds share a process and a few minutes of the host; on a host whose speed "
                  "changes (the lent H200: results/2026-11-30-h200-hostdiag/) they under-state the noise between "
                  "runs. Pooled over the reference runs of the same impl/ tree, their rounds' min-max is that "
                  "noise as measured so far; more runs can still widen it.", "",
                  between_runs_table(data, refs), ""]
    parts += ["## Stages", "", stages_table(data), "",
              "Each stage's own REPORT.md, run.json and log.txt are in its folder (`<stage>/`).", "",
              "## Provenance", "", provenance_table(data), "",
              "## Parameters used", "",
              _table([[k, DASH if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)]
                      for k, v in opts.items()], ["option", "value"]), ""]
    return "\n".join(parts)


def host_state_section(data: dict) -> list[str]:
    """The "Host state per unit" section's lines, or [] when no record carries per-unit samples."""
    table = host_state_table(data)
    if table is None:
        return []
    return ["## Host state per unit (verify, round 1)", "",
            "Sampled right after each timed SPEAK unit, outside its timed region (suite.env.UnitHostSampler): "
            "launch us = microseconds per eager torch.add launch (100 ops), CPU loop us = a pure-Python loop, "
            "SM MHz = the GPU's SM clock (NVML). rho: Spearman rank correlation with the unit's tail time "
            "(a dash: constant or under 3 units).", "", table, ""]


def _verdicts(state: dict) -> str:
    """One line: the stage records' verdicts, with the reasons of the INVALID ones and the stages whose
    record is PARTIAL (a duplex stage that failed after checkpointing)."""
    done = {n: st for n, st in state.get("stages", {}).items() if st.get("verdict")}
    partial = [n for n, st in done.items() if st["verdict"] == "PARTIAL"]
    bad = {n: ", ".join(dict.fromkeys(st.get("invalid_codes") or [])) for n, st in done.items()
           if st["verdict"] not in ("VALID", "PARTIAL")}
    return (f"Stage verdicts: {len(done) - len(bad) - len(partial)} VALID, {len(bad)} INVALID"
            + ("".join(f"; {n}: {codes}" for n, codes in bad.items()) if bad else "")
            + (f"; {len(partial)} PARTIAL (failed after measuring some runs): {', '.join(partial)}" if partial else "")
            + ".")


def prepare(run_dir: str | Path, compare: list[str] | None = None,
            results_root: str | Path | None = None) -> tuple:
    """Load the staged run and its references and render the report in memory, writing nothing: what
    `write` checks first. Returns (data, refs, root). Raises FileNotFoundError (missing stages.json or
    reference) and ValueError (a malformed record or reference; TypeError, KeyError and AttributeError
    from a record of the wrong shape are raised as ValueError naming the folder)."""
    run_dir = Path(run_dir)
    data = load(run_dir)
    refs: dict[str, list] = {}
    folders, seen = [], set()
    for ref in (compare if compare is not None else data["state"].get("compare", [])):
        path = resolve_reference(ref, run_dir)
        if path.resolve() not in seen:                 # a folder named twice is one reference, not two
            seen.add(path.resolve())
            folders.append((ref, path))
    names = [Path(ref).name or str(ref) for ref, _ in folders]
    unique = len(set(names)) == len(names)             # else label each by the path as given
    for (ref, path), name in zip(folders, names):
        if path.resolve() == run_dir.resolve():
            raise ValueError(f"reference run {ref}: it is the run itself ({run_dir})")
        try:
            loaded = load_reference(path)
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"reference run {ref}: a record of the wrong shape ({type(exc).__name__}: {exc})") \
                from None
        for w, rec in loaded.items():
            refs.setdefault(w, []).append((name if unique else str(ref), rec))
    root = Path(results_root) if results_root is not None else run_dir.parent
    try:
        render(data, refs, [], root)   # a malformed record fails here, before any plot is rewritten
    except (TypeError, KeyError, AttributeError, StopIteration) as exc:
        raise ValueError(f"{run_dir}: a record of the wrong shape in the run or its references "
                         f"({type(exc).__name__}: {exc})") from None
    return data, refs, root


def write(run_dir: str | Path, compare: list[str] | None = None, results_root: str | Path | None = None) -> Path:
    """Load the staged run, draw the plots, write REPORT.md; returns its path. compare: reference run
    folders (default: those recorded in stages.json; `resolve_reference`). Raises as `prepare` does, before
    writing anything."""
    run_dir = Path(run_dir)
    data, refs, root = prepare(run_dir, compare, results_root)
    written = plots(data, run_dir)
    path = run_dir / "REPORT.md"
    path.write_text(render(data, refs, written, root))
    return path
