"""One duplex session as suite.measure.duplex runs it: `session_units` (the script tiled to a run, ids of
variant v shifted), `Driver` (one session and the AR stage: `run_unit`, `prepare`, `warm_up`),
`oracle_signatures` (what a session's own script will meet, from a copy of its clocks: foreknowledge),
`footprint` (the bytes admission counts), and a run's `metrics`, `Progress` lines and byte checks.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from duplexcadence.errors import InputError
from suite.measure.session import select_units
from suite.records import max_zero_miss

PERIOD_S = 1.0                 # the duplex cadence
VARIANT_SHIFT = 97             # id shift per payload variant
WARMUP_TURN_UNITS = 4          # SPEAK units of the warm-up turn (+ its final unit)
PREPARES = ("voice", "oracle")  # what a cadence session captures before the cadence
PROGRESS_S = 10.0              # a progress line at most this often while a run is on the cadence


@dataclass(frozen=True)
class DuplexUnit:
    """One unit of one session: index (position in the tiled script), kind, turn key (repeat, turn), final
    flag, payload (tokens or codes, variant-shifted; None without payload) and its size (tokens / frames)."""
    index: int
    kind: str
    turn: tuple | None
    final: bool
    payload: object
    size: int = 0


_SCRIPTS: dict[tuple, list] = {}     # validated scripts, by path, mtime and architecture


def session_units(workload, seconds: float, variant: int = 0) -> list[DuplexUnit]:
    """The workload's script (validated) tiled to cover `seconds` seconds, ids shifted by VARIANT_SHIFT *
    variant modulo the vocabulary. Raises ValueError for seconds <= 0."""
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"seconds: expected a positive number, got {seconds!r}")
    key = (str(workload.script), Path(workload.script).stat().st_mtime_ns, workload.architecture)
    base = _SCRIPTS.get(key)
    if base is None:
        base = _SCRIPTS[key] = select_units(workload)
    vocab, shift = workload.payload_format.vocab, VARIANT_SHIFT * variant
    out = []
    for k in range(int(np.ceil(seconds / PERIOD_S))):
        rep, u = divmod(k, len(base))
        u = base[u]
        payload, size = (u.tokens, len(u.tokens)) if u.tokens is not None else (u.codes, u.frames)
        if payload is not None and shift:
            payload = (tuple((t + shift) % vocab for t in payload) if u.tokens is not None else
                       tuple(tuple((c + shift) % vocab for c in book) for book in payload))
        out.append(DuplexUnit(k, u.kind, None if u.turn is None else (rep, u.turn), bool(u.final), payload,
                              size if payload is not None else 0))
    return out


def has_work(unit: DuplexUnit) -> bool:
    return unit.kind == "SPEAK" or unit.payload is not None


def oracle_signatures(session, units: list[DuplexUnit]) -> list:
    """The signatures of every step `units` will make `session` run, in order and each once, from a copy of
    its clocks walked as `Driver.run_unit` drives the session (start_turn on a new turn, then one
    `unit(size, final)` per unit with work). Stops where the clocks refuse a unit (a bound the run would hit)."""
    clocks, sigs, turn = session.clocks(), {}, None
    try:
        for u in units:
            if not has_work(u):
                continue
            final = u.kind == "SPEAK" and u.final
            if u.kind == "SPEAK" and u.turn != turn:
                clocks.start_turn()
                turn = u.turn
            sigs.update(dict.fromkeys(clocks.unit(u.size, final)))
            if final:
                turn = None
    except InputError:
        pass
    return list(sigs)


class Driver:
    """One session and its AR stage: `run_unit(unit)` does one unit's work and returns its record fields.
    device: the session's device (CUDA: events on the current stream time the unit). tail_lock: held around
    the tail (sessions of one model instance that are not `concurrent`, on the threads policy)."""

    def __init__(self, session, ar, device, name: str, tail_lock=None):
        self.session = session
        self.ar = ar
        self.device = torch.device(device)
        self.name = name
        self.turn = None
        self.tail_lock = tail_lock or contextlib.nullcontext()
        self.prepared: dict = {}

    def run_unit(self, unit: DuplexUnit) -> dict:
        cuda = self.device.type == "cuda"
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
        t0 = time.perf_counter()
        if unit.kind == "SPEAK":
            self.ar.run(seed=unit.index)
        t1 = time.perf_counter()
        with self.tail_lock:
            out = self._tail(unit)
        t2 = time.perf_counter()
        if cuda:
            ev[1].record()
            ev[1].synchronize()
        f32, i16 = out.sha256()
        return {"ar_ms": (t1 - t0) * 1e3, "tail_ms": (t2 - t1) * 1e3,
                "device_ms": float(ev[0].elapsed_time(ev[1])) if cuda else None,
                "samples": out.samples, "sha256_f32": f32, "sha256_pcm16": i16}

    def _tail(self, unit: DuplexUnit):
        if unit.kind != "SPEAK":
            return self.session.speak(unit.payload, final=False)
        if unit.turn != self.turn:
            self.session.start_turn()
            self.turn = unit.turn
        out = self.session.speak(unit.payload, final=unit.final)
        if unit.final:
            self.turn = None
        return out

    def prepare(self, units: list[DuplexUnit], how: str = "voice") -> dict:
        """Capture before the cadence: `prepare(None)` (what every turn of the voice needs); with "oracle" also
        `oracle_signatures(units)` of this session's own script. Returns {"voice": deltas, "oracle": deltas or
        None, "ms"}; a no-op (zeros) for sessions that capture nothing."""
        if how not in PREPARES:
            raise ValueError(f"prepare: expected one of {PREPARES}, got {how!r}")
        t0 = time.perf_counter()
        out = {"voice": self.session.prepare(None), "oracle": None}
        if how == "oracle":
            out["oracle"] = self.session.prepare(oracle_signatures(self.session, units))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out["ms"] = (time.perf_counter() - t0) * 1e3
        self.prepared = out
        return out

    def warm_up(self, units: list[DuplexUnit], body: int = WARMUP_TURN_UNITS) -> None:
        """Before the cadence: the AR stage once; then, for a session whose start_turn restores the voice's
        base state (turn_state "reset"), one warm-up turn over the script's first `body` SPEAK payloads and a
        final unit (the next start_turn undoes it). Other sessions are not warmed: a unit would advance their
        state (`warm_process` warms their process)."""
        self.ar.run(seed=-1)
        speak = [u for u in units if u.kind == "SPEAK"]
        if self.session.capabilities.turn_state != "reset" or not speak:
            return
        finals = [u for u in speak if u.final]
        body = [u for u in speak if not u.final][:body] or speak[:1]
        self.session.start_turn()
        for u in body:
            self.session.speak(u.payload, final=False)
        self.session.speak((finals or body)[0].payload, final=True)
        self.turn = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


# --- footprints ----------------------------------------------------------------------------------------
def storages(obj, depth: int = 6) -> dict[int, int]:
    """{data_ptr: bytes} of the distinct tensor storages reachable from obj (modules' parameters and
    buffers, dicts, lists, tuples, object attributes; `depth` levels deep)."""
    found: dict[int, int] = {}
    visited: set[int] = set()

    def walk(o, level):
        if level > depth or o is None or isinstance(o, (str, bytes, int, float, bool, type)):
            return
        if isinstance(o, torch.Tensor):
            try:
                st = o.untyped_storage()
                found[st.data_ptr()] = max(found.get(st.data_ptr(), 0), st.nbytes())
            except (RuntimeError, NotImplementedError):       # tensors without storage (e.g. meta)
                pass
            return
        if id(o) in visited:
            return
        visited.add(id(o))
        if isinstance(o, torch.nn.Module):
            items = list(o.parameters()) + list(o.buffers())
        elif isinstance(o, dict):
            items = list(o.values())
        elif isinstance(o, (list, tuple, set)):
            items = list(o)
        elif hasattr(o, "__dict__"):
            items = list(vars(o).values())
        else:
            return
        for v in items:
            walk(v, level + 1)

    walk(obj, 0)
    found.pop(0, None)
    return found


def footprint(session, mode: str, model, own_instance: bool) -> tuple[int, str]:
    """(bytes, how) a session adds to the device. DuplexCadence: arena bytes reserved + graph bytes
    (session.stats()) + every other tensor the session holds outside its arena (`state()`'s views) and the
    shared model. Stock: the tensors the session holds, plus its whole model instance when it has its own."""
    stats = session.stats()
    if mode != "stock":
        skip = set(storages(model)) | set(storages(session.state()))
        other = sum(v for k, v in storages(session).items() if k not in skip)
        total = stats.arena_bytes_reserved + stats.graph_bytes + other
        return total, (f"arena_bytes_reserved {stats.arena_bytes_reserved} + graph_bytes {stats.graph_bytes} "
                       f"+ other session tensors {other}")
    if own_instance:
        return sum(storages(session).values()), "model instance + session tensors"
    shared = set(storages(model))
    return (sum(v for k, v in storages(session).items() if k not in shared),
            "session tensors (shared model excluded)")


@dataclass
class PoolEntry:
    """A built, prepared, warmed-up session kept for the next run (turn_state "reset" only)."""
    instance: object
    driver: Driver
    nbytes: int
    how: str


# --- runs -----------------------------------------------------------------------------------------------
def metrics(units: list[dict], period_s: float = PERIOD_S) -> dict:
    """Per run: SPEAK time (ms and fraction of the period: mean, p50, p99, max), miss rate and misses over
    the units that ran, lateness of the latest unit (ms)."""
    ran = [u for u in units if u["start_ms"] is not None]
    speak = np.array([u["speak_ms"] for u in ran if u["kind"] == "SPEAK"], dtype=np.float64)
    misses = sum(u["miss"] for u in ran)
    out = {"units_run": len(ran), "speak_units": int(speak.size), "misses": int(misses),
           "miss_rate": misses / len(ran) if ran else None,
           "speak_misses": int(sum(u["miss"] for u in ran if u["kind"] == "SPEAK")),
           "max_lateness_ms": max((u["lateness_ms"] for u in ran), default=None)}
    if speak.size:
        p = period_s * 1e3
        out.update({"speak_ms_mean": float(speak.mean()), "speak_ms_p50": float(np.percentile(speak, 50)),
                    "speak_ms_p99": float(np.percentile(speak, 99)), "speak_ms_max": float(speak.max()),
                    "speak_frac_mean": float(speak.mean() / p), "speak_frac_p99": float(np.percentile(speak, 99) / p)})
    return out


class Progress:
    """`scheduler` unit callback: counts units and misses, prints a line at most every PROGRESS_S seconds."""

    def __init__(self, label: str, total: int, seconds: float, enabled: bool):
        self.label, self.total, self.seconds, self.enabled = label, total, seconds, enabled
        self.done = self.missed = 0
        self.t0 = self.last = time.perf_counter()
        self.lock = threading.Lock()

    def __call__(self, timing) -> None:
        with self.lock:
            self.done += 1
            self.missed += bool(timing.miss)
            now = time.perf_counter()
            if self.enabled and now - self.last >= PROGRESS_S:
                self.last = now
                print(f"  {self.label}: {self.done}/{self.total} units done, {now - self.t0:.0f} of "
                      f"{self.seconds:g} s, {self.missed} missed", flush=True)


def session_hashes(run: dict) -> dict[int, list]:
    """session -> [(index, sha256_f32, sha256_pcm16)] of the units that ran."""
    out: dict[int, list] = {}
    for u in run["units"]:
        if u.get("sha256_f32"):
            out.setdefault(u["session"], []).append((u["index"], u["sha256_f32"], u["sha256_pcm16"]))
    return out


def check_against_reference(run: dict, refs: dict[int, list], variants: int) -> list[str]:
    """Mismatches of every session against the solo run of its variant (empty: all byte-identical)."""
    bad = []
    for s, rows in session_hashes(run).items():
        ref = refs.get(s % variants)
        if ref is None:
            bad.append(f"session {s}: no solo reference for variant {s % variants}")
        elif rows != ref:
            first = next((a[0] for a, b in zip(rows, ref) if a != b), min(len(rows), len(ref)))
            bad.append(f"{run['mode']} N={run['sessions']} session {s}: unit {first} differs from the same "
                       f"session run alone")
    return bad


def parse_sessions(text: str, flag: str = "--sessions") -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, distinct). Raises ValueError naming `flag`."""
    try:
        ns = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated ints >= 1 (e.g. 1,2,4), got {text!r}") from None
    if not ns or ns[0] < 1:
        raise ValueError(f"{flag}: expected comma-separated ints >= 1 (e.g. 1,2,4), got {text!r}")
    return ns


def next_bisect(runs: list[dict]) -> int | None:
    """The next N to try between the largest N with zero misses and the smallest larger N that missed or was
    refused; None when they are adjacent (or either is missing)."""
    lo = max_zero_miss(runs)
    bad = [r["sessions"] for r in runs if r.get("refused") or r["metrics"]["misses"]]
    hi = min((b for b in bad if lo is None or b > lo), default=None)
    if lo is None or hi is None or hi - lo <= 1:
        return None
    return (lo + hi) // 2
