"""The report's plots (matplotlib, Agg), from records into the run folder; none where matplotlib is missing.
A staged run: `speed.png` (paired ratios per workload, the A/A floor, the targets and the published line),
`memory.png` (peaks with the change in percent), `sessions.png` (miss rate and p99 SPEAK time against
sessions, stock and DuplexCadence on one axis), `speak_limit.png` (SPEAK time distribution at the limit).
A duplex folder (`duplex_plots`): per workload `<workload>_speak.png` (every session's SPEAK times at each
mode's largest count with zero misses, missed units as x) and `<workload>_miss_rate.png`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from suite.records import PUBLISHED
from suite.report.claims import SPEED_TARGET_X, is_published, ordered
from suite.report.figures import combine, memory_figures, speedup

DPI = 80

COLORS = {"stock": "tab:red", "cadence": "tab:blue", "oracle": "tab:gray"}
STYLES = {"stock": dict(marker="s", linestyle="--", markersize=8), "cadence": dict(marker="o", linestyle="-"),
          "oracle": dict(marker="^", linestyle=":")}
LABELS = {"stock": "stock", "cadence": "DuplexCadence", "oracle": "DuplexCadence, oracle graphs"}


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plots(data: dict, run_dir: Path) -> dict[str, list[str]]:
    """Write the run's PNGs into run_dir; returns {section: [file names]} for "speed", "memory", "sessions"
    ({} without matplotlib, a section left out without its figures)."""
    plt = pyplot()
    if plt is None:
        return {}
    out: dict[str, list[str]] = {}
    for section, draw in (("speed", speed_plot), ("memory", memory_plot), ("sessions", sessions_plot),
                          ("sessions", speak_limit_plot)):
        name = draw(plt, data, run_dir)
        if name:
            out.setdefault(section, []).append(name)
    return out


def _save(plt, fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path.name


def speed_plot(plt, data: dict, run_dir: Path) -> str | None:
    """speed.png: per workload the median paired ratio with its 95% interval (hollow: an older record's
    rounds median and min-max), the A/A floor as a grey band, each host state's figure beside, and the target
    as a short line over its workload (dashed: the published figure)."""
    names = [w for w, e in ordered(data) if speedup((e.get("verify") or {}).get("record"))]
    if not names:
        return None
    fig, ax = plt.subplots(figsize=(1.3 * len(names) + 2.5, 3.4))
    for i, w in enumerate(names):
        e = data["workloads"][w]
        sp = speedup(e["verify"]["record"])
        paired = sp["protocol"] == "paired"
        ax.errorbar([i], [sp["x"]], yerr=[[sp["x"] - sp["lo"]], [sp["hi"] - sp["x"]]], fmt="o", color=COLORS["cadence"],
                    mfc=COLORS["cadence"] if paired else "white", capsize=4, label=None)
        if sp["floor"]:
            ax.fill_between([i - 0.3, i + 0.3], sp["floor"][1], sp["floor"][2], color="0.75")
        for k, (state, (x, lo, hi, _)) in enumerate(sorted(sp["states"].items())):
            ax.errorbar([i + 0.15 * (k + 1)], [x], yerr=[[x - lo], [hi - x]], fmt="^" if state == "fast" else "v",
                        color="0.35", markersize=4, capsize=2)
        bound = PUBLISHED["speedup_x"] if is_published(w, e) else SPEED_TARGET_X.get(w)
        if bound:
            ax.plot([i - 0.35, i + 0.35], [bound, bound], "k--" if is_published(w, e) else "k:", lw=1.2)
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("stock / DuplexCadence per unit")
    ax.set_ylim(bottom=0)
    ax.set_title("speedup: filled paired 95% interval, hollow older rounds; grey A/A floor; "
                 "dashed published, dotted target", fontsize=7)
    return _save(plt, fig, run_dir / "speed.png")


def memory_plot(plt, data: dict, run_dir: Path) -> str | None:
    """memory.png: peak over idle per workload, stock and DuplexCadence, the change in percent above."""
    mem = {w: memory_figures(e) for w, e in ordered(data)}
    mem = {w: m for w, m in mem.items() if m.get("stock", {}).get("peak") is not None
           and m.get("cadence", {}).get("peak") is not None}
    if not mem:
        return None
    fig, ax = plt.subplots(figsize=(1.3 * len(mem) + 2.5, 3.2))
    x = np.arange(len(mem))
    for k, mode in enumerate(("stock", "cadence")):
        ax.bar(x + (k - 0.5) * 0.38, [m[mode]["peak"] for m in mem.values()], 0.38, color=COLORS[mode],
               label=LABELS[mode])
    for i, m in enumerate(mem.values()):
        if m["stock"]["peak"]:
            change = 100.0 * (m["cadence"]["peak"] / m["stock"]["peak"] - 1.0)
            ax.annotate(f"{change:+.1f}%", (i + 0.19, m["cadence"]["peak"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, list(mem), fontsize=8)
    ax.set_ylabel("peak over idle MiB (driver)")
    ax.legend(fontsize=8)
    return _save(plt, fig, run_dir / "memory.png")


def _duplex_views(data: dict) -> dict:
    return {w: v for w, e in ordered(data) if (v := duplex_view(e)) is not None}


def _runs(mode: dict) -> list[dict]:
    return sorted((r for r in mode.get("runs") or [] if not r.get("refused") and r.get("metrics")),
                  key=lambda r: r["sessions"])


def sessions_plot(plt, data: dict, run_dir: Path) -> str | None:
    """sessions.png: per workload, the miss rate and the p99 SPEAK time against the session count, stock,
    DuplexCadence (and with oracle graphs) on one pair of axes."""
    views = _duplex_views(data)
    if not views:
        return None
    fig, axes = plt.subplots(len(views), 2, figsize=(8, 2.1 * len(views)), squeeze=False)
    for (w, rec), (a_miss, a_p99) in zip(views.items(), axes):
        for mode, m in rec["workloads"][next(iter(rec["workloads"]))]["modes"].items():
            runs = _runs(m)
            n = [r["sessions"] for r in runs]
            style = dict(color=COLORS.get(mode), label=LABELS.get(mode, mode), **STYLES.get(mode, {}))
            a_miss.plot(n, [r["metrics"].get("miss_rate") or 0.0 for r in runs], **style)
            a_p99.plot(n, [r["metrics"].get("speak_ms_p99") or math.nan for r in runs], **style)
        a_p99.axhline(rec["parameters"]["period_s"] * 1e3, color="0.5", ls="--", lw=0.8)
        a_miss.set_ylabel(f"{w}\nmiss rate", fontsize=8)
        a_p99.set_ylabel("p99 SPEAK ms", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("sessions on one GPU")
    return _save(plt, fig, run_dir / "sessions.png")


def speak_limit_plot(plt, data: dict, run_dir: Path) -> str | None:
    """speak_limit.png: per workload, the distribution (the fraction of units at or under a time) of the
    SPEAK times of every unit at each mode's limit (its largest count with zero misses, else its smallest
    count) against the 1 s cadence."""
    views = _duplex_views(data)
    if not views:
        return None
    fig, axes = plt.subplots(1, len(views), figsize=(2.4 * len(views) + 1, 2.6), squeeze=False, sharey=True)
    for (w, rec), ax in zip(views.items(), axes[0]):
        for mode, m in rec["workloads"][next(iter(rec["workloads"]))]["modes"].items():
            n = shown_n(m)
            run = next((r for r in m["runs"] if r["sessions"] == n and not r.get("refused")), None)
            ms = np.sort([u["speak_ms"] for u in (run or {}).get("units", []) if u.get("kind") == "SPEAK"
                          and u.get("speak_ms") is not None])
            if ms.size:
                ax.step(ms, np.arange(1, ms.size + 1) / ms.size, where="post", color=COLORS.get(mode),
                        label=f"{LABELS.get(mode, mode)} N={n}")
        ax.axvline(rec["parameters"]["period_s"] * 1e3, color="0.5", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(w, fontsize=8)
        ax.set_xlabel("SPEAK ms", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="lower right")
    axes[0, 0].set_ylabel("fraction of units")
    return _save(plt, fig, run_dir / "speak_limit.png")


def duplex_view(entries: dict) -> dict | None:
    """One duplex record of a workload's duplex stages to plot: stock and cadence joined (`combine`), the
    oracle stage's cadence runs as mode "oracle"; None without a record or where they cannot be joined."""
    parts = [e["duplex"]["record"] for h in ("duplex_stock", "duplex_cadence") if (e := entries.get(h)) and e.get("duplex")]
    if not parts and (entries.get("duplex") or {}).get("duplex"):
        parts = [entries["duplex"]["duplex"]["record"]]
    oracle = (entries.get("duplex_oracle") or {}).get("duplex")
    if oracle:
        rec = oracle["record"]
        parts.append({**rec, "workloads": {w: {**v, "modes": {"oracle": v["modes"]["cadence"]}}
                                           for w, v in rec["workloads"].items() if "cadence" in v.get("modes", {})}})
    try:
        return combine(parts) if len(parts) > 1 else (parts[0] if parts else None)
    except (ValueError, KeyError):
        return None


def shown_n(m: dict) -> int | None:
    """The session count a mode's SPEAK-time plot shows: its largest count with zero misses, else its smallest."""
    ran = sorted(r["sessions"] for r in m["runs"] if not r.get("refused"))
    return (m.get("max_zero_miss_sessions") or ran[0]) if ran else None


def duplex_plots(record: dict, out: Path) -> list[str]:
    """Both duplex plots of every workload in a duplex record (units as rows); returns the file names written
    ([] without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return []
    period_ms = record["parameters"]["period_s"] * 1e3
    ar = record["parameters"]["ar"]
    written = []
    for name, w in record["workloads"].items():
        fig, ax = plt.subplots(figsize=(9, 4))
        for mode, m in w["modes"].items():
            n = shown_n(m)
            run = next((r for r in m["runs"] if r["sessions"] == n and not r.get("refused")), None)
            pts = [(u["release_ms"] / 1e3, u["speak_ms"], u.get("miss")) for u in (run or {}).get("units", [])
                   if u.get("kind") == "SPEAK" and u.get("speak_ms") is not None and u.get("release_ms") is not None]
            ok, miss = [p for p in pts if not p[2]], [p for p in pts if p[2]]
            label = f"{LABELS.get(mode, mode)} (N={n})"
            if ok:
                ax.scatter([p[0] for p in ok], [p[1] for p in ok], s=8, color=COLORS.get(mode), alpha=0.7, label=label)
            if miss:
                ax.scatter([p[0] for p in miss], [p[1] for p in miss], marker="x", s=30, color=COLORS.get(mode),
                           label=f"{label}: missed ({len(miss)})")
        ax.axhline(period_ms, color="gray", linestyle="--", label=f"cadence ({period_ms:.0f} ms)")
        ax.set_xlabel("unit release time (s)")
        ax.set_ylabel("SPEAK time, AR + tail (ms)")
        ax.set_title(f"{name}: SPEAK time per unit, AR {ar}")
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"{name}_speak.png", dpi=110)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode, m in w["modes"].items():
            runs = sorted((r for r in m["runs"] if not r.get("refused")), key=lambda r: r["sessions"])
            if runs:
                ax.plot([r["sessions"] for r in runs], [r["metrics"].get("miss_rate") or 0.0 for r in runs],
                        color=COLORS.get(mode), **STYLES.get(mode, {}),
                        label=f"{LABELS.get(mode, mode)} (max zero-miss N={m.get('max_zero_miss_sessions')})")
        ax.set_xlabel("concurrent sessions")
        ax.set_ylabel("miss rate (units past their period)")
        ax.set_title(f"{name}: miss rate vs sessions, AR {ar}")
        ax.set_ylim(bottom=-0.02)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"{name}_miss_rate.png", dpi=110)
        plt.close(fig)
        written += [f"{name}_speak.png", f"{name}_miss_rate.png"]
    return written
