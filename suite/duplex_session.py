"""One duplex session as suite.duplex runs it: its units, its AR stage + tail, its warm-up, its bytes.

* `session_units`: the workload's session script (validated, read once) tiled to cover a run, with the
  payload ids of variant v shifted by VARIANT_SHIFT * v modulo the vocabulary;
* `Driver`: one adapter session and the shared AR stage; `run_unit` is one unit's whole work (AR stage,
  then the tail, each ending in a synchronisation), `warm_up` runs before the cadence starts;
* `footprint`: the device bytes a session adds (admission control); `release`: give them back;
* `PoolEntry` / `reusable`: warmed-up turn-based sessions kept from one session count to the next.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from suite.runner import select_units

PERIOD_S = 1.0                 # the duplex cadence (DESIGN.md section 1)
VARIANT_SHIFT = 97             # id shift per payload variant
WARMUP_TURN_UNITS = 4          # SPEAK units of the warm-up turn (+ its final unit)

# --- the units a session runs ---------------------------------------------------------------------
@dataclass(frozen=True)
class DuplexUnit:
    """One unit of one session: index (position in the tiled script), kind, turn key (repeat, turn),
    final flag, payload (tokens or codes, variant-shifted; None without payload)."""
    index: int
    kind: str
    turn: tuple | None
    final: bool
    payload: object


_SCRIPTS: dict[tuple, list] = {}     # validated scripts (datasets read), by path, mtime and architecture


def session_units(workload, seconds: float, variant: int = 0) -> list[DuplexUnit]:
    """The workload's script (validated, `suite.runner.select_units`) tiled to cover `seconds` seconds,
    ids shifted by VARIANT_SHIFT * variant modulo the vocabulary. Raises ValueError for seconds <= 0."""
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"seconds: expected a positive number, got {seconds!r}")
    key = (str(workload.script), Path(workload.script).stat().st_mtime_ns, workload.architecture)
    base = _SCRIPTS.get(key)
    if base is None:
        base = _SCRIPTS[key] = select_units(workload)
    vocab = workload.payload_format.vocab
    shift = VARIANT_SHIFT * variant
    n = int(np.ceil(seconds / PERIOD_S))
    out = []
    for k in range(n):
        rep, u = divmod(k, len(base))
        u = base[u]
        payload = u.tokens if u.tokens is not None else u.codes
        if payload is not None and shift:
            if u.tokens is not None:
                payload = tuple((t + shift) % vocab for t in payload)
            else:
                payload = tuple(tuple((c + shift) % vocab for c in book) for book in payload)
        out.append(DuplexUnit(k, u.kind, None if u.turn is None else (rep, u.turn), bool(u.final), payload))
    return out


# --- a session with its AR stage -------------------------------------------------------------------------
class Driver:
    """One session and its AR stage: `run_unit(unit)` does one unit's work and returns its record fields.
    device: the session's device (CUDA: events on the current stream time the unit).

    A session whose decoder draws from the process's default generators (`draws_default_generator`:
    Step-Audio 2, whose HiFT draws `torch.rand`/`randn_like` noise, stepaudio2 hifigan_components/layers.py
    L314, L378, L432, and which upstream never seeds) gets its own generator state: the state when the
    Driver is made (build it right after the session opens; the session seeds the generators) is
    restored before each of its tails and warm-ups and saved after, so N sessions in one process each draw
    the stream they would draw alone (otherwise a session's audio would depend on how the others' units
    interleave with its own). Both modes get it; it costs a host-side get/set of the CPU and CUDA default
    generators' state (no kernel), inside the unit's tail time. Such sessions need one host thread
    (suite.duplex refuses the "threads" policy for them)."""

    def __init__(self, session, ar, device, name: str, tail_lock=None):
        self.session = session
        self.ar = ar
        self.device = torch.device(device)
        self.name = name
        self.turn = None
        self.tail_lock = tail_lock or contextlib.nullcontext()   # sessions sharing one model instance
        self.rehearsed = None      # what session.rehearse() did in warm_up (flow_hift / Step-Audio 2 cadence)
        self.own_rng = bool(getattr(session, "draws_default_generator", False))
        self.rng = rng_state(self.device) if self.own_rng else None

    @staticmethod
    def has_work(unit: DuplexUnit) -> bool:
        return unit.kind == "SPEAK" or unit.payload is not None

    def run_unit(self, unit: DuplexUnit) -> dict:
        cuda = self.device.type == "cuda"
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
        t0 = time.perf_counter()
        if unit.kind == "SPEAK":
            self.ar.run(seed=unit.index)
        t1 = time.perf_counter()
        with self.tail_lock, self._own_generators():
            out = self._tail(unit)
        t2 = time.perf_counter()
        if cuda:
            ev[1].record()
            ev[1].synchronize()
        f32, i16 = out.sha256()
        return {"ar_ms": (t1 - t0) * 1e3, "tail_ms": (t2 - t1) * 1e3,
                "device_ms": float(ev[0].elapsed_time(ev[1])) if cuda else None,
                "samples": out.samples, "sha256_f32": f32, "sha256_pcm16": i16}

    @contextlib.contextmanager
    def _own_generators(self):
        """This session's generator state in the default generators for the block (own_rng), else nothing."""
        if not self.own_rng:
            yield
            return
        set_rng_state(self.device, self.rng)
        try:
            yield
        finally:
            self.rng = rng_state(self.device)

    def _tail(self, unit: DuplexUnit):
        if unit.kind == "SPEAK":
            if unit.turn != self.turn:
                self.session.start_turn()
                self.turn = unit.turn
            out = self.session.speak(unit.payload, final=unit.final)
            if unit.final:
                self.turn = None
            return out
        return self.session.speak(unit.payload, final=False)

    def warm_up(self, units: list[DuplexUnit], body: int = WARMUP_TURN_UNITS) -> None:
        """Before the cadence starts: the AR stage once, then the session's own `prepare()` where it has
        one (Moshi cadence: capture + restore), else, for turn-based decoders (flow_hift, code2wav), one
        warm-up turn over the first `body` SPEAK payloads plus a final unit (first / ramp / steady / final
        shapes; graphs capture on a signature's second occurrence, so a second, shorter turn follows on
        CUDA; the next start_turn restores the voice's base state). Step-Audio 2 DuplexCadence: `rehearse`
        over the script's turns in order, then its snapshot restored (its caches carry over turns).
        Stock Moshi (no turns, no prepare) and stock Step-Audio 2 are not warmed: a unit would advance
        their state (the process is, by warm_process)."""
        self.ar.run(seed=-1)
        with self._own_generators():
            self._warm_up(units, body)

    def _warm_up(self, units: list[DuplexUnit], body: int) -> None:
        if self.rehearsed is not None:     # already rehearsed (on CUDA: the script's graphs are captured)
            return
        if _caches_carry_over(self.session):
            # Step-Audio 2: its caches carry over turns, so no warm-up unit of its own; the cadence session
            # rehearses the script's turns in order and restores its snapshot (state, clocks, generators),
            # so its graphs are captured before the cadence starts. Stock has nothing to capture
            # (warm_process warms its process).
            turns = script_turns(units)
            if callable(getattr(self.session, "rehearse", None)) and turns:
                self.rehearsed = self.session.rehearse(turns, freeze=self.device.type == "cuda")
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            return
        if not _turn_based(self.session):
            if callable(getattr(self.session, "prepare", None)):     # Moshi cadence: capture + restore
                self.session.prepare()
            return
        speak = [u for u in units if u.kind == "SPEAK"]
        if not speak:
            return
        if callable(getattr(self.session, "rehearse", None)):
            # flow_hift cadence: every turn shape of this session's script (token counts per unit) as a
            # synthetic turn, so every signature is captured before the cadence starts; on CUDA the graph
            # set is then frozen (no capture while sessions run on several host threads).
            self.rehearsed = self.session.rehearse(script_turns(units), freeze=self.device.type == "cuda")
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return
        # Other turn-based sessions (code2wav, stock flow_hift): one turn over the script's first SPEAK
        # payloads and a final unit (first / ramp / steady / final shapes).
        finals = [u for u in speak if u.final]
        body = [u for u in speak if not u.final][:body]
        self.session.start_turn()
        for u in body:
            self.session.speak(u.payload, final=False)
        self.session.speak(finals[0].payload if finals else body[0].payload, final=True)
        self.turn = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def rng_state(device) -> tuple:
    """The default generators' state: (CPU generator state, the CUDA device's default generator state or
    None off CUDA), as `torch.get_rng_state` / `torch.cuda.get_rng_state` give them (host tensors)."""
    device = torch.device(device)
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def set_rng_state(device, state: tuple) -> None:
    """Put `state` (from `rng_state`) back into the default generators of the CPU and of `device`."""
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, torch.device(device))


def script_turns(units: list[DuplexUnit]) -> list[tuple[int, ...]]:
    """The token counts of every turn's SPEAK units, in order (a turn ends at its final unit; a turn cut
    by the end of the run is left out: it is never flushed)."""
    turns, cur = [], []
    for u in units:
        if u.kind != "SPEAK":
            continue
        cur.append(0 if u.payload is None else len(u.payload))
        if u.final:
            turns.append(tuple(cur))
            cur = []
    return turns


TURN_STATES = ("reset", "carried", "stream")


def turn_state(session) -> str:
    """What the session's start_turn does to its state, as the session class declares it (`turn_state`):
    "reset" (MiniCPM-o, Qwen3-Omni: a turn starts from the voice's base state / an empty context, so a
    warm-up turn leaves no trace), "carried" (Step-Audio 2: the caches carry over turns, upstream never
    resets them), "stream" (Moshi: one continuous stream). Raises TypeError for a session that declares
    none of them (the harness cannot know how to warm it)."""
    state = getattr(session, "turn_state", None)
    if state not in TURN_STATES:
        raise TypeError(f"session {type(session).__name__}: turn_state must be one of {TURN_STATES}, "
                        f"got {state!r}")
    return state


def _turn_based(session) -> bool:
    """True for sessions whose start_turn restores a base state (turn_state "reset")."""
    return turn_state(session) == "reset"


def _caches_carry_over(session) -> bool:
    """True for sessions whose caches carry over turns (turn_state "carried": Step-Audio 2): no warm-up
    unit of their own."""
    return turn_state(session) == "carried"


# --- footprints ----------------------------------------------------------------------------------------
def tensor_bytes(obj, exclude: set[int] | None = None) -> int:
    """Bytes of the distinct tensor storages reachable from obj (modules' parameters and buffers, dicts,
    lists, tuples, object attributes; 6 levels deep), skipping storages whose data_ptr is in `exclude`."""
    return sum(_storages(obj, exclude or set()).values())


def storage_ptrs(obj) -> set[int]:
    """data_ptrs of the tensor storages reachable from obj (see tensor_bytes)."""
    return set(_storages(obj, set()))


def _storages(obj, exclude: set[int]) -> dict[int, int]:
    found: dict[int, int] = {}
    visited: set[int] = set()

    def walk(o, depth):
        if depth > 6 or o is None or isinstance(o, (str, bytes, int, float, bool, type)):
            return
        if isinstance(o, torch.Tensor):
            try:
                st = o.untyped_storage()
                ptr = st.data_ptr()
            except Exception:       # tensors without storage (e.g. meta)
                return
            if ptr and ptr not in exclude:
                found[ptr] = max(found.get(ptr, 0), st.nbytes())
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
            walk(v, depth + 1)

    walk(obj, 0)
    return found


def footprint(session, mode: str, model, sharing: str) -> tuple[int, str]:
    """(bytes, how) a session adds to the device.

    DuplexCadence: arena bytes reserved + graph-pool bytes (session.stats(), issue 7's admission rule),
    plus every other tensor the session owns outside its arena and the shared model (e.g. the voice's
    base caches it restores at each turn), so that admission does not under-count. Stock: the tensors the
    session owns, plus its whole model instance where stock runs one instance per session."""
    stats = session.stats() if callable(getattr(session, "stats", None)) else {}
    if mode != "stock" and "arena_bytes_reserved" in stats:
        arena = getattr(session, "arena", None)
        skip = storage_ptrs(model) | ({arena.base} if arena is not None else set())
        other = tensor_bytes(session, exclude=skip)
        return (int(stats["arena_bytes_reserved"]) + int(stats.get("graph_pool_bytes") or 0) + other,
                f"arena_bytes_reserved {int(stats['arena_bytes_reserved'])} + graph_pool_bytes "
                f"{int(stats.get('graph_pool_bytes') or 0)} + other session tensors {other}")
    if sharing == "instance_per_session":
        return tensor_bytes(session), "model instance + session tensors"
    return tensor_bytes(session, exclude=storage_ptrs(model)), "session tensors (shared model excluded)"


@dataclass
class PoolEntry:
    """A built, warmed-up session kept for the next run (turn-based decoders only, `reusable`)."""
    instance: object
    driver: Driver
    nbytes: int
    how: str


def release(session) -> None:
    """Give a finished session's device memory back: its own `close()` where it has one, else its VMM
    arena's reservation (unmapped and freed: nothing reads it after the session; the arena has no close()
    of its own yet, and torch never frees memory it did not allocate). Graphs are dropped with the session."""
    if callable(getattr(session, "close", None)):
        session.close()
        return
    vmm = getattr(getattr(session, "arena", None), "_vmm", None)
    if vmm is not None:
        graphs = getattr(session, "graphs", None)
        if graphs is not None:
            graphs.entries.clear()
        vmm.close()


def reusable(session) -> bool:
    """A session whose start_turn restores its voice's base state (flow_hift, code2wav) can serve the
    next run: its first SPEAK unit opens a turn, so nothing of the earlier run reaches its bytes."""
    return _turn_based(session)
