"""Peak memory of a session, in MiB, against the right baselines: `idle` (before the model), `model` (built,
no session), the session's base and its peak. The per-session increment is peak - base; "peak over idle"
is (model - idle) + that increment. CUDA: driver-level used memory (NVML, else cudaMemGetInfo: it sees VMM
mappings and graph pools, which torch's allocator statistics cannot) and torch's max allocated / reserved;
CPU: resident set size, its peak VmHWM reset per session (else ru_maxrss, said in `peak_rss_source`).
Driver-level figures are device-wide: one process per measurement.

The itemised view of one session (`itemise`, suite.measure.floor): weights (`model_bytes`), the CUDA context
(`DriverReader` before and after CUDA starts in the process), samples of driver, allocator and session
counters (`device_sample`) at open, after `prepare` and after some units, and the allocation sites a
`torch.cuda.memory` snapshot still holds after `prepare` (`snapshot_sites`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import re
import resource
import shutil
import subprocess
import types
from pathlib import Path

import torch

from duplexcadence import gate, graphs
from suite.measure.env import nvml_handle

MIB = 2**20


def release_cached(device) -> None:
    """Give torch's cached free blocks back to the driver (`torch.cuda.empty_cache()`) once no CUDA-graph capture
    waits or runs: inside gate.device_wide(), after a device-wide synchronize. An empty_cache beside another thread's
    capture invalidates that capture (duplexcadence.gate), and a capture torch sees fail keeps its graph pool for
    the life of the process (pytorch/pytorch#180395, #190308). No-op off CUDA."""
    if torch.device(device).type != "cuda":
        return
    with gate.device_wide():
        gate.synchronize(device)
        torch.cuda.empty_cache()


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


def library_caches(device=None) -> dict:
    """Entries now in per-shape library caches (host memory per new shape, kept until full): on a CUDA `device`,
    "cufft_plans", torch.backends.cuda.cufft_plan_cache's plans (torch.istft / stft use it). {} off CUDA."""
    if device is None or torch.device(device).type != "cuda":
        return {}
    index = torch.device(device).index
    cache = torch.backends.cuda.cufft_plan_cache[torch.cuda.current_device() if index is None else index]
    return {"cufft_plans": int(cache.size)}


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
        with gate.work():
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
        release_cached(self.device)

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



# --- one session's memory, itemised ------------------------------------------------------------------------
class DriverReader:
    """Device-wide used memory (MiB) of one GPU read WITHOUT initialising CUDA in this process: NVML (pynvml)
    or else `nvidia-smi`, for the device that CUDA index `index` will be (CUDA_VISIBLE_DEVICES applied), so
    the same reader gives the memory before and after CUDA starts here. `source` None: neither is available
    (every read returns None). Never raises."""

    def __init__(self, index: int = 0):
        self.ident, self.source, self._nvml, self._handle = _visible_device(index), None, None, None
        if self.ident is None:
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            if self.ident.startswith(("GPU-", "MIG-")):
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(self.ident)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(self.ident))
            self._nvml, self.source = pynvml, "nvml"
        except Exception:       # no pynvml / NVML library, or an odd CUDA_VISIBLE_DEVICES entry
            if shutil.which("nvidia-smi") is not None:
                self.source = "nvidia-smi"

    def same_device(self, device: torch.device) -> bool | None:
        """After CUDA started: whether NVML's device is CUDA's `device` (by UUID; NVML counts in PCI order,
        CUDA may not); a mismatch re-points the reader at CUDA's device. None where it cannot tell."""
        if self.source != "nvml":
            return None
        try:
            uuid = f"GPU-{torch.cuda.get_device_properties(device).uuid}"
            mine = self._nvml.nvmlDeviceGetUUID(self._handle)
            mine = mine.decode() if isinstance(mine, bytes) else str(mine)
            if mine == uuid:
                return True
            self._handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            return False
        except Exception:
            return None

    def used_mib(self) -> float | None:
        try:
            if self.source == "nvml":
                return self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / MIB
            if self.source == "nvidia-smi":
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-i", self.ident], capture_output=True, text=True, timeout=30)
                return float(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else None
        except Exception:
            return None
        return None


def _visible_device(index: int) -> str | None:
    """What NVML / nvidia-smi call CUDA device `index` of this process: an index or a UUID."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return parts[index] if 0 <= index < len(parts) else None


def model_bytes(model, device: str | torch.device | None = None, depth: int = 3) -> dict:
    """Bytes of the nn.Module parameters and buffers reachable from `model` (a module, or an object, dict,
    list or dataclass holding modules, up to `depth` levels), each storage once, only those on `device`
    (None: any): {"parameter_bytes", "buffer_bytes"}."""
    device = None if device is None else torch.device(device)
    seen_modules, seen_storages, out = set(), set(), {"parameter_bytes": 0, "buffer_bytes": 0}

    def add(t: torch.Tensor, key: str) -> None:
        if device is not None and (t.device.type != device.type or
                                   (device.index is not None and t.device.index != device.index)):
            return
        storage = t.untyped_storage()
        ident = (t.device.type, t.device.index, storage.data_ptr(), storage.nbytes())
        if ident not in seen_storages:
            seen_storages.add(ident)
            out[key] += storage.nbytes()

    def visit(obj, level: int) -> None:
        if isinstance(obj, torch.nn.Module):
            if id(obj) not in seen_modules:
                seen_modules.add(id(obj))
                for t in obj.parameters():
                    add(t, "parameter_bytes")
                for t in obj.buffers():
                    add(t, "buffer_bytes")
            return
        if level <= 0 or obj is None or isinstance(obj, (str, bytes, int, float, torch.Tensor, type, types.ModuleType,
                                                         types.FunctionType, types.MethodType)):
            return
        if isinstance(obj, dict):
            values = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            values = list(obj)
        elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
            values = list(vars(obj).values())
        else:
            return
        for v in values:
            visit(v, level - 1)

    visit(model, depth)
    return out


def device_sample(device: torch.device, reader: DriverReader | None, session=None) -> dict:
    """One sample (MiB) of this process's memory: `driver_used_mib` (reader; None without one), torch's
    `allocated_mib` / `reserved_mib`, the cuBLAS workspaces primed on capture streams
    (duplexcadence.graphs.PRIMED_BYTES) and, from `session.stats()` (SessionStats), its arena
    (`arena_reserved_mib`, `arena_mapped_mib`, `arena_backend`) and `graph_pool_mib`. Off CUDA the device
    figures are None. The device is synchronized first."""
    cuda = device.type == "cuda"
    out = {"driver_used_mib": None, "allocated_mib": None, "reserved_mib": None, "cublas_primed_mib": None,
           "arena_reserved_mib": None, "arena_mapped_mib": None, "arena_backend": None, "graph_pool_mib": None}
    if cuda:
        gate.synchronize(device)
        out.update(driver_used_mib=reader.used_mib() if reader is not None else None,
                   allocated_mib=torch.cuda.memory_allocated(device) / MIB,
                   reserved_mib=torch.cuda.memory_reserved(device) / MIB,
                   cublas_primed_mib=graphs.PRIMED_BYTES[0] / MIB)
    if session is not None:
        st = session.stats()
        out.update(arena_reserved_mib=st.arena_bytes_reserved / MIB, arena_mapped_mib=st.arena_bytes_mapped / MIB,
                   arena_backend=st.detail.get("arena_backend"), graph_pool_mib=st.graph_bytes / MIB)
    return out


def _unseen(sample: dict) -> float | None:
    """Driver memory torch's allocator does not hold: used - reserved - the arena's VMM mapping (a prealloc
    arena is inside reserved)."""
    if sample.get("driver_used_mib") is None or sample.get("reserved_mib") is None:
        return None
    vmm = (sample.get("arena_mapped_mib") or 0.0) if sample.get("arena_backend") == "vmm" else 0.0
    return sample["driver_used_mib"] - sample["reserved_mib"] - vmm


def _sub(a, b):
    return None if a is None or b is None else a - b


def itemise(*, weights: dict, idle_mib: float | None, context_mib: float | None, model: dict, opened: dict,
            prepared: dict, steady: dict) -> dict:
    """One session's memory (MiB) by item, from `device_sample`s taken with the model built and no session
    (`model`), at open (`opened`), right after `prepare` (`prepared`) and after some units (`steady`).
    weights: `model_bytes`; idle_mib: the device's used memory before CUDA started in this process;
    context_mib: what starting CUDA added. Items (at `steady` unless named): weights, arena reserved and
    mapped, graph pool, `graph_exec_mib` (driver memory torch does not see, after prepare minus at open:
    graph executables, plus kernels loaded and library handles made by prepare's warm-ups), allocator cache
    (reserved - allocated), CUDA context, cuBLAS workspaces of capture streams; and the totals
    `driver_over_idle_mib`, `unseen_mib` (driver memory beyond the idle device, the context, torch's reserve
    and a VMM arena), `session_allocated_mib` (allocated - the model's). None where a figure is unknown."""
    mib = lambda n: n / MIB
    unseen = _sub(_sub(_unseen(steady), idle_mib), context_mib)
    out = {
        "weights_mib": mib(weights["parameter_bytes"] + weights["buffer_bytes"]),
        "parameters_mib": mib(weights["parameter_bytes"]), "buffers_mib": mib(weights["buffer_bytes"]),
        "arena_reserved_mib": steady.get("arena_reserved_mib"), "arena_mapped_mib": steady.get("arena_mapped_mib"),
        "arena_backend": steady.get("arena_backend"), "graph_pool_mib": steady.get("graph_pool_mib"),
        "graph_exec_mib": _sub(_unseen(prepared), _unseen(opened)),
        "allocator_cache_mib": _sub(steady.get("reserved_mib"), steady.get("allocated_mib")),
        "cuda_context_mib": context_mib, "cublas_workspace_mib": steady.get("cublas_primed_mib"),
        "driver_used_mib": steady.get("driver_used_mib"), "idle_mib": idle_mib,
        "driver_over_idle_mib": _sub(steady.get("driver_used_mib"), idle_mib), "unseen_mib": unseen,
        "torch_allocated_mib": steady.get("allocated_mib"), "torch_reserved_mib": steady.get("reserved_mib"),
        "session_allocated_mib": _sub(steady.get("allocated_mib"), model.get("allocated_mib")),
        "prepare_reserved_mib": _sub(prepared.get("reserved_mib"), opened.get("reserved_mib")),
        "prepare_driver_mib": _sub(prepared.get("driver_used_mib"), opened.get("driver_used_mib")),
    }
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


@contextlib.contextmanager
def allocation_history(device: torch.device, enabled: bool = True, max_entries: int = 200_000):
    """Record the CUDA caching allocator's allocations with Python stacks for the body
    (torch.cuda.memory._record_memory_history); yields a dict whose "snapshot" the body sets by calling
    `take()`, and "error" where recording could not start. Off CUDA or not enabled: records nothing."""
    box: dict = {"snapshot": None, "error": None}
    on = enabled and device.type == "cuda"
    if on:
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                     max_entries=max_entries, device=device)
        except Exception as exc:                 # an older torch: record why, measure the rest
            box["error"], on = f"{type(exc).__name__}: {exc}"[:300], False
    box["take"] = (lambda: box.__setitem__("snapshot", torch.cuda.memory._snapshot(device))) if on else (lambda: None)
    try:
        yield box
    finally:
        if on:
            torch.cuda.memory._record_memory_history(enabled=None, device=device)


def _frame_text(frame: dict) -> str:
    path = Path(str(frame.get("filename", "?")))
    return f"{'/'.join(path.parts[-3:])}:{frame.get('line', '?')} {frame.get('name', '?')}"


def snapshot_sites(snapshot: dict | None, top: int = 10) -> dict | None:
    """The blocks a `torch.cuda.memory._snapshot()` holds allocated (state "active_allocated"), those with a
    recorded stack (allocated while `allocation_history` ran) grouped by site: the innermost frame outside
    torch's own files, with `via`, the innermost frame in duplexcadence, and `pool` ("graph" for a graph's
    private pool, else "default"). Returns {"allocated_bytes", "recorded_bytes", "by_pool": {pool: bytes of
    recorded blocks}, "sites": the `top` sites by bytes, each {site, via, pool, bytes, blocks}}; None for None.
    Frames are innermost first, as torch writes them."""
    if snapshot is None:
        return None
    total = recorded = 0
    by_pool: dict[str, int] = {}
    sites: dict[tuple, list] = {}
    for seg in snapshot.get("segments", []):
        pool = "graph" if tuple(seg.get("segment_pool_id") or (0, 0)) != (0, 0) else "default"
        for block in seg.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            size = int(block.get("size", 0))
            total += size
            frames = block.get("frames") or []
            if not frames:
                continue
            recorded += size
            by_pool[pool] = by_pool.get(pool, 0) + size
            outside = [f for f in frames if "/torch/" not in str(f.get("filename", "")).replace("\\", "/")]
            ours = [f for f in frames if "duplexcadence" in str(f.get("filename", ""))]
            key = (_frame_text(outside[0] if outside else frames[0]), _frame_text(ours[0]) if ours else None, pool)
            entry = sites.setdefault(key, [0, 0])
            entry[0] += size
            entry[1] += 1
    rows = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    return {"allocated_bytes": total, "recorded_bytes": recorded, "by_pool": by_pool,
            "sites": [{"site": k[0], "via": k[1], "pool": k[2], "bytes": v[0], "blocks": v[1]} for k, v in rows]}


def residue(device: torch.device, history: dict | None = None) -> dict:
    """What the process still holds on `device` once every session closed: torch's allocated and reserved MiB,
    the sites of the blocks still allocated (`snapshot_sites` of `history`, an `allocation_history` box that
    recorded the run; None without one), and the MiB of torch's cuBLAS workspaces (one per cuBLAS handle and
    stream pair: a host thread's handle meeting a stream allocates one), freed here to count them when no
    CUDA graph is alive (a graph may hold a workspace's address; None otherwise, or where this torch cannot
    clear them). Call it last: the workspaces are made again on demand. CPU: {}."""
    if device.type != "cuda":
        return {}
    gate.synchronize(device)
    gc.collect()
    alloc = torch.cuda.memory_allocated(device)
    out = {"allocated_mib": alloc / 2 ** 20, "reserved_mib": torch.cuda.memory_reserved(device) / 2 ** 20,
           "sites": None, "cublas_workspaces_mib": None}
    if history is not None and history.get("take") is not None:
        history["take"]()
        out["sites"] = snapshot_sites(history["snapshot"])
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None and not any(isinstance(o, torch.cuda.CUDAGraph) for o in gc.get_objects()):
        clear()
        out["cublas_workspaces_mib"] = (alloc - torch.cuda.memory_allocated(device)) / 2 ** 20
    return out
