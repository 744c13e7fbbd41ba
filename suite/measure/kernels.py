"""Kernel launches, GPU kernel-busy time and the GPU timeline of one call, from the CUDA profiler (CUPTI via
torch.profiler). `profile_call(fn, *args)` runs `fn` once profiled and counts from its Chrome trace `launch_calls`
(by API), `kernel_launches` (graph replays excluded), `graph_launches`, `kernels` (those inside replayed graphs
included), `kernel_busy_ms` (the union of the kernels' intervals), `gpu_busy_ms` (with copies) and `wall_ms`
(under the profiler: no speed figure). On CPU the call runs unprofiled, the summary None.

`unit_timeline(events)` splits the wall span of one profiled call (the UNIT_MARK range `trace_call` puts
around it) into GPU-busy time and gaps, and gives every gap its causes (GAP_CAUSES); `data_movement(events)`
counts the kernels that only move data (DATA_MOVEMENT_KERNELS). Both are pure functions of the trace events.
"""
from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import re
import tempfile
import time

import torch

from duplexcadence import gate

KERNEL_LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                      "cudaLaunchCooperativeKernel")
GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")
COPY_APIS = ("cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy", "cudaMemset")


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length (ms) of the union of [start, end) intervals given in microseconds."""
    total, end_max = 0.0, None
    for start, end in sorted(intervals):
        if end_max is None or start >= end_max:
            total += end - start
            end_max = end
        elif end > end_max:
            total += end - end_max
            end_max = end
    return total / 1000.0


def _interval(i: int, ev: dict) -> tuple[float, float]:
    """[ts, ts + dur) of a complete ("X") event, in microseconds; ValueError naming the event if malformed."""
    try:
        ts, dur = float(ev["ts"]), float(ev.get("dur", 0))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"events[{i}] ({ev.get('cat')!r} {ev.get('name')!r}): expected numeric \"ts\" and "
                         f"\"dur\", got ts={ev.get('ts')!r}, dur={ev.get('dur')!r}") from None
    if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
        raise ValueError(f"events[{i}] ({ev.get('cat')!r} {ev.get('name')!r}): expected a finite ts and dur >= 0, "
                         f"got ts={ts!r}, dur={dur!r}")
    return ts, ts + dur


def summarize_trace(events: list[dict]) -> dict:
    """Counts and busy times from Chrome-trace events (the dicts of a kineto trace's "traceEvents").
    Raises ValueError naming the event for input that is not such a list (a whole trace dict, a non-dict
    event, a kernel/copy event without a finite "ts" or with a negative or non-finite "dur")."""
    if isinstance(events, (dict, str, bytes)) or not hasattr(events, "__iter__"):
        raise ValueError(f"events: expected a list of trace-event dicts (a trace's \"traceEvents\"), "
                         f"got {type(events).__name__}")
    calls: dict[str, int] = {}
    kernels, copies = [], []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise ValueError(f"events[{i}]: expected a dict, got {type(ev).__name__}")
        if ev.get("ph") != "X":
            continue
        cat, name = ev.get("cat", ""), ev.get("name", "")
        if cat in ("cuda_runtime", "cuda_driver"):
            if name in KERNEL_LAUNCH_APIS + GRAPH_LAUNCH_APIS + COPY_APIS:
                calls[name] = calls.get(name, 0) + 1
        elif cat == "kernel":
            kernels.append(_interval(i, ev))
        elif cat in ("gpu_memcpy", "gpu_memset"):
            copies.append(_interval(i, ev))
    return {"launch_calls": calls,
            "kernel_launches": sum(calls.get(n, 0) for n in KERNEL_LAUNCH_APIS),
            "graph_launches": sum(calls.get(n, 0) for n in GRAPH_LAUNCH_APIS),
            "kernels": len(kernels),
            "kernel_busy_ms": _union_ms(kernels), "gpu_busy_ms": _union_ms(kernels + copies)}


def trace_call(fn, *args, device: torch.device | str = "cuda", keep: str | os.PathLike | None = None, **kwargs):
    """Run fn(*args, **kwargs) once under torch.profiler (CPU and CUDA activities) inside
    `record_function(UNIT_MARK)`; the device is synchronized inside the mark, so every kernel the call queued
    is in the trace and the mark spans the call's wall time. Returns (fn's result, the trace's events, wall ms
    by perf_counter); events None on a non-CUDA device (the call still runs). keep: also write the Chrome
    trace there (gzipped when the name ends in .gz)."""
    device = torch.device(device)
    if device.type != "cuda":
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        return out, None, (time.perf_counter() - t0) * 1000.0
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    gate.synchronize(device)
    with torch.profiler.profile(activities=acts) as prof:
        with torch.profiler.record_function(UNIT_MARK):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            gate.synchronize(device)
            wall = (time.perf_counter() - t0) * 1000.0
    if keep is not None:
        path, temporary = str(keep), False
    else:
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        temporary = True
    try:
        prof.export_chrome_trace(path)
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        if temporary:
            os.unlink(path)
    return out, events, wall


def profile_call(fn, *args, device: torch.device | str = "cuda", **kwargs):
    """Run fn(*args, **kwargs) once under the CUDA profiler (`trace_call`). Returns (fn's result, summary dict
    or None): `summarize_trace` of its events plus `wall_ms`. None on a non-CUDA device (the call still runs)."""
    out, events, wall = trace_call(fn, *args, device=device, **kwargs)
    if events is None:
        return out, None
    summary = summarize_trace(events)
    summary["wall_ms"] = wall
    return out, summary


# --- the GPU timeline of one call ------------------------------------------------------------------------
UNIT_MARK = "duplexcadence::unit"       # the record_function range trace_call puts around the call

#: Why the GPU was idle, in the order a host interval is claimed when several overlap (innermost CUDA API
#: call first; an aten op without an API call in it after every API; "python": no aten op and no CUDA API
#: call on the host, pure host work). Two causes are not host work: "queued" (the activity after the gap was
#: launched before the gap began: the device's own latency between activities, e.g. between the kernels of a
#: replayed graph) and, for the launch of the activity that ends a gap, its API's own cause ("graph_launch",
#: "eager_op" for a kernel launch, a copy's direction) from the call's start to the activity's start.
GAP_CAUSES = ("capture", "sync", "alloc", "d2h_copy", "h2d_copy", "d2d_copy", "copy", "memset", "graph_launch",
              "eager_op", "cuda_api", "python", "queued")
CAPTURE_APIS = frozenset({"cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
                          "cudaGraphInstantiateWithFlags", "cudaGraphUpload", "cudaGraphDestroy",
                          "cudaGraphExecDestroy", "cuStreamBeginCapture", "cuStreamEndCapture",
                          "cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphUpload", "cuGraphDestroy",
                          "cuGraphExecDestroy"})
#: Host waits on the device: the synchronize calls and the synchronous (non-Async) copies.
SYNC_APIS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                       "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
                       "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpy"})
#: aten ops that read a device value back to the host (`.item()`, `bool(tensor)`, nonzero's count).
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero"})
ALLOC_APIS = frozenset({"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaMallocHost",
                        "cudaFreeHost", "cudaHostAlloc", "cudaHostRegister", "cudaHostUnregister", "cuMemAlloc",
                        "cuMemFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
                        "cuMemAddressReserve", "cuMemAddressFree"})
MEMCPY_APIS = frozenset({"cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpyPeerAsync", "cuMemcpyAsync",
                         "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync"})
MEMSET_APIS = frozenset({"cudaMemsetAsync", "cudaMemset", "cuMemsetD8Async", "cuMemsetD16Async",
                         "cuMemsetD32Async", "cuMemsetD8", "cuMemsetD32"})
_API_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")


def api_cause(name: str, gpu_name: str = "") -> str:
    """The gap cause of time spent in CUDA API call `name` (runtime or driver; _v2 / _ptsz suffixes ignored);
    gpu_name: the name of the device activity it launched, which gives a copy's direction."""
    n = _API_SUFFIX.sub("", name)
    if n in CAPTURE_APIS:
        return "capture"
    if n in SYNC_APIS:
        return "sync"
    if n in ALLOC_APIS:
        return "alloc"
    if n in MEMSET_APIS:
        return "memset"
    if n in MEMCPY_APIS:
        text = f"{gpu_name} {n}"
        for key, cause in (("HtoD", "h2d_copy"), ("DtoH", "d2h_copy"), ("DtoD", "d2d_copy"), ("PtoP", "d2d_copy")):
            if key in text:
                return cause
        return "copy"
    if n in GRAPH_LAUNCH_APIS:
        return "graph_launch"
    if n in KERNEL_LAUNCH_APIS:
        return "eager_op"
    return "cuda_api"


def _merge(intervals) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as sorted disjoint intervals (empty ones dropped)."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _split(pieces: list[tuple], cover: list[tuple[float, float]]) -> tuple[list, list]:
    """(parts of `pieces` inside `cover`, parts outside). pieces: sorted disjoint (start, end, gap index);
    cover: sorted disjoint (start, end)."""
    inside, outside, j = [], [], 0
    for start, end, g in pieces:
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        pos, k = start, j
        while k < len(cover) and cover[k][0] < end:
            lo, hi = max(pos, cover[k][0]), min(end, cover[k][1])
            if lo > pos:
                outside.append((pos, lo, g))
            if hi > lo:
                inside.append((lo, hi, g))
            pos = max(pos, hi)
            if cover[k][1] >= end:
                break
            k += 1
        if pos < end:
            outside.append((pos, end, g))
    return inside, outside


def _top_level(ops: list[tuple]) -> list[tuple]:
    """The outermost of nested (start, end, name, thread) ranges, per thread, as sorted disjoint (start, end,
    name): where two threads' ranges overlap, the earlier one keeps the overlap."""
    top, ends = [], {}
    for start, end, name, thread in sorted(ops, key=lambda o: (o[0], -o[1])):
        if start >= ends.get(thread, -math.inf):
            top.append((start, end, name))
            ends[thread] = end
    out, last = [], -math.inf
    for start, end, name in sorted(top):
        if end > max(start, last):
            out.append((max(start, last), end, name))
            last = end
    return out


def _by_name(pieces: list[tuple], named: list[tuple]) -> dict[str, float]:
    """Microseconds of `pieces` (sorted disjoint (start, end, ...)) inside each name of `named` ((start, end,
    name), sorted by start)."""
    ends = [p[1] for p in pieces]
    out: dict[str, float] = {}
    for start, end, name in named:
        i = bisect.bisect_right(ends, start)
        while i < len(pieces) and pieces[i][0] < end:
            overlap = min(end, pieces[i][1]) - max(start, pieces[i][0])
            if overlap > 0:
                out[name] = out.get(name, 0.0) + overlap
            i += 1
    return out


def _ms(us: float) -> float:
    return round(us / 1000.0, 4)


def unit_timeline(events: list[dict], span: tuple[float, float] | None = None) -> dict:
    """The GPU timeline of one profiled call from its trace events (a kineto trace's "traceEvents").

    span: (start, end) in the trace's microseconds; default the UNIT_MARK range (`trace_call`), else the
    extent of every complete event. Inside it: `kernel_busy_ms` (union of kernels), `gpu_busy_ms` (kernels,
    copies and memsets), `kernels` (launch counts: the whole trace's), `wall_ms`, `tail_over_kernel_busy_x`
    (wall / kernel-busy; None without kernels) and every gap in the GPU's activity (`kind`: "before" the
    first activity, "between", "after" the last, or "whole" without any), so that wall = gpu_busy + gaps.
    Each gap's time goes to causes (GAP_CAUSES): when the activity ending it was launched (its API call,
    matched by correlation id) before the gap began, "queued"; when its launch call started inside the gap,
    the launch's cause from the call's start on; the rest goes to what the host was doing, from the
    overlapping host events (CUDA API calls, then aten ops, then "python"). `by_cause` / `by_cause_op` sum
    the causes (and the outermost aten op the host was in, "-" for none) over the gaps; `after_sync_ms`: the
    time of gaps that began while the host waited in a sync. Raises ValueError as summarize_trace does for
    malformed input."""
    summary = summarize_trace(events)
    gpu, apis, ops, marks = [], [], [], []
    for i, ev in enumerate(events):
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat", "")
        if cat not in GPU_CATS and cat not in API_CATS and cat not in ("cpu_op", "user_annotation"):
            continue
        start, end = _interval(i, ev)
        name, args = str(ev.get("name", "")), ev.get("args") or {}
        if cat in GPU_CATS:
            gpu.append((start, end, name, args.get("correlation"), cat))
        elif cat in API_CATS:
            apis.append((start, end, name, args.get("correlation")))
        elif cat == "cpu_op":
            ops.append((start, end, name, (ev.get("pid"), ev.get("tid"))))
        elif name == UNIT_MARK:
            marks.append((start, end))
    if span is None:
        if marks:
            span = (min(m[0] for m in marks), max(m[1] for m in marks))
        else:
            spans = [(s, e) for s, e, *_ in gpu + apis + ops]
            span = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0.0, 0.0)
    lo, hi = float(span[0]), float(span[1])
    gpu_name = {c: n for _, _, n, c, _ in gpu if c is not None}
    gpu = sorted((max(s, lo), min(e, hi), n, c, k) for s, e, n, c, k in gpu if e > lo and s < hi)
    busy = _merge((s, e) for s, e, *_ in gpu)
    kernel_busy = _union_ms([(s, e) for s, e, _, _, k in gpu if k == "kernel"])
    # the gaps, and the activity that ends each one
    gaps, pos = [], lo
    for s, e in busy:
        if s > pos:
            gaps.append((pos, s, "before" if pos == lo else "between"))
        pos = e
    if pos < hi:
        gaps.append((pos, hi, "after" if busy else "whole"))
    starts = [g[0] for g in gpu]
    launch_of = {}
    for s, e, n, c in apis:
        if c is not None and c in gpu_name:
            launch_of.setdefault(c, (s, e, n))
    pieces, causes = [], [dict() for _ in gaps]          # host-bound parts; per-gap cause -> us
    assigned = []                                        # (start, end, gap, cause) not decided by host overlap
    for g, (a, b, kind) in enumerate(gaps):
        nxt = gpu[bisect.bisect_left(starts, b)] if kind in ("before", "between") else None
        launch = launch_of.get(nxt[3]) if nxt is not None and nxt[3] is not None else None
        if launch is None or launch[0] >= b:
            pieces.append((a, b, g))
        elif launch[1] <= a:
            assigned.append((a, b, g, "queued"))
        else:
            cause = api_cause(launch[2], nxt[2])
            if launch[0] > a:
                pieces.append((a, launch[0], g))
            assigned.append((max(a, launch[0]), b, g, cause))
    by_class: dict[str, list] = {}
    for s, e, n, c in apis:
        by_class.setdefault(api_cause(n, gpu_name.get(c, "")), []).append((s, e))
    by_class.setdefault("sync", []).extend((s, e) for s, e, n, _ in ops if n in SYNC_OPS)
    order = [(cause, by_class.get(cause, [])) for cause in GAP_CAUSES[:11]]
    order.append(("eager_op", [(s, e) for s, e, *_ in ops]))
    labelled = [(s, e, g, c) for s, e, g, c in assigned]
    for cause, cover in order:
        inside, pieces = _split(sorted(pieces), _merge(cover))
        labelled += [(s, e, g, cause) for s, e, g in inside]
    labelled += [(s, e, g, "python") for s, e, g in pieces]
    top = _top_level(ops)
    by_cause: dict[str, float] = {}
    by_cause_op: dict[str, dict[str, float]] = {}
    for s, e, g, cause in labelled:
        causes[g][cause] = causes[g].get(cause, 0.0) + (e - s)
        by_cause[cause] = by_cause.get(cause, 0.0) + (e - s)
    for cause in by_cause:
        mine = sorted((s, e) for s, e, _, c in labelled if c == cause)
        named = _by_name(mine, top)
        rest = by_cause[cause] - sum(named.values())
        if rest > 1e-6:
            named["-"] = rest
        by_cause_op[cause] = {k: _ms(v) for k, v in sorted(named.items(), key=lambda kv: -kv[1])}
    sync_cover = _merge(by_class.get("sync", []))
    sync_starts = [s for s, _ in sync_cover]
    rows, top_ends = [], [t[1] for t in top]
    for g, (a, b, kind) in enumerate(gaps):
        i = bisect.bisect_right(sync_starts, a) - 1
        after_sync = i >= 0 and sync_cover[i][1] > a
        j, ops_here = bisect.bisect_right(top_ends, a), {}
        while j < len(top) and top[j][0] < b:
            ops_here[top[j][2]] = ops_here.get(top[j][2], 0.0) + min(b, top[j][1]) - max(a, top[j][0])
            j += 1
        rows.append({"start_us": round(a - lo, 3), "ms": _ms(b - a), "kind": kind,
                     "cause": max(causes[g], key=causes[g].get),
                     "causes": {k: _ms(v) for k, v in sorted(causes[g].items(), key=lambda kv: -kv[1])},
                     "ops": [k for k, _ in sorted(ops_here.items(), key=lambda kv: -kv[1])][:5],
                     "after_sync": after_sync})
    wall = _ms(hi - lo)
    return {"wall_ms": wall, "kernel_busy_ms": round(kernel_busy, 4), "gpu_busy_ms": _ms(sum(e - s for s, e in busy)),
            "tail_over_kernel_busy_x": round(wall / kernel_busy, 4) if kernel_busy > 0 else None,
            "kernels": sum(k == "kernel" for *_, k in gpu), "kernel_launches": summary["kernel_launches"],
            "graph_launches": summary["graph_launches"], "gaps": len(rows),
            "gaps_ms": _ms(sum(b - a for a, b, _ in gaps)),
            "by_cause": {k: _ms(v) for k, v in sorted(by_cause.items(), key=lambda kv: -kv[1])},
            "by_cause_op": by_cause_op,
            "after_sync_ms": round(sum(r["ms"] for r in rows if r["after_sync"]), 4), "gap_list": rows}


# --- kernels that only move data -------------------------------------------------------------------------
#: Kernel-name fragments of PyTorch's CUDA kernels that only move bytes (no arithmetic on them), by kind; a
#: kernel is of the first kind one of whose fragments its name contains. aten/src/ATen/native/cuda: Shape.cu
#: (cat: CatArrayBatchedCopy*), Copy.cu (copy_, contiguous, clone, .to: direct_copy_kernel_cuda, a dtype cast
#: included), IndexKernel.cu / Indexing.cu (index_put_, index_copy_ into caches; index / index_select
#: gathers), ScatterGatherKernel.cu (scatter_, gather), ReflectionPad.cu / ReplicationPadding.cu, Roll and
#: flip (TensorTransformations.cu). Device-to-device memcpy activities (a same-dtype contiguous copy_) are
#: counted beside them as "memcpy_dtod"; fills (FILL_KERNELS, memsets) are counted but are not data movement.
DATA_MOVEMENT_KERNELS = (
    ("cat", ("CatArrayBatchedCopy",)),
    ("index_put", ("index_put", "index_copy", "indexing_backward_kernel")),
    ("copy", ("direct_copy_kernel", "copy_kernel")),
    ("index", ("index_kernel", "indexSelect", "index_select")),
    ("scatter_gather", ("scatter_gather", "scatter_kernel", "gather_kernel")),
    ("pad", ("reflection_pad", "replication_pad")),
    ("roll_flip", ("roll_cuda_kernel", "flip_kernel")),
)
FILL_KERNELS = ("FillFunctor", "fill_kernel")


def movement_kind(name: str) -> str | None:
    """The DATA_MOVEMENT_KERNELS kind of a kernel name, or None (an arithmetic kernel, or a fill)."""
    for kind, fragments in DATA_MOVEMENT_KERNELS:
        if any(f in name for f in fragments):
            return kind
    return None


def data_movement(events: list[dict]) -> dict:
    """Per kind of DATA_MOVEMENT_KERNELS, how many kernels of the trace only move data and their summed
    duration (ms); `movement_kernels` / `kernels` totals and `movement_share` of the kernel count;
    `memcpy_dtod` (device-to-device copies, not kernels) and `fills` (fill kernels and memsets) beside them.
    Raises ValueError as summarize_trace does."""
    summarize_trace(events)                                      # validates the events
    kinds = {kind: {"count": 0, "ms": 0.0} for kind, _ in DATA_MOVEMENT_KERNELS}
    kernels = dtod = fills = 0
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat, name = ev.get("cat", ""), str(ev.get("name", ""))
        if cat == "kernel":
            kernels += 1
            kind = movement_kind(name)
            if kind is not None:
                kinds[kind]["count"] += 1
                kinds[kind]["ms"] += float(ev.get("dur", 0)) / 1000.0
            elif any(f in name for f in FILL_KERNELS):
                fills += 1
        elif cat == "gpu_memcpy" and "DtoD" in name:
            dtod += 1
        elif cat == "gpu_memset":
            fills += 1
    moved = sum(k["count"] for k in kinds.values())
    return {"kernels": kernels, "movement_kernels": moved,
            "movement_share": round(moved / kernels, 4) if kernels else None,
            "movement_ms": round(sum(k["ms"] for k in kinds.values()), 4),
            "by_kind": {k: {"count": v["count"], "ms": round(v["ms"], 4)} for k, v in kinds.items()},
            "memcpy_dtod": dtod, "fills": fills}
