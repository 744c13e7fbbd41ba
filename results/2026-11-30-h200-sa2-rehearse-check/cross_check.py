"""Compare this probe's 4-session DuplexCadence units with reproduce-8's 4-session stock and DuplexCadence
units of the same workload (same session variants, same script): per (session, unit) sha256 of the float32
waveform and of the PCM16 bytes. Run from the project root: python results/2026-11-30-h200-sa2-rehearse-check/cross_check.py"""
import json
import sys


def units(path, mode, n):
    d = json.load(open(path))
    run = [r for r in d["workloads"]["stepaudio2_mini"]["modes"][mode]["runs"] if r["sessions"] == n][0]
    return {(u["session"], u["index"]): (u["sha256_f32"], u["sha256_pcm16"]) for u in run["units"]
            if u.get("sha256_f32")}


probe = units("results/2026-11-30-h200-sa2-rehearse-check/stepaudio2_mini.duplex_cadence/duplex.json", "cadence", 4)
stock = units("results/2026-11-30-h200-reproduce-8/stepaudio2_mini.duplex_stock/duplex.json", "stock", 4)
cad = units("results/2026-11-30-h200-reproduce-8/stepaudio2_mini.duplex_cadence/duplex.json", "cadence", 4)
same_stock = sum(probe[k] == stock.get(k) for k in probe)
same_cad = sum(probe[k] == cad.get(k) for k in probe)
print(f"probe units {len(probe)}; equal to reproduce-8 stock: {same_stock}/{len(stock)}; "
      f"equal to reproduce-8 cadence (not rehearsed): {same_cad}/{len(cad)}")
sys.exit(0 if same_stock == len(probe) == len(stock) else 1)
