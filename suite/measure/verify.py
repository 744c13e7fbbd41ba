"""Verify: stock against DuplexCadence on one model instance, paired unit by unit, over several fresh
processes (suite.measure.verify_process is one), every unit of both compared byte for byte.

Launch ("processes"): `verify` starts N `python -m <entry> verify-process` children. All N set up at once
(model build, priming, captures: nothing is timed then), then each runs its timed part alone, one after
the other, on a "go" written to its stdin, while the others wait blocked on theirs; each exits when done,
its result in a file. "inline": the processes' parts run in this process, one after the other (the only
way with one process; not fresh processes, so for a CPU check and tests).

The record (run.json, schema VERIFY_SCHEMA) pools them: `paired.speedup` (suite.records.paired.summarise
over the A/B pairs: median stock / DuplexCadence ratio, 95% interval over processes and pairs, per host
state), `paired.floor` (the A/A run), `paired.pairs` (every pair of every process with its hashes),
`modes` (process 1's first walk per mode as units, for the per-unit table and tools/same_bytes.py; metrics
pooled over every process's measured pairs, kernel figures from the profiled units), `comparison` (bytes).
INVALID codes: mismatch (an A/B pair's stock and cadence bytes differ, or an A/A pair's two stock
sessions'), capture_in_timed_unit, few_units (a process with fewer than min_measured_units measured
pairs), few_processes (on CUDA: fewer than MIN_PROCESSES), degenerate, no_audio, dirty_tree.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tabulate import tabulate

from suite.measure.paired import clears_floor, noise_floor, summarise
from suite.records import SAMPLE_RATE, UNIT_PERIOD_S, VERIFY_SCHEMA, device_type, jsonable
from suite.records.paired import MIN_PROCESSES, Pair, Protocol, pack_pairs

LAUNCHES = ("processes", "inline")
EXIT_UNAVAILABLE_CHILD = 4     # suite.records.EXIT_UNAVAILABLE, as a verify-process exits with it


@dataclass
class VerifyResult:
    """A verify record (`to_dict()`) and process 1's audio per mode (`audio()`: int16 PCM of its first walk)."""
    record: dict
    pcm16: dict

    @property
    def verdict(self) -> str:
        return self.record["verdict"]

    @property
    def notes(self) -> list:
        return self.record["notes"]

    def to_dict(self) -> dict:
        return self.record

    def audio(self) -> dict:
        return self.pcm16


def verify(workload, device, *, protocol: Protocol | None = None, launch: str | None = None,
           entry: str = "suite.measure.stage", depth: str = "released", seconds: float | None = None,
           max_speak_units: int | None = None, steps: int | None = None, seed: int | None = None,
           progress: bool = True, command: list[str] | None = None) -> VerifyResult:
    """The paired verify of `workload` on `device` (module docstring). protocol: suite.records.paired.Protocol
    (default: its defaults); launch: "processes" | "inline" (default: processes when there are two or more);
    entry: the module the children run as `python -m entry verify-process` (the stage's own, so a test's
    stage entry carries its registrations). Other arguments as `session.run_workload`. Raises ValueError
    for a launch not in LAUNCHES; ModeUnavailable where the adapter has no cadence mode; RuntimeError when
    a process fails."""
    protocol = protocol or Protocol()
    launch = launch or ("processes" if protocol.processes > 1 else "inline")
    if launch not in LAUNCHES:
        raise ValueError(f"launch: expected one of {LAUNCHES}, got {launch!r}")
    opts = dict(depth=depth, seconds=seconds, max_speak_units=max_speak_units, steps=steps, seed=seed)
    if launch == "inline":
        results = _inline(workload, device, protocol, opts, progress, command)
    else:
        results = _spawn(workload.name, device, protocol, entry, opts, progress)
    return assemble(results, protocol, launch, command)


def _inline(workload, device, protocol: Protocol, opts: dict, progress: bool, command) -> list[dict]:
    from suite.measure import env
    from suite.measure.verify_process import Process

    n = protocol.processes
    with env.deterministic() as flags:
        procs = [Process(workload, device, protocol, index=i, profile=i == n, progress=progress, command=command,
                         flags=flags, **opts) for i in range(1, n + 1)]
        try:
            for proc in procs:
                proc.set_up()
            return [proc.timed() for proc in procs]
        finally:
            for proc in procs:
                proc.close()


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the verify dies."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):                   # not Linux: the stage's timeout still ends it
        pass


def _read_line(fd: int) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _failed(i: int, rc: int, when: str) -> Exception:
    if rc == EXIT_UNAVAILABLE_CHILD:
        from suite.measure.session import ModeUnavailable
        return ModeUnavailable(f"verify process {i}: the adapter lacks a mode (exit status {rc}, {when})")
    return RuntimeError(f"verify process {i} failed {when} with exit status {rc} (its output is above in the log)")


def _spawn(name: str, device: str, protocol: Protocol, entry: str, opts: dict, progress: bool) -> list[dict]:
    from suite.measure.verify_process import read_result

    work = Path(tempfile.mkdtemp(prefix="duplexcadence-verify-"))
    n, procs = protocol.processes, []
    base = [sys.executable, "-m", entry, "verify-process", "--workload", name, "--device", str(device),
            "--protocol", json.dumps(protocol.to_dict())]
    for key, value in opts.items():
        if value is not None:
            base += [f"--{key.replace('_', '-')}", str(value)]
    if not progress:
        base.append("--quiet")
    try:
        for i in range(1, n + 1):
            r, w = os.pipe()
            argv = base + ["--index", str(i), "--result", str(work / f"process_{i}.json"), "--ready-fd", str(w)]
            argv += ["--profile"] if i == n else []
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=(w,), preexec_fn=_die_with_parent)
            finally:
                os.close(w)
            procs.append((i, proc, r))
        print(f"verify: {n} processes started; each sets up, then each runs its timed part alone", flush=True)
        for i, proc, r in procs:
            if _read_line(r) != "ready":
                raise _failed(i, proc.wait(), "in its set-up")
        results = []
        for i, proc, _ in procs:
            print(f"verify: process {i} of {n}: timed part", flush=True)
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            rc = proc.wait()
            if rc != 0:
                raise _failed(i, rc, "in its timed part")
            results.append(read_result(work / f"process_{i}.json"))
        return results
    finally:
        for _, proc, r in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(r)
        shutil.rmtree(work, ignore_errors=True)


# --- the record --------------------------------------------------------------------------------------------
def _pct(values, q) -> float:
    return float(np.percentile(values, q))


def arm_metrics(processes: list[list[Pair]], arm: str) -> dict:
    """One arm's figures ("a" stock, "b" cadence) over every process's A/B pairs: tail ms over the measured
    pairs (p50, p90, p99, mean, min, max), RTF, the tail against the 1 s period, misses; kernel figures
    (p50 over the profiled units) and tail / kernel-busy; graph counters: eager first occurrences and
    captures inside timed calls (in measured pairs, and in all), captures right after them."""
    every = [q for proc in processes for q in proc]
    measured = [q for q in every if q.measured]
    prof = [k for q in every if q.profiled and (k := getattr(q, f"{arm}_kernels"))]
    out = {"units_total": len(every), "speak_units": sum(q.kind == "SPEAK" for q in every),
           "units_measured": len(measured), "processes": len(processes), "units_profiled": len(prof),
           "eager_fallbacks_measured_units": sum(getattr(q, f"{arm}_eager") for q in measured),
           "graph_captures_measured_units": sum(getattr(q, f"{arm}_captures") for q in measured),
           "eager_first_occurrences": sum(getattr(q, f"{arm}_eager") for q in every),
           "captures_in_timed_units": sum(getattr(q, f"{arm}_captures") for q in every),
           "captures_after_units": sum(getattr(q, f"{arm}_captured") for q in every)}
    for key, name in (("kernel_launches", "kernel_launches_per_unit_p50"),
                      ("graph_launches", "graph_launches_per_unit_p50"), ("kernels", "kernels_per_unit_p50"),
                      ("kernel_busy_ms", "kernel_busy_ms_per_unit_p50"), ("gpu_busy_ms", "gpu_busy_ms_per_unit_p50")):
        if prof:
            out[name] = _pct([k[key] for k in prof], 50)
    if not measured:
        return out
    tail = np.array([getattr(q, f"{arm}_ms") for q in measured], dtype=np.float64)
    audio_s = sum(q.samples for q in measured) / SAMPLE_RATE
    p50, period_ms = _pct(tail, 50), UNIT_PERIOD_S * 1e3
    out.update(tail_ms_p50=p50, tail_ms_p90=_pct(tail, 90), tail_ms_p99=_pct(tail, 99), tail_ms_mean=float(tail.mean()),
               tail_ms_min=float(tail.min()), tail_ms_max=float(tail.max()), audio_s_measured=audio_s,
               rtf=float(tail.sum() / 1e3 / audio_s) if audio_s > 0 else None,
               tail_vs_period_pct_p50=100.0 * (p50 / period_ms - 1.0), deadline_misses=int(np.sum(tail > period_ms)))
    busy = out.get("kernel_busy_ms_per_unit_p50")
    if busy:
        out["tail_over_kernel_busy_x"] = p50 / busy
    return out


def _listed(rows: list[str], most: int = 8) -> list[str]:
    return rows[:most] + ([f"... and {len(rows) - most} more"] if len(rows) > most else [])


def assemble(results: list[dict], protocol: Protocol, launch: str, command: list[str] | None) -> VerifyResult:
    """The verify record from the processes' results (module docstring)."""
    first = results[0]
    ab = [[Pair.from_dict(d) for d in r["ab"]] for r in results]
    aa = [[Pair.from_dict(d) for d in r["aa"]] for r in results if r.get("aa")]
    speed = summarise(ab)
    floor = noise_floor(aa) if aa else None
    params = {**first["parameters"], "warmup_speak_units": protocol.warmup_for(first["parameters"]["speak_units_run"]),
              **protocol.to_dict(),
              "launch": launch}
    prov = {**first["provenance"], "command": list(command if command is not None else sys.argv)}
    reasons, codes, notes = [], [], []

    def bad(code: str, reason: str) -> None:
        reasons.append(reason)
        codes.append(code)
    modes = {}
    for mode, arm in (("stock", "a"), ("cadence", "b")):
        judged = first["judged"][mode]
        for reason, code in zip(judged["reasons"], judged["codes"]):
            if code != "dirty_tree":
                bad(code, f"{mode}: {reason}")
            elif "dirty_tree" not in codes:
                bad(code, reason)
        modes[mode] = {"mode": mode, "units": first["units"][mode], "memory": {}, "metrics": arm_metrics(ab, arm),
                       "session_stats": first["session_stats"][mode], "capabilities": first["capabilities"][mode],
                       "prepared": first.get("prepared") if mode == "cadence" else None,
                       "verdict": "INVALID" if judged["codes"] else "VALID", "invalid_reasons": judged["reasons"],
                       "invalid_codes": judged["codes"],
                       "audio_samples": int(np.asarray((first.get("pcm16") or {}).get(mode, [])).size)}
    differ = [(i, q) for i, proc in enumerate(ab, 1) for q in proc if not q.equal]
    for line in _listed([f"process {i} pass {q.walk} unit {q.index}: stock and cadence bytes differ" for i, q in differ]):
        bad("mismatch", line)
    aa_differ = [(i, q) for i, proc in enumerate(aa, 1) for q in proc if not q.equal]
    for line in _listed([f"A/A process {i} unit {q.index}: the two stock sessions' bytes differ" for i, q in aa_differ]):
        bad("mismatch", line)
    inside = [f"{run} process {i} pass {q.walk} unit {q.index}" for run, runs in (("A/B", ab), ("A/A", aa))
              for i, proc in enumerate(runs, 1) for q in proc if q.a_captures or q.b_captures]
    for line in _listed(inside):
        bad("capture_in_timed_unit", f"graph capture inside a timed unit ({line}): graphs are captured ahead or "
                                     f"right after a unit, never inside one")
    least = params.get("min_measured_units", 0)
    for i, proc in enumerate(ab, 1):
        n = sum(q.measured for q in proc)
        if n < least:
            why = f" (run limited by {first['limited']})" if first.get("limited") else " (the whole script)"
            bad("few_units", f"process {i}: {n} measured pairs < {least}{why}")
    if device_type(first["provenance"]["device"]["device"]) == "cuda" and len(ab) < MIN_PROCESSES:
        bad("few_processes", f"{len(ab)} processes < {MIN_PROCESSES}: the interval needs the spread between processes")
    ref = {(q.walk, q.index): (q.sha256_a, q.sha256_b) for q in ab[0]}
    apart = sum(ref.get((q.walk, q.index)) not in (None, (q.sha256_a, q.sha256_b)) for proc in ab[1:] for q in proc)
    if apart:
        notes.append(f"{apart} unit(s) of processes 2-{len(ab)} hashed differently from process 1's same unit "
                     f"(both modes equal within each process)")
    if launch == "inline" and len(ab) > 1:
        notes.append(f"{len(ab)} processes run inline in one process (not fresh processes)")
    comparison = {"protocol": "paired", "units_compared": sum(len(p) for p in ab),
                  "script_units_compared": len({q.index for proc in ab for q in proc}),
                  "mismatched_units": sorted({q.index for _, q in differ}),
                  "mismatches": [{"process": i, "walk": q.walk, "index": q.index} for i, q in differ],
                  "aa_units_compared": sum(len(p) for p in aa), "aa_mismatched_units": sorted({q.index for _, q in aa_differ}),
                  "speedup_x": speed.speedup, "ci_low": speed.ci_low, "ci_high": speed.ci_high}
    processes = [{k: r.get(k) for k in ("index", "pid", "started_utc", "timed_utc", "ended_utc", "seconds", "aa_copy",
                                        "profiled", "prepared")}
                 | {"measured_pairs": sum(q.measured for q in proc), "gpu_uuid": r["provenance"]["device"].get("gpu_uuid"),
                    "cadence_eager_first": sum(q.b_eager for q in proc), "cadence_captured_after": sum(q.b_captured for q in proc)}
                 for r, proc in zip(results, ab)]
    rows = [{"process": i, "run": run, **q.to_dict()} for run, runs in (("ab", ab), ("aa", aa))
            for i, proc in enumerate(runs, 1) for q in proc]
    paired = {"protocol": {**protocol.to_dict(), "launch": launch}, "speedup": speed.to_dict(),
              "floor": floor.to_dict() if floor else None,
              "clears_floor": clears_floor(speed, floor) if floor else None,
              "processes": processes, "pairs": pack_pairs(rows)}
    record = jsonable({"schema": VERIFY_SCHEMA, "workload": first["workload"], "device": first["device"],
                       "depth": params.get("depth"), "parameters": params, "seeds": first["seeds"], "provenance": prov,
                       "determinism": first["determinism"], "sample_rate": SAMPLE_RATE, "modes": modes,
                       "comparison": comparison, "paired": paired, "verdict": "INVALID" if reasons else "VALID",
                       "invalid_reasons": reasons, "invalid_codes": codes, "notes": notes})
    return VerifyResult(record, dict(first.get("pcm16") or {}))


# --- the console -----------------------------------------------------------------------------------------
def _f(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def summary_text(record: dict) -> str:
    """What a verify or one-mode run prints at its end: first whether every unit's bytes matched, then (on
    a CPU) that its times are no speed measurement, then the figures and the verdict."""
    comp, lines = record.get("comparison"), []
    if comp:
        n, bad = comp["units_compared"], comp["mismatched_units"]
        aa = comp.get("aa_units_compared")
        lines.append(f"bytes: {n - len(comp.get('mismatches', bad))}/{n} units byte-identical, stock vs cadence "
                     f"(float32 waveform and int16 PCM)" + (f"; A/A stock vs stock {aa - len(comp['aa_mismatched_units'])}"
                                                              f"/{aa}" if aa else "")
                     + (f"; DIFFERING units {bad}" if bad else ""))
    if not str(record.get("device", "")).startswith("cuda"):
        lines.append("speed: not measured: a CPU run checks the pipeline and the bytes; its times are no speed "
                     "measurement (tail times below are for orientation only)")
    rows = [[mode, _f(m.get("units_measured")), _f(m.get("tail_ms_p50")), _f(m.get("tail_ms_p90")),
             _f(m.get("tail_ms_p99")), _f(m.get("rtf"), ".3f"), _f(m.get("eager_first_occurrences")),
             ("pass" if run["verdict"] == "VALID" else run["verdict"]) if m.get("units_measured")
             else "- (no unit measured)"]
            for mode, run in record["modes"].items() for m in [run["metrics"]]]
    lines.append(tabulate(rows, headers=["mode", "units measured", "tail ms p50", "p90", "p99", "RTF",
                                         "eager first occurrences", "mode's own checks"], disable_numparse=True))
    paired = record.get("paired") or {}
    sp, floor = paired.get("speedup") or {}, paired.get("floor") or {}
    if sp.get("speedup") is not None:
        lines.append(f"speedup (median stock / cadence per pair): {sp['speedup']:.3f}x [{sp['ci_low']:.3f}-"
                     f"{sp['ci_high']:.3f}] over {sp['processes']} processes, {sp['pairs']} pairs")
        for name, st in (sp.get("states") or {}).items():
            lines.append(f"  {name} host ({_f(st.get('probe_median'), '.2f')} us/op): {st['speedup']:.3f}x "
                         f"[{st['ci_low']:.3f}-{st['ci_high']:.3f}], {st['pairs']} pairs")
    if floor.get("speedup") is not None:
        lines.append(f"A/A floor (stock / stock): {floor['speedup']:.3f}x [{floor['ci_low']:.3f}-{floor['ci_high']:.3f}]"
                     f", {floor['pairs']} pairs; the speedup {'clears' if paired.get('clears_floor') else 'does NOT clear'}"
                     f" it")
    lines.append(f"verdict: {record['verdict']}")
    lines += [f"  - {r}" for r in record.get("invalid_reasons", [])]
    lines += [f"  note: {n}" for n in record.get("notes", [])]
    return "\n".join(lines)
