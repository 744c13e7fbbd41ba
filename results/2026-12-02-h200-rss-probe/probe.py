"""Does the host and driver memory a CUDA stress keeps follow the most DuplexCadence sessions held open at once?

One process, one Step-Audio 2 model (the workload's spec). Rounds of k cadence sessions open at once (k from
ROUNDS): each opened, prepared (prepare(None)), one turn of UNITS full units spoken, all k then closed; after each
round, with no session open and torch's cache emptied, RSS, the C heap in use, the driver's used memory and torch's
allocated memory. GRAPHS=0 runs the same with graphs off (always off on CPU). Prints one line per round and writes probe.json to OUT.

    PYTHONPATH=impl:. python results/2026-12-02-h200-rss-probe/probe.py [cuda|cpu] [released|reduced]
"""
import json
import os
import sys
import time

import numpy as np
import torch

import workloads
from duplexcadence import runtime
from suite.measure.memory import DeviceMemory, host_heap_mib, release_cached, rss_mib
from suite.measure.session import make_spec

ROUNDS = [1, 2, 4, 4, 8, 8, 2, 8]
UNITS = 4
device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
depth = sys.argv[2] if len(sys.argv) > 2 else "released"
graphs = os.environ.get("GRAPHS", "1") == "1" and device.type == "cuda"
out = os.environ.get("OUT", ".")

wl = workloads.get("stepaudio2_mini")
spec = make_spec(wl)
adapter = runtime.adapter(wl.architecture)
model = adapter.build_model(spec, device=device, depth=depth, seed=0)
driver = DeviceMemory(device) if device.type == "cuda" else None
rng = np.random.default_rng(0)


def sample(label, k):
    if device.type == "cuda":
        release_cached(device)
    row = {"round": label, "k": k, "rss_mib": rss_mib(), **host_heap_mib(device)}
    if driver is not None:
        row.update(driver_used_mib=driver.used_mib(), alloc_mib=torch.cuda.memory_allocated(device) / 2 ** 20)
    print(json.dumps({key: (round(v, 1) if isinstance(v, float) else v) for key, v in row.items()}), flush=True)
    return row


rows, t0 = [sample("built", 0)], time.time()
for i, k in enumerate(ROUNDS):
    sessions = [adapter.new_session(model, "cadence", {**spec, "cadence": {**spec.get("cadence", {}), "graphs": graphs}})
                for _ in range(k)]
    for s in sessions:
        s.prepare(None)
        s.start_turn()
    for u in range(UNITS):
        for s in sessions:
            s.speak(rng.integers(0, 6561, size=25).tolist(), final=False)
    stats = [s.stats() for s in sessions]
    for s in sessions:
        s.close()
    del sessions
    row = sample(i, k)
    row.update(graphs_per_session=float(np.mean([st.graphs for st in stats])), seconds=time.time() - t0)
    rows.append(row)
with open(os.path.join(out, "probe.json"), "w") as f:
    json.dump({"device": str(device), "depth": depth, "graphs": graphs, "units": UNITS, "rounds": rows,
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}, f, indent=1)
