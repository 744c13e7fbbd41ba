"""Helpers shared by the per-model GPU check scripts (tools/gpu/*_check.py)."""
from __future__ import annotations

import time

import numpy as np
import torch


def timed(device: torch.device, fn, *a, **kw):
    """(fn's result, ms): CUDA events around fn (device synchronized before and after) on CUDA,
    perf_counter on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(*a, **kw)
        end.record()
        torch.cuda.synchronize(device)
        return out, float(start.elapsed_time(end))
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, (time.perf_counter() - t0) * 1e3


def stats_ms(values) -> dict:
    """p50 / p90 / p99 / mean / max (ms, numpy linear percentiles) and n of a list of times; {} if empty."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {}
    return {"p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)),
            "p99": float(np.percentile(v, 99)), "mean": float(v.mean()), "max": float(v.max()), "n": int(v.size)}
