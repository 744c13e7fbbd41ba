"""The claim tables of a staged run's REPORT.md: speedup, host state, peak memory, per-session increment,
SPEAK time against the cadence, sessions per GPU, bitwise equality. Each beside the published figure
(suite.records.PUBLISHED, only for the architecture it was measured on) and the stock baseline of the run.
Figures from different GPUs are never paired: a ratio of two stages needs both on one GPU type."""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import spearmanr

from suite.records import PUBLISHED, PUBLISHED_ARCHITECTURE, architecture
from suite.report.figures import (PER_MODE, duplex_figures, memory_figures, session_limit, speedup, status,
                                  timed_note)
from suite.report.text import DASH, fmt, pct_change, table

DUPLEX_MODE_STAGES = {"stock": "duplex_stock", "cadence": "duplex_cadence"}


def any_record(entries: dict) -> dict | None:
    return next((e["record"] for e in entries.values() if e.get("record")), None)


def paper(workload: str, entries: dict, text: str) -> str:
    """`text` (the published figure) for the architecture it was measured on, else a dash saying why. The
    architecture comes from the workload's records, else from the registry."""
    arch = (any_record(entries) or {}).get("workload", {}).get("architecture") or architecture(workload)
    return text if arch == PUBLISHED_ARCHITECTURE else f"{DASH} (published for MiniCPM-o only)"


def is_published_model(entries: dict, steps: int | None = None) -> bool:
    """The workload's records are of the published architecture (and run `steps` Euler steps, if given)."""
    rec = any_record(entries) or {}
    return (rec.get("workload", {}).get("architecture") == PUBLISHED_ARCHITECTURE
            and (steps is None or rec.get("parameters", {}).get("euler_steps") == steps))


def speedup_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        rec = e.get("verify", {}).get("record")
        sp = speedup(rec)
        steps = (rec or {}).get("parameters", {}).get("euler_steps")
        pub = paper(w, e, f"{PUBLISHED['speedup_x']:.2f}x")
        if sp is None:
            rows.append([w, fmt(steps), pub, DASH, DASH, f"not measured ({status(e, 'verify')})", DASH, DASH, DASH,
                         DASH, DASH, DASH])
            continue
        timed = e["verify"].get("timed")
        s, c = sp["stock"], sp["cadence"]
        ms, mc = (rec["modes"][m]["metrics"] for m in ("stock", "cadence"))
        rows.append([w, fmt(steps), pub, f"{s[1]:.1f} [{s[0]:.1f}-{s[2]:.1f}]", f"{c[1]:.1f} [{c[0]:.1f}-{c[2]:.1f}]",
                     f"{sp['x']:.2f}x [{sp['lo']:.2f}-{sp['hi']:.2f}] ({sp['band']})", str(sp["units"]),
                     f"{fmt(ms.get('kernel_launches_per_unit_p50'), '.0f')} -> "
                     f"{fmt(mc.get('kernel_launches_per_unit_p50'), '.0f')}",
                     fmt(mc.get("tail_over_kernel_busy_x"), ".2f"),
                     DASH if sp["host"] is None else f"{sp['host'][0]:.1f}-{sp['host'][1]:.1f}",
                     unit_host_cell(ms, mc), DASH if timed is None else timed or "alone"])
    return table(rows, ["workload", "Euler steps", "paper", "stock tail ms p50 [p10-p90]",
                        "cadence tail ms p50 [p10-p90]", "ours: speedup [band]", "units measured",
                        "kernel launches / unit, stock -> cadence", "cadence tail / kernel-busy",
                        "host us / eager op", "per unit p50, stock / cadence (round 1)",
                        "timed (stages running at the same time)"])


def unit_host_cell(ms: dict, mc: dict) -> str:
    """"A / B us launch, C / D MHz SM" from two modes' metrics (the per-unit host samples' p50s); a dash for
    records made before the samples existed."""
    parts = [f"{fmt(ms.get(key), spec)} / {fmt(mc.get(key), spec)} {label}"
             for key, spec, label in (("host_op_us_p50", ".1f", "us launch"), ("sm_mhz_p50", ".0f", "MHz SM"))
             if ms.get(key) is not None or mc.get(key) is not None]
    return ", ".join(parts) if parts else DASH


def rank_corr(x, y) -> float | None:
    """Spearman rank correlation of two equal-length 1-d sequences over the pairs where both are finite;
    None for fewer than 3 such pairs or a constant sequence. Raises ValueError for other shapes."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.size != y.size:
        raise ValueError(f"x, y: expected two 1-d sequences of one length, got shapes {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def number(value) -> float | None:
    """A finite int or float of a record as float; None for anything else (null, NaN, a bool, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        return None
    return float(value)


#: Per-unit host samples (UnitRecord.host) the host-state table reads: key, label, format.
HOST_SAMPLES = (("op_us", "launch us", ".2f"), ("cpu_loop_us", "CPU loop us", ".0f"), ("sm_mhz", "SM MHz", ".0f"))


def host_state_rows(record: dict | None, mode: str) -> list | None:
    """One row of the host-state table: per sample kind, p50 [p10-p90] over the mode's measured SPEAK units of
    round 1 and its rank correlation with the unit's tail time; None when no measured unit carries samples."""
    units = []
    for u in ((record or {}).get("modes", {}).get(mode) or {}).get("units", []):
        if not (u.get("measured") and number(u.get("tail_ms")) is not None and u.get("host") is not None):
            continue
        if not isinstance(u["host"], dict):
            raise ValueError(f"{mode} unit {u.get('index')}: host: expected an object of per-unit samples "
                             f"({', '.join(k for k, _l, _s in HOST_SAMPLES)}) or null, got {type(u['host']).__name__}")
        units.append(u)
    if not units:
        return None
    row = [str(len(units))]
    for key, _label, spec in HOST_SAMPLES:
        pairs = [(number(u["host"].get(key)), number(u["tail_ms"])) for u in units]
        pairs = [p for p in pairs if p[0] is not None]
        if not pairs:
            row += [DASH, DASH]
            continue
        v = np.array([p[0] for p in pairs], dtype=np.float64)
        p10, p50, p90 = np.percentile(v, [10, 50, 90])
        row += [f"{p50:{spec}} [{p10:{spec}}-{p90:{spec}}]", fmt(rank_corr(v, [p[1] for p in pairs]), "+.2f")]
    return row


def host_state_table(data: dict) -> str | None:
    """Per workload and mode: the per-unit host samples of verify's round 1 and how each tracks the tail time
    (Spearman rho). None when no record carries samples."""
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
    return table(rows, heads)


def memory_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        m = memory_figures(e)
        s, c = m.get("stock", {}), m.get("cadence", {})
        change = pct_change(c.get("peak"), s.get("peak"))
        rows.append([w, paper(w, e, f"{PUBLISHED['peak_memory_change_pct']:+.1f}%"), fmt(s.get("peak")),
                     fmt(c.get("peak")), DASH if change is None else f"{change:+.1f}%",
                     f"{fmt(s.get('alloc'))} / {fmt(c.get('alloc'))}", f"{fmt(c.get('arena'))} / {fmt(c.get('pool'))}",
                     "; ".join(sorted({x["how"] for x in m.values()})) or f"not measured ({status(e, 'memory_stock')})"])
    return table(rows, ["workload", "paper", "stock peak over idle MiB", "cadence peak over idle MiB", "ours: change",
                        "torch allocator over idle MiB, stock / cadence", "cadence arena / graph pool MiB",
                        "measured as"])


def session_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        m = memory_figures(e)
        s, c = m.get("stock", {}).get("session"), m.get("cadence", {}).get("session")
        ratio = c / s if s and c is not None else None
        target = is_published_model(e)
        judged = all(x["how"].startswith(PER_MODE) for x in m.values())
        verdict = ("" if ratio is None or not target else
                   f" ({'met' if ratio <= 0.5 else 'missed'})" if judged else " (not judged: needs both memory stages)")
        rows.append([w, DASH, "cadence <= 1/2 stock" if target else DASH, fmt(s), fmt(c),
                     DASH if ratio is None else f"{ratio:.2f} of stock{verdict}",
                     "; ".join(sorted({x["how"] for x in m.values()})) or "not measured"])
    return table(rows, ["workload", "paper", "target (MiniCPM-o)", "stock MiB", "cadence MiB", "ours",
                        "measured as (peak with one session - model loaded, no session)"])


def duplex_status(e: dict) -> str:
    """The duplex stages' statuses, one clause ("duplex: <status>" when both say the same)."""
    st = {h: status(e, h) for h in DUPLEX_MODE_STAGES.values()}
    if len(set(st.values())) == 1:
        return f"duplex: {next(iter(st.values()))}"
    return "; ".join(f"{h}: {v}" for h, v in st.items())


def duplex_source(e: dict, d: dict) -> str:
    """The duplex figures' files, the status of each mode they lack, and stock == cadence when both are in."""
    text = f"duplex ({', '.join(d['files'])})"
    text += "".join(f"; {mode}: {mark}" for mode, mark in d.get("marks", {}).items())
    text += "".join(f"; {mode}: {status(e, h)}" for mode, h in DUPLEX_MODE_STAGES.items() if mode not in d["modes"])
    if d["cadence_equals_stock"] is not None:
        text += f"; one session alone, cadence == stock: {'yes' if d['cadence_equals_stock'] else 'NO'}"
    text += timed_note(e, DUPLEX_MODE_STAGES.values()) if d["modes"] else ""
    return text + (f"; {d['error']}" if d["error"] else "")


def pct_text(value) -> str:
    return DASH if value is None else f"{value:+.1f}%"


ORACLE = " (oracle: graphs from the sessions' own script)"


def speak_table(data: dict) -> str:
    pub = f"{PUBLISHED['speak_vs_period_pct_stock']:+.0f}% -> {PUBLISHED['speak_vs_period_pct_cadence']:+.0f}%"
    rows = []
    for w, e in data["workloads"].items():
        d = duplex_figures(e, w)
        if d and d["modes"]:
            s, c = d["modes"].get("stock", {}), d["modes"].get("cadence", {})
            rows.append([w, paper(w, e, pub), pct_text(s.get("speak_vs_period_pct_mean")),
                         pct_text(c.get("speak_vs_period_pct_mean")) + (ORACLE if c.get("oracle") else ""),
                         " / ".join(pct_text(m.get("speak_vs_period_pct_p99")) for m in (s, c)),
                         f"{fmt(s.get('miss_rate'), '.3f')} / {fmt(c.get('miss_rate'), '.3f')}", duplex_source(e, d)])
            continue
        ms = ((e.get("verify", {}).get("record")) or {}).get("modes", {})
        s = ms.get("stock", {}).get("metrics", {}).get("tail_vs_period_pct_p50")
        c = ms.get("cadence", {}).get("metrics", {}).get("tail_vs_period_pct_p50")
        rows.append([w, paper(w, e, pub), pct_text(s), pct_text(c), DASH, DASH,
                     f"tail only, p50, no AR stage (verify{timed_note(e, 'verify', ', ')}); "
                     f"{duplex_source(e, d) if d else duplex_status(e)}"])
    return table(rows, ["workload", "paper (mean SPEAK vs 1 s)", "ours stock", "ours cadence", "p99 stock / cadence",
                        "miss rate stock / cadence", "source"])


def limit_cell(fig: dict | None) -> str:
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
    """The cadence / stock session-limit ratio from the two brackets (`session_limit`): exact where both limits
    are, else its range ('0.5-12.5x'), a bound ('>= 4.0x'), or a dash where neither limit was found. Two modes
    measured on different GPU types are not paired."""
    if stock and cadence and stock.get("gpu") and cadence.get("gpu") and stock["gpu"] != cadence["gpu"]:
        return f"{DASH} (not paired: stock on {stock['gpu']}, cadence on {cadence['gpu']})"
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
        fs, fc = ((d or {}).get("modes", {}).get(m) for m in ("stock", "cadence"))
        cut = {m for m, mark in (d or {}).get("marks", {}).items() if mark.startswith("PARTIAL")}
        cells = [limit_cell(f) + (" (PARTIAL)" if m in cut and f else "") + (ORACLE if f and f.get("oracle") else "")
                 for m, f in (("stock", fs), ("cadence", fc))]
        ratio = session_ratio(fs, fc) + (" (oracle)" if fc and fc.get("oracle") else "")
        oracle = duplex_figures(e, w, ("duplex_oracle",))
        if oracle and oracle["modes"].get("cadence"):
            cells[1] += f"; with oracle graphs: {limit_cell(oracle['modes']['cadence'])}"
        target = ">= 24 and >= 4x stock (tail only)" if is_published_model(e, 10) else DASH
        rows.append([w, paper(w, e, "more per GPU (no figure)"), target, *cells, ratio,
                     duplex_source(e, d) if d else f"not measured ({duplex_status(e)})"])
    return table(rows, ["workload", "paper", "target (MiniCPM-o 10 steps)", "stock sessions, 0 misses in 60 s",
                        "cadence sessions", "ours: ratio", "source"])


def bitwise_table(data: dict) -> str:
    rows = []
    for w, e in data["workloads"].items():
        rec = e.get("verify", {}).get("record")
        comp = (rec or {}).get("comparison")
        if not comp:
            rows.append([w, "every unit", DASH, DASH, DASH, f"not compared ({status(e, 'verify')})"])
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
    return table(rows, ["workload", "paper", "units compared", "byte-identical (f32 and int16)", "differing units",
                        "again in later rounds / profile pass: identical", "stage verdict"])
