"""Verify: stock and DuplexCadence sessions on ONE model instance, compared unit by unit, timed in rounds.

Round 1 is a stock session, then a cadence session (the memory probe in it); each further round opens a
fresh session per mode in alternating order, so a drift of the host's speed favours no mode, and compares
every unit again. Each round records its speedup (stock / cadence tail p50 over round 1's measured units)
and the host probe before and after it. A unit differing in any round makes the verdict INVALID. On CUDA a
profile pass comes last (a fresh session per mode, its last PROFILED_SPEAK_UNITS units profiled, their
kernel records put on round 1's units): kineto leaves CUPTI attached once it has profiled
(pytorch/pytorch#144455), which would slow every later timed launch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tabulate import tabulate

from duplexcadence import runtime
from suite.measure import env
from suite.measure.session import (PROFILED_SPEAK_UNITS, ModeUnavailable, RunResult, host_p50, metrics,
                                   mode_result, modes, run_session, setup, build)
from suite.records import headline, run_record


@dataclass
class VerifyResult:
    """Stock and cadence sessions on one model instance, compared unit by unit."""
    stock: RunResult
    cadence: RunResult | None        # None where the adapter has no cadence mode (see notes)
    comparison: list[dict]           # per decoded unit: index, equal, detail
    speedup_x: float | None          # stock tail_ms_p50 / cadence tail_ms_p50 (the rounds' median)
    verdict: str = "VALID"
    invalid_reasons: list[str] = field(default_factory=list)
    invalid_codes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: per round {round, order, stock_tail_ms_p50, cadence_tail_ms_p50, speedup_x, units_compared,
    #: mismatched_units, host_us_per_op: {before, after}, unit_host_p50}; round 1 is stock / cadence above
    rounds: list[dict] = field(default_factory=list)
    #: the CUDA profile pass: {units_compared, mismatched_units, profiled_units: {mode: [index]}}
    profile_pass: dict | None = None

    @property
    def modes(self) -> dict[str, RunResult]:
        return {r.mode: r for r in (self.stock, self.cadence) if r is not None}

    @property
    def mismatches(self) -> list[int]:
        return [c["index"] for c in self.comparison if not c["equal"]]

    def to_dict(self) -> dict:
        comp = None
        if self.cadence is not None:
            comp = {"units": self.comparison, "mismatched_units": self.mismatches,
                    "units_compared": len(self.comparison), "speedup_x": self.speedup_x,
                    "rounds": self.rounds, "profile_pass": self.profile_pass}
        return run_record(vars(self.stock), {m: r.mode_dict() for m, r in self.modes.items()}, comp,
                          self.verdict, self.invalid_reasons, self.invalid_codes, self.notes)

    def audio(self) -> dict[str, np.ndarray]:
        return {m: r.pcm16 for m, r in self.modes.items()}


def compare_outputs(workload_name: str, units, stock: dict, cadence: dict) -> list[dict]:
    """Per decoded unit (every SPEAK unit; a LISTEN unit with a payload too): {index, equal, detail}, by
    `runtime.compare_units` (bytes of the float32 waveform and of the int16 PCM), recorded instead of
    raised. A unit missing from one side is not equal."""
    rows = []
    for rec in units:
        if rec.kind != "SPEAK" and rec.index not in stock:
            continue
        a, b = stock.get(rec.index), cadence.get(rec.index)
        if a is None or b is None:
            rows.append({"index": rec.index, "equal": False, "detail": "unit missing in one mode"})
            continue
        try:
            runtime.compare_units(workload_name, rec.index, a, b)
            rows.append({"index": rec.index, "equal": True, "detail": "identical"})
        except runtime.BitMismatch as exc:
            rows.append({"index": rec.index, "equal": False, "detail": str(exc)})
    return rows


def verify(workload, device, *, depth: str = "released", seconds: float | None = None,
           max_speak_units: int | None = None, steps: int | None = None, seed: int | None = None,
           progress: bool = True, command: list[str] | None = None, rounds: int = 1) -> VerifyResult:
    """Stock then cadence on one model instance, `rounds` timing rounds (module docstring), compared per
    unit. Where the adapter has no cadence mode (not in its MODES, or new_session raising
    NotImplementedError), stock only, said in `notes`. Other arguments as `session.run_workload`.
    Raises ValueError for rounds that is not an int >= 1 (before building anything)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected an int >= 1, got {rounds!r}")
    s = setup(workload, device, depth, seconds, max_speak_units, steps, seed)
    s.parameters["timing_rounds"] = rounds
    prov = env.provenance(command, device=s.device)
    notes, extra = [], []
    with env.deterministic() as det:
        model, probe, _ = build(s, depth)

        def session(mode, label, **kw):
            return run_session(s.adapter, model, mode, s.spec, s.units, s.device, label=f"{workload.name} {label}",
                               progress=progress, **kw)
        host_before = env.host_op_us(s.device)
        stock = mode_result(workload, "stock", s, depth, prov, det, session("stock", "stock", probe=probe,
                                                                             host_samples=True))
        cadence = None
        if "cadence" in modes(s.adapter):
            try:
                cadence = mode_result(workload, "cadence", s, depth, prov, det,
                                      session("cadence", "cadence", probe=probe, host_samples=True))
            except ModeUnavailable as exc:
                notes.append(f"cadence mode not available: {exc}; stock only")
        else:
            notes.append(f"cadence mode not available in adapter {workload.architecture!r}; stock only")
        host_first = {"before": host_before, "after": env.host_op_us(s.device)}
        if cadence is not None:
            measured = {u.index for u in cadence.units if u.measured}
            for r in range(2, rounds + 1):
                extra.append(_timing_round(workload.name, session, s.device, r, measured))
        elif rounds > 1:
            notes.append(f"timing rounds: {rounds} asked, 1 run (no cadence mode to time against)")
        profiled = None
        if s.device.type == "cuda":
            profiled = _profile_pass(workload.name, session, [r.mode for r in (stock, cadence) if r is not None])
            for run in (stock, cadence):
                if run is not None:
                    attach_kernels(run, profiled["kernels"][run.mode])
    result = _verdict(workload.name, stock, cadence, notes)
    if profiled is not None:
        _add_profile_pass(result, profiled)
    if cadence is not None:
        first = {"round": 1, "order": ["stock", "cadence"], "stock_tail_ms_p50": stock.metrics.get("tail_ms_p50"),
                 "cadence_tail_ms_p50": cadence.metrics.get("tail_ms_p50"), "speedup_x": result.speedup_x,
                 "units_compared": len(result.comparison), "mismatched_units": result.mismatches,
                 "host_us_per_op": host_first,
                 "unit_host_p50": {m.mode: host_p50([u for u in m.units if u.measured]) for m in (stock, cadence)}}
        _add_rounds(result, [first, *extra])
    return result


def _timing_round(name: str, session, device, r: int, measured: set) -> dict:
    """One further timing round: a fresh session per mode, the order alternating with r (even r: cadence
    first); p50 tail over round 1's measured units; every unit compared."""
    order = ["cadence", "stock"] if r % 2 == 0 else ["stock", "cadence"]
    host_before = env.host_op_us(device)
    runs = {}
    for mode in order:
        run = session(mode, f"{mode} round {r}", host_samples=True)
        tails = [u.tail_ms for u in run.records if u.index in measured and u.tail_ms is not None]
        runs[mode] = (run, float(np.percentile(tails, 50)) if tails else None,
                      host_p50([u for u in run.records if u.index in measured]))
    rows = compare_outputs(name, runs["stock"][0].records, runs["stock"][0].outputs, runs["cadence"][0].outputs)
    st, ca = runs["stock"][1], runs["cadence"][1]
    return {"round": r, "order": order, "stock_tail_ms_p50": st, "cadence_tail_ms_p50": ca,
            "speedup_x": st / ca if st and ca else None, "units_compared": len(rows),
            "mismatched_units": [row["index"] for row in rows if not row["equal"]],
            "mismatch_details": [row["detail"] for row in rows if not row["equal"]],
            "host_us_per_op": {"before": host_before, "after": env.host_op_us(device)},
            "unit_host_p50": {mode: runs[mode][2] for mode in order}}


def _profile_pass(name: str, session, pass_modes: list[str]) -> dict:
    """A fresh session per mode, its last PROFILED_SPEAK_UNITS SPEAK units under the profiler. Returns
    {kernels: {mode: {unit index: kernels record}}, rows: compare rows ([] with one mode)}."""
    runs = {mode: session(mode, f"{mode} profile pass", profile_units=PROFILED_SPEAK_UNITS) for mode in pass_modes}
    rows = (compare_outputs(name, runs["stock"].records, runs["stock"].outputs, runs["cadence"].outputs)
            if len(runs) == 2 else [])
    return {"kernels": {m: {u.index: u.kernels for u in r.records if u.kernels} for m, r in runs.items()},
            "rows": rows}


def attach_kernels(run: RunResult, kernels: dict) -> None:
    """Put profile-pass kernel records ({unit index: record}) on `run`'s units of the same index and
    recompute its metrics; the units keep their own timing."""
    for u in run.units:
        if u.index in kernels:
            u.kernels = kernels[u.index]
    run.metrics = metrics(run.units)


def _add_profile_pass(result: VerifyResult, profiled: dict) -> None:
    bad = [row for row in profiled["rows"] if not row["equal"]]
    result.profile_pass = {"units_compared": len(profiled["rows"]), "mismatched_units": [r["index"] for r in bad],
                           "profiled_units": {m: sorted(k) for m, k in profiled["kernels"].items()}}
    for row in bad:
        result.invalid_reasons.append(f"profile pass: sha256 mismatch at unit {row['index']}: {row['detail']}")
        result.invalid_codes.append("mismatch")
    if bad:
        result.verdict = "INVALID"


def _add_rounds(result: VerifyResult, rounds: list[dict]) -> None:
    """Attach the timing rounds; with more than one, the speedup is their median."""
    result.rounds = rounds
    for rd in rounds[1:]:
        for idx, detail in zip(rd["mismatched_units"], rd.pop("mismatch_details")):
            result.invalid_reasons.append(f"round {rd['round']}: sha256 mismatch at unit {idx}: {detail}")
            result.invalid_codes.append("mismatch")
    if result.invalid_reasons:
        result.verdict = "INVALID"
    xs = [rd["speedup_x"] for rd in rounds if rd["speedup_x"]]
    if len(rounds) > 1 and xs:
        result.speedup_x = float(np.median(xs))


def _verdict(name: str, stock: RunResult, cadence: RunResult | None, notes: list[str]) -> VerifyResult:
    reasons, codes = [], []
    for run in (stock, cadence):
        for reason, code in zip(run.invalid_reasons, run.invalid_codes) if run is not None else ():
            if code == "dirty_tree" and "dirty_tree" in codes:
                continue
            reasons.append(reason if code == "dirty_tree" else f"{run.mode}: {reason}")
            codes.append(code)
    comparison, speedup = [], None
    if cadence is not None:
        comparison = compare_outputs(name, stock.units, stock.outputs, cadence.outputs)
        for row in comparison:
            if not row["equal"]:
                reasons.append(f"sha256 mismatch at unit {row['index']}: {row['detail']}")
                codes.append("mismatch")
        st, ca = stock.metrics.get("tail_ms_p50"), cadence.metrics.get("tail_ms_p50")
        speedup = st / ca if st and ca else None
    return VerifyResult(stock=stock, cadence=cadence, comparison=comparison, speedup_x=speedup,
                        verdict="INVALID" if reasons else "VALID", invalid_reasons=reasons, invalid_codes=codes,
                        notes=notes)


def _f(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def summary_text(record: dict) -> str:
    """What a verify or one-mode run prints at its end: first whether every unit's bytes matched, then (on
    a CPU) that its times are no speed measurement, then the figures and the verdict."""
    comp = record.get("comparison")
    lines = []
    if comp:
        equal = comp["units_compared"] - len(comp["mismatched_units"])
        again = [r for r in comp.get("rounds") or [] if r.get("round") != 1]
        n2 = sum(r.get("units_compared") or 0 for r in again)
        bad2 = sum(len(r.get("mismatched_units") or []) for r in again)
        lines.append(f"bytes: {equal}/{comp['units_compared']} units byte-identical, stock vs cadence (float32 "
                     f"waveform and int16 PCM)" + (f"; again in later rounds {n2 - bad2}/{n2}" if again else "")
                     + ("" if equal == comp["units_compared"] else f"; DIFFERING units {comp['mismatched_units']}"))
    if not str(record.get("device", "")).startswith("cuda"):
        lines.append("speed: not measured: a CPU run checks the pipeline and the bytes; its times are no speed "
                     "measurement (tail times below are for orientation only)")
    rows = [[mode, _f(m.get("units_measured")), _f(m.get("tail_ms_p50")), _f(m.get("tail_ms_p90")),
             _f(m.get("tail_ms_p99")), _f(m.get("rtf"), ".3f"), f"{_f(headline(run['memory'])[1])}", run["verdict"]]
            for mode, run in record["modes"].items() for m in [run["metrics"]]]
    lines.append(tabulate(rows, headers=["mode", "units measured", "tail ms p50", "p90", "p99", "RTF",
                                         "peak MiB over idle", "verdict"], disable_numparse=True))
    timed = [r for r in (comp or {}).get("rounds") or [] if r.get("speedup_x")]
    if comp and comp.get("speedup_x"):
        xs = [r["speedup_x"] for r in timed]
        band = f" [{min(xs):.3f}-{max(xs):.3f}] over {len(xs)} timing rounds" if len(xs) >= 2 else ""
        lines.append(f"speedup (stock p50 / cadence p50): {comp['speedup_x']:.3f}x{band}")
        for r in timed:
            host = r.get("host_us_per_op") or {}
            lines.append(f"  round {r['round']} ({' then '.join(r['order'])}): {r['stock_tail_ms_p50']:.1f} / "
                         f"{r['cadence_tail_ms_p50']:.1f} ms = {r['speedup_x']:.3f}x, host "
                         f"{_f(host.get('before'), '.2f')} -> {_f(host.get('after'), '.2f')} us/op")
    lines.append(f"verdict: {record['verdict']}")
    lines += [f"  - {r}" for r in record.get("invalid_reasons", [])]
    lines += [f"  note: {n}" for n in record.get("notes", [])]
    return "\n".join(lines)
