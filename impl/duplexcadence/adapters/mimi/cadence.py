"""DuplexCadence for Moshi's Mimi: `MimiModel.decode` (compression.py L406-429) as it ships (moshi's graphs and
compile off, as stock eager) on arena views, with CUDA-graph replay.

* State: every decoder-side tensor `streaming(1)` allocated for the session is copied into one Arena and
  the session's own moshi State points at the view (same shape, contiguous as stock's); moshi updates it
  in place (`x[:] = torch.where(...)`, `scatter_`) at an address that never moves.
* Ring KV bookkeeping (kv_bookkeeping="host", default): the slots a call writes and every slot's position
  come from the host clock (`ring_rows`) in the call's io row, instead of about 19 small device kernels per
  layer and call (`HostRingKV`); every kernel that computes audio stays moshi's. "stock": moshi's
  RingKVCache on the arena views.
* Graphs (CUDA): the decode step is captured per `Signature` (MimiClock) ahead of time (`prepare`) and
  replayed: cadence_graphs="frame" (default) graphs one decode call, "unit" a unit's 12 or 13 calls (as
  fast on the H200, about 32 MiB more driver memory). A unit's io rows reach the device in one copy, its
  PCM leaves in one.
* Sharing: the states are installed on the shared model only inside an eager step or a capture
  (stock.StreamStates, under the model lock); a replay runs no Python of the model and takes no lock.
"""
from __future__ import annotations

import types

import torch

from duplexcadence import gate, graphs
from duplexcadence.adapters.mimi.schedule import (
    BATCH, N_Q, POSITIONS_PER_FRAME, SAMPLES_PER_FRAME, UNIT, UNIT_SIZES, MimiClock, declare_regions, ring_rows)
from duplexcadence.adapters.mimi.stock import CAPABILITIES, MimiSession, StreamStates
from duplexcadence.arena import Arena
from duplexcadence.clocks import Ring
from duplexcadence.errors import InputError
from duplexcadence.graphs import GraphCache, WarmSet
from duplexcadence.payload import check_signatures, shown
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import Capabilities, SessionStats, host_waveform, unit_output

OPTIONS = {"cadence_graphs": ("frame", "unit"), "kv_bookkeeping": ("host", "stock"), "capture": ("ahead", "inline")}


class HostRingKV:
    """Stands in for one layer's moshi `RingKVCache` (transformer.py L196-288) with kv_bookkeeping="host":
    `complete` makes the stock's only writes, the same two `scatter_` of k and v into the ring (an arena
    view) at the same slots, with the same expanded index, and returns the same (keys, values, positions),
    slots and positions read from the io row the host filled. B = 1, exec_mask always True (server.py L59)."""

    def __init__(self, cache: torch.Tensor, io):
        self.cache, self.io = cache, io

    def complete(self, k, v, exec_mask):
        B, H, T, D = k.shape
        write, pos = self.io.row[N_Q:N_Q + T], self.io.row[N_Q + T:].view(B, -1)
        index = write.view(B, 1, T, 1).expand(-1, H, T, D)                  # as L247-248
        self.cache[0].scatter_(2, index, k)
        self.cache[1].scatter_(2, index, v)
        return self.cache[0], self.cache[1], pos                            # KVCacheResult's fields


class CadenceSession(MimiSession):
    """DuplexCadence over the stock modules (module docstring). spec: cadence_graphs ("frame" | "unit"),
    kv_bookkeeping ("host" | "stock"), capture ("ahead": graphs only from `prepare`, an uncaptured step runs
    eagerly and is counted; "inline": capture on first use), arena_backend, graphs (bool; default CUDA).
    Raises InputError for a bad spec value. Host clocks advance here, never read back from the device;
    moshi's host `offset_cpu` counters (read only for weights_per_step, which Mimi lacks) follow them."""

    capabilities = Capabilities(graphs=True, **CAPABILITIES)

    def __init__(self, model, spec: dict | None = None):
        spec = spec or {}
        graphs.check_options(spec.get("graphs"))
        for key, allowed in OPTIONS.items():
            if spec.get(key, allowed[0]) not in allowed:
                raise InputError(f"spec[{key!r}]: expected one of {allowed}, got {shown(spec[key])}")
        self.graph_mode, self.kv_mode = spec.get("cadence_graphs", "frame"), spec.get("kv_bookkeeping", "host")
        self.model, self.device = model, next(model.parameters()).device
        self.own = StreamStates(model)
        self.bindings = [b for b in declare_regions(model, self.own.states)     # host: end_offset is the clock
                         if self.kv_mode == "stock" or b.kind != "RingKVCache.end_offset"]
        self.capacity = next(b.spec.policy.capacity for b in self.bindings if isinstance(b.spec.policy, Ring))
        row, most = N_Q + POSITIONS_PER_FRAME + self.capacity, UNIT.policy.bound()
        with gate.work():
            self.arena = Arena(self.device, backend=spec.get("arena_backend", "auto"), name="mimi")
            for b in self.bindings:
                self.arena.declare(b.spec.name, getattr(b.owner, b.attr).shape, getattr(b.owner, b.attr).dtype)
            self.arena.declare("io.unit", (most, row), torch.int64)
            self.arena.declare("io.frame", (row,), torch.int64)
            self.arena.declare("io.pcm", (BATCH, 1, most * SAMPLES_PER_FRAME), torch.float32)
            self.arena.allocate()
            for b in self.bindings:   # moshi's initial values in, then the session's own State points at the view
                b.view = self.arena[b.spec.name].view(getattr(b.owner, b.attr).shape)
                b.view.copy_(getattr(b.owner, b.attr))
                setattr(b.owner, b.attr, b.view)
            self.io = types.SimpleNamespace(row=None)         # the io row the decode call being run reads
            for state in self.own.states.values():
                if self.kv_mode == "host" and getattr(state, "kv_cache", None) is not None:
                    state.kv_cache = HostRingKV(state.kv_cache.cache, self.io)
            self._unit, self._frame = self.arena["io.unit"].view((most, row)), self.arena["io.frame"].view((row,))
            self._counted = [st for st in self.own.states.values() if hasattr(st, "offset_cpu")]
            self.graphs = GraphCache(self.device, arena=self.arena, enabled=spec.get("graphs"), warmup=1,
                                     inline=spec.get("capture") == "inline", lock=model_lock(model),
                                     warmed=model_state(model).setdefault("mimi.warmed", WarmSet()))
        self.clock = MimiClock(tuple(b.spec for b in self.bindings), self.graph_mode)
        self.units = 0

    def _decode(self, rows) -> list:
        with self.own.installed():
            outs = []
            for row in rows:
                self.io.row = row
                outs.append(self.model.decode(row[:N_Q].view(BATCH, N_Q, 1)))
            return outs

    def _step(self, sig):
        """The step of `sig`: stock kernels reading the io rows, writing the regions (and io.pcm)."""
        if sig.step == "frame":
            return lambda: self._decode([self._frame])[0]
        rows, pcm = [self._unit[t] for t in range(sig.size)], (BATCH, 1, sig.size * SAMPLES_PER_FRAME)
        return lambda: torch.cat(self._decode(rows), dim=-1, out=self.arena["io.pcm"].view(pcm))

    def _sync_counters(self) -> None:
        for state in self._counted:
            state.offset_cpu = self.clock.positions

    def speak(self, payload, *, final: bool = False):
        """One unit: codes [8][F] (1 <= F <= 13) -> float32 waveform [F * 1920] @ 24 kHz and its int16 PCM,
        byte-identical to the stock session; `final` changes nothing. Raises InputError (LimitError past 13
        frames) before anything runs: the arena and clocks are then unchanged."""
        codes, clock, sigs = self.begin_unit(payload, final)
        frames = int(codes.shape[1])
        with gate.work():
            self._unit[:frames].copy_(torch.cat([codes.t(), ring_rows(self.clock.positions, frames, self.capacity)], 1))
            pcm = self.arena["io.pcm"].view((BATCH, 1, frames * SAMPLES_PER_FRAME))
            if self.graph_mode == "unit":
                self.graphs.run(sigs[0], self._step(sigs[0]))
            for t, sig in enumerate(sigs if self.graph_mode == "frame" else ()):
                self._frame.copy_(self._unit[t])
                pcm[..., t * SAMPLES_PER_FRAME:(t + 1) * SAMPLES_PER_FRAME].copy_(self.graphs.run(sig, self._step(sig)))
            wave = host_waveform(pcm)                      # the unit's one device-to-host copy
        self.clock, self.units = clock, self.units + 1
        self._sync_counters()
        return unit_output([wave], frames=frames)

    def prepare(self, signatures=None) -> dict:
        """Capture these signatures ahead (None: what every unit needs, units of `UNIT_SIZES` = 12 and 13
        frames: the one frame step, or both unit graphs), changing neither state nor clocks: a capture
        records kernels without running them; a signature's first capture on a host thread follows one eager
        warm-up decode (zero codes), every region restored after it. Returns the counters' change. No-op on
        CPU. Raises InputError for a signature that is not a step of this session."""
        self.check_open("prepare")
        before, want = self.stats(), self.clock.copy().unit(1)[0]
        sigs = sorted({s for n in UNIT_SIZES for s in self.clock.copy().unit(n)} if signatures is None
                      else set(check_signatures(signatures)))
        for sig in sigs:
            if sig._replace(size=1) != want or not 1 <= sig.size <= UNIT.policy.bound():
                raise InputError(f"signatures: {sig!r} is not a step of this session (e.g. {want!r})")
        with gate.work():
            for sig in sigs if self.graphs.enabled else ():
                if not self.graphs.capture(sig, self._step(sig)) and sig not in self.graphs.eager_only:
                    snap = [b.view.clone() for b in self.bindings]
                    self._unit.copy_(torch.cat([torch.zeros(len(self._unit), N_Q, dtype=torch.int64),
                                                ring_rows(self.clock.positions, len(self._unit), self.capacity)], 1))
                    self._frame.copy_(self._unit[0])
                    self.graphs.run(sig, self._step(sig))          # the warm-up
                    for b, s in zip(self.bindings, snap):
                        b.view.copy_(s)
                    self.graphs.capture(sig, self._step(sig))
                self._sync_counters()                # a capture runs moshi's Python, which advances offset_cpu
        after = self.stats()
        return {k: getattr(after, k) - getattr(before, k) for k in (*SessionStats.COUNTERS, "graphs", "graph_bytes")}

    def state(self) -> dict:
        """Every region's arena view by name, and the host clocks (frames, positions)."""
        self.check_open("state")
        return {**{b.spec.name: b.view for b in self.bindings},
                "frames": self.clock.frames, "positions": self.clock.positions}

    def stats(self) -> SessionStats:
        self.check_open("stats")
        return SessionStats.of(units=self.units, graphs=self.graphs, arena=self.arena, mode="cadence",
                               cadence_graphs=self.graph_mode, kv_bookkeeping=self.kv_mode,
                               frames=self.clock.frames, arena_backend=self.arena.backend,
                               regions=len(self.bindings), signatures=[repr(s) for s in self.graphs.entries])

    def close(self) -> None:
        """Free the graphs, the arena and the session's streaming states now."""
        if not self.closed:
            with gate.device_wide():
                self.graphs.drop()
                self.own.close()
                self.bindings, self._counted, self.io = [], [], None
                self._unit = self._frame = self.graphs = None
                self.arena.close()
        super().close()
