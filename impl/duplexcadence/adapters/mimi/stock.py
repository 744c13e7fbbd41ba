"""Stock Mimi sessions: moshi's server loop over a model that several sessions share.

Moshi keeps its streaming state on the modules (`StreamingModule._streaming_state`, streaming.py L58-75).
Each session owns the State objects `streaming(1)` allocated for it (`StreamStates`) and installs them on
the shared model only for the duration of one decode, through `duplexcadence.bind` under the model's lock;
moshi's compile and CUDA-graph switches (`no_compile`, `no_cuda_graph`, `_in_cuda_graph`: process globals,
utils/compile.py L21-34, L150-186) are read inside every decode, so every moshi decode in the process also
holds `SWITCHES`. Sessions are therefore independent on any number of host threads: a decode sees only
its own state and the switches it set.
"""
from __future__ import annotations

import contextlib
import math
import threading

import torch

from duplexcadence import bind, upstream
from duplexcadence.adapters.mimi.schedule import (
    BATCH, CARDINALITY, N_Q, UNIT, MimiClock, declare_regions, on_decode_path)
from duplexcadence.errors import ConcurrencyError
from duplexcadence.payload import check_codes
from duplexcadence.runtime import model_lock
from duplexcadence.session import (
    Capabilities, Session, SessionStats, check_final, host_waveform, unit_output)

#: Held by every moshi decode in the process (after the model lock): moshi's switches are module globals.
SWITCHES = threading.Lock()
CAPABILITIES = dict(turn_state="stream", concurrent=True, payload="frames", max_payload=UNIT.policy.bound())


def parse_codes(codes) -> torch.Tensor:
    """One unit's codes as int64 [8, F] (payload.check_codes; InputError). The most frames a unit may carry
    is the clock's bound (MimiClock.unit raises LimitError), not checked here."""
    return check_codes(codes, n_q=N_Q, cardinality=CARDINALITY, max_frames=math.inf)


class StreamStates:
    """A session's own moshi streaming states and their installation for one decode. The States are the
    ones `model.streaming(1)` allocates (streaming.py L110-137), taken under the model lock (no other
    session's decode is in flight) inside `bind.bound`, which puts every module's `_streaming_state` back
    to None on the way out. decode_only: keep the decode path's states only (`decode` never reads the
    encoder's). Raises ConcurrencyError if the model streams on its own (`streaming_forever`)."""

    def __init__(self, model, *, decode_only: bool):
        self.lock, (_, self.mcompile) = model_lock(model), upstream.moshi()
        with self.lock:
            current = model.get_streaming_state()
            if any(s is not None for s in current.values()):
                raise ConcurrencyError("the Mimi model is streaming on its own (streaming / streaming_forever): "
                                       "its state would be shared; open sessions on a model that is not")
            modules = {k: model.get_submodule(k) if k else model for k in current}
            with bind.bound(*(bind.attr(m, "_streaming_state", None) for m in modules.values())):
                model.streaming(BATCH)
                states = model.get_streaming_state()
        self.states = {k: v for k, v in states.items() if not decode_only or on_decode_path(k)}
        self.modules = {k: modules[k] for k in self.states}

    @contextlib.contextmanager
    def installed(self, *, moshi_graphs: bool = False):
        """Inside: the session's states on the shared model (bind.attr per streaming module), under the
        model lock and SWITCHES, with moshi's CUDA graphs and compile off unless `moshi_graphs`."""
        patches = [bind.attr(self.modules[k], "_streaming_state", s) for k, s in self.states.items()]
        with bind.bound(*patches, lock=self.lock), SWITCHES, torch.no_grad():
            with contextlib.ExitStack() as stack:
                if not moshi_graphs:
                    stack.enter_context(self.mcompile.no_cuda_graph())
                    stack.enter_context(self.mcompile.no_compile())
                yield

    def tensors(self) -> dict:
        """Every tensor of every State by name, and moshi's host counters (`offset_cpu`)."""
        out = {}
        for name, state in self.states.items():
            for owner, prefix in ((state, name), (getattr(state, "kv_cache", None), f"{name}.kv_cache")):
                for attr, value in (vars(owner).items() if owner is not None else ()):
                    if isinstance(value, torch.Tensor) or attr == "offset_cpu":
                        out[f"{prefix}.{attr}".lstrip(".")] = value
        return out

    def close(self) -> None:
        self.states, self.modules = {}, {}


class StockSession(Session):
    """moshi's server loop: `decode(codes[:, :, t:t+1])` per frame, then `.cpu()` (server.py L59-82, L151).
    moshi_graphs=False ("stock"): eager, the bit-exact reference, with moshi's CUDA graphs and compile off
    through its own switches (utils/compile.py L25-34, L169-186). moshi_graphs=True ("stock_graphs"):
    moshi's CUDAGraphed path as shipped (decoder transformer and SEANet graphed after one eager call, RoPE
    torch.compile'd on CUDA; compression.py L219-230, L415-429); on CPU it equals stock eager. Independent
    of other sessions on the model (module docstring)."""

    capabilities = Capabilities(graphs=False, **CAPABILITIES)

    def __init__(self, model, *, moshi_graphs: bool = False):
        self.model, self.moshi_graphs = model, moshi_graphs
        self.device = next(model.parameters()).device
        self.own = StreamStates(model, decode_only=False)
        regions = declare_regions(model, self.own.states)         # the decoder regions moshi allocated
        self._clock = MimiClock(tuple(b.spec for b in regions), "frame")
        self.units = 0

    def start_turn(self) -> None:
        """Nothing: one continuous stream (MimiClock.start_turn). Raises ClosedError."""
        self._check_open("start_turn")

    def clocks(self) -> MimiClock:
        self._check_open("clocks")
        return self._clock.copy()

    def speak(self, payload, *, final: bool = False):
        """One unit: codes [8][F] (1 <= F <= 13) -> float32 waveform [F * 1920] @ 24 kHz and its int16 PCM.
        Raises InputError (LimitError past 13 frames) before anything changes; `final` changes nothing."""
        self._check_open("speak")
        check_final(final)
        codes = parse_codes(payload)
        frames = int(codes.shape[1])
        clock = self._clock.copy()
        clock.unit(frames, final)
        tokens = codes.to(self.device)[None]                             # [1, 8, F], one copy per unit
        with self.own.installed(moshi_graphs=self.moshi_graphs):
            waves = [host_waveform(self.model.decode(tokens[:, :, t:t + 1])) for t in range(frames)]
        self._clock, self.units = clock, self.units + 1
        return unit_output(waves, frames=frames)

    def state(self) -> dict:
        """moshi's state tensors by name (encoder side included), `offset_cpu` counters, and clock FRAMES."""
        self._check_open("state")
        return {**self.own.tensors(), "frames": self._clock.frames}

    def stats(self) -> SessionStats:
        """Units and frames; for stock_graphs, how many of moshi's own graphs are captured (detail)."""
        self._check_open("stats")
        top = self.own.states[""]
        graphed = [getattr(top, f) for f in ("graphed_tr_dec", "graphed_decoder")]
        return SessionStats.of(units=self.units, mode="stock_graphs" if self.moshi_graphs else "stock",
                               frames=self._clock.frames,
                               moshi_graphs_captured=sum(g._graph is not None for g in graphed))

    def prepare(self, signatures=None) -> dict:
        """Nothing to capture (zeros). Raises ClosedError."""
        self._check_open("prepare")
        return super().prepare(signatures)

    def close(self) -> None:
        """Drop the session's streaming states now (nothing else holds them)."""
        if not self.closed:
            self.own.close()
        super().close()
