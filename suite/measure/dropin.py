"""Drop-in speed: a stock decode call against its drop-in (duplexcadence.dropin, docs/dropins.md), each driven
by the stock caller's own loop over the workload's script, paired in A B B A blocks in each of several fresh
processes (suite.measure.paired.run_pairs), every unit's output hashed and compared.

    python -m suite.measure.dropin --dropin mimi|code2wav|token2wav --device cpu|cuda --out DIR [--processes N]
        [--depth released|reduced] [--steps N] [--max-speak-units N] [--aa-units K] [--warmup-pairs W] [--seed N]

A unit is what the caller's loop does with one unit of the script: mimi, moshi's server decode (`decode` of
each frame, `.cpu()`) of every unit, listening ones too; code2wav, the serving window loop (the adapter's
StockSession: one or two windows); token2wav, the demo's token loop (`stream` per 8-28 buffered tokens, the
flush at a turn's end; every call `return_waveform=True`). A turn's reset (moshi's `reset_streaming` once per
connection, Token2wav's cache restore or `set_stream_cache`) runs inside its first unit's timed call, so what
a drop-in captures there or on a first shape is in that unit's time; the record counts the drop-in's units
that captured, replayed and ran eagerly. Set-up, untimed: the model built once and deep-copied per arm, each
drop-in wrapped (its own `prepare()`, nothing from the script). Then the A/A run (two stock arms, the first
--aa-units SPEAK units, the first up to 3 not measured), then the A/B run (the first --warmup-pairs not
measured; default none). Writes DIR/dropin_<name>.json (suite.records.DROPIN_SCHEMA).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import torch

import workloads
from suite.measure import env
from suite.measure.paired import MIN_PROCESSES, Pair, clears_floor, first_speak_units, noise_floor, run_pairs, summarise
from suite.measure.session import UnitTimer, build, setup
from suite.records import DROPIN_SCHEMA, device_type, jsonable
from suite.records.paired import Protocol, pack_pairs

WORKLOAD = {"mimi": "moshi", "code2wav": "qwen3_omni", "token2wav": "minicpmo45"}
#: the stock call each drop-in stands in for (the package versions that ran are in the record's provenance)
STOCK_CALL = {"mimi": "moshi MimiModel.decode under streaming(1)",
              "code2wav": "transformers Qwen3OmniMoeCode2Wav.forward",
              "token2wav": "minicpmo-utils stepaudio2 Token2wav.stream"}
VERIFY_ONLY = ("min_measured_units", "std_min", "clip_level", "clip_fraction_max")     # judged by the verify only
COUNTERS = ("captures", "replays", "eager_runs", "warmup_runs", "eager_fallbacks", "capture_failures")


class Arm:
    """One arm as a run_pairs session. step(payload, final) -> UnitOutput; reset(): the caller's stream reset,
    run inside the next `speak` after construction or `start_turn()` (continuous: only after construction);
    dropin: the drop-in (its `.session` the CadenceSession now), None for stock. `mark()` before and `count()`
    after a timed `speak` (outside its time: `timed`) read the drop-in's counters: `calls`, its units by what
    their steps did ("captured" any graph, else "eager" any step, else "replayed"); `stats()`, its graph
    counters summed over its sessions."""

    def __init__(self, step, reset, dropin=None, continuous: bool = False):
        self.step, self.reset, self.dropin, self.continuous = step, reset, dropin, continuous
        self.pending, self.totals, self.calls, self.was = True, dict.fromkeys(COUNTERS, 0), Counter(), None

    def session(self):
        return None if self.dropin is None else self.dropin.session

    def start_turn(self) -> None:
        self.pending = self.pending or not self.continuous

    def speak(self, payload, *, final: bool = False):
        if self.pending:
            self.reset()
            self.pending = False
        return self.step(payload, final)

    def mark(self) -> None:
        self.was = self.session()
        self.before = self.was.stats() if self.was is not None else None

    def count(self) -> None:
        now = self.session()
        if now is None:
            return
        after = now.stats()
        d = {k: getattr(after, k) - (getattr(self.before, k) if now is self.was else 0) for k in COUNTERS}
        self.totals = {k: self.totals[k] + d[k] for k in COUNTERS}
        eager = d["eager_runs"] + d["warmup_runs"] + d["eager_fallbacks"]
        self.calls["captured" if d["captures"] else "eager" if eager else "replayed"] += 1

    def stats(self):
        return SimpleNamespace(**self.totals)


def timed(timer):
    """run_pairs' timer: `timer` (UnitTimer: (result, ms, wall ms)) around an Arm's speak, its counters read
    before and after, outside the time."""
    def call(speak, *args, **kwargs):
        speak.__self__.mark()
        out = timer(speak, *args, **kwargs)
        speak.__self__.count()
        return out
    return call


def _mimi(model, spec, dropin: bool) -> Arm:
    from duplexcadence.dropin import mimi as drop
    from duplexcadence.session import unit_output
    mimi = drop.wrap(model) if dropin else model
    mimi.streaming_forever(1)                                   # server.py ServerState.__init__

    def step(codes, final):
        with torch.no_grad():
            return unit_output([mimi.decode(codes[:, :, t:t + 1]).cpu().numpy() for t in range(codes.shape[-1])])
    return Arm(step, mimi.reset_streaming, mimi if dropin else None, continuous=True)


def _code2wav(model, spec, dropin: bool) -> Arm:
    from duplexcadence.adapters.code2wav.stock import StockSession
    from duplexcadence.dropin import code2wav as drop
    module = drop.wrap(model, left_context=spec.get("left_context", 25)) if dropin else model
    loop = StockSession(module, spec)
    return Arm(lambda codes, final: loop.speak(codes, final=final), loop.start_turn, module if dropin else None)


def _token2wav(model, spec, dropin: bool) -> Arm:
    from duplexcadence.adapters.flow_hift.build import clone_recursive
    from duplexcadence.dropin import token2wav as drop
    from duplexcadence.session import unit_output
    t2w, key, buf = drop.wrap(model) if dropin else model.t2w, model.prompt.key, []
    base = None if dropin else [clone_recursive(c) for c in t2w.set_stream_cache(key)]

    def reset():                                   # unified L4406-4410 (stock), or the drop-in's one changed line
        if dropin:
            t2w.set_stream_cache(key)
        else:
            t2w.stream_cache, t2w.hift_cache_dict = clone_recursive(base[0]), clone_recursive(base[1])
        buf[:] = [4218] * 3

    def step(tokens, final):                       # unified L5446-5525
        buf.extend(tokens)
        waves = []
        while len(buf) >= 8:
            n = min(28, len(buf))
            waves.append(t2w.stream(buf[:n], return_waveform=True))
            del buf[:min(25, n - 3)]
        if final:
            waves.append(t2w.stream(list(buf), last_chunk=True, return_waveform=True))
        return unit_output(waves)
    return Arm(step, reset, t2w if dropin else None)


#: drop-in name -> arm(model, spec, dropin) (a test may put a perturbed one here)
LOOPS = {"mimi": _mimi, "code2wav": _code2wav, "token2wav": _token2wav}


def _units(name: str, units: list, device: torch.device) -> list:
    """The script's units with a payload, as run_pairs takes them; mimi: every one a SPEAK unit of one stream,
    its codes int64 [1, 8, F] on the device (as the LM hands them to the server)."""
    return [SimpleNamespace(index=u.index, kind="SPEAK", turn=0, final=False,
                            payload=torch.tensor(u.codes, dtype=torch.int64, device=device)[None])
            if name == "mimi" else u for u in units if u.payload is not None]


def run_process(name: str, device, *, index: int = 1, depth: str = "reduced", steps: int | None = None,
                max_speak_units: int | None = None, aa_units: int = 10, warmup_pairs: int = 0,
                seed: int | None = None, command: list[str] | None = None) -> dict:
    """One process's part (module docstring): {"ab", "aa": Pair dicts, "calls", "graph" (the drop-in's units by
    kind, its graph counters), "provenance", "determinism", "seconds", "index", "pid"}. Raises what the
    model build and the arms raise (ValueError for a bad limit)."""
    s = setup(workloads.get(WORKLOAD[name]), device, depth, None, max_speak_units, steps, seed)
    aa_warmup = min(Protocol().aa_warmup_pairs, max(aa_units - 1, 0))
    params = {**{k: v for k, v in s.parameters.items() if k not in VERIFY_ONLY}, "warmup_speak_units": warmup_pairs,
              "aa_speak_units": aa_units, "aa_warmup_pairs": aa_warmup}
    out = {"index": index, "pid": os.getpid(), "parameters": params, "seeds": s.seeds, "device": str(s.device),
           "provenance": env.provenance(command, device=s.device)}
    t0, timer = time.perf_counter(), timed(UnitTimer(s.device))
    buffers = [torch.zeros(1, device=s.device) for _ in 'ab']

    def probe() -> float:                        # microseconds per tiny eager launch now (as the verify's)
        return env.host_op_us(s.device, ops=env.UNIT_PROBE_OPS, repeats=1, buffers=buffers, warmup=0)
    with env.deterministic() as flags, contextlib.ExitStack() as stack:
        if name == "mimi":                       # the eager reference: moshi's own graphs and compile off
            from duplexcadence import upstream
            stack.enter_context(upstream.moshi()[1].no_cuda_graph())
            stack.enter_context(upstream.moshi()[1].no_compile())
        model, _, _ = build(s, depth)
        units, make = _units(name, s.units, s.device), LOOPS[name]
        copies = [copy.deepcopy(model) for _ in range(2 if aa_units else 1)]    # before any arm streams
        stock, dropin = make(model, s.spec, False), make(copies[0], s.spec, True)
        aa = make(copies[1], s.spec, False) if aa_units else None
        out["seconds"] = {"set_up": time.perf_counter() - t0}
        pairs = {"aa": [], "ab": []}
        if aa is not None:
            pairs["aa"] = run_pairs(stock, aa, first_speak_units(units, aa_units), timer=timer, probe=probe,
                                    warmup=aa_warmup, capture_after=False)
            stock.pending = True                # the A/B run is a new stream for every arm
        t1 = time.perf_counter()
        pairs["ab"] = run_pairs(stock, dropin, units, timer=timer, probe=probe, warmup=warmup_pairs,
                               capture_after=False)
        out["seconds"].update(aa=t1 - t0 - out["seconds"]["set_up"], ab=time.perf_counter() - t1)
    out.update({k: [q.to_dict() for q in v] for k, v in pairs.items()}, determinism=flags,
               calls=dict(dropin.calls), graph=dropin.totals)
    return jsonable(out)


def measure(name: str, device, *, processes: int = MIN_PROCESSES, command: list[str] | None = None, **opts) -> dict:
    """The drop-in record of `name` (a key of LOOPS) on `device` ("cpu", "cuda", "cuda:N"): `processes` fresh
    processes one after another (one: run in this process), each `run_process(name, device, **opts)`.
    Returns the record (DROPIN_SCHEMA: per-pair ratios a_ms / b_ms in ms per unit, the paired summary with its
    95% interval, the A/A floor, bytes, the drop-in's units by kind, provenance, verdict). Raises ValueError
    for an unknown name, processes not an int >= 1 or steps for a drop-in without Euler steps, RuntimeError when
    a process fails."""
    if name not in LOOPS:
        raise ValueError(f"dropin: expected one of {sorted(LOOPS)}, got {name!r}")
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes: expected an int >= 1, got {processes!r}")
    if opts.get("steps") is not None and workloads.get(WORKLOAD[name]).euler_steps is None:
        raise ValueError(f"steps: the {name} drop-in ({WORKLOAD[name]}) has no Euler steps; got steps="
                         f"{opts['steps']!r} (only token2wav takes it)")
    command = list(command if command is not None else sys.argv)
    if processes == 1:
        return assemble(name, [run_process(name, device, command=command, **opts)], command)
    setup(workloads.get(WORKLOAD[name]), device, opts.get("depth", "reduced"), None, opts.get("max_speak_units"),
          opts.get("steps"), opts.get("seed"))                      # a bad limit raises here, before any process
    results, work = [], Path(tempfile.mkdtemp(prefix="duplexcadence-dropin-"))
    base = [sys.executable, "-m", "suite.measure.dropin", "--dropin", name, "--device", str(device), "--out",
            str(work)] + [f"--{k.replace('_', '-')}={v}" for k, v in opts.items() if v is not None]
    try:
        for i in range(1, processes + 1):
            print(f"drop-in {name}: process {i} of {processes}", flush=True)
            rc = subprocess.run(base + ["--index", str(i), "--result", str(work / f"{i}.json")]).returncode
            if rc != 0:
                raise RuntimeError(f"drop-in process {i} of {processes} failed with exit status {rc}")
            results.append(json.loads((work / f"{i}.json").read_text()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return assemble(name, results, command)


def assemble(name: str, results: list[dict], command: list[str]) -> dict:
    """The record from the processes' results (`run_process`), judged: INVALID for a pair whose bytes differ
    (mismatch), no measured pair (no_pairs), fewer than MIN_PROCESSES processes on CUDA (few_processes), a
    dirty tree (dirty_tree)."""
    ab = [[Pair.from_dict(d) for d in r["ab"]] for r in results]
    aa = [[Pair.from_dict(d) for d in r["aa"]] for r in results if r["aa"]]
    speed, floor = summarise(ab), noise_floor(aa) if aa else None
    measured = [q for proc in ab for q in proc if q.measured]
    differ = [(run, i, q.index) for run, runs in (("A/B", ab), ("A/A", aa)) for i, proc in enumerate(runs, 1)
              for q in proc if not q.equal]
    first = results[0]
    reasons = [(f"{run} process {i} unit {k}: the two arms' bytes differ", "mismatch") for run, i, k in differ[:8]]
    if not measured:
        reasons.append(("no measured pair", "no_pairs"))
    cuda = device_type(first["provenance"]["device"]["device"]) == "cuda"
    if cuda and len(ab) < MIN_PROCESSES:
        reasons.append((f"{len(ab)} processes < {MIN_PROCESSES}", "few_processes"))
    if first["provenance"].get("git_dirty"):
        reasons.append(("dirty tree: uncommitted changes (see provenance.git_status)", "dirty_tree"))
    calls = sum((Counter(r["calls"]) for r in results), Counter())
    rows = [{"process": i, "run": run, **q.to_dict()} for run, runs in (("ab", ab), ("aa", aa))
            for i, proc in enumerate(runs, 1) for q in proc]
    n_ab = sum(map(len, ab))
    return jsonable({
        "schema": DROPIN_SCHEMA, "dropin": name, "stock_call": STOCK_CALL[name], "workload": WORKLOAD[name],
        "device": first["device"], "depth": first["parameters"]["depth"],
        "parameters": {**first["parameters"], "processes": len(results)},
        "seeds": first["seeds"], "provenance": {**first["provenance"], "command": command},
        "determinism": first["determinism"],
        "paired": {"speedup": speed.to_dict(), "floor": floor.to_dict() if floor else None,
                   "clears_floor": clears_floor(speed, floor) if floor else None,
                   "total_ratio": sum(q.a_ms for q in measured) / sum(q.b_ms for q in measured) if measured else None,
                   "pairs": pack_pairs(rows)},
        "calls": {"dropin_units": dict(calls), "graph_counters": {k: sum(r["graph"][k] for r in results)
                                                                 for k in COUNTERS}},
        "bytes": {"verdict": "INVALID" if differ else "VALID", "units_compared": n_ab + sum(map(len, aa)),
                  "units_equal": n_ab + sum(map(len, aa)) - len(differ),
                  "mismatches": [{"run": run, "process": i, "index": k} for run, i, k in differ]},
        "processes": [{k: r[k] for k in ("index", "pid", "seconds")} for r in results],
        "verdict": "INVALID" if reasons else "VALID", "invalid_reasons": [r for r, _ in reasons],
        "invalid_codes": list(dict.fromkeys(c for _, c in reasons)),
        "notes": [f"{len(results)} process run in the measuring process"] if len(results) == 1 else []})


def _int(least: int):
    def parse(text: str) -> int:
        if not re.fullmatch(r"-?\d+", text) or int(text) < least:
            raise argparse.ArgumentTypeError(f"expected an int >= {least}, got {text!r}")
        return int(text)
    return parse


def main(argv: list[str] | None = None) -> int:
    """The CLI (module docstring). Exit status 0: the record was written (whatever its verdict); 2: bad
    arguments (argparse names the argument); anything else is a crash."""
    ap = argparse.ArgumentParser(prog="python -m suite.measure.dropin", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dropin", required=True, choices=sorted(LOOPS))
    ap.add_argument("--device", required=True, type=env.device_arg, help="cpu | cuda | cuda:N")
    ap.add_argument("--out", required=True, type=env.out_folder, help="the folder dropin_<name>.json goes to")
    ap.add_argument("--processes", type=_int(1), default=MIN_PROCESSES, help=f"default {MIN_PROCESSES}")
    ap.add_argument("--depth", choices=("released", "reduced"), default=None, help="default: released on CUDA")
    ap.add_argument("--steps", type=_int(1), default=None, help="Euler steps (token2wav)")
    ap.add_argument("--max-speak-units", type=_int(1), default=None, help="cut the script (whole turns, >= 2)")
    ap.add_argument("--aa-units", type=_int(0), default=10, help="SPEAK units of the A/A run (0: none; 10)")
    ap.add_argument("--warmup-pairs", type=_int(0), default=0, help="first SPEAK pairs not measured (0)")
    ap.add_argument("--seed", type=_int(0), default=None, help="the weights seed")
    ap.add_argument("--index", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    depth = args.depth or ("released" if args.device.startswith("cuda") else "reduced")
    opts = dict(depth=depth, steps=args.steps, max_speak_units=args.max_speak_units, aa_units=args.aa_units,
                warmup_pairs=args.warmup_pairs, seed=args.seed)
    command = [sys.executable, "-m", "suite.measure.dropin", *(sys.argv[1:] if argv is None else argv)]
    if args.result:                               # one process of a measure(): its result only
        Path(args.result).write_text(json.dumps(run_process(args.dropin, args.device, index=args.index,
                                                            command=command, **opts)))
        return 0
    try:
        record = measure(args.dropin, args.device, processes=args.processes, command=command, **opts)
    except ValueError as exc:                    # a limit the script cannot take (session.select_units)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = Path(args.out) / f"dropin_{args.dropin}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    sp, b = record["paired"]["speedup"], record["bytes"]
    print(f"drop-in {args.dropin}: stock / drop-in {sp['speedup']:.3f}x [{sp['ci_low']:.3f}-{sp['ci_high']:.3f}] "
          f"per unit ({sp['processes']} processes, {sp['pairs']} pairs); bytes {b['verdict']} ({b['units_equal']}/"
          f"{b['units_compared']} units equal)" if sp.get("speedup") is not None else
          f"drop-in {args.dropin}: no measured pair; bytes {b['verdict']}")
    print(f"drop-in record: {path} (verdict {record['verdict']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
