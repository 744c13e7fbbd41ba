"""Kernel launches and GPU kernel-busy time of one call, from the CUDA profiler (CUPTI via torch.profiler):
`profile_call(fn, *args)` runs `fn` once profiled and counts from its Chrome trace `launch_calls` (by API),
`kernel_launches` (graph replays excluded), `graph_launches`, `kernels` (those inside replayed graphs
included), `kernel_busy_ms` (the union of the kernels' intervals), `gpu_busy_ms` (with copies) and
`wall_ms` (under the profiler: no speed figure). On CPU the call runs unprofiled, the summary None.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time

import torch

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


def profile_call(fn, *args, device: torch.device | str = "cuda", **kwargs):
    """Run fn(*args, **kwargs) once under the CUDA profiler. Returns (fn's result, summary dict or None).

    None on a non-CUDA device (the call still runs). The device is synchronized before the profiler
    stops, so every kernel the call queued is in the trace."""
    device = torch.device(device)
    if device.type != "cuda":
        return fn(*args, **kwargs), None
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        torch.cuda.synchronize(device)
        wall = (time.perf_counter() - t0) * 1000.0
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    summary = summarize_trace(events)
    summary["wall_ms"] = wall
    return out, summary
