"""Stock Mimi sessions (moshi's server loop) on a shared model, and each session's own streaming states.

moshi keeps streaming state on the modules (`StreamingModule._streaming_state`, streaming.py L58-75). A
session owns the States `streaming(1)` allocated for it and installs them on the shared model for one decode
only, through `duplexcadence.bind` under the model's lock; moshi's compile and CUDA-graph switches are
process globals read inside every decode (utils/compile.py L21-34, L150-186), so every moshi decode also
holds `SWITCHES`. A decode sees only its own state and switches, on any number of host threads.
"""
from __future__ import annotations

import contextlib
import threading

import torch

from duplexcadence import bind, clocks, gate, upstream
from duplexcadence.adapters.mimi.schedule import (
    BATCH, CARDINALITY, N_Q, UNIT, MimiClock, declare_regions, on_decode_path)
from duplexcadence.errors import ConcurrencyError
from duplexcadence.payload import check_codes
from duplexcadence.runtime import model_lock
from duplexcadence.session import Capabilities, Session, SessionStats, check_final, host_waveform, unit_output

#: Held by every moshi decode in the process, inside the model lock and gate.work() (a capture step takes it: never
#: held while waiting for the gate): moshi's switches are module globals.
SWITCHES = threading.Lock()
CAPABILITIES = dict(turn_state="stream", concurrent=True, payload="frames", max_payload=UNIT.policy.bound())


class StreamStates:
    """A session's own moshi streaming states: those `model.streaming(1)` allocates (streaming.py L110-137),
    taken under the model lock inside `bind.bound`, which puts every `_streaming_state` back to None; the
    decode path's only (`decode` never reads the encoder's). Raises ConcurrencyError for a model streaming
    on its own (`streaming_forever`): its state would be shared."""

    def __init__(self, model):
        self.lock, (_, self.mcompile) = model_lock(model), upstream.moshi()
        with self.lock, gate.work():         # the model lock first, then work() (duplexcadence.gate)
            current = model.get_streaming_state()
            if any(s is not None for s in current.values()):
                raise ConcurrencyError("the Mimi model is streaming on its own (streaming / streaming_forever): "
                                       "its state would be shared; open sessions on a model that is not")
            modules = {k: model.get_submodule(k) if k else model for k in current}
            with bind.bound(*(bind.attr(m, "_streaming_state", None) for m in modules.values())):
                model.streaming(BATCH)
                states = model.get_streaming_state()
        self.states = {k: v for k, v in states.items() if on_decode_path(k)}
        self.modules = {k: modules[k] for k in self.states}

    @contextlib.contextmanager
    def installed(self, *, moshi_graphs: bool = False):
        """Inside: the states on the shared model (bind.attr per streaming module) under the model lock and
        SWITCHES, with moshi's CUDA graphs and compile off unless `moshi_graphs`."""
        patches = [bind.attr(self.modules[k], "_streaming_state", s) for k, s in self.states.items()]
        with bind.bound(*patches, lock=self.lock), SWITCHES, torch.no_grad(), contextlib.ExitStack() as stack:
            if not moshi_graphs:
                stack.enter_context(self.mcompile.no_cuda_graph())
                stack.enter_context(self.mcompile.no_compile())
            yield

    def close(self) -> None:
        self.states, self.modules = {}, {}


class MimiSession(Session):
    """What both Mimi sessions share: one continuous stream, `clock` (MimiClock; callers read it through
    `clocks()`, a copy), a unit's checks."""

    def start_turn(self) -> None:
        """Nothing: one continuous stream (server.py resets only per connection, L163-164). Raises ClosedError."""
        self.check_open("start_turn")

    def clocks(self) -> MimiClock:
        self.check_open("clocks")
        return self.clock.copy()

    def begin_unit(self, payload, final) -> tuple:
        """speak's checks, before anything changes: (codes int64 [8, F], the clock advanced by the unit, its
        signatures). Raises ClosedError, InputError (payload.check_codes, check_final), LimitError past the
        unit bound (MimiClock.unit)."""
        self.check_open("speak")
        check_final(final)
        codes, clock = check_codes(payload, n_q=N_Q, cardinality=CARDINALITY, max_frames=None), self.clock.copy()
        with clocks.argument("codes"):
            return codes, clock, clock.unit(int(codes.shape[1]), final)


class StockSession(MimiSession):
    """moshi's server loop: `decode(codes[:, :, t:t+1])` per frame, then `.cpu()` (server.py L59-82, L151).
    moshi_graphs=False ("stock"): eager, the bit-exact reference, moshi's CUDA graphs and compile off through
    its own switches (utils/compile.py L25-34, L169-186). True ("stock_graphs"): moshi's CUDAGraphed path as
    shipped (transformer and SEANet graphed after one eager call, RoPE torch.compile'd on CUDA;
    compression.py L219-230, L415-429); on CPU it equals stock eager."""

    capabilities = Capabilities(graphs=False, **CAPABILITIES)

    def __init__(self, model, *, moshi_graphs: bool = False):
        self.model, self.moshi_graphs = model, moshi_graphs
        self.device = next(model.parameters()).device
        self.own = StreamStates(model)
        self.regions = declare_regions(model, self.own.states)      # what moshi allocated, as regions
        self.clock = MimiClock(tuple(b.spec for b in self.regions), "frame")
        self.units = 0

    def speak(self, payload, *, final: bool = False):
        """One unit: codes [8][F] (1 <= F <= 13) -> float32 waveform [F * 1920] @ 24 kHz and its int16 PCM.
        Raises InputError (LimitError past 13 frames) before anything changes; `final` changes nothing."""
        codes, clock, _ = self.begin_unit(payload, final)
        frames = int(codes.shape[1])
        with self.device_use():
            tokens = codes.to(self.device)[None]                             # [1, 8, F], one copy per unit
            with self.own.installed(moshi_graphs=self.moshi_graphs):
                waves = [host_waveform(self.model.decode(tokens[:, :, t:t + 1])) for t in range(frames)]
        self.clock, self.units = clock, self.units + 1
        return unit_output(waves, frames=frames)

    def device_use(self):
        """The hold a unit's device work runs under: the capture gate's shared work()."""
        return gate.work()

    def prepare(self, signatures=None) -> dict:
        """Nothing to capture: zeros. Raises ClosedError."""
        self.check_open("prepare")
        return super().prepare(signatures)

    def state(self) -> dict:
        """moshi's state tensors by region name, and the host clocks (frames, positions)."""
        self.check_open("state")
        return {**{b.spec.name: getattr(b.owner, b.attr) for b in self.regions},
                "frames": self.clock.frames, "positions": self.clock.positions}

    def stats(self) -> SessionStats:
        """Units and frames; for stock_graphs, how many of moshi's own graphs are captured (detail)."""
        self.check_open("stats")
        top = self.own.states[""]
        captured = sum(getattr(top, f)._graph is not None for f in ("graphed_tr_dec", "graphed_decoder"))
        return SessionStats.of(units=self.units, mode="stock_graphs" if self.moshi_graphs else "stock",
                               frames=self.clock.frames, moshi_graphs_captured=captured)

    def close(self) -> None:
        """Drop the session's streaming states now (moshi's graphs among them: inside gate.device_wide())."""
        with gate.device_wide():
            self.own.close()
        self.regions = []
        super().close()


class StockGraphsSession(StockSession):
    """"stock_graphs": moshi's CUDAGraphed path (the baseline its server runs). Each session's graphs live in its
    own streaming states (`_MimiState`, compression.py L219-230), so sessions of one model stay independent; they
    capture on the stream's second decode (`warmup_steps=1`) in torch's global capture mode (utils/compile.py
    L261-271), where another thread's synchronising CUDA call breaks the capture.

    So speak waits, it does not refuse: while any of the stream's decoder graphs is not captured yet (always off
    CUDA, where moshi's graphs never capture), the unit holds the capture gate alone (`gate.capture(alone=True)`,
    after the model lock, as the gate's lock order says) and no other thread's CUDA work runs beside it; once
    both are captured a unit only replays and runs under the shared work() like every other session. Raises what
    StockSession.speak raises, before anything changes. Hence concurrent False: a unit that may capture runs
    alone in the process, never beside other sessions'."""

    capabilities = Capabilities(graphs=True, **{**CAPABILITIES, "concurrent": False})

    def __init__(self, model):
        super().__init__(model, moshi_graphs=True)

    def moshi_may_capture(self) -> bool:
        """True while one of the stream's decoder graphs (graphed_tr_dec, graphed_decoder) is not captured, so
        moshi may capture in the next decode; always True off CUDA (CUDAGraphed(disable=True) never captures)."""
        top = self.own.states[""]
        return any(g is not None and g._graph is None for g in (top.graphed_tr_dec, top.graphed_decoder))

    @contextlib.contextmanager
    def device_use(self):
        """gate.capture(alone=True) after the model lock while moshi may capture, else gate.work()."""
        if not self.moshi_may_capture():
            with gate.work():
                yield
            return
        with self.own.lock, gate.capture(alone=True):
            yield
