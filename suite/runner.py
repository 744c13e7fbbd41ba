"""Run a workload's duplex session script through its adapter, unit by unit, and measure it.

`run_workload` builds the model through `duplexcadence.runtime.adapter(workload.architecture)`, opens one
session in one mode and walks the script: LISTEN units are recorded and pass; each SPEAK unit calls
`session.speak(payload, final=unit.final)` (after `start_turn()` on the first unit of a turn) inside the
timer. `verify` builds the model once and runs a stock session, then a cadence session, on that same
instance (construction-time random tables belong to the instance, DESIGN.md section 3), and compares
them unit by unit with `duplexcadence.runtime.compare_units`, recording instead of raising.

Timing (DESIGN.md section 5): on CUDA, CUDA events recorded around the whole `speak` call (host work
included: the device is idle when the start event is recorded, and `torch.cuda.synchronize()` follows
the end event); on CPU, `time.perf_counter`. Either way `wall_ms` (perf_counter) is recorded beside it.
Statistics are over the measured SPEAK units: all SPEAK units after the first `WARMUP_SPEAK_UNITS`.
Percentiles are numpy's linear interpolation.

Every run ends in a verdict, VALID or INVALID with reasons (`invalid_reasons`, and a stable code per
reason in `invalid_codes`): fewer than `MIN_MEASURED_UNITS` measured units ("few_units"), a degenerate
unit ("degenerate": std < 1e-4 or more than half the samples at |x| >= 0.99), no audio at all
("no_audio"), a dirty git tree ("dirty_tree"), and in `verify` a unit whose bytes differ ("mismatch").
"""
from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from duplexcadence import runtime
from suite import env
from suite.memory import MemoryProbe

WARMUP_SPEAK_UNITS = 3      # first SPEAK units of a run, timed but not in the statistics
MIN_MEASURED_UNITS = 30     # DESIGN.md section 5: medians and p99 over >= 30 units after warm-up
STD_MIN = 1e-4              # a SPEAK unit quieter than this is degenerate
CLIP_LEVEL = 0.99           # |x| at or above this counts as clipped (the causal HiFT audio_limit)
CLIP_FRACTION_MAX = 0.5     # more than this fraction clipped is degenerate
UNIT_PERIOD_S = 1.0         # the duplex cadence: one unit per second (DESIGN.md section 1)
PROFILED_SPEAK_UNITS = 5    # CUDA: the last SPEAK units run under the profiler (suite.kernels), untimed
DEFAULT_SAMPLE_RATE = 24000


# --- records -------------------------------------------------------------------------------------
@dataclass
class UnitRecord:
    """One unit of the script as it ran. LISTEN units have samples 0 and no timing or hashes."""
    index: int                      # unit index in the session script
    kind: str                       # "LISTEN" | "SPEAK"
    turn: int | None                # turn number in the script (None: a LISTEN unit)
    final: bool                     # last unit of its turn (flushes the stream)
    t_start_s: float                # unit start in the session, seconds
    payload: str                    # "tokens" (speech tokens @ 25 Hz) | "frames" (codec frames)
    payload_size: int               # tokens or codec frames passed to speak()
    samples: int = 0                # audio samples out @ sample_rate
    tail_ms: float | None = None    # CUDA events (CUDA) or perf_counter (CPU) around speak()
    wall_ms: float | None = None    # perf_counter around speak(), always
    measured: bool = False          # counted in the statistics (SPEAK, after warm-up)
    sha256_f32: str | None = None   # of the float32 little-endian waveform bytes
    sha256_pcm16: str | None = None  # of the int16 little-endian PCM bytes
    std: float | None = None        # of the float32 waveform
    clipped_frac: float | None = None  # fraction of samples with |x| >= CLIP_LEVEL
    stats: dict | None = None       # session.stats() after the unit (cumulative), if the session has it
    kernels: dict | None = None     # profiled units (CUDA): launches, kernels, kernel-busy ms (suite.kernels)
    host: dict | None = None        # verify's timed SPEAK units: host / GPU state right after (env.UnitHostSampler)
    info: dict = field(default_factory=dict)   # UnitOutput.info (e.g. the stream calls made)


@dataclass
class RunResult:
    """One session of one mode. `pcm16` (int16 [samples] @ sample_rate, all units concatenated) and
    `outputs` (unit index -> UnitOutput) stay in memory; `to_dict()` is the JSON record."""
    workload: dict
    mode: str
    device: str
    depth: str
    parameters: dict
    seeds: dict
    provenance: dict
    determinism: dict
    sample_rate: int
    units: list[UnitRecord]
    memory: dict
    metrics: dict
    session_stats: dict | None
    verdict: str = "VALID"
    invalid_reasons: list[str] = field(default_factory=list)
    invalid_codes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pcm16: np.ndarray = field(default_factory=lambda: np.zeros(0, "<i2"), repr=False)
    outputs: dict = field(default_factory=dict, repr=False)

    def mode_dict(self) -> dict:
        """This mode's part of the record: units, memory, metrics, stats, verdict."""
        return jsonable({"mode": self.mode, "units": [dataclasses.asdict(u) for u in self.units],
                         "memory": self.memory, "metrics": self.metrics,
                         "session_stats": self.session_stats, "verdict": self.verdict,
                         "invalid_reasons": self.invalid_reasons, "invalid_codes": self.invalid_codes,
                         "audio_samples": int(self.pcm16.size)})

    def to_dict(self) -> dict:
        """The run record (the schema `suite.report` reads), with this one mode."""
        return _record(self, {self.mode: self}, None, self.verdict, self.invalid_reasons,
                       self.invalid_codes, self.notes)

    def audio(self) -> dict[str, np.ndarray]:
        return {self.mode: self.pcm16}


@dataclass
class VerifyResult:
    """Stock and cadence sessions on one model instance, compared unit by unit."""
    stock: RunResult
    cadence: RunResult | None        # None where the adapter has no cadence mode (see notes)
    comparison: list[dict]           # per SPEAK unit: index, equal, detail
    speedup_x: float | None          # stock tail_ms_p50 / cadence tail_ms_p50
    verdict: str = "VALID"
    invalid_reasons: list[str] = field(default_factory=list)
    invalid_codes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: timing rounds (`verify(rounds=R)`): per round {round, order, stock_tail_ms_p50, cadence_tail_ms_p50,
    #: speedup_x, units_compared, mismatched_units, host_us_per_op: {before, after}}; round 1 is the run
    #: of `stock` / `cadence` above
    rounds: list[dict] = field(default_factory=list)
    #: the CUDA profile pass (`verify`): {units_compared, mismatched_units, profiled_units: {mode: [index]}}
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
        return _record(self.stock, self.modes, comp, self.verdict, self.invalid_reasons,
                       self.invalid_codes, self.notes)

    def audio(self) -> dict[str, np.ndarray]:
        return {m: r.pcm16 for m, r in self.modes.items()}


SCHEMA = "duplexcadence.run/1"


def _record(first: RunResult, modes: dict, comparison, verdict, reasons, codes, notes) -> dict:
    return jsonable({
        "schema": SCHEMA,
        "workload": first.workload,
        "device": first.device,
        "depth": first.depth,
        "sample_rate": first.sample_rate,
        "parameters": first.parameters,
        "seeds": first.seeds,
        "provenance": first.provenance,
        "determinism": first.determinism,
        "modes": {m: r.mode_dict() for m, r in modes.items()},
        "comparison": comparison,
        "verdict": verdict,
        "invalid_reasons": list(reasons),
        "invalid_codes": list(codes),
        "notes": list(notes),
    })


def jsonable(obj):
    """Plain JSON types: numpy scalars converted, Paths as str (relative to the repository root when
    inside it), tuples to lists, other objects to str."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):          # repository paths relative, so results read the same anywhere
        try:
            return str(obj.resolve().relative_to(env.REPO_ROOT))
        except ValueError:
            return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    return str(obj)


# --- the script ----------------------------------------------------------------------------------
def select_units(workload, *, seconds: float | None = None, max_speak_units: int | None = None) -> list:
    """The units to run: the workload's script (`workload.session_script()`, validated), cut to its first
    `max_speak_units` SPEAK units over at least 2 turns (`SessionScript.select`: whole turns, a cut turn
    keeps its final unit) and/or to units starting before `seconds` (a turn cut there stays unflushed).
    Raises ValueError for a non-positive limit, or a limit too small for 2 turns."""
    for name, value in (("seconds", seconds), ("max_speak_units", max_speak_units)):
        if value is not None and value <= 0:
            raise ValueError(f"{name}: expected a positive number or None, got {value!r}")
    if callable(getattr(workload, "session_script", None)):
        script = workload.session_script()
    elif isinstance(workload.script, (str, Path)):
        from workloads.common import load_script
        script = load_script(workload.script)
    else:
        script = workload.script
    if max_speak_units is not None:
        script = script.select(max_speak_units, min_turns=2)
    units = list(script.units)
    if seconds is not None:
        units = [u for u in units if u.t_start_s < seconds]
    return units


def payload_of(unit) -> tuple[object, str, int]:
    """(payload for speak(), "tokens" | "frames", its size) of a unit; ("none", 0) without a payload."""
    tokens = getattr(unit, "tokens", None)
    if tokens is not None:
        return tokens, "tokens", len(tokens)
    codes = getattr(unit, "codes", None)
    if codes is not None:
        frames = codes.shape[-1] if hasattr(codes, "shape") else (len(codes[0]) if len(codes) else 0)
        return codes, "frames", int(frames)
    return None, "none", 0


def make_spec(workload, steps: int | None = None) -> dict:
    """What the adapter builds from: workload.spec plus the voice prompt, prompt length and dtype, and
    the Euler step count under `n_timesteps` (the stock `Token2wav.n_timesteps` name the flow_hift
    adapter reads): `steps` if given, else the spec's own, else workload.euler_steps (None: no ODE)."""
    spec = dict(workload.spec or {})
    spec["voice_prompt"] = workload.voice_prompt
    spec["prompt_seconds"] = workload.prompt_seconds
    spec.setdefault("dtype", workload.dtype)
    n = steps if steps is not None else spec.get("n_timesteps", workload.euler_steps)
    if n is not None:
        spec["n_timesteps"] = int(n)
    return spec


def workload_dict(workload) -> dict:
    """The workload definition as plain data (the script by reference, not its units)."""
    if dataclasses.is_dataclass(workload):
        fields = {f.name: getattr(workload, f.name) for f in dataclasses.fields(workload)}
    else:
        fields = dict(vars(workload))
    if not isinstance(fields.get("script"), (str, Path, type(None))):
        fields["script"] = getattr(fields["script"], "path", type(fields["script"]).__name__)
    return jsonable(fields)


# --- timing and sanity ---------------------------------------------------------------------------
class UnitTimer:
    """Times one call: CUDA events + synchronize on CUDA, perf_counter on CPU (and always wall)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def __call__(self, fn, *args, **kwargs):
        """Returns (fn's result, tail_ms, wall_ms)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            end.record()
            torch.cuda.synchronize(self.device)
            wall = (time.perf_counter() - t0) * 1e3
            return out, float(start.elapsed_time(end)), wall
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        wall = (time.perf_counter() - t0) * 1e3
        return out, wall, wall


def sanity(wave: np.ndarray) -> tuple[float | None, float | None]:
    """(std, fraction of samples with |x| >= CLIP_LEVEL) of a float waveform; (None, None) if empty."""
    if wave.size == 0:
        return None, None
    x = wave.astype(np.float64, copy=False)
    return float(x.std()), float(np.mean(np.abs(x) >= CLIP_LEVEL))


def metrics(units: list[UnitRecord], sample_rate: int, period_s: float = UNIT_PERIOD_S) -> dict:
    """Statistics over the measured SPEAK units (ms, seconds, ratios; keys carry the unit)."""
    speak = [u for u in units if u.kind == "SPEAK"]
    measured = [u for u in speak if u.measured]
    prof = [u.kernels for u in speak if u.kernels]
    out = {"speak_units": len(speak), "warmup_units": sum(1 for u in speak if not u.measured and not u.kernels),
           "units_measured": len(measured), "unit_period_s": period_s, "units_profiled": len(prof)}
    if prof:
        for key in ("kernel_launches", "graph_launches", "kernels", "kernel_busy_ms", "gpu_busy_ms"):
            out[f"{key}_per_unit_p50"] = float(np.percentile([k[key] for k in prof], 50))
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
        "wall_ms_p50": float(np.percentile(wall, 50)),
        "audio_s_measured": audio_s,
        "rtf": float(tail.sum() / 1e3 / audio_s) if audio_s > 0 else None,
        "tail_vs_period_pct_p50": 100.0 * (p50 / (period_s * 1e3) - 1.0),
        "deadline_misses": int(np.sum(tail > period_s * 1e3)),
    })
    out.update(host_p50(measured))
    graphs = _graph_deltas(units, measured)
    if graphs:
        out.update(graphs)
    if prof:   # issue 3: tail time against the GPU kernel-busy time of the same run
        out["tail_over_kernel_busy_x"] = p50 / out["kernel_busy_ms_per_unit_p50"] \
            if out["kernel_busy_ms_per_unit_p50"] > 0 else None
    return out


def host_p50(units: list[UnitRecord]) -> dict:
    """p50 over `units` of each per-unit host sample (UnitRecord.host, env.UnitHostSampler) that they carry:
    {"host_op_us_p50", "cpu_loop_us_p50", "sm_mhz_p50"}, a key only where some unit has a value."""
    out = {}
    for key, name in (("op_us", "host_op_us_p50"), ("cpu_loop_us", "cpu_loop_us_p50"), ("sm_mhz", "sm_mhz_p50")):
        vals = [u.host[key] for u in units if u.host and isinstance(u.host.get(key), (int, float))]
        if vals:
            out[name] = float(np.percentile(vals, 50))
    return out


def _graph_deltas(units: list[UnitRecord], measured: list[UnitRecord]) -> dict:
    """Per-unit changes of the session's cumulative graph counters (UnitRecord.stats), over the measured
    units: captures and eager fallbacks in them (issue 3: both 0 in steady units) and replays per unit."""
    keys = ("captures", "replays", "eager_fallbacks", "warmup_runs")
    prev, deltas = None, {}
    for u in units:
        if not u.stats or not all(isinstance(u.stats.get(k), (int, float)) for k in keys):
            continue
        cur = {k: u.stats[k] for k in keys}
        base = prev or {k: 0 for k in keys}
        deltas[u.index] = {k: cur[k] - base[k] for k in keys}
        prev = cur
    rows = [deltas[u.index] for u in measured if u.index in deltas]
    if not rows:
        return {}
    return {"graph_captures_measured_units": int(sum(r["captures"] for r in rows)),
            "eager_fallbacks_measured_units": int(sum(r["eager_fallbacks"] for r in rows)),
            "warmup_runs_measured_units": int(sum(r["warmup_runs"] for r in rows)),
            "units_with_capture": [u.index for u in measured if deltas.get(u.index, {}).get("captures")],
            "graph_replays_per_unit_p50": float(np.percentile([r["replays"] for r in rows], 50))}


def judge(units: list[UnitRecord], provenance: dict, *, min_units: int = MIN_MEASURED_UNITS,
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
        if u.std is None:
            continue
        if u.std < STD_MIN or u.clipped_frac > CLIP_FRACTION_MAX:
            reasons.append(f"degenerate audio at unit {u.index}: std {u.std:.3g}, "
                           f"clipped {u.clipped_frac:.1%} (need std >= {STD_MIN:g}, clipped <= "
                           f"{CLIP_FRACTION_MAX:.0%})")
            codes.append("degenerate")
    if speak and all(u.samples == 0 for u in speak):
        reasons.append("no SPEAK unit produced audio")
        codes.append("no_audio")
    if provenance.get("git_dirty"):
        reasons.append("dirty tree: uncommitted changes (see provenance.git_status)")
        codes.append("dirty_tree")
    return reasons, codes


class ModeUnavailable(RuntimeError):
    """The adapter has no implementation of the requested mode (yet)."""


def open_session(adapter, model, mode: str, spec: dict):
    """adapter.new_session(model, mode, spec); raises ModeUnavailable if the adapter says the mode is not
    implemented (NotImplementedError, or its own mode module is missing). Other errors propagate."""
    try:
        return adapter.new_session(model, mode, spec)
    except NotImplementedError as exc:
        raise ModeUnavailable(f"{adapter.__name__}: mode {mode!r} not implemented ({exc})") from exc
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("duplexcadence."):
            raise ModeUnavailable(f"{adapter.__name__}: mode {mode!r} needs {exc.name}, which is not "
                                  f"there yet") from exc
        raise


# --- sessions ------------------------------------------------------------------------------------
def run_session(adapter, model, mode: str, spec: dict, units: list, device: torch.device, *,
                probe: MemoryProbe | None = None, label: str = "", progress: bool = True,
                profile_units: int | None = None, host_samples: bool = False):
    """Open one session and walk the units. Returns (records, UnitOutputs by index, pcm16, memory,
    final stats). The first WARMUP_SPEAK_UNITS SPEAK units are marked measured=False.

    profile_units: on CUDA, the last this-many SPEAK units (default PROFILED_SPEAK_UNITS) run under the
    CUDA profiler (suite.kernels.profile_call): their `kernels` record holds kernel launches, graph
    launches, kernels run and GPU kernel-busy ms; they are not in the timing statistics (measured=False,
    the profiler slows the host) but their bytes are hashed and compared like every unit's.

    SPEAK unit: `start_turn()` when it opens a turn, then the timed `speak(payload, final=unit.final)`.
    LISTEN unit: passes, unless it carries a payload (Moshi: the stock server decodes every frame,
    listening or not, workloads/moshi.py): then it is decoded the same way, with `final=False` and no
    turn, timed and hashed but never measured. The session audio is every decoded unit in order.

    host_samples: after each timed SPEAK unit, outside its timed region, record the host's and GPU's state
    (`UnitRecord.host`, env.UnitHostSampler: ~1 ms; its two probe tensors are allocated before the memory
    probe's session starts). `verify` asks for them; the memory stages (run_workload) do not.
    Raises ValueError for a unit kind other than LISTEN / SPEAK."""
    from tqdm import tqdm

    sample_host = env.UnitHostSampler(device) if host_samples else None
    if probe is not None:
        probe.begin_session()
    session = open_session(adapter, model, mode, spec)
    timer = UnitTimer(device)
    n_prof = (PROFILED_SPEAK_UNITS if profile_units is None else int(profile_units)) if device.type == "cuda" else 0
    speak_idx = [int(u.index) for u in units if u.kind == "SPEAK"]
    profiled = set(speak_idx[len(speak_idx) - n_prof:]) if n_prof > 0 else set()
    has_stats = callable(getattr(session, "stats", None))
    records, outputs, pcm = [], {}, []
    open_turn, n_speak = None, 0
    bar = tqdm(units, desc=label or mode, unit="unit", disable=not progress, leave=True)
    for unit in bar:
        if unit.kind not in ("LISTEN", "SPEAK"):
            raise ValueError(f"unit {unit.index}: kind {unit.kind!r}, expected 'LISTEN' or 'SPEAK'")
        payload, what, size = payload_of(unit)
        speak = unit.kind == "SPEAK"
        rec = UnitRecord(index=int(unit.index), kind=unit.kind,
                         turn=None if unit.turn is None else int(unit.turn), final=bool(unit.final),
                         t_start_s=float(unit.t_start_s), payload=what, payload_size=size)
        records.append(rec)
        if not speak and payload is None:
            continue
        if speak and unit.turn != open_turn:
            session.start_turn()
            open_turn = unit.turn
        if rec.index in profiled:
            from suite.kernels import profile_call
            out, rec.kernels = profile_call(session.speak, payload, final=bool(speak and unit.final),
                                            device=device)
            rec.wall_ms = rec.kernels["wall_ms"]
        else:
            out, rec.tail_ms, rec.wall_ms = timer(session.speak, payload, final=bool(speak and unit.final))
            if speak and sample_host is not None:
                rec.host = sample_host()
        if speak and unit.final:
            open_turn = None
        rec.samples = out.samples
        rec.sha256_f32, rec.sha256_pcm16 = out.sha256()
        rec.std, rec.clipped_frac = sanity(np.asarray(out.waveform).reshape(-1))
        rec.measured = speak and n_speak >= WARMUP_SPEAK_UNITS and rec.index not in profiled
        rec.info = jsonable(out.info)
        n_speak += speak
        outputs[rec.index] = out
        pcm.append(np.asarray(out.pcm16, dtype="<i2").reshape(-1))
        if has_stats:
            rec.stats = jsonable(session.stats())
        if probe is not None:
            probe.observe()
        bar.set_postfix_str(f"unit {rec.index}: {rec.wall_ms:.1f} ms")
    bar.close()
    stats = jsonable(session.stats()) if has_stats else None
    memory = probe.end_session() if probe is not None else {}
    if callable(getattr(session, "close", None)):
        session.close()                   # drop what it put into the shared model (e.g. stream caches)
    del session
    gc.collect()
    pcm16 = np.concatenate(pcm) if pcm else np.zeros(0, "<i2")
    return records, outputs, pcm16, memory, stats


def known_modes(adapter) -> tuple:
    """The modes an adapter declares (`SUPPORTED_MODES` or `MODES`), else runtime.MODES."""
    return tuple(getattr(adapter, "SUPPORTED_MODES", None) or getattr(adapter, "MODES", None)
                 or runtime.MODES)


def _setup(workload, device, depth, seconds, max_speak_units, steps, seed, mode=None):
    device = torch.device(device)
    adapter = runtime.adapter(workload.architecture)
    if mode is not None and mode not in known_modes(adapter):
        raise ValueError(f"mode: expected one of {known_modes(adapter)} (adapter {adapter.__name__}), "
                         f"got {mode!r}")
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
    return device, adapter, spec, seeds, units, params, (" and ".join(limits) or None)


def _build(adapter, spec, device, depth, seeds, mode: str | None = None):
    """Build the model; in a one-mode process (`mode` given) the adapter's `for_mode(model, mode)` hook,
    if it has one, drops what that mode never uses (e.g. flow_hift's stock buffers for cadence) before the
    model-loaded memory sample. Returns (model, probe); the hook's report is `model_prepared` on the probe."""
    probe = MemoryProbe(device)
    model = adapter.build_model(spec, device=device, depth=depth, seed=seeds.get("weights", 0))
    hook = getattr(adapter, "for_mode", None)
    probe.for_mode = hook(model, mode) if (mode is not None and callable(hook)) else {}
    probe.model_loaded()
    return model, probe


def _mode_result(workload, mode, device, depth, params, seeds, prov, det, sample_rate, session_out,
                 limited) -> RunResult:
    records, outputs, pcm16, memory, stats = session_out
    reasons, codes = judge(records, prov, limited=limited)
    return RunResult(workload=workload_dict(workload), mode=mode, device=str(device), depth=depth,
                     parameters=params, seeds=seeds, provenance=prov, determinism=det,
                     sample_rate=sample_rate, units=records, memory=memory,
                     metrics=metrics(records, sample_rate), session_stats=stats,
                     verdict="INVALID" if reasons else "VALID", invalid_reasons=reasons,
                     invalid_codes=codes, pcm16=pcm16, outputs=outputs)


def run_workload(workload, mode: str, device, *, depth: str = "released", seconds: float | None = None,
                 max_speak_units: int | None = None, steps: int | None = None, seed: int | None = None,
                 progress: bool = True, command: list[str] | None = None,
                 profile_units: int | None = None) -> RunResult:
    """Build the workload's model, run one `mode` session over its script, measure every unit.
    profile_units: SPEAK units run under the CUDA profiler at the end (run_session; 0: none, e.g. for a
    memory-only run).

    mode: "stock" | "cadence" | another mode the adapter declares (e.g. mimi's "stock_graphs").
    depth: "released" | "reduced" (passed to build_model). seconds / max_speak_units cut the script
    (see `select_units`); steps overrides the Euler steps; seed the weights seed. Raises ValueError for a mode the adapter does not declare, KeyError for an unknown
    architecture.
    """
    device, adapter, spec, seeds, units, params, limited = _setup(
        workload, device, depth, seconds, max_speak_units, steps, seed, mode)
    rate = int(getattr(adapter, "SAMPLE_RATE", DEFAULT_SAMPLE_RATE))
    prov = env.provenance(command, device=device)
    with env.deterministic() as det:
        model, probe = _build(adapter, spec, device, depth, seeds, mode=mode)
        out = run_session(adapter, model, mode, spec, units, device, probe=probe,
                          label=f"{workload.name} {mode}", progress=progress, profile_units=profile_units)
        if probe.for_mode:
            out[3].update(probe.for_mode)      # memory record: what the one-mode process dropped
    result = _mode_result(workload, mode, device, depth, params, seeds, prov, det, rate, out, limited)
    if progress:
        print(summary_table(result))
    return result


def supports_cadence(adapter) -> bool:
    """True unless the adapter's declared modes lack "cadence" or it has no new_session."""
    return "cadence" in known_modes(adapter) and callable(getattr(adapter, "new_session", None))


def compare(workload_name: str, stock: RunResult, cadence: RunResult) -> list[dict]:
    """Per decoded unit (every SPEAK unit; LISTEN units with a payload too): {index, equal, detail}, by `runtime.compare_units` (bytes of the float32 waveform
    and of the int16 PCM), recorded instead of raised. A unit missing from one side is not equal."""
    return _compare_outputs(workload_name, stock.units, stock.outputs, cadence.outputs)


def _compare_outputs(workload_name: str, units: list[UnitRecord], stock: dict, cadence: dict) -> list[dict]:
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
    """Stock, then cadence, on ONE model instance (two sessions one after the other); compare per unit.

    rounds: timing rounds (>= 1). Round 1 is the stock session then the cadence session above (the memory
    probe in it; no profiled unit). Each further round opens a fresh session of each mode on the same
    model, in alternating order (round 2 cadence first, round 3 stock first, ...: a drift of the host's
    speed during the stage does not favour one mode), hashes and compares every unit again, and times the
    same measured units as round 1 (no profiler, no memory probe). Each round records its speedup (stock
    tail p50 / cadence tail p50) and `env.host_op_us` before and after it: the spread of the rounds'
    speedups is the noise the report gives (suite.claims.speedup), the host probe says how fast the host
    launched eager kernels meanwhile (stock is host-bound). A differing unit in any round makes the
    verdict INVALID ("round R: sha256 mismatch at unit I").

    Profiling comes last (CUDA): the kernel counts and kernel-busy times (suite.kernels) come from a profile
    pass after every timing round, a fresh session per mode whose last PROFILED_SPEAK_UNITS SPEAK units run
    under the profiler; their `kernels` records are attached to round 1's units of the same index, and
    its bytes are compared too ("profile pass: sha256 mismatch ..."). No timed unit runs after the profiler
    in the same process: kineto leaves CUPTI attached once it has profiled (pytorch/pytorch#144455: kineto
    skips cuptiFinalize unless TEARDOWN_CUPTI=1, which torch's own code calls unsafe with CUDA graphs), which slows every later
    eager launch (H200, results/2026-11-30-h200-reproduce-4*: the host probe read 6.4-7.9 us/op before
    round 1 in all 10 verify stages, 8.5-13.0 right after it, when round 1 still ended in profiled units).

    Where the adapter has no cadence mode (`supports_cadence`, or new_session raising
    NotImplementedError), runs stock only (one round) and says so in `notes`. Other arguments as
    `run_workload`. Raises ValueError for rounds that is not an int >= 1 (before building anything).
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected an int >= 1, got {rounds!r}")
    device, adapter, spec, seeds, units, params, limited = _setup(
        workload, device, depth, seconds, max_speak_units, steps, seed)
    params["timing_rounds"] = rounds
    rate = int(getattr(adapter, "SAMPLE_RATE", DEFAULT_SAMPLE_RATE))
    prov = env.provenance(command, device=device)
    notes, extra = [], []
    with env.deterministic() as det:
        model, probe = _build(adapter, spec, device, depth, seeds)
        host_before = env.host_op_us(device)
        stock_out = run_session(adapter, model, "stock", spec, units, device, probe=probe,
                                label=f"{workload.name} stock", progress=progress, profile_units=0,
                                host_samples=True)
        stock = _mode_result(workload, "stock", device, depth, params, seeds, prov, det, rate,
                             stock_out, limited)
        cadence = None
        if supports_cadence(adapter):
            try:
                cadence_out = run_session(adapter, model, "cadence", spec, units, device, probe=probe,
                                          label=f"{workload.name} cadence", progress=progress, profile_units=0,
                                          host_samples=True)
                cadence = _mode_result(workload, "cadence", device, depth, params, seeds, prov, det,
                                       rate, cadence_out, limited)
            except ModeUnavailable as exc:
                notes.append(f"cadence mode not available: {exc}; stock only")
        else:
            notes.append(f"cadence mode not available in adapter {workload.architecture!r}; stock only")
        host_first = {"before": host_before, "after": env.host_op_us(device)}
        if cadence is not None:
            measured = {u.index for u in cadence.units if u.measured}
            for r in range(2, rounds + 1):
                extra.append(_timing_round(workload.name, adapter, model, spec, units, device, r,
                                           measured, progress))
        elif rounds > 1:
            notes.append(f"timing rounds: {rounds} asked, 1 run (no cadence mode to time against)")
        profiled = None
        if device.type == "cuda":
            profiled = _profile_pass(workload.name, adapter, model, spec, units, device,
                                     [m for m, r in (("stock", stock), ("cadence", cadence)) if r is not None],
                                     progress)
            for run in (stock, cadence):
                if run is not None:
                    attach_kernels(run, profiled["kernels"][run.mode])
    result = _verdict(workload.name, stock, cadence, notes)
    if profiled is not None:
        _add_profile_pass(result, profiled)
    if cadence is not None:
        first = {"round": 1, "order": ["stock", "cadence"],
                 "stock_tail_ms_p50": stock.metrics.get("tail_ms_p50"),
                 "cadence_tail_ms_p50": cadence.metrics.get("tail_ms_p50"), "speedup_x": result.speedup_x,
                 "units_compared": len(result.comparison), "mismatched_units": result.mismatches,
                 "host_us_per_op": host_first,
                 "unit_host_p50": {m.mode: host_p50([u for u in m.units if u.measured]) for m in (stock, cadence)}}
        _add_rounds(result, [first, *extra])
    if progress:
        print(summary_table(result))
    return result


def _timing_round(name: str, adapter, model, spec: dict, units: list, device, r: int, measured: set,
                  progress: bool) -> dict:
    """One further timing round of `verify`: a fresh session per mode, order alternating with r (even r:
    cadence first); p50 tail over the units in `measured` (round 1's); every unit compared."""
    order = ["cadence", "stock"] if r % 2 == 0 else ["stock", "cadence"]
    host_before = env.host_op_us(device)
    runs = {}
    for mode in order:
        recs, outs, _pcm, _mem, _stats = run_session(adapter, model, mode, spec, units, device, probe=None,
                                                     label=f"{name} {mode} round {r}", progress=progress,
                                                     profile_units=0,
                                                     host_samples=True)
        tails = [u.tail_ms for u in recs if u.index in measured and u.tail_ms is not None]
        runs[mode] = (recs, outs, float(np.percentile(tails, 50)) if tails else None,
                      host_p50([u for u in recs if u.index in measured]))
    host = {"before": host_before, "after": env.host_op_us(device)}
    rows = _compare_outputs(name, runs["stock"][0], runs["stock"][1], runs["cadence"][1])
    s, c = runs["stock"][2], runs["cadence"][2]
    return {"round": r, "order": order, "stock_tail_ms_p50": s, "cadence_tail_ms_p50": c,
            "speedup_x": s / c if s and c else None, "units_compared": len(rows),
            "mismatched_units": [row["index"] for row in rows if not row["equal"]],
            "mismatch_details": [row["detail"] for row in rows if not row["equal"]],
            "host_us_per_op": host, "unit_host_p50": {mode: runs[mode][3] for mode in order}}


def _profile_pass(name: str, adapter, model, spec: dict, units: list, device, modes: list[str],
                  progress: bool) -> dict:
    """verify's last pass on CUDA: a fresh session per mode, its last PROFILED_SPEAK_UNITS SPEAK units under
    the profiler. Returns {kernels: {mode: {unit index: kernels record}}, rows: compare rows or []}."""
    kernels, outputs, records = {}, {}, {}
    for mode in modes:
        recs, outs, _pcm, _mem, _stats = run_session(adapter, model, mode, spec, units, device, probe=None,
                                                     label=f"{name} {mode} profile pass", progress=progress,
                                                     profile_units=PROFILED_SPEAK_UNITS)
        kernels[mode] = {u.index: u.kernels for u in recs if u.kernels}
        outputs[mode], records[mode] = outs, recs
    rows = (_compare_outputs(name, records["stock"], outputs["stock"], outputs["cadence"])
            if len(modes) == 2 else [])
    return {"kernels": kernels, "rows": rows}


def attach_kernels(run: RunResult, kernels: dict) -> None:
    """Put profile-pass kernel records ({unit index: record}) on `run`'s units of the same index and
    recompute its metrics (the kernel figures per unit, tail over kernel-busy). The units keep their own
    timing: the profiled session's times are not used."""
    for u in run.units:
        if u.index in kernels:
            u.kernels = kernels[u.index]
    run.metrics = metrics(run.units, run.sample_rate)


def _add_profile_pass(result: VerifyResult, profiled: dict) -> None:
    rows = profiled["rows"]
    bad = [row for row in rows if not row["equal"]]
    result.profile_pass = {"units_compared": len(rows), "mismatched_units": [row["index"] for row in bad],
                           "profiled_units": {m: sorted(k) for m, k in profiled["kernels"].items()}}
    for row in bad:
        result.invalid_reasons.append(f"profile pass: sha256 mismatch at unit {row['index']}: {row['detail']}")
        result.invalid_codes.append("mismatch")
    if bad:
        result.verdict = "INVALID"


def _add_rounds(result: VerifyResult, rounds: list[dict]) -> None:
    """Attach the timing rounds; with more than one, the speedup is their median and a differing unit in
    a later round makes the verdict INVALID."""
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
        if run is None:
            continue
        for reason, code in zip(run.invalid_reasons, run.invalid_codes):
            if code == "dirty_tree" and "dirty_tree" in codes:
                continue
            reasons.append(reason if code == "dirty_tree" else f"{run.mode}: {reason}")
            codes.append(code)
    comparison, speedup = [], None
    if cadence is not None:
        comparison = compare(name, stock, cadence)
        for row in comparison:
            if not row["equal"]:
                reasons.append(f"sha256 mismatch at unit {row['index']}: {row['detail']}")
                codes.append("mismatch")
        s, c = stock.metrics.get("tail_ms_p50"), cadence.metrics.get("tail_ms_p50")
        speedup = s / c if s and c else None
    return VerifyResult(stock=stock, cadence=cadence, comparison=comparison, speedup_x=speedup,
                        verdict="INVALID" if reasons else "VALID", invalid_reasons=reasons,
                        invalid_codes=codes, notes=notes)


def summary_table(result) -> str:
    """The printed summary of a RunResult / VerifyResult (rendered by `suite.report.summary_text`)."""
    from suite.report import summary_text

    return summary_text(result.to_dict())
