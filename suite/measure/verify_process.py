"""One process of a paired verify (suite.measure.verify runs N of them): the model built once, stock against
DuplexCadence on that one instance.

Set-up (untimed; the verify runs every process's set-up at the same time): build the model; prime the process
with a stock session over the script's first `prime_speak_units` SPEAK units, closed again (CUDA's lazy
kernel loading, the cuDNN / cuBLAS handles and the allocator's first pools land there, not in a timed unit);
open the DuplexCadence session and `prepare(None)` it (what the clocks say every turn of the voice needs,
nothing from the script); open the two stock sessions of the A/A run, the second on a deepcopy of the model
where the adapter refuses a second stock session on one instance (ConcurrencyError), as the duplex harness
does. Timed (alone on the host, one process after another): the A/A run (stock against stock over the
script's first `aa_speak_units` SPEAK units), its sessions closed; then the A/B run (a stock session against
the DuplexCadence session, `passes` walks of the script in A B B A blocks, suite.measure.paired.run_pairs);
in the profiling process its last `profiled_speak_units` SPEAK units run under the CUDA profiler, last of
all (kineto leaves CUPTI attached once it has profiled, pytorch/pytorch#144455, which would slow any
unit timed after it). Timing: UnitTimer (CUDA events, synchronised, around each `speak`); the host probe
(`env.host_op_us` of UNIT_PROBE_OPS tiny launches) before, between and after each block pair.

    python -m suite.measure.stage verify-process ... --index I --result FILE [--ready-fd FD]

(the verify starts these): set-up, then "ready" on --ready-fd, then the timed part once "go" arrives on
stdin (anything else, or end of input: exit 3), the result as JSON in FILE (process 1's audio beside it
as FILE.<mode>.npy).
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from duplexcadence import gate
from duplexcadence.errors import ConcurrencyError
from suite.measure import env
from suite.measure.kernels import profile_call
from suite.measure.paired import first_speak_units, run_pairs
from suite.measure.session import (ModeUnavailable, UnitTimer, build, judge, metrics, modes, open_session,
                                   payload_of, sanity, setup, workload_dict)
from suite.records import UnitRecord, jsonable, utc_now
from suite.records.paired import Protocol

EXIT_NOT_STARTED = 3      # the verify never said "go" (it stopped, or a set-up elsewhere failed)


class Process:
    """One verify process: `set_up()` then `timed()`; `result()` is what the verify pools."""

    def __init__(self, workload, device, protocol: Protocol, *, index: int = 1, profile: bool = False,
                 depth: str = "released", seconds=None, max_speak_units=None, steps=None, seed=None,
                 command: list[str] | None = None, progress: bool = True, flags: dict | None = None):
        """flags: the deterministic flags a caller has set around every process here (inline processes
        share one `env.deterministic()`); None: the process sets them itself for its lifetime."""
        self.workload, self.protocol, self.index, self.progress = workload, protocol, index, progress
        self.s = setup(workload, device, depth, seconds, max_speak_units, steps, seed)
        if "cadence" not in modes(self.s.adapter):
            raise ModeUnavailable(f"{self.s.adapter.__name__}: no cadence mode to verify against stock")
        self.profile = profile and self.s.device.type == "cuda"
        self.depth, self.command = depth, command
        self.out: dict = {"index": index, "pid": os.getpid(), "started_utc": utc_now("milliseconds"), "seconds": {}, "notes": []}
        self.sessions: dict = {}
        self.copy, self.det, self.flags = None, None, flags

    # --- set-up ------------------------------------------------------------------------------------------
    def set_up(self) -> None:
        t0 = time.perf_counter()
        s = self.s
        self.out["provenance"] = {**env.provenance(self.command, device=s.device),
                                  "weights": env.weights(self.workload.name, s.seeds.get("weights", 0))}
        if self.flags is None:
            self.det = env.deterministic()
            self.flags = self.det.__enter__()
        self.out["determinism"] = self.flags
        self.model, _, _ = build(s, self.depth)
        self.out["seconds"]["build"] = time.perf_counter() - t0
        if self.protocol.prime_speak_units:
            stock = open_session(s.adapter, self.model, "stock", s.spec)
            try:
                _walk_untimed(stock, first_speak_units(s.units, self.protocol.prime_speak_units))
            finally:
                stock.close()
        t1 = time.perf_counter()
        cadence = self.sessions["cadence"] = open_session(s.adapter, self.model, "cadence", s.spec)
        counters = cadence.prepare(None)
        self._sync()
        self.out["prepared"] = {"counters": jsonable(counters), "ms": (time.perf_counter() - t1) * 1e3}
        if self.protocol.aa_speak_units:
            self.sessions["aa1"] = open_session(s.adapter, self.model, "stock", s.spec)
            try:
                self.sessions["aa2"] = open_session(s.adapter, self.model, "stock", s.spec)
                self.out["aa_copy"] = False
            except ConcurrencyError:
                self.copy = copy.deepcopy(self.model)
                self.sessions["aa2"] = open_session(s.adapter, self.copy, "stock", s.spec)
                self.out["aa_copy"] = True
        self._sync()
        self.out["seconds"]["set_up"] = time.perf_counter() - t0

    # --- timed -------------------------------------------------------------------------------------------
    def timed(self) -> dict:
        s, p = self.s, self.protocol
        timer, probe = UnitTimer(s.device), _probe(s.device)
        t0 = time.perf_counter()
        self.out["timed_utc"] = utc_now("milliseconds")
        aa = []
        if "aa1" in self.sessions:
            aa = run_pairs(self.sessions["aa1"], self.sessions["aa2"], first_speak_units(s.units, p.aa_speak_units),
                           timer=timer, probe=probe, block=p.block, warmup=p.aa_warmup_pairs, capture_after=False,
                           progress=self._printer("A/A"))
            for name in ("aa1", "aa2"):
                self.sessions.pop(name).close()
            self.copy = None
            gc.collect()
        t1 = time.perf_counter()
        stock = self.sessions["stock"] = open_session(s.adapter, self.model, "stock", s.spec)
        cadence = self.sessions["cadence"]
        outputs = {} if self.index == 1 else None
        prof = (lambda fn, *a, **k: profile_call(fn, *a, device=s.device, **k)) if self.profile else None
        warmup = p.warmup_for(sum(u.kind == "SPEAK" for u in s.units))
        ab = run_pairs(stock, cadence, s.units, timer=timer, probe=probe, block=p.block, warmup=warmup,
                       passes=p.passes, profile=prof, profiled=p.profiled_speak_units if self.profile else 0,
                       outputs=outputs, progress=self._printer("A/B"))
        self._sync()
        self.out["seconds"].update(aa=t1 - t0, ab=time.perf_counter() - t1)
        self.out["session_stats"] = {m: jsonable(self.sessions[m].stats().to_dict()) for m in ("stock", "cadence")}
        self.out["capabilities"] = {m: jsonable(dataclasses.asdict(self.sessions[m].capabilities))
                                    for m in ("stock", "cadence")}
        self.close()
        self.out.update(aa=[q.to_dict() for q in aa], ab=[q.to_dict() for q in ab], profiled=self.profile,
                        ended_utc=utc_now("milliseconds"))
        if outputs is not None:
            self._first_process(ab, outputs)
        return self.out

    def _first_process(self, ab: list, outputs: dict) -> None:
        """Process 1's units of the first walk per mode (UnitRecord, with sanity figures), each mode judged
        (degenerate audio, no audio, a dirty tree), its audio (int16 PCM of the first walk)."""
        by_index = {u.index: u for u in self.s.units}
        units, judged, pcm = {}, {}, {}
        for mode, arm in (("stock", "a"), ("cadence", "b")):
            recs = []
            for q in ab:
                if q.walk != 0:
                    continue
                unit, out = by_index[q.index], outputs[arm][(0, q.index)]
                _, what, size = payload_of(unit)
                rec = UnitRecord(index=q.index, kind=unit.kind, turn=unit.turn, final=bool(unit.final),
                                 t_start_s=float(unit.t_start_s), payload=what, payload_size=size, samples=out.samples,
                                 measured=q.measured, info=jsonable(out.info))
                if q.profiled:
                    rec.kernels, rec.wall_ms = getattr(q, f"{arm}_kernels"), getattr(q, f"{arm}_ms")
                else:
                    rec.tail_ms = rec.wall_ms = getattr(q, f"{arm}_ms")
                rec.sha256_f32, rec.sha256_pcm16 = out.sha256()
                rec.std, rec.clipped_frac = sanity(np.asarray(out.waveform).reshape(-1))
                recs.append(rec)
            reasons, codes = judge(recs, self.out["provenance"], metrics(recs), min_units=0, limited=self.s.limited)
            units[mode] = [jsonable(dataclasses.asdict(r)) for r in recs]
            judged[mode] = {"reasons": reasons, "codes": codes}
            pcm[mode] = np.concatenate([np.asarray(outputs[arm][(0, q.index)].pcm16, dtype="<i2").reshape(-1)
                                        for q in ab if q.walk == 0] or [np.zeros(0, "<i2")])
        self.out.update(units=units, judged=judged, pcm16=pcm, parameters=self.s.parameters, seeds=self.s.seeds,
                        limited=self.s.limited, workload=workload_dict(self.workload), device=str(self.s.device))

    def close(self) -> None:
        """Close every session still open (idempotent), leave the deterministic flags."""
        for name in list(self.sessions):
            self.sessions.pop(name).close()
        self.copy = None
        if self.det is not None:
            self.det.__exit__(None, None, None)
            self.det = None
        gc.collect()

    # --- helpers -----------------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.s.device.type == "cuda":
            gate.synchronize(self.s.device)

    def _printer(self, run: str):
        if not self.progress:
            return None
        label = f"  process {self.index} {run}"
        b_name = "stock again" if run == "A/A" else "cadence"

        def show(q) -> None:
            kind = "profiled" if q.profiled else "measured" if q.measured else "warm-up" if q.kind == "SPEAK" else "listen"
            print(f"{label} pass {q.walk} unit {q.index} {q.kind} ({kind}): stock {q.a_ms:.1f} ms, {b_name} "
                  f"{q.b_ms:.1f} ms"
                  + ("" if q.equal else " BYTES DIFFER"), flush=True)
        return show


def _walk_untimed(session, units: list) -> None:
    """Speak `units` on `session` as the runner does (start_turn per turn), untimed, outputs dropped."""
    open_turn = None
    for unit in units:
        payload = unit.payload
        if unit.kind != "SPEAK" and payload is None:
            continue
        if unit.kind == "SPEAK" and unit.turn != open_turn:
            session.start_turn()
            open_turn = unit.turn
        final = bool(unit.kind == "SPEAK" and unit.final)
        session.speak(payload, final=final)
        if final:
            open_turn = None


def _probe(device: torch.device):
    """The host probe: microseconds per eager launch of a tiny kernel now (env.host_op_us, one batch of
    UNIT_PROBE_OPS ops on buffers made once)."""
    x = torch.zeros(1, device=device)
    buffers = (x, torch.empty_like(x))
    return lambda: env.host_op_us(device, ops=env.UNIT_PROBE_OPS, repeats=1, buffers=buffers, warmup=0)


# --- the child process -----------------------------------------------------------------------------------
def write_result(out: dict, path: Path) -> None:
    """The process's result as JSON at `path`, its audio (process 1) as path.<mode>.npy."""
    out = dict(out)
    for mode, pcm in (out.pop("pcm16", None) or {}).items():
        np.save(f"{path}.{mode}.npy", pcm)
    Path(path).write_text(json.dumps(jsonable(out)))


def read_result(path: Path) -> dict:
    """What `write_result` wrote, audio as arrays under "pcm16" (files removed)."""
    out = json.loads(Path(path).read_text())
    pcm = {}
    for mode in ("stock", "cadence"):
        f = Path(f"{path}.{mode}.npy")
        if f.is_file():
            pcm[mode] = np.load(f)
            f.unlink()
    if pcm:
        out["pcm16"] = pcm
    return out


def child(workload, args, command: list[str]) -> int:
    """`verify-process`: set-up, "ready" on args.ready_fd, wait for "go" on stdin, the timed part, the result
    in args.result. Exit 0 written; EXIT_NOT_STARTED no "go" came; what set-up raises propagates."""
    protocol = Protocol(**json.loads(args.protocol))
    proc = Process(workload, args.device, protocol, index=args.index, profile=args.profile, depth=args.depth,
                   seconds=args.seconds, max_speak_units=args.max_speak_units, steps=args.steps, seed=args.seed,
                   command=command, progress=not args.quiet)
    try:
        proc.set_up()
        if args.ready_fd is not None:
            os.write(args.ready_fd, b"ready\n")
            os.close(args.ready_fd)
        line = sys.stdin.readline() if args.ready_fd is not None else "go\n"
        if line.strip() != "go":
            print(f"process {args.index}: no 'go' from the verify ({line.strip() or 'end of input'}); stopping",
                  file=sys.stderr)
            return EXIT_NOT_STARTED
        write_result(proc.timed(), Path(args.result))
    finally:
        proc.close()
    return 0
