"""DuplexCadence session for Moshi's Mimi decoder (moshi==0.2.13); the model facts, clocks and regions
are declared in duplexcadence.adapters.mimi.

Same kernels as the stock session: `MimiModel.decode` (compression.py L406-429) runs as it ships, with
moshi's CUDA graphs and torch.compile off through its own switches, as in stock eager. What changes:

* State: every decoder-side streaming tensor that `streaming(1)` allocated (8 ring KV caches, the RoPE
  and transformer counters, every SEANet conv / conv-transpose tail, the upsample tail, the exec masks)
  is copied into one Arena and the moshi State is re-pointed at the arena view (same shape, contiguous
  as stock's), so the stock modules update arena memory in place, at addresses that never move. moshi
  writes all of them in place (`x[:] = torch.where(...)`, `scatter_`); the one rebinding in its code,
  `state.first = torch.where(...)` (conv.py L269-273), runs only under pad_mode="replicate", which Mimi
  does not use; were it to run, `_decode` copies the new tensor back into the arena view (`rebinds`).
* Ring KV bookkeeping (kv_bookkeeping="host", the default): which slots a call writes and the position of
  every slot come from the host clock (`ring_rows`, the integer arithmetic of RingKVCache.complete) in
  the unit's io row instead of about 19 small device kernels per layer and call (`HostRingKV`); the
  scatter writes and every kernel that computes audio stay moshi's. kv_bookkeeping="stock" keeps moshi's
  RingKVCache on the arena views.
* Graphs: on CUDA the whole decode step (quantizer decode + upsample + transformer + SEANet) is captured
  once per exact `Signature` and replayed (duplexcadence.graphs): cadence_graphs="frame" (default) is one
  graph of one decode call (one signature per session); "unit" puts a unit's 12 or 13 calls in one graph
  (two signatures). The codes and ring rows of a unit reach the device in one copy; the PCM leaves in one.
  Measured on one H200 over a 10-minute session (released config): both 18.5 ms per second of audio, but
  the two 13-frame graphs hold about 32 MiB more driver memory than the one-frame graph, hence the default.

Bit-exactness: every frame's float32 waveform and int16 PCM equal stock eager's (tests/test_adapter_mimi.py
on CPU, suite/gpu/mimi_check.py on the GPU).
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np
import torch

from duplexcadence.adapters.mimi import (
    BATCH, CADENCE_GRAPHS, KV_BOOKKEEPING, MAX_FRAMES_PER_UNIT, N_Q, POSITIONS_PER_FRAME, SAMPLES_PER_FRAME,
    _OwnStates, _moshi, _unit_output, check_codes, declare_regions)
from duplexcadence.arena import Arena
from duplexcadence.clocks import Ring
from duplexcadence.graphs import GraphCache
from duplexcadence.session import UnitOutput


def _host_waveform(pcm: torch.Tensor) -> np.ndarray:
    """The unit's one device-to-host copy, after the step: float32 [samples]. Always a copy: on CPU
    `.cpu()` returns the arena view itself, which the next unit overwrites."""
    return np.array(pcm.reshape(-1).cpu().numpy(), dtype=np.float32, copy=True)


class Signature(NamedTuple):
    """Exact lengths of one captured step; the CUDA-graph key. Never padded."""
    graph: str        # "frame" (one decode call) | "unit" (F calls in order, one graph)
    frames: int       # codec frames @ 12.5 Hz decoded by the graph (1, or 12 / 13)
    batch: int        # streams (1: server.py L59)
    kv_slots: int     # ring KV slots every attention reads (context = 250)


def ring_rows(positions: int, frames: int, capacity: int) -> torch.Tensor:
    """The ring KV bookkeeping of `frames` decode calls from the host clock: int64 [frames, 2 + capacity],
    row t = the 2 slots call t writes, then the position of every slot after it (-1: not yet written).

    `positions`: clock POSITIONS before the first call (every layer's `end_offset`). The integer arithmetic
    of RingKVCache.complete (transformer.py L240-242, L258-286), on the host, for B = 1 and exec_mask True.
    """
    t = POSITIONS_PER_FRAME
    end = torch.arange(frames, dtype=torch.int64) * t + positions                  # end_offset before call
    write = (torch.arange(t, dtype=torch.int64) + end[:, None]) % capacity          # L240-242
    slots = torch.arange(capacity, dtype=torch.int64)
    last = end[:, None] + t - 1                                                      # L263
    delta = slots - last % capacity                                                  # L264-265
    pos = torch.where(delta <= 0, last + delta, last + delta - capacity)             # L273-277
    pos = torch.where(slots >= end[:, None] + t, torch.full_like(pos, -1), pos)      # L279-286
    return torch.cat([write, pos], dim=1)


class HostRingKV:
    """Stands in for one layer's moshi `RingKVCache` (transformer.py L196-288) in a cadence session with
    kv_bookkeeping="host". `complete` makes the stock's only writes, the same two `scatter_` of k and v
    into the ring (an arena view) at the same slots, with the same expanded index layout, and returns the
    same (keys, values, positions); the slots and positions are read from the unit's io row, which the
    host filled from clock POSITIONS (`ring_rows`), instead of being recomputed on the device from a device
    `end_offset` by about 19 small kernels per layer and call. Cache bookkeeping only: every kernel that
    computes audio is moshi's. B = 1 with exec_mask always True (the server never masks: server.py L59)."""

    def __init__(self, cache: torch.Tensor, capacity: int, session: "CadenceSession"):
        self.cache = cache
        self.capacity = capacity
        self._session = session

    def complete(self, k, v, exec_mask):
        from moshi.modules.transformer import KVCacheResult

        B, H, T, D = k.shape
        write, pos = self._session._ring_now()
        index = write.view(B, 1, T, 1).expand(-1, H, T, D)                  # as L247-248
        self.cache[0].scatter_(2, index, k)
        self.cache[1].scatter_(2, index, v)
        return KVCacheResult(self.cache[0], self.cache[1], pos)

    def reset(self, reset_mask) -> None:
        raise RuntimeError("HostRingKV: a cadence session is never reset (Moshi streams continuously)")


class CadenceSession:
    """DuplexCadence over the stock modules (module docstring). spec: cadence_graphs ("frame" | "unit"),
    kv_bookkeeping ("host" | "stock"), arena_backend (duplexcadence.arena), graphs (bool; default on CUDA).
    Raises ValueError for a bad spec value. Host clocks (frames, positions) advance here, never read back
    from the device; moshi's host-side `offset_cpu` counters (read only for weights_per_step, which Mimi
    lacks) are set from them after each unit, since a replay runs no Python.
    """

    #: What start_turn does to the state (duplex_session.turn_state): nothing, one continuous stream.
    turn_state = "stream"

    def __init__(self, model, spec: dict | None = None):
        spec = spec or {}
        self.model = model
        self.device = next(model.parameters()).device
        self.graph_mode = spec.get("cadence_graphs", "frame")
        if self.graph_mode not in CADENCE_GRAPHS:
            raise ValueError(f"spec['cadence_graphs']: expected one of {CADENCE_GRAPHS}, "
                             f"got {self.graph_mode!r}")
        self.kv_mode = spec.get("kv_bookkeeping", "host")
        if self.kv_mode not in KV_BOOKKEEPING:
            raise ValueError(f"spec['kv_bookkeeping']: expected one of {KV_BOOKKEEPING}, "
                             f"got {self.kv_mode!r}")
        self.own = _OwnStates(model, decode_only=True)
        bindings = declare_regions(model, self.own.states)
        if self.kv_mode == "host":            # the write counter becomes the host clock POSITIONS
            bindings = [b for b in bindings if b.kind != "RingKVCache.end_offset"]
        self.bindings = bindings
        self.capacity = next(b.spec.policy.capacity for b in bindings if isinstance(b.spec.policy, Ring))
        # io row of one decode call: codes [8], ring slots written [2], ring positions [capacity]
        self.row = N_Q + POSITIONS_PER_FRAME + self.capacity
        self.arena = Arena(self.device, backend=spec.get("arena_backend", "auto"), name="mimi")
        for b in self.bindings:
            t = getattr(b.owner, b.attr)
            self.arena.declare(b.spec.name, t.shape, t.dtype)
        self.arena.declare("io.unit", (MAX_FRAMES_PER_UNIT, self.row), torch.int64)
        self.arena.declare("io.frame", (self.row,), torch.int64)
        self.arena.declare("io.pcm", (BATCH, 1, MAX_FRAMES_PER_UNIT * SAMPLES_PER_FRAME), torch.float32)
        self.arena.allocate()
        for b in self.bindings:   # copy moshi's initial values in, then point the stock state at the view
            stock = getattr(b.owner, b.attr)
            b.view = self.arena[b.spec.name].view(stock.shape)
            b.view.copy_(stock)
            setattr(b.owner, b.attr, b.view)
        if self.kv_mode == "host":
            for state in self.own.states.values():
                kv = getattr(state, "kv_cache", None)
                if kv is not None:
                    state.kv_cache = HostRingKV(kv.cache, self.capacity, self)
                    for b in self.bindings:
                        if b.owner is kv:
                            b.owner = state.kv_cache
        self._unit = self.arena["io.unit"].view((MAX_FRAMES_PER_UNIT, self.row))
        self._frame = self.arena["io.frame"].view((self.row,))
        self._now = self._frame           # the io row the step being traced reads
        self._pcm_views: dict[int, torch.Tensor] = {}
        self._host_counted = [st for st in self.own.states.values() if hasattr(st, "offset_cpu")]
        self.graphs = GraphCache(self.device, arena=self.arena, enabled=spec.get("graphs"))
        self.frames = 0            # clock FRAMES: decode calls so far
        self.rebinds = 0           # state tensors moshi rebound (copied back into the arena)
        self._warm = False

    @property
    def positions(self) -> int:
        """Clock POSITIONS: transformer positions written so far (= every counter region's value)."""
        return self.frames * POSITIONS_PER_FRAME

    def kv_slots(self) -> int:
        return self.capacity

    def start_turn(self) -> None:
        """No-op: Moshi streams continuously; state is never reset between turns (server.py L163-164
        resets only per connection)."""

    # -- the step: stock kernels on arena views ------------------------------------------------
    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        _, mc = _moshi()
        with mc.no_cuda_graph(), mc.no_compile(), torch.no_grad():
            out = self.model.decode(codes)
        for b in self.bindings:   # moshi updates in place; a rebinding is copied back into the arena
            cur = getattr(b.owner, b.attr)
            if cur is not b.view:
                b.view.copy_(cur)
                setattr(b.owner, b.attr, b.view)
                self.rebinds += 1
        return out

    def _ring_now(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots written [2], positions [B, capacity]) of the call being traced, from its io row."""
        return self._now[N_Q:N_Q + POSITIONS_PER_FRAME], self._now[N_Q + POSITIONS_PER_FRAME:].view(BATCH, -1)

    def _decode_row(self, row: torch.Tensor) -> torch.Tensor:
        self._now = row
        return self._decode(row[:N_Q].view(BATCH, N_Q, 1))

    def _frame_step(self) -> torch.Tensor:
        return self._decode_row(self._frame)

    def _unit_step(self, frames: int) -> torch.Tensor:
        outs = [self._decode_row(self._unit[t]) for t in range(frames)]
        return torch.cat(outs, dim=-1, out=self._pcm_view(frames))

    def _pcm_view(self, frames: int) -> torch.Tensor:
        """float32 [1, 1, frames * 1920] at the base of region io.pcm (one view per frame count)."""
        view = self._pcm_views.get(frames)
        if view is None:
            view = self._pcm_views[frames] = self.arena["io.pcm"].view((BATCH, 1, frames * SAMPLES_PER_FRAME))
        return view

    def _sync_host_counters(self) -> None:
        for state in self._host_counted:
            state.offset_cpu = self.positions

    def snapshot(self) -> list[torch.Tensor]:
        """Copies of every region (device), for `restore`."""
        return [b.view.clone() for b in self.bindings]

    def restore(self, snap: list[torch.Tensor]) -> None:
        for b, s in zip(self.bindings, snap):
            b.view.copy_(s)

    def _warm_up(self) -> None:
        """One eager decode before the first capture (lazy codebook tables, cuBLAS / cuDNN handles), then
        every region restored: the session's state is as before."""
        snap = self.snapshot()
        with self.own:
            self._frame.copy_(self._host_rows(torch.zeros(N_Q, 1, dtype=torch.int64))[0])
            self._frame_step()
        self.restore(snap)
        self._sync_host_counters()
        self._warm = True

    def prepare(self, unit_frames=(12, 13)) -> list[Signature]:
        """Capture, ahead of the first unit, the graph of every signature units of these frame counts need
        (the clocks fix the set: 12 and 13 frames, or the one frame step), each on zero codes with every
        region restored afterwards: the session's state and clocks are as before. Returns the signatures.
        On CPU (graphs off) nothing is captured."""
        sigs = sorted({self.signature(int(f)) for f in unit_frames})
        if not self.graphs.enabled:
            return sigs
        if not self._warm:
            self._warm_up()
        snap = self.snapshot()
        with self.own:
            self._unit.copy_(self._host_rows(torch.zeros(N_Q, MAX_FRAMES_PER_UNIT, dtype=torch.int64)))
            self._frame.copy_(self._unit[0])
            for sig in sigs:
                if sig not in self.graphs:
                    step = (self._frame_step if sig.graph == "frame"
                            else (lambda f=sig.frames: self._unit_step(f)))
                    self.graphs.run(sig, step)
                    self.restore(snap)
        self._sync_host_counters()
        return sigs

    def _host_rows(self, codes: torch.Tensor) -> torch.Tensor:
        """io rows of a unit, on the host: int64 [F, row] = codes of call t | ring_rows from the clock."""
        return torch.cat([codes.t(), ring_rows(self.positions, codes.shape[1], self.capacity)], dim=1)

    def signature(self, frames: int) -> Signature:
        if self.graph_mode == "unit":
            return Signature("unit", frames, BATCH, self.kv_slots())
        return Signature("frame", 1, BATCH, self.kv_slots())

    def speak(self, codes, final: bool = False) -> UnitOutput:
        """One unit: codes [8][F] (F <= 13) -> float32 waveform [F * 1920] @ 24 kHz and its int16 PCM,
        byte-identical to StockSession(graphs=False). `final` changes nothing (no flush in Mimi).
        Raises InputError before anything runs; the arena and clocks are then unchanged."""
        codes = check_codes(codes)
        frames = int(codes.shape[1])
        if self.graphs.enabled and not self._warm:
            self._warm_up()
        sig = self.signature(frames)
        pcm = self._pcm_view(frames)
        # moshi's Python runs only when a step is captured or run eagerly; a replay needs no module state
        replay = self.graphs.enabled and sig in self.graphs
        with (contextlib.nullcontext() if replay else self.own):
            self._unit[:frames].copy_(self._host_rows(codes))           # one host-to-device copy
            if self.graph_mode == "unit":
                self.graphs.run(sig, lambda: self._unit_step(frames))
            else:
                for t in range(frames):
                    self._frame.copy_(self._unit[t])
                    out = self.graphs.run(sig, self._frame_step)
                    pcm[..., t * SAMPLES_PER_FRAME:(t + 1) * SAMPLES_PER_FRAME].copy_(out)
        self.frames += frames
        self._sync_host_counters()
        return _unit_output(_host_waveform(pcm), frames, signature=tuple(sig))

    def stats(self) -> dict:
        return {"mode": "cadence", "cadence_graphs": self.graph_mode, "kv_bookkeeping": self.kv_mode,
                "frames": self.frames,
                "positions": self.positions, "graphs": self.graphs.stats.snapshot(),
                "graph_signatures": [tuple(s) for s in self.graphs.entries],
                "graph_pool_bytes": self.graphs.pool_bytes, "arena_backend": self.arena.backend,
                "arena_bytes_reserved": self.arena.bytes_reserved,
                "arena_bytes_mapped": self.arena.bytes_mapped,
                "regions": len(self.bindings), "rebinds": self.rebinds}
