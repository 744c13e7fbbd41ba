"""MiniCPM-o 4.5 tail, stock and DuplexCadence variants over the same session script, in one process.

Variants (one model instance, sessions one after another, every unit compared byte for byte with stock):
  stock            Token2wav.stream as MiniCPM-o drives it (the reference)
  cadence_vocoder_eager   flow on the arena + graphs, the stock BoundedVocoder eager (vocoder="stock")
  cadence_noise_host      flow and vocoder on the arena + graphs; noise gathered on the host as stock
  cadence_noise_device    the same with the noise table on the GPU (259 MB per model), gathered in-graph

Per variant: tail ms per SPEAK unit (CUDA events, median / p90 / p99 after 3 warm-up units), and, for the
last 5 SPEAK units under the CUDA profiler, kernel launches, graph launches and GPU kernel-busy ms per unit
(suite.measure.kernels). Driver memory per variant is not separated here (one process): `suite.reproduce` does it.
This is the measurement behind the choice of noise path (issue 3: "measure both").

    python -m tools.gpu.flow_hift_check --steps 10 5 --out DIR        # H200, released config
    python -m tools.gpu.flow_hift_check --device cpu --depth reduced --max-speak-units 4 --steps 2
Writes DIR/flow_hift_check.json; prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

VARIANTS = {
    "stock": ("stock", {}),
    "cadence_vocoder_eager": ("cadence", {"vocoder": "stock"}),
    "cadence_noise_host": ("cadence", {"vocoder": "cadence", "noise": "host"}),
    "cadence_noise_device": ("cadence", {"vocoder": "cadence", "noise": "device"}),
}


def run(steps: int, args) -> dict:
    import workloads
    from suite.measure import session as runner
    from suite.records import jsonable

    wl = workloads.get("minicpmo45")
    s = runner.setup(wl, args.device, args.depth, None, args.max_speak_units, steps, None)
    device, adapter, spec, units = s.device, s.adapter, s.spec, s.units
    t0 = time.perf_counter()
    model, _probe, _ = runner.build(s, args.depth)
    build_s = time.perf_counter() - t0
    out = {"steps": steps, "build_s": build_s, "variants": {}}
    ref = None
    for name in args.variants:
        mode, cadence_opts = VARIANTS[name]
        vspec = dict(spec, cadence=cadence_opts)
        t0 = time.perf_counter()
        run = runner.run_session(adapter, model, mode, vspec, units, device, progress=False)
        records, stats = run.records, run.stats
        m = runner.metrics(records)
        hashes = {r.index: r.sha256_f32 for r in records if r.kind == "SPEAK"}
        if ref is None:
            ref = hashes
        mism = sorted(i for i in ref if hashes.get(i) != ref[i])
        out["variants"][name] = {"metrics": m, "session_stats": stats, "mismatched_units": mism,
                                 "units_compared": len(ref), "seconds": time.perf_counter() - t0,
                                 "units": [jsonable(r.__dict__) for r in records if r.kind == "SPEAK"]}
        print(f"steps {steps} {name}: p50 {m.get('tail_ms_p50', float('nan')):.1f} ms, "
              f"mismatches {len(mism)}, stats {({k: stats.get(k) for k in ('captures', 'replays', 'eager_fallbacks', 'capture_failures')} if stats else None)}",
              flush=True)
    return out


def table(record: dict) -> str:
    from tabulate import tabulate

    rows = []
    for res in record["runs"]:
        base = res["variants"].get("stock", {}).get("metrics", {}).get("tail_ms_p50")
        for name, v in res["variants"].items():
            m, st = v["metrics"], v["session_stats"] or {}
            p50 = m.get("tail_ms_p50")
            rows.append([res["steps"], name, _f(p50), _f(m.get("tail_ms_p99")),
                         _f(base / p50, ".2f") if base and p50 else "",
                         _f(m.get("kernel_launches_per_unit_p50"), ".0f"),
                         _f(m.get("graph_launches_per_unit_p50"), ".0f"),
                         _f(m.get("kernel_busy_ms_per_unit_p50")),
                         _f(m.get("tail_over_kernel_busy_x"), ".2f"),
                         f"{st.get('captures', '')}/{st.get('replays', '')}/{st.get('capture_failures', '')}"
                         if st else "",
                         f"{v['units_compared'] - len(v['mismatched_units'])}/{v['units_compared']}"])
    return tabulate(rows, headers=["steps", "variant", "tail ms p50", "p99", "speedup", "launches/unit",
                                   "graphs/unit", "kernel-busy ms", "tail/busy", "capt/replay/fail",
                                   "bit-exact"], tablefmt="pipe", disable_numparse=True)


def _f(v, fmt=".1f"):
    return "" if v is None else format(v, fmt)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, nargs="+", default=[10, 5], help="Euler steps, one run each")
    p.add_argument("--device", default="cuda")
    p.add_argument("--depth", choices=("released", "reduced"), default="released")
    p.add_argument("--max-speak-units", type=int, default=None, help="cut the script (default: all)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out", default="results/_scratch/flow_hift_check")
    args = p.parse_args(argv)
    if args.variants[0] != "stock":
        p.error("--variants: the first must be 'stock' (the reference the others are compared with)")
    bad_steps = [n for n in args.steps if not 1 <= n <= 16]
    if bad_steps:
        p.error(f"--steps: expected ints in [1, 16] (Euler steps), got {bad_steps}")
    if args.max_speak_units is not None and args.max_speak_units < 1:
        p.error(f"--max-speak-units: expected an int >= 1, got {args.max_speak_units}")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        p.error(f"--device: expected cpu, cuda or cuda:N, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here (use --device cpu --depth reduced)")
    from suite.measure import env

    record = {"provenance": env.provenance(["python", "-m", "tools.gpu.flow_hift_check", *(argv or sys.argv[1:])],
                                           device=args.device),
              "runs": [run(s, args) for s in args.steps]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "flow_hift_check.json").write_text(json.dumps(record, indent=1, default=str))
    print(table(record))
    bad = sum(len(v["mismatched_units"]) for r in record["runs"] for v in r["variants"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
