"""Moshi's Mimi decoder, four ways over the same codes: bytes, time per unit, memory at the driver.

Modes (each in its own process, so driver-level memory is the mode's own):
  stock          `MimiModel.decode` per frame, moshi's graphs and compile off: the bit-exact reference
  stock_graphs   moshi's own CUDAGraphed path as its server runs it (a speed baseline, not a reference)
  cadence_frame  DuplexCadence, one CUDA graph per decode call (signature: 1 frame)
  cadence_unit   DuplexCadence, one CUDA graph per one-second unit (signatures: 12 and 13 frames)
  cadence_unit_moshi_kv  as cadence_unit, with moshi's own RingKVCache bookkeeping on the device
                 (kv_bookkeeping="stock") instead of ring slots and positions from the host clock

Every frame of every mode is compared byte for byte (sha256 of float32 and of int16 PCM) with stock.
Time per unit: CUDA events around `session.speak` (host work, H2D of the codes and the D2H of the PCM
included), reported as ms per second of audio, median / p90 / p99 over the units after the warm-up, and
per minute of the session (the 10-minute mode: --seconds 600). Memory at the driver, over the
model-loaded baseline: the session's peak (suite.measure.memory.MemoryProbe, warm-up and capture included) and
its steady state (after the warm-up units the allocator's unused cache is returned, in every mode alike,
then the largest cudaMemGetInfo reading over the measured units), plus used memory per minute.

    python -m tools.gpu.mimi_check --seconds 60 --out DIR          # on the GPU, released config
    python -m tools.gpu.mimi_check --seconds 2 --device cpu        # tiny, reduced config
Writes DIR/mimi_check.json and prints a short table last.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODES = {
    "stock": ("stock", {}),
    "stock_graphs": ("stock_graphs", {}),
    "cadence_frame": ("cadence", {"cadence_graphs": "frame"}),
    "cadence_unit": ("cadence", {"cadence_graphs": "unit"}),
    "cadence_unit_moshi_kv": ("cadence", {"cadence_graphs": "unit", "kv_bookkeeping": "stock"}),
}
WARMUP_UNITS = 3                 # DESIGN.md section 7: "30 s after 3 s warm-up"
MIN_MEASURED_UNITS = 30
TARGET_MS_PER_S = 20.0           # issue 5: at most 20 ms per second of audio
SPF = 1920                       # samples per codec frame (mimi.SAMPLES_PER_FRAME)


def unit_frames(n_units: int) -> list[int]:
    """Codec frames of each one-second unit at exactly 12.5 Hz: 12, 13, 12, 13, ..."""
    return [math.floor((k + 1) * 12.5) - math.floor(k * 12.5) for k in range(n_units)]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=int, default=60, help="measured seconds of audio (after the warm-up)")
    p.add_argument("--out", default="results/_scratch/mimi_check", help="folder for mimi_check.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--depth", choices=("released", "reduced"), default=None,
                   help="default: released on CUDA, reduced on CPU")
    p.add_argument("--seed", type=int, default=0, help="weights seed (codes use seed + 1000)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    p.add_argument("--in-process", action="store_true", help="run every mode in this process (debugging)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.depth = args.depth or ("released" if args.device.startswith("cuda") else "reduced")
    return args


# --- one mode (a worker process) -------------------------------------------------------------------
def driver_used_mib(device) -> float | None:
    """Device-wide used memory (cudaMemGetInfo: total - free), MiB; None on CPU."""
    import torch

    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**20


def run_mode(name: str, args, codes: np.ndarray, frames: list[int], work: Path) -> dict:
    import torch

    from duplexcadence.adapters import mimi
    from suite.measure.memory import MemoryProbe

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    flags = {"cudnn_benchmark": False, "cudnn_deterministic": False}   # moshi server.py seed_all L28-36
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    flags.update(cuda_matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                 cudnn_allow_tf32=torch.backends.cudnn.allow_tf32)
    probe = MemoryProbe(device)
    t0 = time.perf_counter()
    model = mimi.build_model({}, device=device, depth=args.depth, seed=args.seed)
    build_s = time.perf_counter() - t0
    weights = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        weights.update(key.encode() + value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    probe.model_loaded()
    probe.begin_session()
    base_used = driver_used_mib(device)
    steady_used = None
    mode, spec = MODES[name]
    session = mimi.new_session(model, mode, spec)
    cuda = device.type == "cuda"
    prepare_s = None
    if hasattr(session, "prepare"):      # cadence: capture every signature the clocks allow, ahead of time
        t0 = time.perf_counter()
        session.prepare(sorted(set(frames)))
        prepare_s = time.perf_counter() - t0
    units, frame_hashes, waves, memory_trace = [], [], [], []
    start = 0
    for k, f in enumerate(frames):
        unit_codes = codes[:, start:start + f]
        start += f
        if cuda:
            torch.cuda.synchronize(device)
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        t = time.perf_counter()
        out = session.speak(unit_codes)
        if cuda:
            ev1.record()
            torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - t) * 1e3
        ms = float(ev0.elapsed_time(ev1)) if cuda else wall_ms
        units.append({"unit": k, "frames": f, "ms": ms, "wall_ms": wall_ms, "ms_per_s": ms / (f / 12.5),
                      "measured": k >= WARMUP_UNITS})
        for j in range(f):
            seg = out.waveform[j * SPF:(j + 1) * SPF]
            frame_hashes.append(hashlib.sha256(seg.tobytes()).hexdigest()[:32]
                                + hashlib.sha256(out.pcm16[j * SPF:(j + 1) * SPF].tobytes()).hexdigest()[:32])
        waves.append(out.waveform)
        probe.observe()
        if cuda and k == WARMUP_UNITS - 1:
            # steady state: what the warm-up (and, for cadence, the eager warm-up before capture) left
            # cached but unused goes back to the driver, in every mode alike; stock re-reserves its own
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        elif cuda and k >= WARMUP_UNITS:
            steady_used = max(steady_used or 0.0, driver_used_mib(device))
        if k % 60 == 0 or k == len(frames) - 1:
            memory_trace.append({"unit": k, "driver_used_mib": driver_used_mib(device)})
    stats = session.stats()
    memory = probe.end_session()
    if steady_used is not None:
        memory["steady_session_driver_mib"] = round(steady_used - base_used, 3)
    wave = np.concatenate(waves)
    np.save(work / f"{name}.npy", wave)
    return {"mode": name, "build_s": build_s, "prepare_s": prepare_s, "weights_sha256": weights.hexdigest(),
            "units": units,
            "frame_hashes": frame_hashes, "memory": memory, "memory_trace": memory_trace, "stats": stats,
            "flags": flags, "std": float(wave.std()), "clipped_frac": float(np.mean(np.abs(wave) >= 1.0))}


def summarize(rec: dict) -> dict:
    measured = [u for u in rec["units"] if u["measured"]]
    out = {"units_measured": len(measured), "warmup_units": len(rec["units"]) - len(measured)}
    if measured:
        x = np.array([u["ms_per_s"] for u in measured])
        out.update({f"ms_per_s_p{q}": float(np.percentile(x, q)) for q in (50, 90, 99)})
        out["ms_per_s_max"] = float(x.max())
        per_min = {}
        for u in measured:
            per_min.setdefault(u["unit"] // 60, []).append(u["ms_per_s"])
        out["ms_per_s_p50_by_minute"] = [float(np.median(v)) for _, v in sorted(per_min.items())]
    return out


def first_mismatch(ref: dict, rec: dict, work: Path) -> dict | None:
    """The first frame whose bytes differ from stock's, with max |diff| over that frame; None if all equal."""
    for i, (a, b) in enumerate(zip(ref["frame_hashes"], rec["frame_hashes"])):
        if a != b:
            wa, wb = np.load(work / f"{ref['mode']}.npy"), np.load(work / f"{rec['mode']}.npy")
            seg = slice(i * SPF, (i + 1) * SPF)
            return {"frame": i, "max_abs_diff": float(np.max(np.abs(wa[seg].astype(np.float64) - wb[seg])))}
    if len(ref["frame_hashes"]) != len(rec["frame_hashes"]):
        return {"frame": min(len(ref["frame_hashes"]), len(rec["frame_hashes"])), "max_abs_diff": None}
    return None


# --- the parent: one process per mode, then compare ---------------------------------------------------
def spawn(name: str, argv: list[str], work: Path) -> dict:
    cmd = [sys.executable, "-m", "tools.gpu.mimi_check", *argv, "--worker", name, "--work", str(work)]
    done = subprocess.run(cmd, text=True)
    if done.returncode != 0:
        return {"mode": name, "error": f"worker exited with {done.returncode}"}
    return json.loads((work / f"{name}.json").read_text())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    frames = unit_frames(WARMUP_UNITS + args.seconds)
    if args.worker:
        work = Path(args.work)
        codes = np.load(work / "codes.npy")
        rec = run_mode(args.worker, args, codes, frames, work)
        (work / f"{args.worker}.json").write_text(json.dumps(rec))
        return 0
    names = [m for m in args.modes.split(",") if m]
    unknown = [m for m in names if m not in MODES]
    if unknown or "stock" not in names:
        raise SystemExit(f"--modes: expected a subset of {list(MODES)} including 'stock', got {names}")
    rng = np.random.default_rng(args.seed + 1000)
    codes = rng.integers(0, 2048, size=(8, sum(frames)), dtype=np.int64)
    with tempfile.TemporaryDirectory(prefix="mimi_check_") as tmp:
        work = Path(tmp)
        np.save(work / "codes.npy", codes)
        recs = {}
        for name in names:
            print(f"[mimi_check] {name}: {len(frames)} units on {args.device} ({args.depth})", flush=True)
            if args.in_process:
                recs[name] = run_mode(name, args, codes, frames, work)
            else:
                recs[name] = spawn(name, argv, work)
        ref = recs["stock"]
        modes, reasons = {}, []
        for name, rec in recs.items():
            if "error" in rec:
                modes[name] = rec
                reasons.append(f"{name}: {rec['error']}")
                continue
            row = {**summarize(rec), "memory": rec["memory"], "memory_trace": rec["memory_trace"],
                   "stats": rec["stats"], "build_s": rec["build_s"], "prepare_s": rec["prepare_s"],
                   "flags": rec["flags"],
                   "std": rec["std"], "clipped_frac": rec["clipped_frac"],
                   "frames": len(rec["frame_hashes"]), "weights_sha256": rec["weights_sha256"],
                   "frames_sha256": hashlib.sha256("".join(rec["frame_hashes"]).encode()).hexdigest(),
                   "unit_ms": [round(u["ms"], 3) for u in rec["units"]]}
            if "error" not in ref:
                mismatch = first_mismatch(ref, rec, work)
                row["bytes_equal_stock"] = mismatch is None
                row["first_mismatch"] = mismatch
                if rec["weights_sha256"] != ref["weights_sha256"]:
                    reasons.append(f"{name}: weights differ from stock's process")
                if mismatch is not None and name.startswith("cadence"):
                    reasons.append(f"{name}: frame {mismatch['frame']} differs from stock eager")
            if row["units_measured"] < MIN_MEASURED_UNITS:
                reasons.append(f"{name}: {row['units_measured']} units < {MIN_MEASURED_UNITS}")
            graphs = rec["stats"].get("graphs", {})
            if graphs.get("capture_failures") or graphs.get("eager_fallbacks"):
                reasons.append(f"{name}: graph capture failures {graphs}")
            modes[name] = row
    from suite.measure.env import provenance

    record = {"check": "mimi_check", "workload": "moshi", "architecture": "mimi", "depth": args.depth,
              "seconds": args.seconds, "warmup_units": WARMUP_UNITS, "units": len(frames),
              "unit_frames": frames[:4], "seeds": {"weights": args.seed, "codes": args.seed + 1000},
              "targets": {"ms_per_s_p50_max": TARGET_MS_PER_S}, "modes": modes,
              "provenance": provenance(command=["python", "-m", "tools.gpu.mimi_check", *argv],
                                       device=args.device)}
    if record["provenance"].get("git_dirty"):
        reasons.append("dirty tree: uncommitted changes (see provenance.git_status)")
    record["verdict"] = "INVALID" if reasons else "VALID"
    record["invalid_reasons"] = reasons
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mimi_check.json").write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))
    print(f"wrote {out / 'mimi_check.json'}")
    return 0


def table(record: dict) -> str:
    from tabulate import tabulate

    rows = []
    for name, m in record["modes"].items():
        if "error" in m:
            rows.append([name, m["error"]] + [""] * 7)
            continue
        mem = m["memory"]
        g = m["stats"].get("graphs", {})
        captured = g.get("captures", m["stats"].get("moshi_graphs_captured", ""))
        rows.append([name, m.get("bytes_equal_stock"), m.get("ms_per_s_p50"), m.get("ms_per_s_p90"),
                     m.get("ms_per_s_p99"), mem.get("session_driver_mib", mem.get("session_rss_mib")),
                     mem.get("steady_session_driver_mib"), captured, m.get("units_measured")])
    head = ["mode", "bytes==stock", "ms/s p50", "p90", "p99", "session peak MiB", "steady MiB", "graphs",
            "units"]
    return (tabulate(rows, head, floatfmt=".1f") + f"\nverdict: {record['verdict']}"
            + "".join(f"\n  - {r}" for r in record["invalid_reasons"]))


if __name__ == "__main__":
    sys.exit(main())
