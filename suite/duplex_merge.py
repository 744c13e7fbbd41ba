"""Merge suite.duplex records of the same workloads measured in separate processes (e.g. stock and
DuplexCadence each on its own GPU of one host, run at the same time) into one record and its plots.

    python -m suite.duplex_merge results/<run>/duplex-a/duplex.json results/<run>/duplex-b/duplex.json \
        --out results/<run>/duplex

Per workload, the modes of every part are put side by side (a mode measured in two parts is an error);
`cadence_equals_stock` is recomputed from the two modes' one-session runs (every unit's sha256, in order),
so the merged record still says whether DuplexCadence's session alone is byte-identical to stock's.
The parts' provenance and parameters are kept under `parts`; the verdict is INVALID if any part is, or if
the one-session runs differ (or one is missing); PARTIAL if a part's list of runs was cut short (its
finished runs are kept) and nothing else is wrong.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from suite.duplex import (NOT_FINISHED, READ_SCHEMAS, SCHEMA, OneLineParser, record_reasons, unpack_units,
                          write_record)


RECORD_KEYS = ("parameters", "provenance", "verdict", "invalid_reasons", "workloads")   # what merge() reads


def _solo_hashes(mode_record: dict) -> list | None:
    run = next((r for r in mode_record["runs"] if r["sessions"] == 1 and not r.get("refused")), None)
    if run is None:
        return None
    return [(u["index"], u["sha256_f32"], u["sha256_pcm16"]) for u in run["units"] if u.get("sha256_f32")]


def shape_error(rec: dict) -> str | None:
    """What is mis-shaped in a record's workloads (the containers merge() walks), or None."""
    if not isinstance(rec.get("workloads"), dict):
        return f"'workloads': expected an object, got {type(rec.get('workloads')).__name__}"
    for name, w in rec["workloads"].items():
        if name in ("", ".", "..") or any(c in name for c in "/\\\0"):     # it names the plot files
            return f"workload {name!r}: expected a workload name (no path separators)"
        if not isinstance(w, dict) or not isinstance(w.get("modes", {}), dict):
            what = "'modes'" if isinstance(w, dict) else "itself"
            return f"workload {name!r}: {what}: expected an object"
        for mode, m in w.get("modes", {}).items():
            if not isinstance(m, dict):
                return f"workload {name!r} mode {mode!r}: expected an object, got {type(m).__name__}"
            if not isinstance(m.get("runs", []), list):
                return f"workload {name!r} mode {mode!r}: 'runs': expected a list, got {type(m['runs']).__name__}"
    return None


def merge(records: list[dict]) -> dict:
    """One record from several (same schema). Raises ValueError for another schema, a mode measured
    twice for one workload, or parts with different cadence periods or AR stages."""
    if len(records) < 2:
        raise ValueError(f"records: expected at least 2 duplex records, got {len(records)}")
    for i, r in enumerate(records):
        if r.get("schema") not in READ_SCHEMAS:
            raise ValueError(f"records[{i}]: expected schema {' or '.join(READ_SCHEMAS)}, got {r.get('schema')!r}")
        if not r.get("workloads"):
            raise ValueError(f"records[{i}]: no workloads (nothing measured in that part)")
    for key in ("period_s", "ar", "seconds"):
        vals = {json.dumps(r["parameters"][key]) for r in records}
        if len(vals) > 1:
            raise ValueError(f"parameters.{key}: the parts differ ({sorted(vals)}); they cannot share one record")
    out = {"schema": SCHEMA, "merged_from": len(records),
           "provenance": records[0]["provenance"], "parameters": dict(records[0]["parameters"]),
           "parts": [{"provenance": r["provenance"], "parameters": r["parameters"], "verdict": r["verdict"],
                      "invalid_reasons": r["invalid_reasons"]} for r in records],
           "workloads": {}}
    out["parameters"]["modes"] = []
    for key in ("sessions", "policy"):     # per mode in suite.duplex: every part's modes, not part 0's only
        if all(isinstance(r["parameters"].get(key), dict) for r in records):
            out["parameters"][key] = {m: v for r in records for m, v in r["parameters"][key].items()}
    reasons = []
    for i, r in enumerate(records):
        reasons += [f"part {i}: {x}" for x in record_reasons(r)]     # a checkpoint's: its runs' so far too
        for name, w in r["workloads"].items():
            dst = out["workloads"].setdefault(name, {**{k: v for k, v in w.items() if k not in
                                                        ("modes", "reference", "invalid_reasons",
                                                         "cadence_equals_stock")},
                                                     "modes": {}, "reference": {}, "invalid_reasons": []})
            for mode, m in w["modes"].items():
                if mode in dst["modes"]:
                    raise ValueError(f"workload {name!r}: mode {mode!r} is in more than one part")
                dst["modes"][mode] = m
                dst["reference"][mode] = w.get("reference", {}).get(mode)
                if mode not in out["parameters"]["modes"]:
                    out["parameters"]["modes"].append(mode)
            dst["invalid_reasons"] += w["invalid_reasons"]
    for name, w in out["workloads"].items():
        if "stock" in w["modes"] and "cadence" in w["modes"]:
            a, b = _solo_hashes(w["modes"]["stock"]), _solo_hashes(w["modes"]["cadence"])
            w["cadence_equals_stock"] = a is not None and a == b
            if not w["cadence_equals_stock"]:
                why = "a one-session run is missing" if a is None or b is None else "they differ"
                reasons.append(f"{name}: cadence one-session run vs stock one-session run: {why}")
    unfinished = [i for i, r in enumerate(records) if r.get("verdict") == "PARTIAL"]
    other = [x for x in reasons if not x.endswith(f": {NOT_FINISHED}")]
    out["verdict"] = "INVALID" if other else ("PARTIAL" if unfinished else "VALID")
    out["invalid_reasons"] = reasons
    return out


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m suite.duplex_merge", description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", help="duplex.json files")
    p.add_argument("--out", required=True, help="folder for the merged duplex.json and plots")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)

    def fail(message: str) -> int:
        print(f"python -m suite.duplex_merge: error: {message}", file=sys.stderr)
        return 2

    if not args.out.strip():
        return fail("--out: expected a folder for the merged record, got an empty path")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        return fail(f"--out: expected a folder (new or existing), got the file {args.out!r}")
    records = []
    for f in args.records:
        try:
            rec = json.loads(Path(f).read_text())
        except OSError as exc:
            return fail(str(exc))
        except ValueError as exc:          # JSONDecodeError, UnicodeDecodeError
            return fail(f"{f}: not JSON ({exc})")
        try:
            if isinstance(rec, dict) and rec.get("schema") in READ_SCHEMAS and not shape_error(rec):
                unpack_units(rec)          # units as one table (suite.duplex.pack_units) -> rows of objects
        except (ValueError, TypeError, AttributeError) as exc:
            return fail(f"{f}: {exc}: not a suite.duplex record")
        if not isinstance(rec, dict):
            return fail(f"{f}: expected a JSON object (a suite.duplex record), got {type(rec).__name__}")
        missing = [k for k in RECORD_KEYS if k not in rec]
        if rec.get("schema") in READ_SCHEMAS and missing:
            return fail(f"{f}: missing key {missing[0]!r}: not a complete suite.duplex record")
        if rec.get("schema") in READ_SCHEMAS and (why := shape_error(rec)):
            return fail(f"{f}: {why}: not a suite.duplex record")
        records.append(rec)
    try:
        record = merge(records)
    except ValueError as exc:
        return fail(str(exc))
    except KeyError as exc:
        return fail(f"a record lacks key {exc}: not a complete suite.duplex record")
    except (TypeError, AttributeError) as exc:
        return fail(f"a record of the wrong shape ({type(exc).__name__}: {exc}): not a suite.duplex record")
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="duplex_merge-") as staging:
        # the plots and the record are made in a staging folder first: one that cannot be made leaves nothing
        if not args.no_plots:
            from suite.duplex_plot import plot_all
            try:
                record["plots"] = plot_all(record, Path(staging))
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                return fail(f"the merged record cannot be plotted ({type(exc).__name__}: {exc}): a unit or run lacks "
                            "a field suite.duplex writes, or holds a value of the wrong kind; --no-plots merges "
                            "without the plots")
        try:
            write_record(Path(staging) / "duplex.json", record)     # compact, units as a table, as suite.duplex
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return fail(f"the merged record cannot be written ({type(exc).__name__}: {exc}): a run's units are "
                        "not those suite.duplex writes")
        try:
            out.mkdir(parents=True, exist_ok=True)
            for name in [*record.get("plots", []), "duplex.json"]:
                shutil.copyfile(Path(staging) / name, out / name)
        except OSError as exc:
            return fail(f"--out {args.out}: cannot write there ({exc.strerror or exc})")
    for name, w in record["workloads"].items():
        for mode, m in w["modes"].items():
            print(f"{name} {mode}: max sessions with zero misses = {m.get('max_zero_miss_sessions')}")
    print(f"verdict {record['verdict']}" + (f": {record['invalid_reasons']}" if record["invalid_reasons"] else ""))
    return 0 if record["verdict"] == "VALID" else 1


if __name__ == "__main__":
    sys.exit(main())
