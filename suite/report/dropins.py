"""The drop-in lines of a report: one per drop-in record (suite.measure.dropin) in a run folder."""
from __future__ import annotations

from pathlib import Path

from suite.records import device_type, read_dropins, read_json
from suite.report.text import DASH, interval

INTRO = ("The stock decode call's own loop against the same loop through its drop-in (`duplexcadence.dropin`), "
         "paired per unit in A B B A blocks over fresh processes: median stock / drop-in per unit, its 95% "
         "interval over processes and pairs; whole loop: summed stock time / summed drop-in time (a turn's reset "
         "and every capture a drop-in makes are inside its units' times); A/A: two stock arms.")


def line(rec: dict) -> str:
    """One Markdown list item of a drop-in record: what ran, the paired ratio with its interval, the A/A floor,
    bytes, the drop-in's units by kind, the verdict with its reasons. Raises KeyError / TypeError for a record
    of the wrong shape."""
    p, sp = rec["paired"], rec["paired"]["speedup"]
    dev = rec["provenance"].get("device", {})
    where = f"{rec['device']} {dev.get('gpu_name') or ''}".strip()
    fl, b, calls = p.get("floor") or {}, rec["bytes"], rec["calls"]["dropin_units"]
    speed = (f"stock / drop-in {interval(sp['speedup'], sp['ci_low'], sp['ci_high'])} per unit over "
             f"{sp['processes']} processes, {sp['pairs']} pairs; whole loop {interval(p.get('total_ratio'), None, None)}")
    if device_type(rec["device"]) != "cuda":
        speed = f"no speed figure (a CPU run checks the loop and the bytes; {speed})"
    floor = (DASH if not fl else f"{interval(fl['speedup'], fl['ci_low'], fl['ci_high'], '.3f')}"
             f"{'' if p.get('clears_floor') else ' not'} cleared by the ratio's interval")
    kinds = ", ".join(f"{calls.get(k, 0)} {k}" for k in ("captured", "replayed", "eager"))
    return (f"- **{rec['dropin']}** ({rec['stock_call']}; {rec['depth']}, {where}): {speed}; A/A floor {floor}; bytes "
            f"{b['verdict']} ({b['units_equal']}/{b['units_compared']} units equal); drop-in units: {kinds}; "
            f"**{rec['verdict']}**" + "".join(f"; {r}" for r in rec.get("invalid_reasons") or []))


def section(records: list[dict]) -> list[str]:
    """The "Drop-ins" section's lines ([] without records)."""
    return ["## Drop-ins", "", INTRO, "", *map(line, records), ""] if records else []


def render(folder: Path) -> str:
    """REPORT.md of a folder holding drop-in records only. Raises ValueError for a record that does not read
    as JSON or is of the wrong shape."""
    unreadable = [p.name for p in sorted(Path(folder).glob("dropin_*.json")) if read_json(p) is None]
    if unreadable:
        raise ValueError(f"{folder}: {', '.join(unreadable)}: not a JSON object (truncated or damaged)")
    try:
        return "\n".join([f"# DuplexCadence drop-ins {Path(folder).name}", "", *section(read_dropins(folder))])
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        raise ValueError(f"{folder}: a drop-in record of the wrong shape ({type(exc).__name__}: {exc})") from None
