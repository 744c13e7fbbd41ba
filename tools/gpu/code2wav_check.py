"""Qwen3-Omni Code2Wav: stock vs DuplexCadence over the same codes: bytes, time per unit, graph memory.

One process, one model instance (transformers `Qwen3OmniMoeCode2Wav`, seeded random weights): a stock
session and a cadence session (CUDA graphs per exact window) decode the same turns unit by unit, in
alternation; every unit is compared byte for byte (float32 waveform and int16 PCM). The cadence graphs of
the workload's shape family are captured ahead of time (`CadenceSession.prepare`) and the capture time is
reported on its own. A warm-up turn (not measured) precedes the measured units.

Measured per unit: CUDA events around `session.speak` (host validation, H2D of the codes, the calls, the
D2H of the audio included; on CPU perf_counter), as ms per second of audio (frames / 12.5 Hz): median /
p90 / p99; first-unit time of each turn (= TTFA of the tail: a first unit is the initial 4-frame window
plus the rest of the unit). Memory: graph pool bytes per shape and in total (allocator growth at capture),
arena bytes, peak allocated. Reference rows: the whole-utterance `chunked_decode(300, 25)` per turn, and
(--seamless) the opt-in non-bit-exact "cadence_seamless" mode, each with its deviation from the whole
utterance on the common timeline (max |diff|, SNR).

    python -m tools.gpu.code2wav_check --units 40 --out DIR                              # H200, released bf16
    python -m tools.gpu.code2wav_check --device cpu --depth reduced --units 4 --out DIR  # CPU, tiny
Writes DIR/code2wav_check.json and prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from duplexcadence.adapters import code2wav as c2w
from duplexcadence.runtime import BitMismatch, compare_units
from suite.measure import env
from tools.gpu.common import stats_ms, timed

MIN_MEASURED_UNITS = 30
TARGET_MS_PER_S = 8.0            # issue 6: at most 8 ms per second of audio
TARGET_GRAPH_MIB = 1024.0        # issue 6: total graph memory under 1 GiB
FRAME_S = 1 / 12.5


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--units", type=int, default=40, help="measured SPEAK units (after the warm-up turn)")
    p.add_argument("--turn-units", type=int, default=10, help="SPEAK units per turn (the last is final)")
    p.add_argument("--warmup-units", type=int, default=3, help="units of the unmeasured warm-up turn")
    p.add_argument("--out", default="results/_scratch/code2wav_check")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--depth", choices=("released", "reduced"), default="released")
    p.add_argument("--dtype", choices=sorted(c2w.DTYPES), default="bfloat16")
    p.add_argument("--seed", type=int, default=0, help="weights seed (codes use seed + 1000)")
    p.add_argument("--no-whole", action="store_true", help="skip the whole-utterance reference row")
    p.add_argument("--seamless", action="store_true", help="also run cadence_seamless and measure it")
    return p.parse_args(argv)


def turn_frames(turn: int, n_units: int) -> list[int]:
    """Frames of each unit of a turn at 12.5 Hz (12, 13, 12, ...); the final unit is a partial second of
    1 + (5 * turn) % 13 frames, so turns end on different final shapes."""
    frames = [math.floor((k + 1) * 12.5) - math.floor(k * 12.5) for k in range(n_units)]
    frames[-1] = 1 + (5 * turn) % 13
    return frames


def make_turns(args) -> list[list[torch.Tensor]]:
    """Seeded codes: a warm-up turn, then turns of --turn-units units until --units are scheduled."""
    gen = torch.Generator().manual_seed(args.seed + 1000)
    sizes, left = [args.warmup_units], args.units
    while left > 0:
        sizes.append(min(args.turn_units, left))
        left -= sizes[-1]
    return [[torch.randint(0, c2w.CODEBOOK_SIZE, (c2w.NUM_QUANTIZERS, n), generator=gen)
             for n in turn_frames(t, size)] for t, size in enumerate(sizes)]


def deviation(reference: np.ndarray, pieces: list[tuple[int, np.ndarray]]) -> dict:
    """Compare pieces placed at timeline offsets (samples) with a reference waveform."""
    ref, diff, covered = [], [], 0
    for start, wave in pieces:
        end = min(start + wave.size, reference.size)
        r = reference[start:end].astype(np.float64)
        ref.append(r)
        diff.append(wave[:end - start].astype(np.float64) - r)
        covered += end - start
    r, d = np.concatenate(ref), np.concatenate(diff)
    snr = 10 * math.log10(float(np.sum(r * r)) / float(np.sum(d * d))) if np.any(d) else float("inf")
    return {"reference_samples": int(reference.size), "stream_samples": int(sum(w.size for _, w in pieces)),
            "samples_missing": int(reference.size - covered), "max_abs_diff": float(np.max(np.abs(d))),
            "rms_diff": float(np.sqrt(np.mean(d * d))), "snr_db": snr}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(min(torch.get_num_threads(), 16))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    prov = env.provenance(device=device)
    with env.deterministic() as det:
        t0 = time.perf_counter()
        model = c2w.build_model({"dtype": args.dtype}, device=device, depth=args.depth, seed=args.seed)
        build_s = time.perf_counter() - t0
        turns = make_turns(args)
        modes = {"stock": c2w.new_session(model, "stock"), "cadence": c2w.new_session(model, "cadence")}
        if args.seamless:
            modes["cadence_seamless"] = c2w.new_session(model, "cadence_seamless")
        signatures = {c2w.Signature(c.ctx, c.new, c2w.keep_from(c.ctx, False))
                      for turn in turns for unit in c2w.turn_schedule([u.shape[1] for u in turn]) for c in unit}
        t0 = time.perf_counter()
        modes["cadence"].prepare(sorted(signatures))
        if args.seamless:
            modes["cadence_seamless"].prepare(sorted(c2w.Signature(g.ctx, g.new, c2w.keep_from(g.ctx, True))
                                                     for g in signatures))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        capture_s = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        units, mismatches, whole_rows, seamless_rows = [], [], [], []
        for t, turn in enumerate(turns):
            for s in modes.values():
                s.start_turn()
            streamed = {m: [] for m in modes}
            for k, codes in enumerate(turn):
                final = k == len(turn) - 1
                rec = {"turn": t, "unit": k, "frames": int(codes.shape[1]), "final": final, "measured": t > 0}
                outs = {}
                for m, s in modes.items():
                    outs[m], rec[f"{m}_ms"] = timed(device, s.speak, codes, final=final)
                    streamed[m].extend((ci["timeline_start"], w)
                                       for ci, w in zip(outs[m].info["calls"], _split(outs[m])))
                try:
                    compare_units("qwen3_omni", len(units), outs["stock"], outs["cadence"])
                    rec["equal"] = True
                except BitMismatch as exc:
                    mismatches.append(str(exc))
                    rec["equal"] = False
                rec.update({"sha256_f32": outs["stock"].sha256()[0], "sha256_i16": outs["stock"].sha256()[1],
                            "samples": outs["stock"].samples, "calls": outs["cadence"].info["calls"],
                            "std": float(outs["stock"].waveform.std()),
                            "clipped": float(np.mean(np.abs(outs["stock"].waveform) >= 0.99))})
                units.append(rec)
            if t > 0 and not args.no_whole:
                codes = torch.cat(turn, dim=1)
                whole, ms = timed(device, c2w.whole_utterance, model, codes)
                whole_rows.append({"turn": t, "frames": int(codes.shape[1]), "ms": ms,
                                   **deviation(whole, streamed["stock"])})
                if args.seamless:
                    seamless_rows.append({"turn": t, **deviation(whole, streamed["cadence_seamless"])})
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    record = summarize(args, prov, det, build_s, capture_s, units, mismatches, whole_rows, seamless_rows,
                       {m: s.stats() for m, s in modes.items()}, peak_mib)
    (out_dir / "code2wav_check.json").write_text(json.dumps(record, indent=1, default=str))
    print(table(record))
    return 0 if record["verdict"] == "VALID" else 1


def _split(out) -> list[np.ndarray]:
    """The unit's waveform split back into its calls."""
    bounds = np.cumsum([ci["samples"] for ci in out.info["calls"]])[:-1]
    return np.split(out.waveform, bounds)


def summarize(args, prov, det, build_s, capture_s, units, mismatches, whole_rows, seamless_rows, stats,
              peak_mib) -> dict:
    measured = [u for u in units if u["measured"]]
    per_s = {m: [u[f"{m}_ms"] / (u["frames"] * FRAME_S) for u in measured] for m in stats}
    first = {m: [u[f"{m}_ms"] for u in measured if u["unit"] == 0] for m in stats}
    cad = stats["cadence"]
    graph_mib = cad["graph_pool_bytes"] / 2**20
    reasons = []
    if len(measured) < MIN_MEASURED_UNITS:
        reasons.append(f"{len(measured)} measured units < {MIN_MEASURED_UNITS}")
    if mismatches:
        reasons.append(f"{len(mismatches)} units differ; first: {mismatches[0]}")
    if prov.get("git_dirty"):
        reasons.append("dirty tree")
    if any(u["std"] < 1e-3 for u in units):
        reasons.append("degenerate audio (std < 1e-3)")
    if args.device.startswith("cuda") and (cad["graphs"]["eager_fallbacks"] or cad["graphs"]["capture_failures"]):
        reasons.append(f"graph capture failed: {cad['graph_failures'][:2]}")
    ms = {m: stats_ms(v) for m, v in per_s.items()}
    by_phase = {m: {ph: stats_ms([u[f"{m}_ms"] for u in measured if u["calls"][0]["phase"] == ph])
                    for ph in ("initial", "ramp", "steady", "final")} for m in stats}
    audio_s = sum(u["frames"] for u in measured) * FRAME_S
    overall = {m: sum(u[f"{m}_ms"] for u in measured) / audio_s if audio_s else None for m in stats}
    return {
        "what": "Qwen3-Omni Code2Wav, stock vs DuplexCadence (tools/gpu/code2wav_check.py)",
        "provenance": prov, "determinism": det,
        "params": {"units": args.units, "turn_units": args.turn_units, "warmup_units": args.warmup_units,
                   "depth": args.depth, "dtype": args.dtype, "seed_weights": args.seed,
                   "seed_codes": args.seed + 1000, "left_context": c2w.LEFT_CONTEXT,
                   "initial_frames": c2w.INITIAL_FRAMES},
        "build_s": build_s, "capture_s": capture_s, "units_measured": len(measured),
        "ms_per_audio_s": ms, "ms_per_audio_s_overall": overall, "ms_per_unit_by_phase": by_phase,
        "first_unit_ms": {m: stats_ms(v) for m, v in first.items()},
        "speedup_p50": ms["stock"]["p50"] / ms["cadence"]["p50"] if measured else None,
        "graph_pool_mib": graph_mib, "graph_pool_bytes_per_shape": cad["graph_pool_bytes_per_shape"],
        "graph_shapes": len(cad["graph_signatures"]), "arena_bytes": cad["arena_bytes_reserved"],
        "peak_allocated_mib": peak_mib, "sessions": stats,
        "whole_utterance": whole_rows, "seamless_vs_whole": seamless_rows,
        "targets": {"ms_per_audio_s_p50_le_8": bool(measured) and ms["cadence"]["p50"] <= TARGET_MS_PER_S,
                    "graph_mib_lt_1024": graph_mib < TARGET_GRAPH_MIB, "bit_exact": not mismatches},
        "units": units, "mismatches": mismatches[:10],
        "verdict": "INVALID" if reasons else "VALID", "invalid_reasons": reasons,
    }


def table(record: dict) -> str:
    from tabulate import tabulate

    rows = []
    for m, s in record["ms_per_audio_s"].items():
        f = record["first_unit_ms"].get(m, {})
        steady = record["ms_per_unit_by_phase"][m]["steady"]
        rows.append([m, s.get("p50"), s.get("p90"), s.get("p99"), record["ms_per_audio_s_overall"][m],
                     steady.get("p50"), f.get("p50")])
    for w in record["whole_utterance"][:1]:
        rows.append(["whole chunked_decode (turn 1)", w["ms"] / (w["frames"] * FRAME_S), None, None, None, None,
                     None])
    text = tabulate(rows, headers=["mode", "ms/s p50", "p90", "p99", "ms/s overall", "steady unit ms p50",
                                   "first unit ms p50"], floatfmt=".2f")
    dev = record["whole_utterance"][:1] + record["seamless_vs_whole"][:1]
    lines = [text,
             f"graphs: {record['graph_shapes']} shapes, pool {record['graph_pool_mib']:.1f} MiB; arena "
             f"{record['arena_bytes']} B; capture {record['capture_s']:.1f} s; speedup p50 "
             f"{record['speedup_p50'] or 0:.2f}x; units measured {record['units_measured']}",
             *(f"vs whole utterance ({'stock' if i == 0 else 'seamless'}): missing {d['samples_missing']} "
               f"samples, max|diff| {d['max_abs_diff']:.3g}, SNR {d['snr_db']:.1f} dB" for i, d in enumerate(dev)),
             f"targets: {record['targets']}",
             f"verdict: {record['verdict']} {record['invalid_reasons']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
