"""The report's plots (matplotlib, Agg), from records into the run folder; none where matplotlib is missing:
`speedup.png` (tail p50 with its p10-p90 band per workload and mode), `tail_per_unit.png`, `memory.png`,
and per workload `<workload>_speak.png` (every session's SPEAK times at each mode's largest count with zero
misses, missed units as x, against the cadence) and `<workload>_miss_rate.png` (miss rate against sessions),
stock, DuplexCadence and DuplexCadence with oracle graphs on the same axes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from suite.report.figures import combine, measured_tails, memory_figures, speedup, spread

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


def plots(data: dict, run_dir: Path) -> list[str]:
    """Write the run's PNGs; returns the file names written ([] without matplotlib or without figures)."""
    plt = pyplot()
    if plt is None:
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
    for w, e in data["workloads"].items():
        record = duplex_view(e)
        if record is not None:
            written += duplex_plots(record, run_dir)
    return written


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
