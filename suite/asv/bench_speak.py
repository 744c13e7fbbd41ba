"""Tail time of one steady SPEAK unit, stock vs DuplexCadence, for every workload in the registry.

One class per decoder family, its workloads from the registry; each times `time_steady_unit` and tracks peak
memory, arena MiB, graphs captured and eager fallbacks (whole sessions come from `make reproduce`). CPU runs
the reduced depth (a trend of the host work), CUDA the released one. Importing this module fails when a
registry workload has no class.
"""
from __future__ import annotations

from .common import SpeakUnit, benchmarkable, family, missing_workloads

DEVICES = ["cpu", "cuda"]


class FlowHift(SpeakUnit):
    """MiniCPM-o 4.5 and Step-Audio 2 mini (flow DiT + HiFT, minicpmo-utils 1.0.7): a steady unit is 25 new
    speech tokens -> 24 000 samples @ 24 kHz. steps: Euler steps; a combination runs only at its workload's
    own count (5: minicpmo45_5step)."""
    ARCHITECTURE = "flow_hift"
    params = [family("flow_hift"), ["stock", "cadence"], [5, 10], DEVICES]
    param_names = ["workload", "mode", "steps", "device"]

    def bind(self, workload, mode, steps, device):
        return workload, mode, steps, device


class Mimi(SpeakUnit):
    """Moshi (Mimi decoder, moshi 0.2.13): a steady unit is 13 codec frames @ 12.5 Hz (8 codebooks) -> 13 x 1 920
    samples @ 24 kHz. Modes: stock (eager, the bit-exact reference), stock_graphs (moshi's own CUDAGraphed
    path; CUDA only), cadence."""
    ARCHITECTURE = "mimi"
    params = [family("mimi"), ["stock", "stock_graphs", "cadence"], DEVICES]
    param_names = ["workload", "mode", "device"]

    def bind(self, workload, mode, device):
        return workload, mode, None, device

    def skip_reason(self, workload, mode, device):
        if mode == "stock_graphs" and device.type != "cuda":
            return "mode 'stock_graphs': moshi's CUDAGraphed path is off without CUDA (same as 'stock')"
        return None


class Code2Wav(SpeakUnit):
    """Qwen3-Omni (Code2Wav, transformers 5.17.0, bf16): a steady unit is one call on 25 context + 13 new codec
    frames (16 codebooks) -> 13 x 1 920 - 555 samples kept."""
    ARCHITECTURE = "code2wav"
    params = [family("code2wav"), ["stock", "cadence"], DEVICES]
    param_names = ["workload", "mode", "device"]

    def bind(self, workload, mode, device):
        return workload, mode, None, device


FAMILIES = (FlowHift, Mimi, Code2Wav)

# numpy bench_ufunc.py habit: a registry workload without a benchmark class is an import error.
_missing = missing_workloads(benchmarkable(), FAMILIES)
if _missing:
    raise NotImplementedError(f"Missing benchmarks for workloads {_missing}: add a SpeakUnit class for "
                              f"their architecture in suite/asv/bench_speak.py")
