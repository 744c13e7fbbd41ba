"""DuplexCadence session for Moshi's Mimi decoder: the stock kernels on arena views, CUDA-graph replay.

`MimiModel.decode` (compression.py L406-429) runs as it ships, with moshi's CUDA graphs and compile off
through its own switches, as in stock eager. What changes:

* State: every decoder-side streaming tensor `streaming(1)` allocated for the session (ring KV caches,
  RoPE and transformer counters, SEANet and upsample conv tails, exec masks) is copied into one Arena and
  the session's own moshi State is pointed at the arena view (same shape, contiguous as stock's), so the
  stock modules update arena memory in place (`x[:] = torch.where(...)`, `scatter_`) at fixed addresses.
* Ring KV bookkeeping (kv_bookkeeping="host", the default): which slots a call writes and the position of
  every slot come from the host clock (`ring_rows`) in the call's io row, instead of about 19 small device
  kernels per layer and call (`HostRingKV`); the scatter writes and every kernel that computes audio stay
  moshi's. kv_bookkeeping="stock" keeps moshi's RingKVCache on the arena views.
* Graphs (CUDA): the decode step is captured per exact `Signature` (MimiClock) ahead of time (`prepare`)
  and replayed: cadence_graphs="frame" (default) is one graph of one decode call, "unit" puts a unit's 12
  or 13 calls in one graph. A unit's codes and ring rows reach the device in one copy, the PCM leaves in one.
  Measured on one H200 over a 10-minute session (released config): both 18.5 ms per second of audio, but
  the two 13-frame graphs hold about 32 MiB more driver memory than the one-frame graph, hence the default.
* Sharing: the session's states are installed on the shared model only inside an eager step or a capture
  (stock.StreamStates, under the model lock); a replay runs no Python of the model and takes no lock.
"""
from __future__ import annotations

import torch

from duplexcadence.adapters.mimi.schedule import (
    BATCH, N_Q, POSITIONS_PER_FRAME, SAMPLES_PER_FRAME, UNIT, UNIT_SIZES, MimiClock, declare_regions, ring_rows)
from duplexcadence.adapters.mimi.stock import CAPABILITIES, StreamStates, parse_codes
from duplexcadence.arena import Arena
from duplexcadence.clocks import Ring
from duplexcadence.errors import InputError
from duplexcadence.graphs import GraphCache
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import (
    Capabilities, Session, SessionStats, check_final, host_waveform, unit_output)

GRAPH_MODES = ("frame", "unit")
KV_BOOKKEEPING = ("host", "stock")
CAPTURE = ("ahead", "inline")


class IoRow:
    """The io row the decode call being run or captured reads: int64 [8 codes | 2 slots | capacity]."""
    now: torch.Tensor | None = None


class HostRingKV:
    """Stands in for one layer's moshi `RingKVCache` (transformer.py L196-288) with kv_bookkeeping="host":
    `complete` makes the stock's only writes, the same two `scatter_` of k and v into the ring (an arena
    view) at the same slots with the same expanded index layout, and returns the same (keys, values,
    positions); slots and positions are read from the io row the host filled from clock POSITIONS.
    B = 1 with exec_mask always True (the server never masks: server.py L59)."""

    def __init__(self, cache: torch.Tensor, io: IoRow):
        self.cache, self.io = cache, io

    def complete(self, k, v, exec_mask):
        B, H, T, D = k.shape
        write, pos = self.io.now[N_Q:N_Q + T], self.io.now[N_Q + T:].view(B, -1)
        index = write.view(B, 1, T, 1).expand(-1, H, T, D)                  # as L247-248
        self.cache[0].scatter_(2, index, k)
        self.cache[1].scatter_(2, index, v)
        return self.cache[0], self.cache[1], pos                            # KVCacheResult's fields

    def reset(self, reset_mask) -> None:
        raise RuntimeError("HostRingKV: a cadence session is never reset (Moshi streams continuously)")


class CadenceSession(Session):
    """DuplexCadence over the stock modules (module docstring). spec: cadence_graphs ("frame" | "unit"),
    kv_bookkeeping ("host" | "stock"), capture ("ahead": graphs only from `prepare`, an uncaptured step
    runs eagerly and is counted; "inline": capture on first use), arena_backend, graphs (bool; default
    CUDA). Raises ValueError for a bad spec value. Host clocks advance here, never read back from the
    device; moshi's host `offset_cpu` counters (read only for weights_per_step, which Mimi lacks) are set
    from them after each unit, since a replay runs no Python."""

    capabilities = Capabilities(graphs=True, **CAPABILITIES)

    def __init__(self, model, spec: dict | None = None):
        spec = spec or {}
        for key, allowed in (("cadence_graphs", GRAPH_MODES), ("kv_bookkeeping", KV_BOOKKEEPING),
                             ("capture", CAPTURE)):
            if spec.get(key, allowed[0]) not in allowed:
                raise ValueError(f"spec[{key!r}]: expected one of {allowed}, got {spec[key]!r}")
        self.graph_mode = spec.get("cadence_graphs", "frame")
        self.kv_mode = spec.get("kv_bookkeeping", "host")
        self.model, self.device = model, next(model.parameters()).device
        self.own = StreamStates(model, decode_only=True)
        bindings = declare_regions(model, self.own.states)
        if self.kv_mode == "host":            # the write counter becomes the host clock POSITIONS
            bindings = [b for b in bindings if b.kind != "RingKVCache.end_offset"]
        self.bindings = bindings
        self.capacity = next(b.spec.policy.capacity for b in bindings if isinstance(b.spec.policy, Ring))
        row = N_Q + POSITIONS_PER_FRAME + self.capacity
        most = UNIT.policy.bound()
        self.arena = Arena(self.device, backend=spec.get("arena_backend", "auto"), name="mimi")
        for b in bindings:
            t = getattr(b.owner, b.attr)
            self.arena.declare(b.spec.name, t.shape, t.dtype)
        self.arena.declare("io.unit", (most, row), torch.int64)
        self.arena.declare("io.frame", (row,), torch.int64)
        self.arena.declare("io.pcm", (BATCH, 1, most * SAMPLES_PER_FRAME), torch.float32)
        self.arena.allocate()
        for b in bindings:   # moshi's initial values in, then the session's own State points at the view
            b.view = self.arena[b.spec.name].view(getattr(b.owner, b.attr).shape)
            b.view.copy_(getattr(b.owner, b.attr))
            setattr(b.owner, b.attr, b.view)
        self.io = IoRow()
        if self.kv_mode == "host":
            for state in self.own.states.values():
                if getattr(state, "kv_cache", None) is not None:
                    state.kv_cache = HostRingKV(state.kv_cache.cache, self.io)
        self._unit = self.arena["io.unit"].view((most, row))
        self._frame = self.arena["io.frame"].view((row,))
        self._host_counted = [st for st in self.own.states.values() if hasattr(st, "offset_cpu")]
        self.graphs = GraphCache(self.device, arena=self.arena, enabled=spec.get("graphs"),
                                 inline=spec.get("capture") == "inline", warmup=1, lock=model_lock(model),
                                 warmed=model_state(model).setdefault("mimi.warmed", set()))
        self._clock = MimiClock(tuple(b.spec for b in bindings), self.graph_mode)
        self.units = 0

    def start_turn(self) -> None:
        """Nothing: one continuous stream (MimiClock.start_turn). Raises ClosedError."""
        self._check_open("start_turn")

    def clocks(self) -> MimiClock:
        self._check_open("clocks")
        return self._clock.copy()

    # -- the step: stock kernels on arena views --------------------------------------------------
    def _decode(self, rows) -> list:
        with self.own.installed():
            outs = []
            for row in rows:
                self.io.now = row
                outs.append(self.model.decode(row[:N_Q].view(BATCH, N_Q, 1)))
            return outs

    def _pcm(self, frames: int) -> torch.Tensor:
        """float32 [1, 1, frames * 1920] at the base of region io.pcm."""
        return self.arena["io.pcm"].view((BATCH, 1, frames * SAMPLES_PER_FRAME))

    def _step(self, sig):
        """The step function of `sig` (its kernels read the io rows and write the regions)."""
        if sig.step == "frame":
            return lambda: self._decode([self._frame])[0]
        rows = [self._unit[t] for t in range(sig.size)]
        return lambda: torch.cat(self._decode(rows), dim=-1, out=self._pcm(sig.size))

    def _sync_host_counters(self) -> None:
        for state in self._host_counted:
            state.offset_cpu = self._clock.positions

    def speak(self, payload, *, final: bool = False):
        """One unit: codes [8][F] (1 <= F <= 13) -> float32 waveform [F * 1920] @ 24 kHz and its int16 PCM,
        byte-identical to the stock session. `final` changes nothing (no flush in Mimi). Raises InputError
        (LimitError past 13 frames) before anything runs; the arena and clocks are then unchanged."""
        self._check_open("speak")
        check_final(final)
        codes = parse_codes(payload)
        frames = int(codes.shape[1])
        clock = self._clock.copy()
        sigs = clock.unit(frames, final)
        self._unit[:frames].copy_(torch.cat([codes.t(), ring_rows(self._clock.positions, frames, self.capacity)], 1))
        pcm = self._pcm(frames)
        if self.graph_mode == "unit":
            self.graphs.run(sigs[0], self._step(sigs[0]))
        else:
            for t, sig in enumerate(sigs):
                self._frame.copy_(self._unit[t])
                pcm[..., t * SAMPLES_PER_FRAME:(t + 1) * SAMPLES_PER_FRAME].copy_(self.graphs.run(sig, self._step(sig)))
        self._clock, self.units = clock, self.units + 1
        self._sync_host_counters()
        return unit_output([host_waveform(pcm)], frames=frames)

    def prepare(self, signatures=None) -> dict:
        """Capture these signatures ahead of time (None: what every unit needs, `UNIT_SIZES` = 12 and 13
        frames: the one frame step, or both unit graphs), changing neither state nor clocks. A capture
        records kernels without running them; the first capture of a signature in the process is preceded
        by one eager warm-up decode (zero codes) whose every region is restored afterwards. Returns the
        counters' change. No-op on CPU. Raises InputError for a signature of another session's step."""
        self._check_open("prepare")
        before = self.stats()
        sigs = sorted({s for n in UNIT_SIZES for s in self._clock.copy().unit(n)} if signatures is None
                      else set(signatures))
        want = self._clock.copy().unit(1)[0]
        for sig in sigs:
            if sig.step != self.graph_mode or sig.lengths != want.lengths or sig.exact != want.exact:
                raise InputError(f"signatures: {sig!r} is not a step of this session (e.g. {want!r})")
        if self.graphs.enabled:
            for sig in sigs:
                if not self.graphs.capture(sig, self._step(sig)) and sig not in self.graphs.eager_only:
                    self._warm_up(sig)
                    self.graphs.capture(sig, self._step(sig))
                self._sync_host_counters()        # a capture ran moshi's Python, which advances offset_cpu
        after = self.stats()
        return {k: getattr(after, k) - getattr(before, k) for k in (*SessionStats.COUNTERS, "graphs", "graph_bytes")}

    def _warm_up(self, sig) -> None:
        snap = [b.view.clone() for b in self.bindings]
        rows = torch.cat([torch.zeros(UNIT.policy.bound(), N_Q, dtype=torch.int64),
                          ring_rows(self._clock.positions, UNIT.policy.bound(), self.capacity)], 1)
        self._unit.copy_(rows)
        self._frame.copy_(self._unit[0])
        self.graphs.run(sig, self._step(sig))
        for b, s in zip(self.bindings, snap):
            b.view.copy_(s)

    def state(self) -> dict:
        """Every region's arena view by name, and the host clocks (frames, positions)."""
        self._check_open("state")
        return {**{b.spec.name: b.view for b in self.bindings},
                "frames": self._clock.frames, "positions": self._clock.positions}

    def stats(self) -> SessionStats:
        self._check_open("stats")
        return SessionStats.of(units=self.units, graphs=self.graphs, arena=self.arena, mode="cadence",
                               cadence_graphs=self.graph_mode, kv_bookkeeping=self.kv_mode,
                               frames=self._clock.frames, arena_backend=self.arena.backend,
                               regions=len(self.bindings), signatures=[repr(s) for s in self.graphs.entries])

    def close(self) -> None:
        """Free the graphs, the arena and the session's streaming states now."""
        if self.closed:
            return
        self.graphs.drop()
        self.own.close()
        for b in self.bindings:
            b.view = b.owner = None
        self.bindings, self.io, self._unit, self._frame, self._host_counted = [], None, None, None, []
        self.arena.close()
        self.graphs = None
        super().close()
