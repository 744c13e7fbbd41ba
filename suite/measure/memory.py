"""Peak memory of a session, in MiB, against the right baselines: `idle` (before the model), `model` (built,
no session), the session's base and its peak. The per-session increment is peak - base; "peak over idle"
is (model - idle) + that increment. CUDA: driver-level used memory (NVML, else cudaMemGetInfo: it sees VMM
mappings and graph pools, which torch's allocator statistics cannot) and torch's max allocated / reserved;
CPU: resident set size, its peak VmHWM reset per session (else ru_maxrss, said in `peak_rss_source`).
Driver-level figures are device-wide: one process per measurement.
"""
from __future__ import annotations

import gc
import re
import resource
from pathlib import Path

import torch

from suite.measure.env import nvml_handle

MIB = 2**20


def _status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def rss_mib() -> float | None:
    """Current resident set size of this process, MiB (None where /proc is absent)."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS. True if it worked."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def peak_rss_mib() -> tuple[float, str]:
    """(peak RSS MiB, source): VmHWM where readable, else ru_maxrss (KiB on Linux) of the process."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib / 1024, "VmHWM"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "ru_maxrss"


class DeviceMemory:
    """Device-wide used memory of one GPU: NVML if pynvml imports, else cudaMemGetInfo."""

    def __init__(self, device: torch.device):
        self.device = device
        self._nvml, self.handle = nvml_handle(device)
        self.source = "nvml" if self.handle is not None else "cuda_mem_get_info"

    def used_mib(self) -> float:
        if self.handle is not None:
            return self._nvml.nvmlDeviceGetMemoryInfo(self.handle).used / MIB
        free, total = torch.cuda.mem_get_info(self.device)
        return (total - free) / MIB


class MemoryProbe:
    """Idle / model-loaded / session-peak memory of one device.

    Use: `probe = MemoryProbe(device)` before building the model (takes the idle sample);
    `probe.model_loaded()` after; per session `begin_session()`, `observe()` after every unit,
    `end_session() -> dict`. Raises RuntimeError if a session method is called out of order.
    """

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._driver = DeviceMemory(self.device) if self.cuda else None
        self._settle()
        self.idle = self._current()
        self.model: dict | None = None
        self._session: dict | None = None

    def _settle(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def _current(self) -> dict:
        if self.cuda:
            return {"driver_used_mib": self._driver.used_mib(),
                    "alloc_mib": torch.cuda.memory_allocated(self.device) / MIB,
                    "reserved_mib": torch.cuda.memory_reserved(self.device) / MIB}
        return {"rss_mib": rss_mib()}

    def model_loaded(self) -> dict:
        """Sample with the model built and no session open (the baseline of every session)."""
        self._settle()
        self.model = self._current()
        return self.model

    def begin_session(self) -> None:
        """Free what earlier sessions left cached, re-take the model baseline, reset the peaks."""
        if self.model is None:
            raise RuntimeError("MemoryProbe.begin_session: call model_loaded() after building the model")
        self._settle()
        base = self._current()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            rss_reset = None
        else:
            rss_reset = reset_peak_rss()
        self._session = {"base": base, "driver_peak_mib": base.get("driver_used_mib"), "rss_reset": rss_reset}

    def observe(self) -> None:
        """Take one driver-level sample inside a session (CUDA; a no-op on CPU, where VmHWM tracks it)."""
        if self._session is None:
            raise RuntimeError("MemoryProbe.observe: no session (call begin_session first)")
        if self.cuda:
            used = self._driver.used_mib()
            self._session["driver_peak_mib"] = max(self._session["driver_peak_mib"], used)

    def end_session(self) -> dict:
        """The session's figures (MiB). `model_*`: after the build, before any session; `session_base_*`:
        just before this session (above model_* by whatever earlier sessions left in the shared model:
        `leftover_*`); `session_*` = peak - session_base; `peak_over_idle_*` = (model - idle) + session,
        what one process running only this mode would see."""
        if self._session is None:
            raise RuntimeError("MemoryProbe.end_session: no session (call begin_session first)")
        self.observe()
        s, self._session = self._session, None
        base, model, idle = s["base"], self.model, self.idle
        if self.cuda:
            peak_alloc = torch.cuda.max_memory_allocated(self.device) / MIB
            session_driver = s["driver_peak_mib"] - base["driver_used_mib"]
            out = {
                "idle_driver_used_mib": idle["driver_used_mib"],
                "model_driver_used_mib": model["driver_used_mib"],
                "session_base_driver_used_mib": base["driver_used_mib"],
                "peak_driver_used_mib": s["driver_peak_mib"],
                "session_driver_mib": session_driver,
                "leftover_driver_mib": base["driver_used_mib"] - model["driver_used_mib"],
                "peak_over_idle_driver_mib": model["driver_used_mib"] - idle["driver_used_mib"] + session_driver,
                "model_alloc_mib": model["alloc_mib"],
                "peak_alloc_mib": peak_alloc,
                "session_alloc_mib": peak_alloc - base["alloc_mib"],
                "peak_over_idle_alloc_mib": model["alloc_mib"] - idle["alloc_mib"] + peak_alloc - base["alloc_mib"],
                "peak_reserved_mib": torch.cuda.max_memory_reserved(self.device) / MIB,
                "driver_source": self._driver.source,
            }
        else:
            peak, source = peak_rss_mib()
            if source == "VmHWM" and not s["rss_reset"]:
                source = "VmHWM (not reset: process lifetime)"
            known = None not in (idle["rss_mib"], model["rss_mib"], base["rss_mib"])
            session = peak - base["rss_mib"] if known else None
            out = {
                "idle_rss_mib": idle["rss_mib"],
                "model_rss_mib": model["rss_mib"],
                "session_base_rss_mib": base["rss_mib"],
                "peak_rss_mib": peak,
                "session_rss_mib": session,
                "leftover_rss_mib": base["rss_mib"] - model["rss_mib"] if known else None,
                "peak_over_idle_rss_mib": model["rss_mib"] - idle["rss_mib"] + session if known else None,
                "peak_rss_source": source,
            }
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}

