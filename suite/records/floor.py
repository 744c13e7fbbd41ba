"""Floor records (`floor.json`, schema FLOOR_SCHEMA, written by suite.measure.floor): per workload the
timeline of steady SPEAK units under the CUDA profiler and one session's memory itemised, by mode. `read_floors`
finds them in a run folder; `timeline_rows` and `memory_rows` are the two tables the harness prints and the
report renders, as rows of text cells ("-" where a figure was not measured, as on CPU).
"""
from __future__ import annotations

from pathlib import Path

from suite.records import read_json

FLOOR_SCHEMA = "duplexcadence.floor/1"
TIMELINE_HEADERS = ("workload", "mode", "kernel ms", "wall ms (prof)", "wall/kernel", "tail ms", "tail/kernel",
                    "top gap causes (ms per unit)", "data-moving kernels")
#: memory items (suite.measure.memory.itemise keys, MiB) in the order of MEMORY_HEADERS' columns after mode
MEMORY_ITEMS = ("weights_mib", ("arena_reserved_mib", "arena_mapped_mib"), "graph_pool_mib", "graph_exec_mib",
                "allocator_cache_mib", "cuda_context_mib", "cublas_workspace_mib", "driver_over_idle_mib",
                "unseen_mib")
MEMORY_HEADERS = ("workload", "mode", "weights", "arena res/mapped", "graph pool", "graph exec", "alloc cache",
                  "context", "cuBLAS ws", "driver over idle", "unseen")


def read_floors(folder: Path) -> list[tuple[str, dict]]:
    """(path relative to `folder`, record) of every floor record in `folder` or one folder below it
    (`floor.json`, `<name>/floor.json`), by path; [] for none. Files of another schema are left out."""
    folder = Path(folder)
    found = [folder / "floor.json", *sorted(folder.glob("*/floor.json"))]
    out = []
    for path in found:
        rec = read_json(path) if path.is_file() else None
        if rec and rec.get("schema") == FLOOR_SCHEMA:
            out.append((str(path.relative_to(folder)), rec))
    return out


def _num(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def timeline_rows(record: dict) -> list[list[str]]:
    """One row per workload and profiled mode (TIMELINE_HEADERS): kernel-busy, profiled wall and their ratio,
    the unprofiled tail and its ratio to kernel-busy (p50s, ms), the three largest gap causes (ms per unit),
    data-moving kernels of all kernels per unit. Raises KeyError / TypeError for a record of the wrong shape."""
    rows = []
    for name, entry in record["workloads"].items():
        for mode, tl in entry["timeline"].items():
            s = tl["summary"]
            top = ", ".join(f"{c} {ms:.2f}" for c, ms in s["top_causes"]) or "-"
            dm = s.get("data_movement_per_unit_p50") or {}
            rows.append([name, mode, _num(s["kernel_busy_ms_p50"], 2), _num(s["wall_ms_profiled_p50"], 2),
                         _num(s["tail_over_kernel_busy_x"], 3), _num(s["tail_ms_p50"], 2),
                         _num(s["tail_over_kernel_busy_x_unprofiled"], 3), top,
                         f"{_num(dm.get('movement_kernels'), 0)} / {_num(dm.get('kernels'), 0)}" if dm else "-"])
    return rows


def memory_rows(record: dict) -> list[list[str]]:
    """One row per workload and mode (MEMORY_HEADERS), MiB. Raises KeyError / TypeError for a record of the
    wrong shape."""
    rows = []
    for name, entry in record["workloads"].items():
        for mode, m in entry["memory"].items():
            it = m["items"]
            rows.append([name, mode, *(" / ".join(_num(it[k]) for k in key) if isinstance(key, tuple)
                                      else _num(it[key]) for key in MEMORY_ITEMS)])
    return rows
