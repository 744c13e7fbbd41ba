"""Which object keeps the host heap and driver memory that follows the most graph sessions held at once?

VARIANT (argv[1]), one process each, rounds of k (ROUNDS), memory read after each round with nothing alive:
  streams   k new driver streams per round (from the pool once made), each runs one eager matmul; no graph
  tiny      the same, each stream captures one 1-node matmul graph, replays it, the graph is dropped
  onestream ONE stream; k*G graphs of N nodes captured on it, all alive at once, replayed, dropped
  manystr   k streams, G graphs of N nodes captured on each, all alive at once, replayed, dropped
  sa2       the Step-Audio 2 cadence sessions of results/2026-12-02-h200-rss-probe (k open at once)
After the rounds: cuDeviceGraphMemTrim, malloc_trim(0), torch's cuBLAS workspaces cleared, then every pool
stream destroyed (cuStreamDestroy), each followed by a reading.
"""
import ctypes
import gc
import json
import os
import sys
import time

import numpy as np
import torch

from duplexcadence import graphs as G_
from suite.measure.memory import DeviceMemory, host_heap_mib, release_cached, rss_mib
from cuda.bindings import driver as cu

ROUNDS = [1, 2, 4, 8, 8, 2, 8]
NG, NN = 10, 2000
variant = sys.argv[1]
dev = torch.device("cuda")
torch.cuda.init()
driver = DeviceMemory(dev)
rows = []
out = os.environ.get("OUT", ".")


def sample(label, k, **extra):
    torch.cuda.synchronize()
    gc.collect()
    release_cached(dev)
    row = {"variant": variant, "round": label, "k": k, "rss_mib": rss_mib(), **host_heap_mib(dev),
           "driver_used_mib": driver.used_mib(), "alloc_mib": torch.cuda.memory_allocated(dev) / 2 ** 20, **extra}
    row = {key: (round(v, 1) if isinstance(v, float) else v) for key, v in row.items()}
    print(json.dumps(row), flush=True)
    rows.append(row)


a = torch.randn(64, 64, device=dev)
pool = []          # streams made so far, reused round to round (like StreamLeases)


def streams(k):
    while len(pool) < k:
        s = G_._new_driver_stream(0)
        with torch.cuda.stream(s):
            _ = a @ a          # cuBLAS makes this (handle, stream)'s workspace before any capture
        s.synchronize()
        pool.append(s)
    return pool[:k]


a = torch.randn(64, 64, device=dev)


def big_graph(stream):
    x = torch.zeros(256, device=dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(NN):
            x.add_(1.0)
        y = a @ a
    return g, x, y


sample("start", 0)
if variant == "sa2":
    import workloads
    from duplexcadence import runtime
    from suite.measure.session import make_spec
    wl = workloads.get("stepaudio2_mini")
    spec = make_spec(wl)
    adapter = runtime.adapter(wl.architecture)
    model = adapter.build_model(spec, device=dev, depth="released", seed=0)
    rng = np.random.default_rng(0)
    sample("built", 0)
t0 = time.time()
for i, k in enumerate(ROUNDS):
    extra = {}
    if variant == "streams":
        for s in streams(k):
            with torch.cuda.stream(s):
                _ = a @ a
    elif variant == "tiny":
        for s in streams(k):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                y = a @ a
            g.replay()
            del g, y
    elif variant in ("onestream", "manystr"):
        held = []
        for j in range(k):
            s = streams(1)[0] if variant == "onestream" else streams(k)[j]
            for _ in range(NG):
                held.append(big_graph(s))
        for g, x, y in held:
            g.replay()
        torch.cuda.synchronize()
        del held, g, x, y
    elif variant == "sa2":
        sessions = [adapter.new_session(model, "cadence", spec) for _ in range(k)]
        for s in sessions:
            s.prepare(None)
            s.start_turn()
        for u in range(4):
            for s in sessions:
                s.speak(rng.integers(0, 6561, size=25).tolist(), final=False)
        extra["graphs_per_session"] = float(np.mean([s.stats().graphs for s in sessions]))
        for s in sessions:
            s.close()
        del sessions
    sample(i, k, seconds=round(time.time() - t0, 1), **extra)

err, = cu.cuDeviceGraphMemTrim(cu.CUdevice(0))
sample("graph_mem_trim", -1, err=str(err))
ctypes.CDLL("libc.so.6").malloc_trim(0)
sample("malloc_trim", -1)
torch._C._cuda_clearCublasWorkspaces()
sample("cublas_workspaces_cleared", -1)
own = list(pool)
if variant == "sa2":
    with G_.STREAMS._lock:
        G_.STREAMS._drain()
        own += [s for lst in G_.STREAMS._free.values() for s in lst]
        G_.STREAMS._free.clear()
for s in own:
    cu.cuStreamDestroy(cu.CUstream(s.cuda_stream))
pool.clear()
sample("streams_destroyed", len(own))
with open(os.path.join(out, f"holder-{variant}.json"), "w") as f:
    json.dump({"variant": variant, "nodes_per_graph": NN + 1, "graphs_per_set": NG, "rows": rows,
               "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__}, f, indent=1)
