"""How far each workload's tail is from its floor: a timeline of steady SPEAK units and one session's memory.

    python -m suite.measure.floor --workload W [--workload W2 ... | --workload all] --device cuda --out DIR
        [--units K] [--warm-units N] [--timed-units N] [--memory] [--timeline-modes cadence[,stock]]
        [--prepare met|unit|none] [--depth released|reduced] [--steps N] [--seed N] [--keep-traces]
        [--timeout-s S]

One process per workload and mode (`--child MODE`, started by the command itself, one after another: the
driver-level figures are device-wide). Each builds the model (`suite.measure.session.build`: the one-mode
process drops what the mode never uses), opens one session and `prepare(None)`s it (inside
`memory.allocation_history` when --memory), runs the first N SPEAK units of the script as warm units,
takes the memory sample of the session (`memory.itemise`), then (`--prepare met`) captures the signatures
the warm units met, outside any measured unit (`unit`: each measured unit's own signatures just before it;
`none`: nothing), times N steady SPEAK units (not a turn's first or final unit) with CUDA events, and
profiles K more one at a time (`kernels.trace_call`; CUPTI stays attached once it has profiled, so timed
units come first). From each profiled unit's trace: `kernels.unit_timeline` (kernel-busy, wall, every gap
and its causes) and `kernels.data_movement`. On CPU it runs the same units and records None for every
device figure. Writes DIR/<workload>/<mode>/part.json and log.txt, then DIR/floor.json, and prints a table
per harness. Exit status: 0 every process did its work; 1 some failed (floor.json says which); 2 bad
arguments.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

import workloads
from duplexcadence import gate, runtime
from duplexcadence.session import SessionStats
from suite.measure import env
from suite.measure.kernels import DATA_MOVEMENT_KERNELS, data_movement, trace_call, unit_timeline
from suite.measure.memory import (DriverReader, allocation_history, device_sample, itemise, model_bytes,
                                  snapshot_sites)
from suite.measure.session import ModeUnavailable, UnitTimer, build, modes, open_session, payload_of, setup
from suite.records import EXIT_UNAVAILABLE, REPO_ROOT, jsonable
from suite.records.floor import (FLOOR_SCHEMA, MEMORY_HEADERS, TIMELINE_HEADERS, memory_rows,
                                 timeline_rows)

SCHEMA = FLOOR_SCHEMA
PREPARE = ("met", "unit", "none")
TOP_GAPS = 10                   # the longest gaps of a profiled unit kept in the record
COUNTERS = SessionStats.COUNTERS


def _p50(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return float(np.percentile(values, 50)) if values else None


# --- one process: one workload, one mode -------------------------------------------------------------------
class Walk:
    """The script's units in order on one open session: turns opened as the script says, LISTEN units with a
    payload decoded (role "run"), and `take(role, n)` running units until n SPEAK units of that role ran (a
    role other than "warm": only steady units, those neither a turn's first nor final; the others run as
    "run"). `met`: the signatures of every unit run so far, from the session's clocks before it ran."""

    def __init__(self, session, units: list, device: torch.device, *, prepare_each: bool = False,
                 keep: Path | None = None, progress: bool = True, label: str = ""):
        self.session, self.units, self.device = session, list(units), device
        self.prepare_each, self.keep, self.progress, self.label = prepare_each, keep, progress, label
        self.pos, self.open_turn, self.last_speak_turn = 0, None, object()
        self.met: list = []
        self.timer = UnitTimer(device)

    def _signatures(self, size: int, final: bool) -> list:
        try:
            return list(self.session.signatures(size, final))
        except Exception:                       # a session whose clocks refuse the size: speak will say so
            return []

    def take(self, role: str, n: int) -> list[dict]:
        rows, done = [], 0
        while done < n and self.pos < len(self.units):
            unit = self.units[self.pos]
            self.pos += 1
            payload, _, size = payload_of(unit)
            speak = unit.kind == "SPEAK"
            if not speak and payload is None:
                continue
            first = speak and unit.turn != self.last_speak_turn
            if speak and unit.turn != self.open_turn:
                self.session.start_turn()
                self.open_turn = unit.turn
            final = bool(speak and unit.final)
            mine = speak and (role == "warm" or not (first or final))
            sigs = self._signatures(size, final)
            row = {"index": int(unit.index), "kind": unit.kind, "turn": unit.turn, "final": final,
                   "payload_size": size, "role": role if mine else "run", "signatures": len(sigs)}
            if mine and self.prepare_each and sigs:
                row["prepared"] = self.session.prepare(sigs)
            before = self.session.stats()
            if mine and role == "profiled":
                keep = None if self.keep is None else self.keep / f"trace_unit{unit.index}.json.gz"
                out, events, row["wall_ms"] = trace_call(self.session.speak, payload, final=final,
                                                         device=self.device, keep=keep)
                if events is not None:
                    tl = unit_timeline(events)
                    gaps = tl.pop("gap_list")
                    row["timeline"] = {**tl, "top_gaps": sorted(gaps, key=lambda g: -g["ms"])[:TOP_GAPS]}
                    row["data_movement"] = data_movement(events)
            else:
                out, row["tail_ms"], row["wall_ms"] = self.timer(self.session.speak, payload, final=final)
            after = self.session.stats()
            row["stats"] = {k: getattr(after, k) - getattr(before, k) for k in COUNTERS}
            row["samples"] = out.samples
            self.met.extend(s for s in sigs if s not in self.met)
            if final:
                self.open_turn = None
            if speak:
                self.last_speak_turn = unit.turn
            done += row["role"] == role
            rows.append(row)
            if self.progress:
                print(f"  {self.label}: unit {row['index']} {row['role']} {row['wall_ms']:.1f} ms", flush=True)
        return rows


def timeline_summary(rows: list[dict]) -> dict:
    """Per-unit figures of the profiled units (medians; gap causes as means per unit, so they add up to the
    mean gap time) beside the timed (unprofiled) units' tail p50 and its ratio to the kernel-busy p50."""
    prof = [r for r in rows if r["role"] == "profiled" and r.get("timeline")]
    timed = [r["tail_ms"] for r in rows if r["role"] == "timed"]
    tls = [r["timeline"] for r in prof]
    busy, tail = _p50([t["kernel_busy_ms"] for t in tls]), _p50(timed)
    causes: dict[str, float] = {}
    ops: dict[str, dict[str, float]] = {}
    for t in tls:
        for cause, ms in t["by_cause"].items():
            causes[cause] = causes.get(cause, 0.0) + ms / len(tls)
        for cause, per_op in t["by_cause_op"].items():
            for name, ms in per_op.items():
                ops.setdefault(cause, {})[name] = ops.get(cause, {}).get(name, 0.0) + ms / len(tls)
    causes = dict(sorted(causes.items(), key=lambda kv: -kv[1]))
    moved = [r["data_movement"] for r in prof if r.get("data_movement")]
    return {
        "units_profiled": len([r for r in rows if r["role"] == "profiled"]), "units_timed": len(timed),
        "profiled_indices": [r["index"] for r in rows if r["role"] == "profiled"],
        "kernel_busy_ms_p50": busy, "gpu_busy_ms_p50": _p50([t["gpu_busy_ms"] for t in tls]),
        "wall_ms_profiled_p50": _p50([t["wall_ms"] for t in tls]),
        "tail_over_kernel_busy_x": _p50([t["tail_over_kernel_busy_x"] for t in tls]),
        "tail_ms_p50": tail, "tail_over_kernel_busy_x_unprofiled": tail / busy if tail and busy else None,
        "kernels_per_unit_p50": _p50([t["kernels"] for t in tls]),
        "graph_launches_per_unit_p50": _p50([t["graph_launches"] for t in tls]),
        "kernel_launches_per_unit_p50": _p50([t["kernel_launches"] for t in tls]),
        "gaps_per_unit_p50": _p50([t["gaps"] for t in tls]), "gaps_ms_mean": sum(causes.values()) if tls else None,
        "after_sync_ms_mean": sum(t["after_sync_ms"] for t in tls) / len(tls) if tls else None,
        "by_cause_ms_mean": {k: round(v, 4) for k, v in causes.items()},
        "by_cause_op_ms_mean": {c: {k: round(v, 4) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:8]}
                                for c, d in ops.items()},
        "top_causes": [[k, round(v, 3)] for k, v in list(causes.items())[:3]],
        "data_movement_per_unit_p50": {
            **{k: _p50([m[k] for m in moved]) for k in ("kernels", "movement_kernels", "movement_ms", "memcpy_dtod")},
            "by_kind": {k: _p50([m["by_kind"][k]["count"] for m in moved]) for k, _ in DATA_MOVEMENT_KERNELS},
        } if moved else None,
        "stats_in_measured_units": {k: sum(r["stats"][k] for r in rows if r["role"] in ("timed", "profiled"))
                                    for k in COUNTERS},
    }


def run_mode(workload, mode: str, device, *, depth: str = "released", steps: int | None = None,
             seed: int | None = None, warm: int = 3, timed: int = 3, units: int = 3, memory: bool = True,
             timeline: bool = True, prepare: str = "met", keep: Path | None = None, progress: bool = True,
             command: list[str] | None = None) -> dict:
    """One session of `mode` on `workload` in this process (the module docstring says what runs). Returns
    the part record: {workload, mode, device, parameters, memory (None without `memory`), timeline
    ({summary, units}; None without `timeline`), prepared, provenance, determinism, notes}. Raises
    ModeUnavailable, ValueError (a mode the adapter lacks, a bad count or `prepare`)."""
    for name, value in (("warm", warm), ("timed", timed), ("units", units)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
    if prepare not in PREPARE:
        raise ValueError(f"prepare: expected one of {PREPARE}, got {prepare!r}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    reader = DriverReader(dev.index or 0) if cuda else None
    idle = reader.used_mib() if reader is not None else None          # before CUDA starts in this process
    if cuda:
        torch.cuda.init()
        gate.synchronize(dev)
    after_init = reader.used_mib() if reader is not None else None
    context = after_init - idle if None not in (idle, after_init) else None
    notes, label = [], f"{workload.name} {mode}"
    if reader is not None and reader.same_device(dev) is False:
        idle = context = None
        notes.append("NVML's device before CUDA started was not CUDA's: idle and context figures dropped")
    s = setup(workload, dev, depth, None, None, steps, seed, mode)
    with env.deterministic() as det:
        model, _, dropped = build(s, depth, mode)
        model_sample = device_sample(s.device, reader)
        weights = model_bytes(model, s.device)
        session = open_session(s.adapter, model, mode, s.spec)
        try:
            opened = device_sample(s.device, reader, session)
            with allocation_history(s.device, enabled=memory) as hist:
                t0 = time.perf_counter()
                counters = session.prepare(None)
                if cuda:
                    gate.synchronize(s.device)
                prepare_ms = (time.perf_counter() - t0) * 1e3
                prepared = device_sample(s.device, reader, session)
                hist["take"]()
            sites, hist["snapshot"] = snapshot_sites(hist["snapshot"]), None
            walk = Walk(session, s.units, s.device, prepare_each=prepare == "unit", keep=keep, progress=progress,
                        label=label)
            rows = walk.take("warm", warm)
            steady = device_sample(s.device, reader, session)
            mem = None
            if memory:
                mem = {"items": itemise(weights=weights, idle_mib=idle, context_mib=context, model=model_sample,
                                        opened=opened, prepared=prepared, steady=steady),
                       "samples": {"model": model_sample, "opened": opened, "prepared": prepared, "steady": steady},
                       "driver_source": reader.source if reader is not None else None,
                       "after_units": [r["index"] for r in rows], "snapshot_after_prepare": sites,
                       "history_error": hist["error"], "dropped_for_mode": dropped}
            met, met_n = {}, len(walk.met)
            if prepare == "met" and walk.met:
                met = session.prepare(walk.met)
            if timeline:
                rows += walk.take("timed", timed)
                rows += walk.take("profiled", units)
                n = sum(r["role"] == "profiled" for r in rows)
                if n < units:
                    notes.append(f"the script ran out: {n} of {units} steady SPEAK units profiled")
        finally:
            session.close()
    return jsonable({
        "workload": workload.name, "mode": mode, "device": str(s.device), "depth": depth,
        "parameters": {"warm_units": warm, "timed_units": timed, "units": units, "prepare": prepare,
                       "steps": s.spec.get("n_timesteps"), "seed": s.seeds.get("weights", 0)},
        "prepared": {"none": counters, "ms": prepare_ms, "met": met, "met_signatures": met_n},
        "memory": mem,
        "timeline": {"summary": timeline_summary(rows), "units": rows} if timeline else {"units": rows},
        "provenance": env.provenance(command, device=s.device), "determinism": det, "notes": notes})


# --- the command: one process per workload and mode ----------------------------------------------------------
def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m suite.measure.floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", required=True, help="a workload name, repeatable, or `all`")
    ap.add_argument("--device", required=True, type=env.device_arg, help="cpu | cuda | cuda:N")
    ap.add_argument("--out", required=True, type=env.out_folder,
                    help="the folder for floor.json and one folder per process")
    ap.add_argument("--units", type=int, default=3, help="steady SPEAK units profiled, one at a time (default 3)")
    ap.add_argument("--warm-units", type=int, default=3, help="first SPEAK units run before measuring (default 3)")
    ap.add_argument("--timed-units", type=int, default=3, help="steady SPEAK units timed unprofiled (default 3)")
    ap.add_argument("--memory", action="store_true", help="also the itemised memory of stock and cadence")
    ap.add_argument("--timeline-modes", default="cadence", help="modes profiled, comma-separated (default cadence)")
    ap.add_argument("--prepare", choices=PREPARE, default="met")
    ap.add_argument("--depth", choices=("released", "reduced"), default="released")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=env.seed_arg, default=None)
    ap.add_argument("--keep-traces", action="store_true", help="keep each profiled unit's trace (.json.gz)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per process (default 300)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--child", default=None, metavar="MODE", help=argparse.SUPPRESS)
    ap.add_argument("--no-timeline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name in ("units", "warm_units", "timed_units"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')}: expected an int >= 0, got {getattr(args, name)}")
    if not math.isfinite(args.timeout_s) or args.timeout_s <= 0:
        ap.error(f"--timeout-s: expected finite seconds > 0, got {args.timeout_s}")
    args.timeline_modes = [m for m in args.timeline_modes.split(",") if m]
    if len(set(args.timeline_modes)) != len(args.timeline_modes):
        ap.error(f"--timeline-modes: expected each mode once, got {args.timeline_modes}")
    if not args.timeline_modes and not args.memory and args.child is None:
        ap.error("--timeline-modes: expected at least one mode (or --memory), got none: nothing would be measured")
    if args.child is None:
        try:
            names = _names(args.workload)
            env.check_steps_apply(names, args.steps)
        except KeyError as exc:
            ap.error(f"--workload: {exc.args[0] if exc.args else exc}")
        except ValueError as exc:
            ap.error(str(exc))
        for name in names:
            known = modes(runtime.adapter(workloads.get(name).architecture))
            if unknown := [m for m in args.timeline_modes if m not in known]:
                ap.error(f"--timeline-modes: {name} has the modes {list(known)}, got {unknown}")
    return args


def _names(requested: list[str]) -> list[str]:
    names = workloads.names() if "all" in requested else list(dict.fromkeys(requested))
    for name in names:
        workloads.get(name)                     # KeyError naming the known ones
    return names


def _child(args, argv) -> int:
    workload = workloads.get(args.workload[0])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        part = run_mode(workload, args.child, args.device, depth=args.depth, steps=args.steps, seed=args.seed,
                        warm=args.warm_units, timed=args.timed_units, units=args.units, memory=args.memory,
                        timeline=not args.no_timeline, prepare=args.prepare,
                        keep=out if args.keep_traces else None, progress=not args.quiet,
                        command=[sys.executable, "-m", "suite.measure.floor", *argv])
    except ModeUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    part["notes"].append(f"process pid {os.getpid()}")
    (out / "part.json").write_text(json.dumps(part, indent=1))
    return 0


def _plan(args, names: list[str]) -> list[tuple[str, str, bool]]:
    """(workload, mode, profiled) per process, workload-major; memory adds stock and cadence."""
    out = []
    for name in names:
        wanted = list(dict.fromkeys([*(("stock", "cadence") if args.memory else ()), *args.timeline_modes]))
        out += [(name, mode, mode in args.timeline_modes) for mode in wanted]
    return out


def _spawn(entry: str, args, name: str, mode: str, profiled: bool, folder: Path) -> dict:
    """Run one process (`python -m entry --child MODE ...`) to its end or its timeout."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", entry, "--child", mode, "--workload", name, "--device", args.device, "--out",
            str(folder), "--units", str(args.units), "--warm-units", str(args.warm_units), "--timed-units",
            str(args.timed_units), "--prepare", args.prepare, "--depth", args.depth, "--quiet"]
    argv += ["--memory"] * args.memory + ["--no-timeline"] * (not profiled) + ["--keep-traces"] * args.keep_traces
    for flag, value in (("--steps", args.steps), ("--seed", args.seed)):
        if value is not None:
            argv += [flag, str(value)]
    environ = dict(os.environ)
    roots = [str(REPO_ROOT / "impl"), str(REPO_ROOT)]
    environ["PYTHONPATH"] = os.pathsep.join(roots + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    t0 = time.perf_counter()
    with open(folder / "log.txt", "w") as log:
        try:
            rc = subprocess.run(argv, cwd=REPO_ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
                                timeout=args.timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = None
    seconds = round(time.perf_counter() - t0, 2)
    tail = (folder / "log.txt").read_text(errors="replace").splitlines()[-5:]
    status = {0: "done", EXIT_UNAVAILABLE: "skipped"}.get(rc, "failed")
    reason = f"timed out after {args.timeout_s:.0f} s" if rc is None else ("" if rc == 0 else f"exit status {rc}")
    return {"status": status, "seconds": seconds, "reason": reason, "log_tail": tail if rc != 0 else []}


def merge(parts: dict, outcomes: dict, names: list[str], parameters: dict, provenance: dict) -> dict:
    """floor.json from the processes' part records: per workload its timelines and memory by mode, and
    cadence - stock of every numeric memory item."""
    out = {"schema": SCHEMA, "parameters": parameters, "provenance": provenance,
           "data_movement_kernels": {k: list(v) for k, v in DATA_MOVEMENT_KERNELS}, "workloads": {}}
    for name in names:
        entry = {"timeline": {}, "memory": {}, "processes": {}}
        for (wl, mode), outcome in outcomes.items():
            if wl != name:
                continue
            entry["processes"][mode] = outcome
            part = parts.get((wl, mode))
            if part is None:
                continue
            if part.get("timeline", {}).get("summary") is not None:
                entry["timeline"][mode] = {**part["timeline"], "prepared": part["prepared"], "notes": part["notes"]}
            if part.get("memory") is not None:
                entry["memory"][mode] = part["memory"]
            out.setdefault("devices", {})[f"{wl}.{mode}"] = part["provenance"].get("device", {}).get("gpu_name")
        stock, cadence = (entry["memory"].get(m, {}).get("items") for m in ("stock", "cadence"))
        if stock and cadence:
            entry["memory_cadence_minus_stock"] = {
                k: round(cadence[k] - stock[k], 3) for k in cadence
                if isinstance(cadence.get(k), (int, float)) and isinstance(stock.get(k), (int, float))}
        out["workloads"][name] = entry
    return out


def tables(record: dict) -> str:
    """The printed summary: per workload and profiled mode the timeline, per workload and mode the memory
    (suite.records.floor's rows)."""
    text = tabulate(timeline_rows(record), headers=TIMELINE_HEADERS)
    mem = memory_rows(record)
    if mem:
        text += "\n\n" + tabulate(mem, headers=MEMORY_HEADERS)
    return text


def main(argv: list[str] | None = None, entry: str = "suite.measure.floor") -> int:
    """The command (module docstring). entry: the module each process runs (`python -m entry --child ...`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
        names = _names(args.workload)
    except SystemExit as exc:
        return int(exc.code or 0)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.child is not None:
        try:
            return _child(args, argv)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "TORCHDYNAMO_DISABLE" not in os.environ and not args.quiet:
        print("floor: note: TORCHDYNAMO_DISABLE is not set (make reproduce sets 1): stepaudio2's encoder chunk, "
              "wrapped in torch.compile(backend='eager'), traces inside the units", flush=True)
    parts, outcomes = {}, {}
    for name, mode, profiled in _plan(args, names):
        folder = out / name / mode
        outcome = _spawn(entry, args, name, mode, profiled, folder)
        outcomes[(name, mode)] = outcome
        if outcome["status"] == "done":
            parts[(name, mode)] = json.loads((folder / "part.json").read_text())
        if not args.quiet:
            print(f"floor: {name} {mode}: {outcome['status']} in {outcome['seconds']:.1f} s {outcome['reason']}",
                  flush=True)
    parameters = {k: v for k, v in vars(args).items() if k not in ("child", "no_timeline", "quiet")}
    record = merge(parts, outcomes, names, parameters,
                   env.provenance([sys.executable, "-m", "suite.measure.floor", *argv]))
    (out / "floor.json").write_text(json.dumps(jsonable(record), indent=1))
    print(tables(record))
    print(f"floor record: {out / 'floor.json'}")
    return 0 if all(o["status"] != "failed" for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
