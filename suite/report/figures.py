"""The figures a report gives, from a staged run's records alone (`load`): a verify record's speedup (the
median paired ratio with its 95% interval and A/A floor; for older records the median of the timing rounds
with their min-max, or for one round the unit band), memory per mode (the memory stages where both ran, else verify's, labelled),
duplex figures per mode (the per-mode records joined: cadence == stock from the one-session runs), labelled
"oracle" where a cadence figure's graphs came from its own script, and where each stage ran.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from suite.records import (DUPLEX_READ_SCHEMAS, DUPLEX_STAGES, StateError, family, headline, invalid_codes,
                           max_zero_miss, overlapping, read_dropins, read_json, read_stages, record_reasons,
                           speak_per_second, unpack_units, UNSEEN_TRAFFIC, verify_protocol)
from suite.records.floor import read_floors
from suite.records.host_speed import fit_host_speed
from suite.records.paired import MIN_PROCESSES, CONFIDENCE, Pair, Summary, unpack_pairs

PER_MODE = "one process per mode"
BOTH_MODES = "one process, both modes (verify)"
JOINED = ("stock", "cadence")          # the duplex modes a workload's row joins (the oracle is beside them)


# --- reading ---------------------------------------------------------------------------------------------
def load(run_dir: str | Path) -> dict:
    """{"state": stages.json, "run_dir", "workloads": {name: {harness: {"state", "record", "duplex", "timed"}}},
    "dropins": the folder's drop-in records (suite.records.read_dropins), "floors": its floor records
    (suite.records.floor.read_floors)}:
    "record" a done stage's run.json; "duplex" a duplex stage's {"file", "record"} (done, or the checkpoint
    a failed or pending one left); "timed" how its last attempt was timed (`timed_beside`). Raises
    FileNotFoundError for a missing stages.json, StateError (a ValueError) for a mis-shaped one or a done
    stage's run.json that is there but not a JSON object."""
    run_dir = Path(run_dir)
    state = read_stages(run_dir)
    out: dict = {}
    for name, st in state.get("stages", {}).items():
        folder = run_dir / (st.get("dir") or name)
        entry = {"state": st, "record": None, "duplex": None, "timed": timed_beside(name, state["stages"])}
        if st.get("status") == "done":
            entry["record"] = read_json(folder / "run.json")
            if entry["record"] is None and (folder / "run.json").exists():
                raise StateError(f"{folder / 'run.json'}: stage {name} is done but its record is not a JSON object "
                                 f"(truncated or damaged); restore it, or rerun the stage")
            if family(st["harness"]) == "duplex":           # per-mode stages, and a legacy both-mode one
                entry["duplex"] = duplex_record(folder, run_dir)
        elif st.get("status") in ("failed", "pending") and st["harness"] in DUPLEX_STAGES.values():
            entry["duplex"] = duplex_record(folder, run_dir)   # what a crash or a time limit left (PARTIAL)
        out.setdefault(st["workload"], {})[st["harness"]] = entry
    return {"state": state, "workloads": out, "run_dir": run_dir, "dropins": read_dropins(run_dir),
            "floors": read_floors(run_dir)}


def duplex_record(folder: Path, run_dir: Path) -> dict | None:
    """{"file", "record"}: the first duplex record (a DUPLEX_READ_SCHEMAS schema) in a stage folder, units
    as rows."""
    for path in sorted(folder.rglob("*.json")):
        data = read_json(path)
        if data and data.get("schema") in DUPLEX_READ_SCHEMAS and data.get("workloads"):
            return {"file": str(path.relative_to(run_dir)), "record": unpack_units(data)}
    return None


def beside(name: str, stages: dict) -> list[str]:
    """The stages that ran on the same host at the same time as stage `name`'s last attempt: its recorded
    `overlapped`, else derived from the recorded times (`suite.records.overlapping`)."""
    recorded = stages[name].get("overlapped")
    return list(recorded) if recorded is not None else overlapping(name, stages)


def timed_beside(name: str, stages: dict) -> str | None:
    """How stage `name` was timed: None when it never started, "" when it ran alone, else "timed beside A,
    B" plus " on another GPU" when each of them had a GPU index other than its own."""
    st = stages[name]
    if not st.get("started_utc"):
        return None
    names = beside(name, stages)
    if not names:
        return ""
    gpus = {(stages.get(n) or {}).get("gpu") for n in names}
    other = st.get("gpu") is not None and None not in gpus and st["gpu"] not in gpus
    return f"timed beside {', '.join(names)}" + (" on another GPU" if other else "")


def timed_note(entries: dict, harnesses, sep: str | None = None) -> str:
    """'; <harness> timed beside ...' for each of these stages that ran beside another ('' if none did);
    sep given: '<sep>timed beside ...' (one harness, named already)."""
    harnesses = [harnesses] if isinstance(harnesses, str) else harnesses
    return "".join((f"; {h} " if sep is None else sep) + e["timed"]
                   for h in harnesses if (e := entries.get(h)) and e.get("timed"))


def gpu_name(record: dict | None) -> str | None:
    """The GPU a record was measured on (its provenance), "cpu" for a CPU record, None without a record."""
    if not record:
        return None
    return ((record.get("provenance") or {}).get("device") or {}).get("gpu_name") or "cpu"


def status(entries: dict, harness: str) -> str:
    e = entries.get(harness)
    if e is None:
        return "not in this run"
    st = e["state"]
    if st["status"] == "done":
        return "its stage ran and gave no figure: a CPU run, or too few units"
    return st["status"] + (f": {st['reason']}" if st.get("reason") else "")


# --- duplex ----------------------------------------------------------------------------------------------
def _solo_hashes(mode_record: dict) -> list | None:
    run = next((r for r in mode_record.get("runs") or [] if r.get("sessions") == 1 and not r.get("refused")), None)
    if run is None:
        return None
    return [(u["index"], u["sha256_f32"], u["sha256_pcm16"]) for u in run["units"] if u.get("sha256_f32")]


def combine(records: list[dict]) -> dict:
    """One view of duplex records of the same workloads measured in separate stages: every part's modes side
    by side, `cadence_equals_stock` from the two modes' one-session runs (every unit's sha256, in order).
    Raises ValueError for parts with other cadence periods, AR stages or seconds, or a mode in two parts."""
    for key in ("period_s", "ar", "seconds"):
        vals = {json.dumps(r["parameters"][key]) for r in records}
        if len(vals) > 1:
            raise ValueError(f"parameters.{key}: the parts differ ({sorted(vals)}); they cannot share one record")
    out = {"parameters": dict(records[0]["parameters"]), "workloads": {}}
    for r in records:
        for name, w in r["workloads"].items():
            dst = out["workloads"].setdefault(name, {"ar": w.get("ar"), "modes": {}})
            for mode, m in w["modes"].items():
                if mode in dst["modes"]:
                    raise ValueError(f"workload {name!r}: mode {mode!r} is in more than one part")
                dst["modes"][mode] = m
    for w in out["workloads"].values():
        if all(m in w["modes"] for m in JOINED):
            a, b = (_solo_hashes(w["modes"][m]) for m in JOINED)
            w["cadence_equals_stock"] = a is not None and a == b
    return out


def is_oracle(mode_record: dict) -> bool:
    """A duplex mode whose graphs came from its sessions' own script: `--prepare oracle`, or a record of
    the harness that rehearsed the script (admission entries with `rehearsed`)."""
    if mode_record.get("prepare") == "oracle":
        return True
    runs = [r for r in mode_record.get("runs") or [] if isinstance(r, dict)]
    return any(r.get("prepare") == "oracle" or any(isinstance(a, dict) and a.get("rehearsed")
                                                   for a in r.get("admission") or []) for r in runs)


def mode_figures(mode_record: dict, seconds, ar, period_s: float = 1.0) -> dict:
    """One duplex mode's figures: the one-session run's mean and p99 SPEAK time as a percentage over (+) or
    under (-) the 1 s cadence and its miss rate, the largest count with zero misses (derived from the runs;
    runs not run to the end of their time left out), the first larger count that missed or was refused, and
    "graphs": at the largest count that ran, the most graph MiB one session held, the captures (inside timed
    units too) and eager steps during the cadence and the SPEAK units with audio per second (`speak_per_s`,
    suite.records.speak_per_second; None for records without them)."""
    runs = [r for r in mode_record.get("runs") or [] if isinstance(r, dict) and type(r.get("sessions")) is int]
    solo = next((r for r in runs if r["sessions"] == 1 and not r.get("refused")), None)
    met = (solo or {}).get("metrics") or {}
    best = max_zero_miss([r for r in runs if r.get("refused")
                          or isinstance((r.get("metrics") or {}).get("misses"), int)])
    missed = sorted((r for r in runs if r["sessions"] > (best or 0)
                     and (r.get("refused") or (r.get("metrics") or {}).get("misses"))), key=lambda r: r["sessions"])

    def pct(f):
        return None if f is None else 100.0 * (f - 1.0)
    first = None
    if missed:
        m = missed[0].get("metrics") or {}
        first = {"sessions": missed[0]["sessions"], "refused": bool(missed[0].get("refused")),
                 "misses": m.get("misses"), "units": m.get("units_run")}
    ran = [r for r in runs if not r.get("refused") and isinstance(r.get("metrics"), dict)]
    top = max(ran, key=lambda r: r["sessions"], default=None)
    graphs = None if top is None or "graph_bytes_per_session_max" not in top else {
        "sessions": top["sessions"], "graph_mib_per_session_max": top["graph_bytes_per_session_max"] / 2 ** 20,
        "captures": top.get("captures_during_cadence"), "captures_inside_timed_units":
            top.get("captures_inside_timed_units"), "eager_steps": top.get("eager_fallbacks_during_cadence"),
        "speak_per_s": speak_per_second(top.get("units") or [], period_s)}
    return {"speak_vs_period_pct_mean": pct(met.get("speak_frac_mean")),
            "speak_vs_period_pct_p99": pct(met.get("speak_frac_p99")), "miss_rate": met.get("miss_rate"),
            "max_sessions_zero_miss": best, "first_missed": first, "seconds": seconds, "ar": ar,
            "oracle": is_oracle(mode_record), "prepare": mode_record.get("prepare"), "graphs": graphs}


def duplex_figures(entries: dict, workload: str | None = None, harnesses=("duplex_stock", "duplex_cadence")) -> dict | None:
    """A workload's duplex figures from the records of these duplex stages (`load`: done, or a failed stage's
    checkpoint), joined by `combine`, or a legacy both-mode `duplex` stage's record when none is there. None
    without a record. Returns {"modes": {mode: `mode_figures` + "gpu" + "unseen" (every session on a script of
    its own: parameters.traffic is suite.records.UNSEEN_TRAFFIC)}, "files", "cadence_equals_stock"
    (None unless both modes), "error", "marks": mode -> what a reader must know of its record (`duplex_mark`)}."""
    parts, marks = [], {}
    for h in harnesses:
        if (e := entries.get(h)) and e.get("duplex"):
            parts.append(e["duplex"])
            mode = "cadence" if h == "duplex_oracle" else h.split("_", 1)[1]
            if (mark := duplex_mark(e, mode, workload)) is not None:
                marks[mode] = mark
    if not parts and (entries.get("duplex") or {}).get("duplex"):
        parts = [entries["duplex"]["duplex"]]
    if not parts:
        return None
    files = [p["file"] for p in parts]
    try:
        record = combine([p["record"] for p in parts]) if len(parts) > 1 else parts[0]["record"]
    except (ValueError, KeyError) as exc:
        return {"modes": {}, "files": files, "cadence_equals_stock": None,
                "error": f"the duplex records cannot be joined: {exc}", "marks": marks}
    w = record["workloads"].get(workload) or next(iter(record["workloads"].values()))
    gpus, traffic = {}, {}
    for p in parts:
        pw = p["record"]["workloads"]
        for m in (pw.get(workload) or next(iter(pw.values()))).get("modes", {}):
            gpus[m] = gpu_name(p["record"])
            traffic[m] = (p["record"].get("parameters") or {}).get("traffic")
    seconds = record.get("parameters", {}).get("seconds")
    period_s = record.get("parameters", {}).get("period_s") or 1.0
    modes = {mode: {**mode_figures(m, seconds, w.get("ar"), period_s), "gpu": gpus.get(mode),
                    "unseen": traffic.get(mode) == UNSEEN_TRAFFIC}
             for mode, m in w.get("modes", {}).items()}
    return {"modes": modes, "files": files, "cadence_equals_stock": w.get("cadence_equals_stock"), "error": None,
            "marks": marks}


def duplex_mark(entry: dict, mode: str, workload: str | None) -> str | None:
    """What a per-mode duplex stage's record is when it is not a done stage's VALID one: "PARTIAL, N=1,24
    measured (failed: <reason>)" for a crashed or timed-out stage's checkpoint, "INVALID (<codes>)" for a
    done stage's; None for a done stage's VALID record."""
    st, rec = entry["state"], entry["duplex"]["record"]
    verdict = rec.get("verdict")
    if st.get("status") == "done":
        if verdict == "VALID":
            return None
        return f"{verdict} ({', '.join(dict.fromkeys(invalid_codes(record_reasons(rec))))})"
    w = rec["workloads"].get(workload) or next(iter(rec["workloads"].values()), {})
    counts = [str(r.get("sessions")) for r in w.get("modes", {}).get(mode, {}).get("runs", []) if not r.get("refused")]
    label = "PARTIAL" if verdict == "PARTIAL" else f"verdict {verdict}"
    return f"{label}, N={','.join(counts) or 'none'} measured ({st['status']}: {st.get('reason') or 'no reason'})"


def session_limit(fig: dict | None) -> tuple[int | None, int | None]:
    """(lo, hi): the bracket a mode's duplex runs put on its session limit. lo: the largest count with zero
    misses; hi: one less than the first larger count that missed, None where none did. lo == hi: exact."""
    fig = fig or {}
    lo, first = fig.get("max_sessions_zero_miss"), fig.get("first_missed")
    if lo is None and first and first["sessions"] == 1:
        lo = 0                                          # one session alone already missed
    return lo, (first["sessions"] - 1 if first else None)


# --- references ------------------------------------------------------------------------------------------
def load_reference(path: str | Path) -> dict[str, dict]:
    """Workload name -> verify-style run record, from a staged run folder (its `<w>.verify` stages) or a
    single-run folder (run.json). Raises FileNotFoundError, ValueError (a record of the wrong shape)."""
    path = Path(path)
    if (path / "stages.json").is_file():
        data = load(path)
        unread = [f"{w}.verify" for w, h in data["workloads"].items()
                  if h.get("verify", {}).get("state", {}).get("status") == "done" and not h["verify"].get("record")]
        if unread:
            raise ValueError(f"reference run {path}: stage {unread[0]} is done but its run.json is missing or "
                             f"not JSON")
        return {w: h["verify"]["record"] for w, h in data["workloads"].items() if h.get("verify", {}).get("record")}
    rec = read_json(path / "run.json")
    if rec is None:
        what = "not JSON" if (path / "run.json").is_file() else "neither stages.json nor run.json there"
        raise FileNotFoundError(f"reference run {path}: {what}")
    name = (rec.get("workload") or {}).get("name")
    if not isinstance(name, str) or not isinstance(rec.get("modes"), dict):
        raise ValueError(f"reference run {path}/run.json: expected a run record (workload.name, modes), got "
                         f"{json.dumps(rec)[:80]}")
    return {name: rec}


def resolve_reference(ref: str | Path, run_dir: Path) -> Path:
    """A recorded reference folder as a path that exists: as given (relative to the working directory), else
    the folder of that name beside run_dir; as given when neither is there (load_reference names it)."""
    path = Path(ref)
    if path.exists():
        return path
    near = Path(run_dir).parent / path.name
    return near if path.name and near.exists() else path


# --- verify and memory -----------------------------------------------------------------------------------
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


def finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def timing_rounds(record: dict | None) -> list[dict]:
    """The verify record's timing rounds that have a speedup ([] for an older record or one round)."""
    rounds = ((record or {}).get("comparison") or {}).get("rounds") or []
    return [r for r in rounds if isinstance(r, dict) and finite(r.get("speedup_x")) and r["speedup_x"] > 0]


def profiled_before_rounds(record: dict | None) -> bool:
    """A verify record whose round 1 ended in profiled units (no profile pass), so rounds 2+ ran with CUPTI
    attached (slower eager launches, stock slowed most)."""
    comp = (record or {}).get("comparison") or {}
    if comp.get("profile_pass") is not None or len(comp.get("rounds") or []) < 2:
        return False
    return any(u.get("kernels") for m in (record.get("modes") or {}).values() for u in m.get("units", []))


def paired_summary(record: dict) -> Summary:
    """A paired verify record's Summary (`paired.speedup`). A record made before the fit at the reference host
    speed has no `host_speed`: it is fitted here from the record's A/B pairs (`paired.pairs`), with the
    summary's seed and resamples, as `summarise` fits it now. Raises ValueError for a pairs table not shaped as
    pack_pairs writes it."""
    paired = record["paired"]
    summary = Summary.from_dict(paired["speedup"])
    if summary.host_speed is None and paired.get("pairs"):
        procs: dict = {}
        for row in unpack_pairs(paired["pairs"]):
            if row.get("run", "ab") == "ab":
                procs.setdefault(row.get("process"), []).append(Pair.from_dict(row))
        if procs:
            summary.host_speed = fit_host_speed(list(procs.values()), seed=summary.seed, n_boot=summary.n_boot,
                                                min_processes=MIN_PROCESSES, confidence=CONFIDENCE).to_dict()
    return summary


def speedup(record: dict | None) -> dict | None:
    """A verify record's speedup, None without both modes measured:
    {x, lo, hi, protocol, band, stock_ms, cadence_ms, units, floor, clears_floor, states, processes}.
    protocol "paired" (suite.records.paired: x the median paired ratio, [lo, hi] its 95% interval, floor
    the A/A run's (x, lo, hi) or None, states {name: (x, lo, hi, pairs)}, host_speed the fit at the reference
    host speed (suite.records.host_speed, as a dict; `paired_summary`) or None); "rounds" (older records: the
    median of the timing rounds, [lo, hi] their min-max; no floor); "units" (one round: [stock p10 / cadence
    p90, stock p90 / cadence p10]). stock_ms, cadence_ms: the p50 tail times (pooled, or round 1's)."""
    if verify_protocol(record) == "paired":
        paired = record.get("paired") or {}
        sp, fl = paired.get("speedup") or {}, paired.get("floor") or {}
        if sp.get("speedup") is None:
            return None
        ms = {m: (record["modes"].get(m) or {}).get("metrics") or {} for m in ("stock", "cadence")}
        return {"x": sp["speedup"], "lo": sp["ci_low"], "hi": sp["ci_high"], "protocol": "paired",
                "band": f"95% interval, {sp['processes']} processes x {sp['pairs']} pairs",
                "stock_ms": sp.get("a_ms_median"), "cadence_ms": sp.get("b_ms_median"), "units": sp["pairs"],
                "processes": sp["processes"], "flags": list(sp.get("flags") or []),
                "floor": (fl["speedup"], fl["ci_low"], fl["ci_high"]) if fl.get("speedup") is not None else None,
                "clears_floor": paired.get("clears_floor"),
                "states": {k: (v["speedup"], v["ci_low"], v["ci_high"], v["pairs"])
                           for k, v in (sp.get("states") or {}).items() if v.get("speedup") is not None},
                "host_speed": paired_summary(record).host_speed,
                "kernel_launches": tuple(ms[m].get("kernel_launches_per_unit_p50") for m in ("stock", "cadence"))}
    s, c = spread(measured_tails(record, "stock")), spread(measured_tails(record, "cadence"))
    if s is None or c is None:
        return None
    out = {"x": s[1] / c[1], "lo": s[0] / c[2], "hi": s[2] / c[0], "protocol": "units", "band": "unit band",
           "stock_ms": s[1], "cadence_ms": c[1], "units": int(measured_tails(record, "cadence").size),
           "processes": 1, "flags": [], "floor": None, "clears_floor": None, "states": {}, "host_speed": None,
           "kernel_launches": tuple(record["modes"][m]["metrics"].get("kernel_launches_per_unit_p50")
                                    for m in ("stock", "cadence"))}
    rounds = timing_rounds(record)
    if len(rounds) >= 2:
        xs = [float(r["speedup_x"]) for r in rounds]
        out.update(x=float(np.median(xs)), lo=min(xs), hi=max(xs), protocol="rounds",
                   band=f"min-max of {len(xs)} rounds in one process")
        if profiled_before_rounds(record):
            out["band"] += "; rounds 2+ timed after the profiler"
    return out


def mib(nbytes) -> float | None:
    return None if nbytes is None else nbytes / 2**20


def memory_figures(entries: dict) -> dict:
    """Per mode {peak, session, how, alloc, arena, pool}, both modes from one source: the one-process-per-mode
    memory stages where both are done, else the verify record (one process for both modes, not the same
    measure). One memory stage alone is not paired with the other mode's verify figure."""
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
        level = "driver" if "driver" in key else "RSS" if "rss" in key else "no peak recorded"
        src = mem.get("driver_source")
        pool = stats.get("graph_bytes", stats.get("graph_pool_bytes"))
        out[mode] = {"peak": peak, "session": mem.get("session_driver_mib", mem.get("session_rss_mib")),
                     "how": f"{how}; {level}" + (f" ({src})" if src else ""),
                     "alloc": mem.get("peak_over_idle_alloc_mib"), "arena": mib(stats.get("arena_bytes_mapped")),
                     "pool": mib(pool)}
    return out
