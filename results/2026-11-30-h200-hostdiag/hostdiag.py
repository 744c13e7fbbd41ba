"""Host-speed diagnostic: is the eager-op launch cost bimodal by CPU core? (one call, ~60 s)"""
import os, time, json, statistics, sys
import torch

def cpu_now():
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])

x = torch.zeros(16, device="cuda"); torch.cuda.synchronize()
def probe(ops=1000, reps=5):
    meds = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(ops):
            torch.add(x, 1.0)
        torch.cuda.synchronize(); meds.append((time.perf_counter() - t) / ops * 1e6)
    return statistics.median(meds)

probe()
out = {"threads": torch.get_num_threads(), "affinity": sorted(os.sched_getaffinity(0))}
t0 = time.time(); free = []
while time.time() - t0 < 20:
    c0 = cpu_now(); v = probe(); free.append((round(time.time() - t0, 1), c0, cpu_now(), round(v, 2)))
    time.sleep(0.2)
out["unpinned"] = free
percpu = {}
allc = sorted(os.sched_getaffinity(0))
for rep in range(3):
    for c in allc:
        os.sched_setaffinity(0, {c}); time.sleep(0.02)
        percpu.setdefault(c, []).append(round(probe(reps=3), 2))
os.sched_setaffinity(0, set(allc))
out["pinned"] = percpu
t0 = time.time(); again = []
while time.time() - t0 < 10:
    c0 = cpu_now(); v = probe(); again.append((round(time.time() - t0, 1), c0, cpu_now(), round(v, 2)))
    time.sleep(0.2)
out["unpinned_again"] = again
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "hostdiag.json"), "w"))
print("threads", out["threads"], "affinity", out["affinity"])
print("unpinned:", " ".join(f"{c}:{v}" for _, c, _, v in free))
print("pinned per cpu (3 passes):", {c: v for c, v in percpu.items()})
print("unpinned again:", " ".join(f"{c}:{v}" for _, c, _, v in again))
