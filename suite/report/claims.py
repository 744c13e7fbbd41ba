"""The claims of a staged run, one row per claim and workload (`claim_rows`): speed, the kernel floor, peak
memory, memory per session, SPEAK time against the cadence, sessions per GPU, bytes. Each row has the
published figure (only for the configuration it was measured on: suite.records.published_for), ours with
its interval, stock's figure, the target and a verdict (VERDICTS). Rows are plain data: REPORT.md's verdict
table and claims.json are both made from them. Figures from different GPU types are never paired."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from suite.records import PUBLISHED, published_for, registered, registry_workload
from suite.report.figures import PER_MODE, duplex_figures, memory_figures, session_limit, speedup, status
from suite.report.text import DASH, interval, pct_change

#: The verdict words, as REPORT.md's opening lines define them.
VERDICTS = {
    "met": "measured in this run, and the figure with its whole interval (or bracket) on the target's side",
    "not met": "measured, and the figure with its whole interval on the other side",
    "open": "not settled: not measured in this run, measured only with an oracle (graphs captured from the "
            "sessions' own script) or on one shared script where the target is for unseen scripts, tail only "
            "where the target is for the whole SPEAK unit, or an interval or bracket that straddles the target",
}
#: Speed targets beyond the published bar (a lower bound on the paired median's interval); every other
#: workload's target is a speedup clear of its A/A noise floor.
SPEED_TARGET_X = {"stepaudio2_mini": 3.0}
#: Sessions per GPU on unseen scripts (60 s per count, zero missed units), and the ratio to stock's count.
SESSIONS_TARGET = {"minicpmo45": 24, "minicpmo45_5step": 32, "stepaudio2_mini": 8, "moshi": 32, "qwen3_omni": 32}
SESSIONS_RATIO_TARGET = {"minicpmo45": 12.0}
KERNEL_FLOOR_X = 1.05      # DuplexCadence tail p50 within this factor of its GPU kernel-busy time


@dataclass
class Claim:
    """One row: numbers where there are numbers (None: not measured), the cells as text, and a note saying
    what a reader must know (protocol, oracle, why open)."""
    claim: str
    workload: str
    published: float | None
    ours: float | None
    ci_low: float | None
    ci_high: float | None
    stock: float | None
    target: str
    verdict: str
    unit: str
    published_text: str = DASH
    ours_text: str = DASH
    stock_text: str = DASH
    note: str = ""
    oracle: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def above(x, lo, hi, bound) -> str:
    """The verdict of a figure (with its interval, where it has one) against a lower bound."""
    lo, hi = (x, x) if lo is None or hi is None else (lo, hi)
    return "met" if lo >= bound else "not met" if hi < bound else "open"


def below(x, lo, hi, bound, strict: bool = False) -> str:
    """The verdict against an upper bound (strict: the figure must be under it, not at it)."""
    lo, hi = (x, x) if lo is None or hi is None else (lo, hi)
    ok = hi < bound if strict else hi <= bound
    bad = lo >= bound if strict else lo > bound
    return "met" if ok else "not met" if bad else "open"


def workload_of(name: str, entries: dict) -> tuple[dict | None, int | None]:
    """(the workload as a dict, its Euler steps) from its records, else the registry."""
    for e in entries.values():
        rec = e.get("record")
        if rec and rec.get("workload"):
            return rec["workload"], (rec.get("parameters") or {}).get("euler_steps")
    w = registry_workload(name)
    return w, (w or {}).get("euler_steps")


def is_published(name: str, entries: dict) -> bool:
    return published_for(*workload_of(name, entries))


# --- the claims --------------------------------------------------------------------------------------------
def speed(name: str, e: dict) -> Claim:
    rec = (e.get("verify") or {}).get("record")
    sp = speedup(rec)
    pub = is_published(name, e)
    bound = PUBLISHED["speedup_x"] if pub else SPEED_TARGET_X.get(name)
    target = (f">= {bound:g}x" + (" (published)" if pub else "")) if bound else "faster than stock, clear of the A/A floor"
    row = Claim("speed", name, PUBLISHED["speedup_x"] if pub else None, None, None, None, None, target, "open", "x",
                published_text=f"{PUBLISHED['speedup_x']:.2f}x" if pub else DASH)
    if sp is None:
        row.note = f"not measured: {status(e, 'verify')}"
        return row
    row.ours, row.ci_low, row.ci_high, row.stock = sp["x"], sp["lo"], sp["hi"], sp["stock_ms"]
    row.ours_text = interval(sp["x"], sp["lo"], sp["hi"])
    row.stock_text = f"{sp['stock_ms']:.1f} ms" if sp["stock_ms"] is not None else DASH
    older = sp["protocol"] != "paired"
    if older:
        row.ours_text += " (older protocol)"
        row.note = f"older protocol: {sp['band']}, no paired interval and no A/A floor"
    if bound is not None:
        row.verdict = above(sp["x"], sp["lo"], sp["hi"], bound)
    elif sp["floor"] is None:
        row.note = row.note or "no A/A floor in this record"
    else:
        _, flo, fhi = sp["floor"]
        row.verdict = "met" if sp["lo"] > fhi else "not met" if sp["hi"] < flo else "open"
        row.note = f"A/A floor {interval(*sp['floor'])}"
    if sp["flags"]:                    # short of the protocol (processes, bytes): no verdict either way
        row.verdict = "open"
        row.note = "; ".join([row.note, *sp["flags"]]).strip("; ")
    return row


def kernel_floor(name: str, e: dict) -> Claim:
    rec = (e.get("verify") or {}).get("record")
    m = (((rec or {}).get("modes") or {}).get("cadence") or {}).get("metrics") or {}
    x = m.get("tail_over_kernel_busy_x")
    row = Claim("tail / kernel-busy", name, None, x, None, None, None, f"<= {KERNEL_FLOOR_X:g}", "open", "ratio")
    if x is None:
        row.note = "not profiled in this run" if rec else f"not measured: {status(e, 'verify')}"
        return row
    row.ours_text = f"{x:.2f} ({m['tail_ms_p50']:.1f} / {m['kernel_busy_ms_per_unit_p50']:.1f} ms)"
    row.verdict = below(x, None, None, KERNEL_FLOOR_X)
    return row


def memory(name: str, e: dict) -> Claim:
    pub = is_published(name, e)
    bound = PUBLISHED["peak_memory_change_pct"] if pub else 0.0
    row = Claim("peak memory", name, bound if pub else None, None, None, None, None,
                f"<= {bound:+.1f}% (published)" if pub else "below stock", "open", "%",
                published_text=f"{bound:+.1f}%" if pub else DASH)
    m = memory_figures(e)
    s, c = m.get("stock", {}), m.get("cadence", {})
    change = pct_change(c.get("peak"), s.get("peak"))
    if change is None:
        row.note = f"not measured: {status(e, 'memory_cadence')}"
        return row
    row.ours, row.stock = change, s["peak"]
    row.ours_text, row.stock_text = f"{change:+.1f}% ({c['peak']:.0f} MiB)", f"{s['peak']:.0f} MiB"
    if not all(x["how"].startswith(PER_MODE) for x in m.values()):
        row.note = "one process for both modes (verify), not one process per mode"
        return row
    row.verdict = below(change, None, None, bound, strict=not pub)
    return row


def per_session(name: str, e: dict) -> Claim:
    row = Claim("memory per session", name, None, None, None, None, None, "below stock", "open", "of stock")
    m = memory_figures(e)
    s, c = m.get("stock", {}).get("session"), m.get("cadence", {}).get("session")
    if not s or c is None or not all(x["how"].startswith(PER_MODE) for x in m.values()):
        row.note = f"not measured in a process per mode: {status(e, 'memory_cadence')}"
        return row
    row.ours, row.stock = c / s, s
    row.ours_text, row.stock_text = f"{c / s:.2f} of stock ({c:.0f} MiB)", f"{s:.0f} MiB"
    row.verdict = below(c / s, None, None, 1.0, strict=True)
    return row


def speak_time(name: str, e: dict) -> Claim:
    """MiniCPM-o's published SPEAK time per 1 s unit: stock 14% over the cadence, DuplexCadence 2% under."""
    pub = (f"{PUBLISHED['speak_vs_period_pct_stock']:+.0f}% -> {PUBLISHED['speak_vs_period_pct_cadence']:+.0f}%")
    row = Claim("mean SPEAK vs 1 s", name, PUBLISHED["speak_vs_period_pct_cadence"], None, None, None, None,
                "under 1 s, whole SPEAK unit", "open", "%", published_text=pub)
    d = duplex_figures(e, name)
    s, c = ((d or {}).get("modes") or {}).get("stock") or {}, ((d or {}).get("modes") or {}).get("cadence") or {}
    if c.get("speak_vs_period_pct_mean") is None:
        row.note = f"not measured: {status(e, 'duplex_cadence')}"
        return row
    row.ours, row.stock = c["speak_vs_period_pct_mean"], s.get("speak_vs_period_pct_mean")
    row.ours_text = f"{row.ours:+.1f}%"
    row.stock_text = DASH if row.stock is None else f"{row.stock:+.1f}%"
    ar = c.get("ar")
    if (ar.get("kind") if isinstance(ar, dict) else ar or "none") == "none":
        row.ours_text += " (tail only)"
        row.note = "tail only (no AR stage): the whole SPEAK unit was not measured"
        return row
    row.verdict = below(row.ours, None, None, 0.0, strict=True)
    return row


def limit_text(fig: dict | None) -> str:
    """'2 (3 missed 12/180)', '1-25 (26 missed 46/1066)', '>= 32' (no count tried missed), '<= 4 (5 missed
    10/174)' (no count tried was clean)."""
    lo, hi = session_limit(fig)
    first = (fig or {}).get("first_missed")
    if lo is None and not first:
        return DASH
    if not first:
        return f">= {lo}"
    miss = (f"{first['sessions']} refused" if first.get("refused") else
            f"{first['sessions']} missed {first['misses']}/{first['units'] if first['units'] is not None else '?'}")
    bound = f"<= {hi}" if lo is None else f"{lo}" if hi == lo else f"{lo}-{hi}"
    return f"{bound} ({miss})"


def ratio_bounds(stock: dict | None, cadence: dict | None) -> tuple[float | None, float | None]:
    """(low, high) of cadence / stock session limits from the two brackets (None where unbounded); (None,
    None) for two modes measured on different GPU types or without limits."""
    if stock and cadence and stock.get("gpu") and cadence.get("gpu") and stock["gpu"] != cadence["gpu"]:
        return None, None
    (s_lo, s_hi), (c_lo, c_hi) = session_limit(stock), session_limit(cadence)
    if not s_lo or (c_lo is None and c_hi is None):
        return None, None
    low = math.floor(10 * c_lo / s_hi + 1e-9) / 10 if s_hi and c_lo is not None else None
    high = math.ceil(10 * c_hi / s_lo - 1e-9) / 10 if c_hi is not None else None
    return low, high


def ratio_text(low, high) -> str:
    """'4.5-11.8x', '>= 10.6x', '<= 3.0x', or a dash."""
    if low is None and high is None:
        return DASH
    if low == high:
        return f"{low:g}x"
    return f">= {low:g}x" if high is None else f"<= {high:g}x" if low is None else f"{low:g}-{high:g}x"


def sessions(name: str, e: dict) -> Claim:
    need, ratio = SESSIONS_TARGET.get(name), SESSIONS_RATIO_TARGET.get(name)
    target = DASH if need is None else f">= {need}" + (f" and >= {ratio:g}x stock" if ratio else "") + ", unseen scripts"
    row = Claim("sessions per GPU", name, None, None, None, None, None, target, "open", "sessions")
    d = duplex_figures(e, name)
    modes = (d or {}).get("modes") or {}
    fs, fc = modes.get("stock"), modes.get("cadence")
    if fs:
        row.stock, row.stock_text = session_limit(fs)[0], limit_text(fs)
    if not fc:
        row.note = f"not measured: {status(e, 'duplex_cadence')}"
        return row
    lo, hi = session_limit(fc)
    beside = ((duplex_figures(e, name, ("duplex_oracle",)) or {}).get("modes") or {}).get("cadence")
    if beside:
        row.oracle = f"{limit_text(beside)} (oracle graphs)"
    if fc.get("oracle") or not fc.get("unseen"):
        why = "oracle: graphs from the sessions' own script" if fc.get("oracle") else "every session on one shared script"
        row.oracle = f"{limit_text(fc)} ({why})" + (f"; {row.oracle}" if row.oracle else "")
        row.note = f"measured only as {row.oracle}; the target is for unseen scripts"
        return row
    row.ours, row.ci_low, row.ci_high, row.ours_text = lo, lo, hi, limit_text(fc)
    if need is None:
        return row
    verdicts = ["not met" if hi is not None and hi < need else "open"] if lo is None else [  # lo None: <= hi
        above(lo, lo, math.inf if hi is None else hi, need)]
    if ratio:
        r_lo, r_hi = ratio_bounds(fs, fc)
        verdicts.append(("not met" if r_hi is not None and r_hi < ratio else "open") if r_lo is None else
                        above(r_lo, r_lo, math.inf if r_hi is None else r_hi, ratio))
        row.note = f"cadence / stock {ratio_text(r_lo, r_hi)}"
    row.verdict = "not met" if "not met" in verdicts else "met" if all(v == "met" for v in verdicts) else "open"
    return row


def bytes_equal(name: str, e: dict) -> Claim:
    row = Claim("bytes equal", name, None, None, None, None, None, "every unit", "open", "units")
    comp = ((e.get("verify") or {}).get("record") or {}).get("comparison")
    duplex = [h for h in ("duplex_stock", "duplex_cadence", "duplex_oracle") if (e.get(h) or {}).get("duplex")]
    bad_duplex = [h for h in duplex if "mismatch" in ((e[h].get("state") or {}).get("invalid_codes") or [])]
    # a stage that did not finish (PARTIAL) may hold a count whose sessions alone never ran: no equality claimed
    unfinished = [h for h in duplex if (e[h].get("state") or {}).get("status") != "done" and h not in bad_duplex]
    if not comp and not duplex:
        row.note = f"not compared ({status(e, 'verify')})"
        return row
    parts, bad = [], bool(bad_duplex)
    if comp:
        n = comp["units_compared"]
        k = len(comp.get("mismatches") or comp["mismatched_units"])
        bad = bad or k > 0
        parts.append(f"{n - k}/{n} units stock vs cadence")
        row.ours, row.stock = float(n - k), float(n)
    if duplex:
        said = ("sessions DIFFER from themselves alone in " + ", ".join(bad_duplex) if bad_duplex else
                "every session equal to itself alone" if len(duplex) > len(unfinished) else "")
        if unfinished:
            note = f"not all compared in {', '.join(unfinished)}: unfinished"
            said = f"{said} ({note})" if said else note
        parts.append("duplex: " + said)
    compared = bool(comp) or len(duplex) > len(unfinished)
    row.ours_text, row.verdict = "; ".join(parts), "not met" if bad else "met" if compared else "open"
    return row


CLAIMS = (speed, kernel_floor, memory, per_session, speak_time, sessions, bytes_equal)


def ordered(data: dict) -> list[tuple[str, dict]]:
    """The run's workloads in the registry's order, then any others as the run lists them."""
    order = {n: i for i, n in enumerate(registered())}
    return sorted(data["workloads"].items(), key=lambda kv: order.get(kv[0], len(order)))


def claim_rows(data: dict) -> list[Claim]:
    """Every claim of every workload of a loaded run (figures.load), claim-major, workloads in the registry's
    order; the SPEAK-time claim only for the published configuration (its only figure)."""
    out = []
    for fn in CLAIMS:
        for name, e in ordered(data):
            if fn is speak_time and not is_published(name, e):
                continue
            out.append(fn(name, e))
    return out
