"""Drive one session of a workload's script through its adapter, unit by unit, and measure every unit.

The session (`adapter.new_session`, duplexcadence.session.Session) is prepared at open with
`session.prepare(None)`: what every turn of the voice needs, as a server captures at voice registration;
nothing from the script. Then every unit with a payload calls `session.speak(payload, final=...)` (after
`start_turn()` on a turn's first unit) inside the timer, `session.stats()` is read after it, and
`session.close()` ends the session. Timing: CUDA events around the whole call (synchronised) on CUDA,
perf_counter on CPU; statistics over the SPEAK units after the first WARMUP_SPEAK_UNITS. The verdict is
VALID or INVALID with a code per reason: few_units, degenerate, no_audio, dirty_tree, capture_in_timed_unit
(a graph captured inside a measured unit), and in verify mismatch.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from duplexcadence import gate, runtime
from duplexcadence.session import SessionStats
from suite.measure import env
from suite.measure.memory import MemoryProbe
from suite.records import SAMPLE_RATE, UNIT_PERIOD_S, UnitRecord, jsonable, run_record

WARMUP_SPEAK_UNITS = 3      # first SPEAK units of a run, timed but not in the statistics
MIN_MEASURED_UNITS = 30     # medians and p99 over >= 30 units after warm-up
STD_MIN = 1e-4              # a SPEAK unit quieter than this is degenerate
CLIP_LEVEL = 0.99           # |x| at or above this counts as clipped
CLIP_FRACTION_MAX = 0.5     # more than this fraction clipped is degenerate


@dataclass
class RunResult:
    """One session of one mode. `pcm16` (int16 [samples] @ 24 kHz, the decoded units concatenated) and
    `outputs` (unit index -> UnitOutput) stay in memory; `to_dict()` is the run record."""
    workload: dict
    mode: str
    device: str
    depth: str
    parameters: dict
    seeds: dict
    provenance: dict
    determinism: dict
    units: list[UnitRecord]
    memory: dict
    metrics: dict
    session_stats: dict | None
    prepared: dict | None = None        # session.prepare(None) at open: {"counters", "ms"}
    capabilities: dict | None = None
    verdict: str = "VALID"
    invalid_reasons: list[str] = field(default_factory=list)
    invalid_codes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pcm16: np.ndarray = field(default_factory=lambda: np.zeros(0, "<i2"), repr=False)
    outputs: dict = field(default_factory=dict, repr=False)

    def mode_dict(self) -> dict:
        """This mode's part of the record."""
        return jsonable({"mode": self.mode, "units": [dataclasses.asdict(u) for u in self.units],
                         "memory": self.memory, "metrics": self.metrics, "session_stats": self.session_stats,
                         "prepared": self.prepared, "capabilities": self.capabilities, "verdict": self.verdict,
                         "invalid_reasons": self.invalid_reasons, "invalid_codes": self.invalid_codes,
                         "audio_samples": int(self.pcm16.size)})

    def to_dict(self) -> dict:
        return run_record(vars(self), {self.mode: self.mode_dict()}, None, self.verdict, self.invalid_reasons,
                          self.invalid_codes, self.notes)

    def audio(self) -> dict[str, np.ndarray]:
        return {self.mode: self.pcm16}


@dataclass
class SessionRun:
    """What `run_session` measured."""
    records: list[UnitRecord]
    outputs: dict
    pcm16: np.ndarray
    memory: dict
    stats: dict
    prepared: dict
    capabilities: dict


# --- the script ----------------------------------------------------------------------------------------
def select_units(workload, *, seconds: float | None = None, max_speak_units: int | None = None) -> list:
    """The units to run: the workload's script (`workload.session_script()`, validated), cut to its first
    `max_speak_units` SPEAK units over at least 2 turns (whole turns; a cut turn keeps its final unit) and/or
    to the units starting before `seconds` (a turn cut there stays unflushed). Raises ValueError for a limit
    that is not a finite positive number, one too small for 2 turns, or a cut that leaves no SPEAK unit."""
    for name, value in (("seconds", seconds), ("max_speak_units", max_speak_units)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name}: expected a finite positive number or None, got {value!r}")
    script = workload.session_script()
    if max_speak_units is not None:
        script = script.select(max_speak_units, min_turns=2)
    units = [u for u in script.units if seconds is None or u.t_start_s < seconds]
    if not any(u.kind == "SPEAK" for u in units):
        where = f"the first {seconds:g} s of {workload.name}'s script" if seconds is not None else \
            f"{workload.name}'s script"
        raise ValueError(f"seconds: {where} hold no SPEAK unit (nothing to compare)"
                         + ("; give more seconds" if seconds is not None else ""))
    return units


def payload_of(unit) -> tuple[object, str, int]:
    """(payload for speak(), "tokens" | "frames", its size) of a unit; (None, "none", 0) without one."""
    if unit.tokens is not None:
        return unit.tokens, "tokens", len(unit.tokens)
    if unit.codes is not None:
        return unit.codes, "frames", len(unit.codes[0]) if len(unit.codes) else 0
    return None, "none", 0


def make_spec(workload, steps: int | None = None) -> dict:
    """What the adapter builds from: workload.spec plus the voice prompt, its length and the dtype, and the
    Euler steps under `n_timesteps` (stock Token2wav's name): `steps`, else the spec's, else the workload's; the
    workload's checkpoint in env.checkpoints(), if any, under `checkpoint`."""
    spec = dict(workload.spec or {})
    if workload.name in env.checkpoints():                  # real weights (env.CHECKPOINT_ENV)
        spec["checkpoint"] = env.checkpoints()[workload.name]
    spec["voice_prompt"] = workload.voice_prompt
    spec["prompt_seconds"] = workload.prompt_seconds
    spec.setdefault("dtype", workload.dtype)
    n = steps if steps is not None else spec.get("n_timesteps", workload.euler_steps)
    if n is not None:
        spec["n_timesteps"] = int(n)
    return spec


def workload_dict(workload) -> dict:
    """The workload definition as plain data (the script by reference, not its units)."""
    fields = {f.name: getattr(workload, f.name) for f in dataclasses.fields(workload)}
    if not isinstance(fields.get("script"), (str, Path, type(None))):
        fields["script"] = getattr(fields["script"], "path", type(fields["script"]).__name__)
    return jsonable(fields)


# --- timing and sanity -----------------------------------------------------------------------------------
class UnitTimer:
    """Times one call: CUDA events + synchronize on CUDA, perf_counter on CPU (and always wall)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def __call__(self, fn, *args, **kwargs):
        """Returns (fn's result, tail_ms, wall_ms)."""
        if self.cuda:
            gate.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if not self.cuda:
            wall = (time.perf_counter() - t0) * 1e3
            return out, wall, wall
        end.record()
        gate.synchronize(self.device)
        return out, float(start.elapsed_time(end)), (time.perf_counter() - t0) * 1e3


def sanity(wave: np.ndarray) -> tuple[float | None, float | None]:
    """(std, fraction of samples with |x| >= CLIP_LEVEL) of a float waveform; (None, None) if empty."""
    if wave.size == 0:
        return None, None
    x = wave.astype(np.float64, copy=False)
    return float(x.std()), float(np.mean(np.abs(x) >= CLIP_LEVEL))


def counters(stats: SessionStats) -> dict:
    """A SessionStats as a record's per-unit `stats`: every field but `detail`."""
    return {k: v for k, v in stats.to_dict().items() if k != "detail"}


def metrics(units: list[UnitRecord], sample_rate: int = SAMPLE_RATE, period_s: float = UNIT_PERIOD_S) -> dict:
    """Statistics over the measured SPEAK units (ms, seconds, ratios; keys carry the unit), the kernel
    figures of the profiled units, and the graph counters' changes over the measured units."""
    measured = [u for u in units if u.measured and u.tail_ms is not None]
    prof = [u.kernels for u in units if u.kernels]
    out = {"units_total": len(units), "speak_units": sum(u.kind == "SPEAK" for u in units),
           "units_measured": len(measured), "warmup_units": WARMUP_SPEAK_UNITS, "units_profiled": len(prof)}
    if prof:
        for key, name in (("kernel_launches", "kernel_launches_per_unit_p50"),
                          ("graph_launches", "graph_launches_per_unit_p50"), ("kernels", "kernels_per_unit_p50"),
                          ("kernel_busy_ms", "kernel_busy_ms_per_unit_p50"), ("gpu_busy_ms", "gpu_busy_ms_per_unit_p50")):
            out[name] = float(np.percentile([p[key] for p in prof], 50))
    if not measured:
        return out
    tail = np.array([u.tail_ms for u in measured], dtype=np.float64)
    wall = np.array([u.wall_ms for u in measured], dtype=np.float64)
    audio_s = sum(u.samples for u in measured) / sample_rate
    p50 = float(np.percentile(tail, 50))
    out.update({
        "tail_ms_p50": p50, "tail_ms_p90": float(np.percentile(tail, 90)),
        "tail_ms_p99": float(np.percentile(tail, 99)), "tail_ms_mean": float(tail.mean()),
        "tail_ms_min": float(tail.min()), "tail_ms_max": float(tail.max()),
        "wall_ms_p50": float(np.percentile(wall, 50)), "audio_s_measured": audio_s,
        "rtf": float(tail.sum() / 1e3 / audio_s) if audio_s > 0 else None,
        "tail_vs_period_pct_p50": 100.0 * (p50 / (period_s * 1e3) - 1.0),
        "deadline_misses": int(np.sum(tail > period_s * 1e3)),
    })
    out.update(graph_deltas(units, measured))
    if prof:
        busy = out["kernel_busy_ms_per_unit_p50"]
        out["tail_over_kernel_busy_x"] = p50 / busy if busy > 0 else None
    return out


GRAPH_COUNTERS = ("captures", "replays", "eager_fallbacks", "warmup_runs")


def graph_deltas(units: list[UnitRecord], measured: list[UnitRecord]) -> dict:
    """Per-unit changes of the session's cumulative graph counters (UnitRecord.stats) over the measured
    units: captures, eager fallbacks and eager first runs in them, and replays per unit."""
    prev, deltas = {k: 0 for k in GRAPH_COUNTERS}, {}
    for u in units:
        if u.stats:
            deltas[u.index] = {k: u.stats[k] - prev[k] for k in GRAPH_COUNTERS}
            prev = {k: u.stats[k] for k in GRAPH_COUNTERS}
    rows = [deltas[u.index] for u in measured if u.index in deltas]
    if not rows:
        return {}
    return {"graph_captures_measured_units": int(sum(r["captures"] for r in rows)),
            "eager_fallbacks_measured_units": int(sum(r["eager_fallbacks"] for r in rows)),
            "warmup_runs_measured_units": int(sum(r["warmup_runs"] for r in rows)),
            "units_with_capture": [u.index for u in measured if deltas.get(u.index, {}).get("captures")],
            "graph_replays_per_unit_p50": float(np.percentile([r["replays"] for r in rows], 50))}


def judge(units: list[UnitRecord], provenance: dict, metrics_: dict, *, min_units: int = MIN_MEASURED_UNITS,
          limited: str | None = None) -> tuple[list[str], list[str]]:
    """(reasons, codes) that make a run INVALID; both empty means VALID.
    limited: how the run was cut short, if it was (named in the few_units reason)."""
    reasons, codes = [], []
    speak = [u for u in units if u.kind == "SPEAK"]
    n = sum(1 for u in speak if u.measured)
    if n < min_units:
        why = f" (run limited by {limited})" if limited else " (the whole script)"
        reasons.append(f"{n} measured SPEAK units < {min_units}{why}")
        codes.append("few_units")
    for u in speak:
        if u.std is not None and (u.std < STD_MIN or u.clipped_frac > CLIP_FRACTION_MAX):
            reasons.append(f"degenerate audio at unit {u.index}: std {u.std:.3g}, clipped {u.clipped_frac:.1%} "
                           f"(need std >= {STD_MIN:g}, clipped <= {CLIP_FRACTION_MAX:.0%})")
            codes.append("degenerate")
    if speak and all(u.samples == 0 for u in speak):
        reasons.append("no SPEAK unit produced audio")
        codes.append("no_audio")
    if metrics_.get("units_with_capture"):
        reasons.append(f"graph capture inside timed unit(s) {metrics_['units_with_capture']}: graphs are "
                       f"captured ahead (session.prepare), never inside a timed unit")
        codes.append("capture_in_timed_unit")
    if provenance.get("git_dirty"):
        reasons.append("dirty tree: uncommitted changes (see provenance.git_status)")
        codes.append("dirty_tree")
    return reasons, codes


class ModeUnavailable(RuntimeError):
    """The adapter has no implementation of the requested mode (yet)."""


def open_session(adapter, model, mode: str, spec: dict):
    """adapter.new_session(model, mode, spec); ModeUnavailable where the adapter raises NotImplementedError."""
    try:
        return adapter.new_session(model, mode, spec)
    except NotImplementedError as exc:
        raise ModeUnavailable(f"{adapter.__name__}: mode {mode!r} not implemented ({exc})") from exc


def modes(adapter) -> tuple:
    """The modes an adapter declares (its MODES; runtime.MODES where it declares none)."""
    return tuple(getattr(adapter, "MODES", runtime.MODES))


# --- one session -----------------------------------------------------------------------------------------
def run_session(adapter, model, mode: str, spec: dict, units: list, device: torch.device, *,
                probe: MemoryProbe | None = None, label: str = "", progress: bool = True) -> SessionRun:
    """Open one session, prepare it (`prepare(None)`), walk the units, close it. The first
    WARMUP_SPEAK_UNITS SPEAK units are marked measured=False.

    A LISTEN unit with a payload (Moshi decodes every frame) is decoded with final=False outside any turn,
    timed and hashed, never measured. progress: a line per decoded unit.
    Raises ValueError for a unit kind other than LISTEN / SPEAK."""
    if probe is not None:
        probe.begin_session()
    session = open_session(adapter, model, mode, spec)
    try:
        t0 = time.perf_counter()
        prep = session.prepare(None)
        if device.type == "cuda":
            gate.synchronize(device)
        prepared = {"counters": jsonable(prep), "ms": (time.perf_counter() - t0) * 1e3}
        timer = UnitTimer(device)
        records, outputs, pcm = [], {}, []
        open_turn, n_speak = None, 0
        for unit in units:
            if unit.kind not in ("LISTEN", "SPEAK"):
                raise ValueError(f"unit {unit.index}: kind {unit.kind!r}, expected 'LISTEN' or 'SPEAK'")
            payload, what, size = payload_of(unit)
            speak = unit.kind == "SPEAK"
            rec = UnitRecord(index=int(unit.index), kind=unit.kind, turn=None if unit.turn is None else int(unit.turn),
                             final=bool(unit.final), t_start_s=float(unit.t_start_s), payload=what, payload_size=size)
            records.append(rec)
            if not speak and payload is None:
                continue
            if speak and unit.turn != open_turn:
                session.start_turn()
                open_turn = unit.turn
            final = bool(speak and unit.final)
            out, rec.tail_ms, rec.wall_ms = timer(session.speak, payload, final=final)
            if final:
                open_turn = None
            rec.samples = out.samples
            rec.sha256_f32, rec.sha256_pcm16 = out.sha256()
            rec.std, rec.clipped_frac = sanity(np.asarray(out.waveform).reshape(-1))
            rec.measured = speak and n_speak >= WARMUP_SPEAK_UNITS
            rec.info = jsonable(out.info)
            n_speak += speak
            outputs[rec.index] = out
            pcm.append(np.asarray(out.pcm16, dtype="<i2").reshape(-1))
            rec.stats = counters(session.stats())
            if probe is not None:
                probe.observe()
            if progress:
                print(f"  {label or mode}: unit {rec.index} {rec.kind} {rec.wall_ms:.1f} ms", flush=True)
        stats = jsonable(session.stats().to_dict())
        capabilities = jsonable(dataclasses.asdict(session.capabilities))
        memory = probe.end_session() if probe is not None else {}
    finally:
        session.close()
    del session
    gc.collect()
    pcm16 = np.concatenate(pcm) if pcm else np.zeros(0, "<i2")
    return SessionRun(records, outputs, pcm16, memory, stats, prepared, capabilities)


# --- a one-mode run ---------------------------------------------------------------------------------------
@dataclass
class Setup:
    """What a run needs before it builds anything."""
    device: torch.device
    adapter: object
    spec: dict
    seeds: dict
    units: list
    parameters: dict
    limited: str | None            # how the script was cut ("--max-speak-units 4"), None: the whole script


def setup(workload, device, depth, seconds, max_speak_units, steps, seed, mode=None) -> Setup:
    """Resolve a run's adapter, spec, seeds, units and parameters. Raises ValueError for a mode the adapter
    does not declare or a bad limit, KeyError for an unknown architecture."""
    adapter = runtime.adapter(workload.architecture)
    if mode is not None and mode not in modes(adapter):
        raise ValueError(f"mode: expected one of {modes(adapter)} (adapter {adapter.__name__}), got {mode!r}")
    spec = make_spec(workload, steps)
    seeds = dict(workload.seeds or {})
    if seed is not None:
        seeds["weights"] = seed
    units = select_units(workload, seconds=seconds, max_speak_units=max_speak_units)
    limits = [f"--{k.replace('_', '-')} {v}" for k, v in
              (("max_speak_units", max_speak_units), ("seconds", seconds)) if v is not None]
    params = {"depth": depth, "euler_steps": spec.get("n_timesteps"), "seconds": seconds,
              "max_speak_units": max_speak_units, "seed": seeds.get("weights", 0),
              "warmup_speak_units": WARMUP_SPEAK_UNITS, "min_measured_units": MIN_MEASURED_UNITS,
              "units_run": len(units), "speak_units_run": sum(u.kind == "SPEAK" for u in units),
              "turns_run": len({u.turn for u in units if u.kind == "SPEAK"}),
              "spec": spec, "std_min": STD_MIN, "clip_level": CLIP_LEVEL,
              "clip_fraction_max": CLIP_FRACTION_MAX, "unit_period_s": UNIT_PERIOD_S}
    return Setup(torch.device(device), adapter, spec, seeds, units, params, " and ".join(limits) or None)


def build(s: Setup, depth: str, mode: str | None = None):
    """Build the model; in a one-mode process the adapter's `for_mode(model, mode)`, where it has one, drops
    what that mode never uses before the model-loaded memory sample. Returns (model, probe, its report)."""
    probe = MemoryProbe(s.device)
    model = s.adapter.build_model(s.spec, device=s.device, depth=depth, seed=s.seeds.get("weights", 0))
    hook = getattr(s.adapter, "for_mode", None)
    dropped = hook(model, mode) if (mode is not None and callable(hook)) else {}
    probe.model_loaded()
    return model, probe, dropped or {}


def mode_result(workload, mode: str, s: Setup, depth: str, prov: dict, det: dict, run: SessionRun) -> RunResult:
    m = metrics(run.records)
    reasons, codes = judge(run.records, prov, m, limited=s.limited)
    return RunResult(workload=workload_dict(workload), mode=mode, device=str(s.device), depth=depth,
                     parameters=s.parameters, seeds=s.seeds, determinism=det, units=run.records,
                     provenance={**prov, "weights": env.weights(workload.name, s.seeds.get("weights", 0))},
                     memory=run.memory, metrics=m, session_stats=run.stats, prepared=run.prepared,
                     capabilities=run.capabilities, verdict="INVALID" if reasons else "VALID",
                     invalid_reasons=reasons, invalid_codes=codes, pcm16=run.pcm16, outputs=run.outputs)


def run_workload(workload, mode: str, device, *, depth: str = "released", seconds: float | None = None,
                 max_speak_units: int | None = None, steps: int | None = None, seed: int | None = None,
                 progress: bool = True, command: list[str] | None = None) -> RunResult:
    """Build the workload's model, run one `mode` session over its script, measure every unit (a memory
    stage: no profiler, no host samples). mode: one of the adapter's MODES. depth: "released" | "reduced".
    seconds / max_speak_units cut the script (`select_units`); steps: Euler steps; seed: the weights seed.
    Raises ValueError for a mode the adapter does not declare, KeyError for an unknown architecture."""
    s = setup(workload, device, depth, seconds, max_speak_units, steps, seed, mode)
    prov = env.provenance(command, device=s.device)
    with env.deterministic() as det:
        model, probe, dropped = build(s, depth, mode)
        run = run_session(s.adapter, model, mode, s.spec, s.units, s.device, probe=probe,
                          label=f"{workload.name} {mode}", progress=progress)
        run.memory.update(dropped)         # what the one-mode process dropped from the model
    return mode_result(workload, mode, s, depth, prov, det, run)
