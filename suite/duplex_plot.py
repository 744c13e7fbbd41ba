"""Plots of a suite.duplex record (matplotlib, Agg backend; written next to duplex.json).

Per workload:
* `<workload>_speak.png`: per-unit SPEAK time (ms) against the unit's release time (s) for every SPEAK
  unit of every session, each mode at its largest session count with zero misses (else its smallest run),
  stock and DuplexCadence on the same axes, with the cadence line at the period (1000 ms); missed units drawn as x.
* `<workload>_miss_rate.png`: miss rate (fraction of units that ran) against session count, stock and
  DuplexCadence on the same axes; refused runs (admission) are not drawn.
"""
from __future__ import annotations

from pathlib import Path

COLORS = {"stock": "tab:red", "cadence": "tab:blue"}
STYLES = {"stock": dict(marker="s", linestyle="--", markersize=8), "cadence": dict(marker="o", linestyle="-")}
LABELS = {"stock": "stock", "cadence": "DuplexCadence"}


def _shown_n(m: dict) -> int | None:
    """The session count whose run a mode's SPEAK-time plot shows: its largest count with zero misses,
    else the smallest count it ran."""
    ran = sorted(r["sessions"] for r in m["runs"] if not r.get("refused"))
    if not ran:
        return None
    return m.get("max_zero_miss_sessions") or ran[0]


def plot_all(record: dict, out: Path) -> list[str]:
    """Write both plots for every workload in the record; returns the file names written."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    out = Path(out)
    period_ms = record["parameters"]["period_s"] * 1e3
    ar = record["parameters"]["ar"]
    written = []
    for name, w in record["workloads"].items():
        fig, ax = plt.subplots(figsize=(9, 4))
        for mode, m in w["modes"].items():
            n = _shown_n(m)
            run = next((r for r in m["runs"] if r["sessions"] == n and not r.get("refused")), None)
            if run is None:
                continue
            pts = [(u["release_ms"] / 1e3, u["speak_ms"], u["miss"]) for u in run["units"]
                   if u["kind"] == "SPEAK" and u["speak_ms"] is not None]
            if not pts:
                continue
            ok = [p for p in pts if not p[2]]
            miss = [p for p in pts if p[2]]
            label = f"{LABELS.get(mode, mode)} (N={n})"
            if ok:
                ax.scatter([p[0] for p in ok], [p[1] for p in ok], s=8, color=COLORS.get(mode), alpha=0.7,
                           label=label)
            if miss:
                ax.scatter([p[0] for p in miss], [p[1] for p in miss], marker="x", s=30, color=COLORS.get(mode),
                           label=f"{label}: missed ({len(miss)})")
        ax.axhline(period_ms, color="gray", linestyle="--", label=f"cadence ({period_ms:.0f} ms)")
        ax.set_xlabel("unit release time (s)")
        ax.set_ylabel("SPEAK time, AR + tail (ms)")
        ax.set_title(f"{name}: SPEAK time per unit, AR {ar}")
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        f1 = f"{name}_speak.png"
        fig.savefig(out / f1, dpi=110)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(6, 4))
        for mode, m in w["modes"].items():
            runs = sorted((r for r in m["runs"] if not r.get("refused")), key=lambda r: r["sessions"])
            if runs:
                ax.plot([r["sessions"] for r in runs], [r["metrics"]["miss_rate"] or 0.0 for r in runs],
                        color=COLORS.get(mode), **STYLES.get(mode, {}),
                        label=f"{LABELS.get(mode, mode)} (max zero-miss N={m['max_zero_miss_sessions']})")
        ax.set_xlabel("concurrent sessions")
        ax.set_ylabel("miss rate (units past their period)")
        ax.set_title(f"{name}: miss rate vs sessions, AR {ar}")
        ax.set_ylim(bottom=-0.02)
        ax.legend(fontsize=8)
        fig.tight_layout()
        f2 = f"{name}_miss_rate.png"
        fig.savefig(out / f2, dpi=110)
        plt.close(fig)
        written += [f1, f2]
    return written
