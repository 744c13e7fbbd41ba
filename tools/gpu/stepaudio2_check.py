"""Step-Audio 2 mini tail: stock (upstream driver) vs DuplexCadence on one continuous turn and a short second
turn: bytes, generator offsets, ms per unit, driver memory at the 60 s mark, arena bytes mapped/reserved.

One process, one model instance (released flow + HiFTGenerator() with seeded random weights, 10 Euler
steps), modes run one after the other, each session seeding the default generators when it opens:
`stock` (stepaudio2.StockSession, t2w @ b1bb23c), `cadence` (eager flow on arena views) and, on CUDA,
`cadence_graphs` (graphs=True: the DiT segment replayed as a CUDA graph keyed by (mel frames, DiT length);
encoder and HiFT eager) and `cadence_dit_hift` (graphs="dit+hift": also the HiFT call up to its istft,
one graph per (T, cached mel, cached source, kept source) with its rand/randn draws inside; istft,
cross-fade and cache updates eager). Turn 0 is continuous: --units SPEAK units of 25 tokens (the conformer
cache grows 50 frames a unit, never trimmed upstream); turn 1 has 3 units on the same caches (upstream
never resets).

Per unit and mode: sha256 of the float32 waveform and int16 PCM; the CUDA default generator's offset
(`Generator.get_offset()`, else the sha256 of `torch.cuda.get_rng_state()`) after the unit -- the HiFT
draws torch.rand/randn_like on it every call, so equal offsets say both modes consumed the same random
stream; the session's graph counters after the unit (captures, replays, capture failures, eager
fallbacks); ms per unit (CUDA events around `speak`, audio D2H included); conformer frames; arena bytes
mapped and reserved (cadence). Memory at the 60 s mark of turn 0 (after unit --mark, default 60): the
driver's used memory (NVML, else cudaMemGetInfo) minus the same reading before the session opened
(after empty_cache), torch's allocated/reserved and the arena's mapped bytes; and the session's peak of
torch reserved + arena mapped.

--allocator expandable turns on the CUDA caching allocator's expandable segments for the whole process
(both modes): the cadence's still-eager encoder grows its activations every unit, and with the default
allocator each larger request leaves a new cached segment behind (reserve 6956 MiB for 2931 MiB allocated
at the mark on the H200); the mark also records inactive split bytes, segments and allocation retries.

    TORCHDYNAMO_DISABLE=1 python -m tools.gpu.stepaudio2_check --out DIR                  # H200, < 4 min
    TORCHDYNAMO_DISABLE=1 python -m tools.gpu.stepaudio2_check --device cpu --depth reduced --steps 2 \\
        --units 4 --mark 3 --out DIR                                                     # CPU, tiny
Writes DIR/stepaudio2_check.json; prints the dit+hift mode's per-unit rows, then the summary table last
(per mode: ms, x stock, memory, bytes and generator offsets equal to stock on every unit, captures,
replays, capture failures, wall seconds). Exit status 1 if any unit's bytes or generator offset differ.
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import time
from pathlib import Path

import torch

from duplexcadence.adapters import flow_hift as fh
from duplexcadence.adapters import stepaudio2 as sa
from suite.measure import env
from tools.gpu.common import stats_ms, timed
from suite.measure.memory import DeviceMemory

MIB = 1024 * 1024
#: cadence modes -> CadenceSession(graphs=...)
GRAPHS = {"cadence": False, "cadence_graphs": True, "cadence_dit_hift": "dit+hift"}
GRAPH_COUNTERS = ("captures", "replays", "warmup_runs", "eager_runs", "eager_fallbacks", "capture_failures")
VOICE = Path(__file__).resolve().parents[2] / "workloads" / "data" / "voice_prompts" / \
    "librispeech_8297-275156-0011_24k.wav"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--units", type=int, default=66, help="SPEAK units of the continuous turn 0 (25 tokens each)")
    p.add_argument("--mark", type=int, default=60, help="memory reading after this unit of turn 0 (60 s)")
    p.add_argument("--steps", type=int, default=sa.N_TIMESTEPS, help="Euler steps (upstream: 10)")
    p.add_argument("--out", default="results/_scratch/stepaudio2_check")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--depth", choices=("released", "reduced"), default="released")
    p.add_argument("--seed", type=int, default=0, help="weights and generator seed (tokens use seed + 3000)")
    p.add_argument("--no-graphs", action="store_true",
                   help="skip the graph modes (cadence_graphs, cadence_dit_hift)")
    p.add_argument("--modes", default=None, help="comma list of modes to run (default: all the device allows)")
    p.add_argument("--allocator", choices=("default", "expandable"), default="default",
                   help="torch's CUDA caching allocator for the whole process (every mode): 'expandable' = "
                        "expandable_segments:True, set before anything is allocated")
    a = p.parse_args(argv)
    if a.units < 2 or not 1 <= a.mark <= a.units:
        p.error(f"--units >= 2 and 1 <= --mark <= --units, got --units {a.units} --mark {a.mark}")
    return a


def make_turns(args) -> list[list[tuple[list[int], bool]]]:
    """Turn 0: --units units of 25 tokens, the last carrying 7 (flush 7 + 25 - 25); turn 1: 25, 25, 4."""
    gen = torch.Generator().manual_seed(args.seed + 3000)

    def toks(n):
        return torch.randint(0, fh.VOCAB_SIZE, (n,), generator=gen).tolist()

    t0 = [(toks(25), False) for _ in range(args.units - 1)] + [(toks(7), True)]
    t1 = [(toks(25), False), (toks(25), False), (toks(4), True)]
    return [t0, t1]


def rng_mark(device: torch.device) -> dict:
    """The default generator's position on `device` now: offset (where torch exposes it) and state hash."""
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        gen = torch.cuda.default_generators[idx]
        state = torch.cuda.get_rng_state(idx)
    else:
        gen, state = torch.default_generator, torch.get_rng_state()
    offset = None
    try:
        offset = int(gen.get_offset())
    except Exception:           # CPU generators (and older torch) have no offset: the state hash says it
        pass
    return {"offset": offset, "state_sha256": hashlib.sha256(state.numpy().tobytes()).hexdigest()[:16]}


def torch_mem(device) -> dict:
    """torch's caching-allocator view now: allocated, reserved, and what explains reserved >> allocated
    (inactive split bytes: cached free pieces of segments; segment count; allocation retries)."""
    if device.type != "cuda":
        return {}
    st = torch.cuda.memory_stats(device)
    return {"allocated_mib": torch.cuda.memory_allocated(device) / MIB,
            "reserved_mib": torch.cuda.memory_reserved(device) / MIB,
            "inactive_split_mib": st.get("inactive_split_bytes.all.current", 0) / MIB,
            "segments": st.get("segment.all.current"), "alloc_retries": st.get("num_alloc_retries"),
            "reserved_peak_mib": st.get("reserved_bytes.all.peak", 0) / MIB}


def run_mode(model, mode: str, turns, device, args, driver) -> dict:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    base_used = driver.used_mib() if driver else None
    base_reserved = torch.cuda.memory_reserved(device) / MIB if device.type == "cuda" else None
    spec = {"cadence": {"graphs": GRAPHS[mode]}} if mode != "stock" else {}
    session = sa.new_session(model, "stock" if mode == "stock" else "cadence", spec)
    units, peak, mark = [], 0.0, None
    for t, turn in enumerate(turns):
        session.start_turn()
        for k, (tokens, final) in enumerate(turn):
            out, ms = timed(device, session.speak, tokens, final=final)
            f32, i16 = out.sha256()
            st = session.stats()
            rec = {"turn": t, "unit_in_turn": k, "tokens": len(tokens), "final": final,
                   "calls": out.info["calls"], "samples": out.samples, "ms": ms, "sha256_f32": f32,
                   "sha256_pcm16": i16, "rng": rng_mark(device), "conformer_frames": st.get("conformer_frames"),
                   "arena_bytes_mapped": st.get("arena_bytes_mapped"),
                   "arena_bytes_reserved": st.get("arena_bytes_reserved"),
                   "std": float(out.waveform.std()) if out.samples else None,
                   "graphs": {k: st.get(k) for k in GRAPH_COUNTERS} if "captures" in st else None}
            if device.type == "cuda":
                now = torch.cuda.memory_reserved(device) / MIB + (st.get("arena_bytes_mapped") or 0) / MIB \
                    * (st.get("arena_backend") == "vmm")
                peak = max(peak, now)
            if t == 0 and k + 1 == args.mark:
                mark = {"after_unit": k, "seconds_of_turn": (k + 1) * 1.0,
                        "driver_used_minus_before_mib": (driver.used_mib() - base_used) if driver else None,
                        "arena_bytes_mapped": st.get("arena_bytes_mapped"),
                        "arena_bytes_reserved": st.get("arena_bytes_reserved"),
                        "conformer_frames": st.get("conformer_frames"), **torch_mem(device)}
            units.append(rec)
    stats = session.stats()
    session.close()                       # drop its caches from the shared model / unmap its arena
    del session
    gc.collect()
    steady = [u["ms"] for u in units if u["turn"] == 0 and 3 <= u["unit_in_turn"] < len(turns[0]) - 1]
    return {"mode": mode, "units": units, "mark": mark, "stats": stats,
            "ms_steady": stats_ms(steady), "ms_all": stats_ms([u["ms"] for u in units if u["calls"]]),
            "session_peak_reserved_plus_arena_mib": (peak - base_reserved) if base_reserved is not None else None,
            "driver_source": driver.source if driver else None}


def compare(ref: dict, other: dict) -> dict:
    rows, bad_bytes, bad_rng = [], [], []
    for i, (a, b) in enumerate(zip(ref["units"], other["units"])):
        same = a["sha256_f32"] == b["sha256_f32"] and a["sha256_pcm16"] == b["sha256_pcm16"]
        rng_same = a["rng"] == b["rng"]
        rows.append({"unit": i, "turn": b["turn"], "unit_in_turn": b["unit_in_turn"], "calls": b["calls"],
                     "bytes_equal": same, "rng_equal": rng_same, "offset": b["rng"]["offset"],
                     "offset_stock": a["rng"]["offset"], "graphs": b.get("graphs")})
        if not same:
            bad_bytes.append(i)
        if not rng_same:
            bad_rng.append(i)
    if len(ref["units"]) != len(other["units"]):
        bad_bytes.append("unit count")
    return {"units": len(rows), "bytes_mismatch": bad_bytes, "rng_mismatch": bad_rng, "rows": rows}


def per_minute(res: dict) -> dict | None:
    """Arena bytes mapped against reserved, and conformer frames, per minute of turn-0 speech."""
    u = [x for x in res["units"] if x["turn"] == 0]
    if not u or u[0]["arena_bytes_mapped"] is None:
        return None
    rows = []
    for k in range(0, len(u), 30):
        rows.append({"seconds": k + 1, "mapped_mib": u[k]["arena_bytes_mapped"] / MIB,
                     "reserved_mib": u[k]["arena_bytes_reserved"] / MIB, "conformer_frames": u[k]["conformer_frames"]})
    last = u[-1]
    span = len(u) - 1
    growth = (last["arena_bytes_mapped"] - u[0]["arena_bytes_mapped"]) / MIB * 60.0 / span if span else 0.0
    return {"samples": rows, "mapped_growth_mib_per_minute": growth,
            "reserved_mib": last["arena_bytes_reserved"] / MIB}


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    device = torch.device(args.device)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    prov = env.provenance(device=device)
    if args.allocator == "expandable" and device.type == "cuda":
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    driver = DeviceMemory(device) if device.type == "cuda" else None
    modes = ["stock", "cadence"] + ([] if device.type != "cuda" or args.no_graphs
                                    else ["cadence_graphs", "cadence_dit_hift"])
    if args.modes:
        asked = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in asked if m not in GRAPHS and m != "stock"]
        if unknown or (device.type != "cuda" and any(GRAPHS.get(m) is True for m in asked)):
            raise SystemExit(f"--modes: unknown or not on {device}: {asked} (known: stock, {', '.join(GRAPHS)})")
        modes = ["stock"] + [m for m in asked if m != "stock"]
    with env.deterministic() as det:
        t0 = time.perf_counter()
        spec = {"variant": "stepaudio2", "n_timesteps": args.steps, "voice_prompt": str(VOICE),
                "prompt_seconds": None}
        model = sa.build_model(spec, device=device, depth=args.depth, seed=args.seed)
        build_s = time.perf_counter() - t0
        P = model.prompt.mel_frames
        turns = make_turns(args)
        need = P + 50 * (sum(len(t) for t in turns)) + 2 * 27
        if need > sa.position_limit(model.t2w.flow):
            raise SystemExit(f"--units {args.units}: the conformer cache would reach ~{need} frames, past the "
                             f"position table ({sa.position_limit(model.t2w.flow)}); use fewer units")
        results = {}
        for m in modes:
            t1 = time.perf_counter()
            results[m] = run_mode(model, m, turns, device, args, driver)
            results[m]["wall_s"] = time.perf_counter() - t1
            print(f"{m}: {results[m]['wall_s']:.1f} s", flush=True)
    comparisons = {m: compare(results["stock"], results[m]) for m in modes if m != "stock"}
    record = {"provenance": prov, "determinism": det, "args": vars(args), "build_s": build_s,
              "prompt_mel_frames": P, "position_limit": sa.position_limit(model.t2w.flow),
              "torchdynamo_disable": os.environ.get("TORCHDYNAMO_DISABLE"), "upstream": sa.UPSTREAM,
              "comparisons": comparisons, "per_minute": {m: per_minute(r) for m, r in results.items()},
              "modes": results}
    path = out_dir / "stepaudio2_check.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    ok = all(not c["bytes_mismatch"] and not c["rng_mismatch"] for c in comparisons.values())

    name = env.device_short_name(prov.get("device") or {})
    fmt = (lambda v: f"{v:.1f}" if v is not None else "-")
    for m in [x for x in modes if x == "cadence_dit_hift"]:
        print(f"\n{m}, per unit (cumulative graph counters after the unit; offset = CUDA default generator):")
        print(f"{'unit':>5}{'turn/k':>8}{'calls':>10}{'bytes':>7}{'rng':>5}{'offset':>10}{'stock':>10}"
              f"{'capt':>6}{'repl':>6}{'fail':>6}{'fallb':>6}")
        for r in comparisons[m]["rows"]:
            g = r["graphs"] or {}
            print(f"{r['unit']:>5}{str(r['turn']) + '/' + str(r['unit_in_turn']):>8}"
                  f"{','.join(map(str, r['calls'])) or '-':>10}{'ok' if r['bytes_equal'] else 'DIFF':>7}"
                  f"{'ok' if r['rng_equal'] else 'DIFF':>5}{str(r['offset']):>10}{str(r['offset_stock']):>10}"
                  f"{str(g.get('captures', '-')):>6}{str(g.get('replays', '-')):>6}"
                  f"{str(g.get('capture_failures', '-')):>6}{str(g.get('eager_fallbacks', '-')):>6}")
    print()
    s_ms = results["stock"]["ms_steady"].get("p50")
    s_mark = (results["stock"]["mark"] or {}).get("driver_used_minus_before_mib")
    if s_mark:
        for m in modes[1:]:
            mem = (results[m]["mark"] or {}).get("driver_used_minus_before_mib")
            if mem is not None:
                print(f"memory at the mark, {m} / stock: {mem / s_mark:.2f} (target <= 0.50)")
    for m in modes[1:]:
        st = results[m]["stats"] or {}
        print(f"{m}: arena {st.get('arena_backend')}, graphs {st.get('graphs')}, captures {st.get('captures')}, "
              f"replays {st.get('replays')}, eager fallbacks {st.get('eager_fallbacks')}, capture failures "
              f"{st.get('capture_failures')} {st.get('failures') or ''}, graph pool "
              f"{(st.get('graph_pool_bytes') or 0) / MIB:.1f} MiB, conformer {st.get('conformer_frames')} frames")
    pm = (record["per_minute"].get("cadence") or {})
    if pm:
        print(f"arena mapped growth {pm['mapped_growth_mib_per_minute']:.1f} MiB per minute of speech, "
              f"reserved {pm['reserved_mib']:.0f} MiB")
    print("PASS: every unit byte-identical, generator offsets equal" if ok else "FAIL: see comparisons in the json")
    print(f"\nStep-Audio 2 mini tail, {device} ({name}), depth {args.depth}, "
          f"{args.steps} steps, P = {P} mel frames, turn 0 = {args.units} units, build {build_s:.1f} s, "
          f"total {time.perf_counter() - t_start:.1f} s; json: {path}")
    print(f"{'mode':<18}{'ms p50':>9}{'ms p90':>9}{'x stock':>9}{'mem@mark MiB':>14}{'mapped/reserved MiB':>22}"
          f"{'bytes':>8}{'rng':>6}{'capt':>6}{'repl':>6}{'fail':>6}{'wall s':>8}")
    for m in modes:
        r = results[m]
        p50, p90 = r["ms_steady"].get("p50"), r["ms_steady"].get("p90")
        mark = r["mark"] or {}
        mem = mark.get("driver_used_minus_before_mib")
        mr = (f"{mark['arena_bytes_mapped'] / MIB:.0f}/{mark['arena_bytes_reserved'] / MIB:.0f}"
              if mark.get("arena_bytes_mapped") is not None else "-")
        c = comparisons.get(m)
        eq = "-" if c is None else ("ok" if not c["bytes_mismatch"] else f"{len(c['bytes_mismatch'])}x")
        rq = "-" if c is None else ("ok" if not c["rng_mismatch"] else f"{len(c['rng_mismatch'])}x")
        speed = f"{s_ms / p50:.2f}" if (s_ms and p50) else "-"
        st = r["stats"] or {}
        print(f"{m:<18}{fmt(p50):>9}{fmt(p90):>9}{speed:>9}{fmt(mem):>14}{mr:>22}{eq:>8}{rq:>6}"
              f"{str(st.get('captures', '-')):>6}{str(st.get('replays', '-')):>6}"
              f"{str(st.get('capture_failures', '-')):>6}{r['wall_s']:>8.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
