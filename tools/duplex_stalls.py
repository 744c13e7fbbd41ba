"""Where a duplex count's time went: per session count of a duplex record (suite.measure.duplex's duplex.json),
the SPEAK units that ran a step eagerly (no graph yet) and their tail, the missed units that ran no step eagerly
(late for another reason: a start behind slack work or an earlier late unit), the slack captures and the wall
time the slack spent on them (a capture under the "exclusive" capture gate waits for every other session's unit
in progress and holds new ones back until it ends: duplexcadence.gate), the slack jobs that ran past their
next release, and how late units started. The capture gate is the record's (its provenance; "not recorded"
where it holds none). `speak_per_s`: SPEAK units that made audio per second of the cadence (first release to
one period after the last); with --kernels, `kernel_ms_per_unit` is the workload's steady SPEAK unit's GPU
kernel-busy time in DuplexCadence mode from that run's verify record (one session, the CUDA profiler), and
`kernel_demand` = speak_per_s x that / 1000: the seconds of kernel time per second the count asks of a GPU that
runs one kernel at a time. Above 1, only kernels of several sessions running at once on the GPU can keep up.

    python tools/duplex_stalls.py RECORD_OR_FOLDER [...] [--kernels VERIFY_RUN_FOLDER] [--json OUT]

Prints one row per (record, workload, mode, count); --json also writes the rows. Reads the records only (host,
no device). Exit status 0, 2 for a path that holds no duplex.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tabulate import tabulate

from suite.records import read_duplex, speak_per_second

COLUMNS = ("record", "workload", "mode", "sessions", "capture_gate", "prepare", "wall_s", "speak_units", "missed",
           "eager_units", "missed_eager", "missed_replayed", "eager_tail_ms_p50", "eager_tail_s_sum",
           "replay_tail_ms_p50", "replay_tail_ms_p90", "slack_captures", "slack_capture_wall_s",
           "ms_per_slack_capture", "slack_jobs_overrun", "start_delay_ms_p50", "start_delay_ms_p90", "speak_per_s",
           "kernel_ms_per_unit", "kernel_demand")


def _units(run: dict) -> list[dict]:
    return run.get("units") or []


def _p(values, q):
    return float(np.percentile(values, q)) if values else None


def kernel_ms(run_dir: Path | None, workload: str) -> float | None:
    """The steady SPEAK unit's kernel-busy ms (DuplexCadence mode, p50) in `run_dir/<workload>.verify/run.json`;
    None without a folder, such a record or the figure."""
    if run_dir is None:
        return None
    try:
        rec = json.loads((run_dir / f"{workload}.verify" / "run.json").read_text())
        value = rec["modes"]["cadence"]["metrics"]["kernel_busy_ms_per_unit_p50"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rows_of(path: Path, kernels: Path | None = None) -> list[dict]:
    """The rows of one duplex.json; kernels: a run folder with verify records (`kernel_ms`). Raises
    FileNotFoundError for a path without one."""
    file = path / "duplex.json" if path.is_dir() else path
    rec = read_duplex(file)
    params, out = rec.get("parameters", {}), []
    gate = rec.get("provenance", {}).get("capture_gate") or params.get("capture_gate") or "not recorded"
    for name, w in rec["workloads"].items():
        for mode, m in w["modes"].items():
            for run in m["runs"]:
                speak = [u for u in _units(run) if u["kind"] == "SPEAK" and u["service_ms"] is not None]
                eager = [u for u in speak if u["eager_fallbacks"]]
                replay = [u["tail_ms"] for u in speak if not u["eager_fallbacks"]]
                slack = [u for u in speak if u.get("slack_captures")]
                caps = sum(u["slack_captures"] for u in slack)
                cap_s = sum(u["slack_ms"] or 0.0 for u in slack) / 1000
                delay = [u["start_ms"] - u["release_ms"] for u in speak]
                per_s = speak_per_second(_units(run), params.get("period_s") or 1.0)
                k_ms = kernel_ms(kernels, name)
                out.append({
                    "record": file.parent.name, "workload": name, "mode": mode, "sessions": run["sessions"],
                    "capture_gate": gate, "prepare": run.get("prepare"),
                    "wall_s": run["wall_s"], "speak_units": len(speak), "missed": sum(bool(u["miss"]) for u in speak),
                    "eager_units": len(eager), "missed_eager": sum(bool(u["miss"]) for u in eager),
                    "missed_replayed": sum(bool(u["miss"]) and not u["eager_fallbacks"] for u in speak),
                    "eager_tail_ms_p50": _p([u["tail_ms"] for u in eager], 50),
                    "eager_tail_s_sum": sum(u["tail_ms"] for u in eager) / 1000,
                    "replay_tail_ms_p50": _p(replay, 50), "replay_tail_ms_p90": _p(replay, 90),
                    "slack_captures": caps, "slack_capture_wall_s": cap_s,
                    "ms_per_slack_capture": 1000 * cap_s / caps if caps else None,
                    "slack_jobs_overrun": sum((u.get("slack_overrun_ms") or 0) > 0 for u in speak),
                    "start_delay_ms_p50": _p(delay, 50), "start_delay_ms_p90": _p(delay, 90),
                    "speak_per_s": per_s, "kernel_ms_per_unit": k_ms,
                    "kernel_demand": per_s * k_ms / 1000 if per_s is not None and k_ms is not None else None})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path, help="duplex.json files or folders holding one")
    p.add_argument("--kernels", type=Path, default=None,
                   help="a run folder with <workload>.verify/run.json records: their kernel-busy time per unit")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    if args.kernels is not None and not args.kernels.is_dir():
        p.error(f"--kernels: expected a run folder holding <workload>.verify/run.json, got {str(args.kernels)!r}")
    if args.json is not None and (args.json.is_dir() or not args.json.parent.is_dir()):
        p.error(f"--json: expected a file in an existing folder, got {str(args.json)!r}")
    rows = []
    for path in args.records:
        try:
            rows += rows_of(path, args.kernels)
        except FileNotFoundError:
            p.error(f"records: {str(path)!r} is not a duplex.json nor a folder holding one")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            p.error(f"records: {str(path)!r}: not a duplex record this tool can read ({type(exc).__name__}: "
                    f"{str(exc)[:200]})")
    print(tabulate([[r[c] for c in COLUMNS] for r in rows], headers=COLUMNS,
                   floatfmt=[".2f" if c in ("speak_per_s", "kernel_demand") else ".0f" for c in COLUMNS]))
    if args.json:
        command = ["python", "tools/duplex_stalls.py", *(argv if argv is not None else sys.argv[1:])]
        args.json.write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
