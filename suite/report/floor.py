"""The "Close to the floor" section of a report: the floor records (suite.measure.floor) in a run folder,
each as its timeline table and its memory table (suite.records.floor's rows), with what it ran on."""
from __future__ import annotations

from suite.records.floor import MEMORY_HEADERS, TIMELINE_HEADERS, memory_rows, timeline_rows
from suite.report.text import DASH, table

INTRO = ("From the floor records in this folder (`python -m suite.measure.floor`; a diagnostic beside the verdicts, "
         "whose tail / kernel-busy comes from the verify stage): per workload one session per mode, each in a "
         "process of its own. After the warm units, steady SPEAK units are timed unprofiled (tail ms: their p50) "
         "and then run one at a time under the CUDA profiler: kernel ms is the kernels' busy time (the union of "
         "their intervals), wall ms the unit's wall time under the profiler, the gap causes the time between "
         "kernels by what the host did (eager op, Python, graph launch, queued behind earlier work, copies, "
         "syncs), data-moving kernels those that only copy, concatenate, index, scatter, pad or roll. Memory: one "
         "session's device memory itemised, MiB (driver over idle: at the driver, above the process's idle "
         "baseline). A unit that ran a step eagerly (its signature had no graph yet) is no floor reading: such "
         "units are counted under each record.")


def _where(rec: dict) -> str:
    prov, p = rec.get("provenance") or {}, rec.get("parameters") or {}
    gpus = sorted({g for g in (rec.get("devices") or {}).values() if g}) or ["cpu"]
    return (f"commit {(prov.get('git_rev') or DASH)[:12]}, impl/ tree {(prov.get('impl_tree') or DASH)[:12]}, "
            f"{', '.join(gpus)}, {prov.get('date_utc') or DASH}; per mode {p.get('warm_units')} warm, "
            f"{p.get('timed_units')} timed, {p.get('units')} profiled units, prepare {p.get('prepare')!r}, "
            f"{p.get('depth')} depth")


def _eager(rec: dict) -> str:
    found = []
    for name, entry in rec["workloads"].items():
        for mode, tl in entry["timeline"].items():
            n = ((tl["summary"].get("stats_in_measured_units") or {}).get("eager_fallbacks")) or 0
            if n:
                found.append(f"{name} {mode} {n}")
    return ("Steps run eagerly in the measured units: " + ", ".join(found) + ".") if found else \
        "No step ran eagerly in the measured units."


def section(records: list[tuple[str, dict]]) -> list[str]:
    """The section's lines ([] without records). records: (path, floor record), as suite.records.floor.
    read_floors gives them. Raises KeyError / TypeError for a record of the wrong shape."""
    if not records:
        return []
    out = ["## Close to the floor", "", INTRO, ""]
    for path, rec in records:
        out += [f"`{path}`: {_where(rec)}.", "", table(timeline_rows(rec), TIMELINE_HEADERS), "", _eager(rec), ""]
        mem = memory_rows(rec)
        if mem:
            out += [table(mem, MEMORY_HEADERS), ""]
    return out
