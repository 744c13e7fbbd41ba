"""What the SPEAK-unit benchmarks share: a warm session per process, timed one steady unit at a time.

asv runs every benchmark method of every combination in a process of its own and calls `setup` before a
`track_` method and before every timing sample of a `time_` one. The first `setup` of a process builds the
model, opens a session, prepares it (`prepare(None)`, then the steady unit's signatures) and runs the
warm-up units; the session stays in `_WARM` for the later calls. That is sound because the timed unit is
steady: it meets the signatures of the unit before it, which `check_steady` proves from a copy of the
session's clocks before anything is timed, so every sample times the same signatures (on CUDA, replays).
Warm-up: the longest turn's first WARMUP_UNITS SPEAK units, then its largest non-final payload (the steady
one), which the timed unit speaks again (`final=False`: the turn never closes). asv does the timing.
"""
from __future__ import annotations

import abc
import contextlib
import gc
from dataclasses import dataclass, field

import torch

import workloads
from duplexcadence import gate, runtime
from suite.measure import env, memory
from suite.measure.session import (WARMUP_SPEAK_UNITS, ModeUnavailable, make_spec, modes, open_session, payload_of,
                                   select_units)
from suite.records import headline
from suite.stages.plan import served_variants

MIB = 2**20
#: Model depth per device. CPU: the reduced-depth configuration of the same stock classes (each adapter's
#: REDUCED): a released-depth flow_hift unit takes tens of seconds on a 2-core CPU, past any useful asv
#: budget. CUDA: the released configuration.
DEPTH = {"cpu": "reduced", "cuda": "released"}
WARMUP_UNITS = WARMUP_SPEAK_UNITS          # the turn's first SPEAK units, before the steady payload


# --- the registry ----------------------------------------------------------------------------------
def benchmarkable() -> list[str]:
    """Registry workloads (`workloads.names()` order) whose architecture has an adapter."""
    return [n for n in workloads.names() if workloads.get(n).architecture in runtime.ADAPTERS]


def family(architecture: str) -> list[str]:
    """The benchmarkable workloads of one decoder architecture, in registry order."""
    return [n for n in benchmarkable() if workloads.get(n).architecture == architecture]


def missing_workloads(names: list[str], classes) -> list[str]:
    """The names no class in `classes` lists as a workload (its `params[0]`)."""
    covered = {w for cls in classes for w in cls.params[0]}
    return [n for n in names if n not in covered]


def turn_payloads(workload) -> tuple[list, object]:
    """(warm-up payloads, steady payload) from the workload's session script (module docstring).

    Raises ValueError if no turn has WARMUP_UNITS + 1 non-final SPEAK units."""
    turns: dict = {}
    for unit in select_units(workload):
        if unit.kind == "SPEAK":
            turns.setdefault(unit.turn, []).append(unit)
    body = [u for u in max(turns.values(), key=len, default=[]) if not u.final]
    if len(body) < WARMUP_UNITS + 1:
        raise ValueError(f"workload {workload.name!r}: script {workload.script}: longest turn has "
                         f"{len(body)} non-final SPEAK units, the benchmark needs {WARMUP_UNITS + 1}")
    sizes = [payload_of(u)[2] for u in body]
    steady = body[sizes.index(max(sizes))]
    return [payload_of(u)[0] for u in body[:WARMUP_UNITS]], payload_of(steady)[0]


def unit_plan(session, payloads: list) -> list[tuple]:
    """The step signatures of each of `payloads` spoken in order from a fresh turn (final=False), from a copy
    of the session's clocks (nothing runs)."""
    clocks = session.clocks()
    clocks.start_turn()
    return [tuple(clocks.unit(payload_size(p), False)) for p in payloads]


def payload_size(payload) -> int:
    """Tokens of a token payload, frames of a [codebooks][frames] one."""
    return len(payload[0]) if payload and isinstance(payload[0], (list, tuple)) else len(payload)


def check_steady(name: str, mode: str, plan: list[tuple]) -> None:
    """plan: the signatures per unit of warm-up + steady + timed + next. The timed unit and the next must meet
    the signatures of the warm-up's last unit, so no timed unit meets a new one. Raises RuntimeError naming
    them otherwise."""
    if not plan[-3] == plan[-2] == plan[-1]:
        raise RuntimeError(f"{name} {mode}: the timed unit is not steady after {len(plan) - 2} warm-up units: "
                           f"signatures of the last warm-up, timed and next unit: {plan[-3:]}; a longer warm-up "
                           f"(WARMUP_UNITS) or a bounded region is needed")


# --- one warm session per process --------------------------------------------------------------------
@dataclass
class Warm:
    """A session after its warm-up. key: (class, workload, mode, steps, device)."""
    key: tuple
    device: torch.device
    depth: str
    model: object
    session: object
    probe: memory.MemoryProbe
    steady: object                      # the steady unit's payload (tokens or codes)
    plan: list                          # (phase, shape key) per unit: warm-up, timed, next
    flags: contextlib.ExitStack         # env.deterministic(), held for the process
    _memory: dict | None = field(default=None, repr=False)

    def steady_unit(self) -> None:
        """One steady SPEAK unit; on CUDA it returns after gate.synchronize() (no capture meets it)."""
        self.session.speak(self.steady, final=False)
        if self.device.type == "cuda":
            gate.synchronize(self.device)

    def stats(self):
        """The session's SessionStats."""
        return self.session.stats()

    def memory(self) -> dict:
        """MemoryProbe figures of the session so far (the probe's session ends at the first call)."""
        if self._memory is None:
            self._memory = self.probe.end_session()
        return self._memory

    def close(self) -> None:
        self.session.close()
        self.flags.close()
        self.session = self.model = None
        gc.collect()
        memory.release_cached(self.device)


_WARM: Warm | None = None


def drop_warm() -> None:
    """Close and forget the process's warm session (the next `setup` builds anew)."""
    global _WARM
    warm, _WARM = _WARM, None
    if warm is not None:
        warm.close()


# --- the benchmark base ------------------------------------------------------------------------------
class SpeakUnit(abc.ABC):
    """Steady SPEAK units of one decoder architecture (a subclass per family, bench_speak.py). setup raises
    NotImplementedError (asv: skipped) for CUDA without CUDA, Euler steps not the workload's own, a mode or
    variant the adapter lacks, and the family's `skip_reason`."""
    ARCHITECTURE = ""
    timeout = 1200              # s per benchmark process, setup included (CPU flow_hift: ~2 min + ~40 s/unit)
    rounds = 1                  # one process per time_ benchmark: a build costs more than a round tells
    number = 1                  # one unit per sample
    repeat = (3, 20, 60.0)      # 3 to 20 samples; no new sample after 60 s once 3 are taken
    warmup_time = 0.0           # setup ran the warm-up units

    @abc.abstractmethod
    def bind(self, *params) -> tuple:
        """(workload, mode, steps or None, device) from this class's parameters."""

    def skip_reason(self, workload, mode: str, device: torch.device) -> str | None:
        """A family's own reason to skip a combination, or None."""
        return None

    def setup(self, *params):
        self.warm = warm_session(self, *self.bind(*params))

    def time_steady_unit(self, *params):
        self.warm.steady_unit()

    def track_peak_mib(self, *params):
        """Peak memory over idle (model + session through the warm-up), MiB: driver level on CUDA, RSS on
        CPU (suite.records.headline)."""
        return headline(self.warm.memory())[1]
    track_peak_mib.unit = "MiB"

    def track_arena_mib(self, *params):
        """Physical memory behind the session's arena (session.stats() arena_bytes_mapped), MiB."""
        return self.warm.stats().arena_bytes_mapped / MIB
    track_arena_mib.unit = "MiB"

    def track_graphs_captured(self, *params):
        """CUDA graphs captured by the session (DuplexCadence's GraphCache, or moshi's own)."""
        return self.warm.stats().captures
    track_graphs_captured.unit = "graphs"

    def track_eager_fallbacks(self, *params):
        """Steps that ran eagerly after their graph was due (unseen signature, failed capture)."""
        return self.warm.stats().eager_fallbacks
    track_eager_fallbacks.unit = "steps"


def warm_session(bench: SpeakUnit, name: str, mode: str, steps: int | None, device: str) -> Warm:
    """The process's warm session for this combination: reused, or built (model, session, warm-up)."""
    global _WARM
    wl = workloads.get(name)
    if wl.architecture != bench.ARCHITECTURE:
        raise ValueError(f"workload {name!r} is {wl.architecture}, {type(bench).__name__} benchmarks "
                         f"{bench.ARCHITECTURE}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise NotImplementedError("device 'cuda': this machine has no CUDA device")
    if steps is not None and steps != wl.euler_steps:
        same = [n for n in family(wl.architecture) if workloads.get(n).euler_steps == steps]
        raise NotImplementedError(f"workload {name!r} runs {wl.euler_steps} Euler steps, not {steps}"
                                  + (f" ({steps} steps: workload {same[0]!r})" if same else ""))
    adapter = runtime.adapter(wl.architecture)
    if mode not in modes(adapter):
        raise NotImplementedError(f"mode {mode!r}: adapter {adapter.__name__} declares {modes(adapter)}")
    variant = (wl.spec or {}).get("variant")
    if variant is not None and variant not in served_variants(wl.architecture):
        raise NotImplementedError(f"workload {name!r}: adapter {adapter.__name__} serves no {variant!r} variant "
                                  f"(duplexcadence.runtime.MODELS); it would run another model's path")
    reason = bench.skip_reason(wl, mode, dev)
    if reason:
        raise NotImplementedError(reason)
    key = (type(bench).__name__, name, mode, steps, str(dev))
    if _WARM is not None and _WARM.key == key:
        return _WARM
    drop_warm()
    _WARM = _build(bench, key, wl, adapter, mode, steps, dev)
    return _WARM


def _build(bench, key, wl, adapter, mode, steps, device) -> Warm:
    depth = DEPTH[device.type]
    spec = make_spec(wl, steps)
    warmup, steady = turn_payloads(wl)
    flags, session = contextlib.ExitStack(), None
    try:
        flags.enter_context(env.deterministic())
        probe = memory.MemoryProbe(device)
        model = adapter.build_model(spec, device=device, depth=depth, seed=wl.seeds["weights"])
        probe.model_loaded()
        probe.begin_session()
        try:
            session = open_session(adapter, model, mode, spec)
        except ModeUnavailable as exc:
            raise NotImplementedError(str(exc)) from exc
        plan = unit_plan(session, warmup + [steady] * 3)
        check_steady(wl.name, mode, plan)
        session.prepare(None)
        session.prepare(plan[-1])           # the steady unit's signatures: the timed unit replays
        session.start_turn()
        for payload in warmup + [steady]:
            session.speak(payload, final=False)
            probe.observe()
        if device.type == "cuda":
            gate.synchronize(device)
    except BaseException:
        if session is not None:
            session.close()
        flags.close()
        raise
    return Warm(key, device, depth, model, session, probe, steady, plan, flags)
