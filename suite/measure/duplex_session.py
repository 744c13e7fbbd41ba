"""One duplex session as suite.measure.duplex runs it: its units (`traffic_units`: its own real script from
workloads.traffic; `session_units`: the committed script tiled to a run, ids of variant v shifted, kept for
comparison with older records), `Driver` (one session and the AR stage: `run_unit`, `prepare`, `warm_up`, the
slack capture after each unit), `oracle_signatures` (what a session's own script will meet, from a copy of its
clocks: foreknowledge), `footprint` (the bytes admission counts), and a run's `metrics`, `Progress` lines and
byte checks.
"""
from __future__ import annotations

import contextlib
import random
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from duplexcadence import gate
from duplexcadence.errors import InputError
from suite.measure.session import select_units
from suite.measure.slack import turn_family

PERIOD_S = 1.0                 # the duplex cadence
VARIANT_SHIFT = 97             # id shift per payload variant
WARMUP_TURN_UNITS = 4          # full SPEAK units of the warm-up turn (synthetic payloads)
PREPARES = ("voice", "turns", "oracle", "learned:K")  # what a cadence session captures before the cadence
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


def traffic_units(script, seconds: float | None = None) -> list[DuplexUnit]:
    """A workloads.traffic session script (`Arrival.script`) as the harness's units, the first `seconds` of it
    (None: all; a turn cut there stays unflushed). Raises ValueError for seconds <= 0."""
    if seconds is not None and (not isinstance(seconds, (int, float)) or seconds <= 0):
        raise ValueError(f"seconds: expected a positive number or None, got {seconds!r}")
    out = []
    for u in script.units:
        if seconds is not None and u.t_start_s >= seconds:
            break
        payload = u.tokens if u.tokens is not None else u.codes
        size = len(u.tokens) if u.tokens is not None else u.frames
        out.append(DuplexUnit(u.index, u.kind, None if u.turn is None else (0, u.turn), bool(u.final), payload,
                              size if payload is not None else 0))
    return out


def synthetic_payload(fmt, size: int, seed: int):
    """A payload of `size` tokens / frames in payload format `fmt` (workloads.common.PayloadFormat), ids from
    random.Random(seed): what a warm-up speaks, never a session's script."""
    rng = random.Random(seed)
    if fmt.key == "tokens":
        return tuple(rng.randrange(fmt.vocab) for _ in range(size))
    return tuple(tuple(rng.randrange(fmt.vocab) for _ in range(size)) for _ in range(fmt.codebooks))


def has_work(unit: DuplexUnit) -> bool:
    return unit.kind == "SPEAK" or unit.payload is not None


def learned_graphs(how: str) -> int | None:
    """K of a "learned:K" prepare (an int >= 1), None for "voice", "turns" and "oracle". Raises ValueError naming
    `prepare` for anything else."""
    if how in ("voice", "turns", "oracle"):
        return None
    head, _, k = str(how).partition(":")
    if head != "learned" or not (k.isascii() and k.isdigit()) or int(k) < 1:
        raise ValueError(f"prepare: expected one of {PREPARES} (K an int >= 1), got {how!r}")
    return int(k)


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
    the tail and the slack's captures (sessions of one model instance that are not `concurrent`, on the threads
    policy). slack: the session's suite.measure.slack.SlackCapture (None: no slack work, stock)."""

    def __init__(self, session, ar, device, name: str, tail_lock=None):
        self.session = session
        self.ar = ar
        self.device = torch.device(device)
        self.name = name
        self.turn = None
        self.opened = False                # the last unit opened a turn
        self.tail_lock = tail_lock or contextlib.nullcontext()
        self.prepared: dict = {}
        self.slack = None

    def run_unit(self, unit: DuplexUnit) -> dict:
        """One unit's work (the AR stage for a SPEAK unit, then the tail). A unit the session refuses
        (InputError: e.g. Step-Audio 2's 1-token final flush, which the stock driver cannot stream) leaves the
        session as it was and is recorded as rejected (its message), as a server answers a bad unit."""
        cuda = self.device.type == "cuda"
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
        t0 = time.perf_counter()
        if unit.kind == "SPEAK":
            self.ar.run(seed=unit.index)
        t1 = time.perf_counter()
        rejected = None
        with self.tail_lock:
            try:
                out = self._tail(unit)
            except InputError as exc:
                out, rejected = None, f"{type(exc).__name__}: {exc}"[:300]
        t2 = time.perf_counter()
        if cuda:
            ev[1].record()
            ev[1].synchronize()
        f32, i16 = out.sha256() if out is not None else (None, None)
        rec = {"ar_ms": (t1 - t0) * 1e3, "tail_ms": (t2 - t1) * 1e3,
               "device_ms": float(ev[0].elapsed_time(ev[1])) if cuda else None,
               "samples": out.samples if out is not None else 0, "sha256_f32": f32, "sha256_pcm16": i16}
        if rejected:
            rec["rejected"] = rejected
        return rec

    def _tail(self, unit: DuplexUnit):
        self.opened = False
        if unit.kind != "SPEAK":
            return self.session.speak(unit.payload, final=False)
        if unit.turn != self.turn:
            self.session.start_turn()
            self.turn, self.opened = unit.turn, True
        try:
            return self.session.speak(unit.payload, final=unit.final)
        finally:
            if unit.final:
                self.turn = None

    def after_unit(self, unit: DuplexUnit):
        """The scheduler's `Slot.after_unit`: the slack's bookkeeping of the unit that just ran; returns the
        slack job (None without slack)."""
        if self.slack is None:
            return None
        return self.slack.note(unit, opened_turn=self.opened, turn_open=self.turn is not None)

    def prepare(self, units: list[DuplexUnit], how: str = "voice", learned: list | None = None) -> dict:
        """Capture before the cadence: `prepare(None)` (what every turn of the voice needs); with "turns" also
        `slack.turn_family` of the session's clocks now (every signature a turn of full units between a first
        and a last unit of any size meets: the clocks alone, no script); with "oracle" also
        `oracle_signatures(units)` of this session's own script; with "learned:K" also `learned` (signatures
        learned from other recordings' traffic: duplex_run.learned_signatures). Returns {"voice": deltas,
        "turns", "oracle", "learned": deltas or None, "ms"}; a no-op (zeros) for sessions that capture nothing.
        Raises ValueError for another `how`, or "learned:K" without `learned`."""
        k = learned_graphs(how)
        if k is not None and learned is None:
            raise ValueError(f"prepare: {how!r} needs the learned signatures")
        t0 = time.perf_counter()
        out = {"voice": self.session.prepare(None), "turns": None, "oracle": None, "learned": None}
        if how == "turns":
            out["turns"] = self.session.prepare(turn_family(self.session.clocks(), self.session.capabilities))
        if how == "oracle":
            out["oracle"] = self.session.prepare(oracle_signatures(self.session, units))
        if k is not None:
            out["learned"] = self.session.prepare(learned)
        if self.device.type == "cuda":
            gate.synchronize(self.device)
        out["ms"] = (time.perf_counter() - t0) * 1e3
        self.prepared = out
        return out

    def warm_up(self, fmt, body: int | None = None) -> None:
        """Before the cadence: the AR stage once; then, for a session whose start_turn restores the voice's
        base state (turn_state "reset"), one warm-up turn of `body` (WARMUP_TURN_UNITS) full units of synthetic payload
        (`synthetic_payload` in payload format `fmt`, max_payload each: shapes prepare(None) holds), left open
        (the next start_turn undoes it). Nothing of the session's script is read. Other sessions are not warmed:
        a unit would advance their state (`warm_process` warms their process)."""
        self.ar.run(seed=-1)
        caps, body = self.session.capabilities, WARMUP_TURN_UNITS if body is None else body
        if caps.turn_state != "reset" or body < 1:
            return
        self.session.start_turn()
        for k in range(body):
            self.session.speak(synthetic_payload(fmt, caps.max_payload, seed=k), final=False)
        self.turn = None
        if self.device.type == "cuda":
            gate.synchronize(self.device)


# --- footprints ----------------------------------------------------------------------------------------
def storages(obj, depth: int = 6) -> dict[int, int]:
    """{data_ptr: bytes} of the distinct tensor storages reachable from obj (modules' parameters and
    buffers, dicts, lists, tuples, object attributes; `depth` levels deep). Python modules (a package an
    object keeps a reference to) are not walked: what a session holds is never reached through them."""
    found: dict[int, int] = {}
    visited: set[int] = set()

    def walk(o, level):
        if level > depth or o is None or isinstance(o, (str, bytes, int, float, bool, type, types.ModuleType)):
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
    """A built, prepared, warmed-up session (kept for the next run where its turn_state is "reset"): its model
    instance, driver, footprint bytes and how they were counted, and the seconds it took to build."""
    instance: object
    driver: Driver
    nbytes: int
    how: str
    build_s: float = 0.0


# --- runs -----------------------------------------------------------------------------------------------
def metrics(units: list[dict], period_s: float = PERIOD_S) -> dict:
    """Per run: SPEAK time (ms and fraction of the period: mean, p50, p99, max), miss rate and misses over
    the units that ran, units the sessions rejected (InputError), lateness of the latest unit (ms)."""
    ran = [u for u in units if u["start_ms"] is not None]
    speak = np.array([u["speak_ms"] for u in ran if u["kind"] == "SPEAK" and u.get("speak_ms") is not None],
                     dtype=np.float64)
    misses = sum(u["miss"] for u in ran)
    out = {"units_run": len(ran), "speak_units": int(speak.size), "misses": int(misses),
           "rejected_units": sum(bool(u.get("rejected")) for u in ran),
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


def check_bytes(run: dict, refs: dict, keys: list) -> dict:
    """Every session of a run against its reference (`refs`: plan key -> the same plan run alone; keys[s]: session
    s's plan key): {"checked": sessions compared, "unchecked": sessions without a reference, "mismatches":
    one line per session whose bytes differ from the same session run alone}."""
    bad, checked, unchecked = [], 0, []
    rows_of = session_hashes(run)
    for s, key in enumerate(keys):
        ref = refs.get(key)
        if ref is None:
            unchecked.append(s)
            continue
        checked += 1
        rows = rows_of.get(s, [])
        if rows != ref:
            first = next((a[0] for a, b in zip(rows, ref) if a != b), min(len(rows), len(ref)))
            bad.append(f"{run['mode']} N={run['sessions']} session {s}: unit {first} differs from the same "
                       f"session run alone")
    return {"checked": checked, "unchecked": unchecked, "mismatches": bad}


def parse_sessions(text: str, flag: str = "--sessions") -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, distinct). Raises ValueError naming `flag`."""
    try:
        ns = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated ints >= 1 (e.g. 1,2,4), got {text!r}") from None
    if not ns or ns[0] < 1:
        raise ValueError(f"{flag}: expected comma-separated ints >= 1 (e.g. 1,2,4), got {text!r}")
    return ns
