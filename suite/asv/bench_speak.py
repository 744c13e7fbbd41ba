"""Tail time of one steady SPEAK unit, stock vs DuplexCadence, for every workload in the registry.

One class per decoder family; its workloads come from `workloads.names()` (those whose architecture has
an adapter). Each class times `time_steady_unit` (one steady unit after the warm-up: common.py) and tracks
peak memory, arena MiB, graphs captured and eager fallbacks. First, ramp and final units, medians and p99
over a whole session come from `make reproduce` (suite.runner), not from here.

CPU combinations run the reduced-depth configuration of the same stock classes (common.DEPTH): a trend
line for the runtime's host work, not the released model's speed. CUDA combinations run the released
configuration. A module-level check fails when a registry workload has no benchmark class.
"""
from __future__ import annotations

from .common import SpeakUnit, benchmarkable, family, missing_workloads

DEVICES = ["cpu", "cuda"]


def _frames(codes) -> int:
    """Codec frames in a [codebooks][frames] payload."""
    return len(codes[0])


class FlowHift(SpeakUnit):
    """MiniCPM-o 4.5 and Step-Audio 2 mini (flow DiT + causal HiFT, minicpmo-utils 1.0.7): a steady unit
    is 25 new speech tokens -> one 28-token `Token2wav.stream` call -> 24 000 samples @ 24 kHz.
    steps: Euler steps; a combination runs only at its workload's own count (5: minicpmo45_5step).
    CPU: reduced depth (2 conformer + 1 up block, DiT depth 2)."""
    ARCHITECTURE = "flow_hift"
    params = [family("flow_hift"), ["stock", "cadence"], [5, 10], DEVICES]
    param_names = ["workload", "mode", "steps", "device"]

    def bind(self, workload, mode, steps, device):
        return workload, mode, steps, device

    def unit_plan(self, adapter, model, session, spec, payloads):
        """Per unit: its stream calls (`plan_calls`, the duplex token loop) through `turn_schedule`; a unit
        is steady when all its calls are; key = (tokens, region lengths before) of each call."""
        buffer, per_unit, calls = [adapter.SILENCE_TOKEN] * adapter.PRE_LOOKAHEAD, [], []
        for tokens in payloads:
            unit_calls, buffer = adapter.plan_calls(buffer, list(tokens), False)
            per_unit.append(len(unit_calls))
            calls += unit_calls
        steps = iter(adapter.turn_schedule(model.prompt.mel_frames, calls))
        plan = []
        for n in per_unit:
            mine = [next(steps) for _ in range(n)]
            phase = "steady" if mine and all(s.phase == "steady" for s in mine) else \
                (mine[0].phase if mine else "none")
            plan.append((phase, tuple((s.size, tuple(sorted(s.before.items()))) for s in mine)))
        return plan


class Mimi(SpeakUnit):
    """Moshi (Mimi decoder, moshi 0.2.13): a steady unit is 13 codec frames @ 12.5 Hz (8 codebooks) ->
    13 x 1 920 samples @ 24 kHz. Modes: stock (eager, the bit-exact reference), stock_graphs (moshi's own
    CUDAGraphed path; CUDA only), cadence. CPU: reduced depth (adapters/mimi.py REDUCED)."""
    ARCHITECTURE = "mimi"
    params = [family("mimi"), ["stock", "stock_graphs", "cadence"], DEVICES]
    param_names = ["workload", "mode", "device"]

    def bind(self, workload, mode, device):
        return workload, mode, None, device

    def skip_reason(self, workload, mode, device):
        if mode == "stock_graphs" and device.type != "cuda":
            return "mode 'stock_graphs': moshi's CUDAGraphed path is off without CUDA (same as 'stock')"
        return None

    def unit_plan(self, adapter, model, session, spec, payloads):
        """`session_schedule` over the session's declared regions; key = (frames, region lengths)."""
        bindings = adapter.declare_regions(model, session.own.states)
        steps = adapter.session_schedule(bindings, [_frames(c) for c in payloads])
        return [(s.phase, (s.size, tuple(sorted(s.before.items())))) for s in steps]


class Code2Wav(SpeakUnit):
    """Qwen3-Omni (Code2Wav, transformers 5.17.0, bf16): a steady unit is one call on 25 context + 13 new
    codec frames (16 codebooks) -> 13 x 1 920 - 555 samples kept. CPU: reduced depth."""
    ARCHITECTURE = "code2wav"
    params = [family("code2wav"), ["stock", "cadence"], DEVICES]
    param_names = ["workload", "mode", "device"]

    def bind(self, workload, mode, device):
        return workload, mode, None, device

    def unit_plan(self, adapter, model, session, spec, payloads):
        """`turn_schedule` over the units' frame counts (one extra unit takes the final flag); a unit is
        steady when all its calls are; key = (context, new frames) of each call."""
        frames = [_frames(c) for c in payloads] + [1]
        units = adapter.turn_schedule(frames, left_context=int(spec.get("left_context", adapter.LEFT_CONTEXT)),
                                      initial=int(spec.get("initial_frames", adapter.INITIAL_FRAMES)))[:-1]
        return [("steady" if all(c.phase == "steady" for c in calls) else calls[0].phase,
                 tuple((c.ctx, c.new) for c in calls)) for calls in units]


FAMILIES = (FlowHift, Mimi, Code2Wav)

# numpy bench_ufunc.py habit: a registry workload without a benchmark class is an import error.
_missing = missing_workloads(benchmarkable(), FAMILIES)
if _missing:
    raise NotImplementedError(f"Missing benchmarks for workloads {_missing}: add a SpeakUnit class for "
                              f"their architecture in suite/asv/bench_speak.py")
