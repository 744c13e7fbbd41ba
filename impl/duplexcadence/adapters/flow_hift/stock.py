"""The stock sessions: the upstream code as it ships, driven as each model's own serving loop drives it.

MiniCPM-o 4.5 (`StockSession`): `set_stream_cache` once per voice, cloned as the base (unified L4398-4404); every
turn starts from clones of it and [4218] * 3 (L4406-4410); the duplex loop's calls (L5446-5525). Step-Audio 2
(`StepAudio2StockSession`, build.StockToken2wav): `set_stream_cache` once per session (ex L46); every turn starts
with an empty buffer (ex L5) on the same caches (ex L59, L69); a call whenever 28 tokens are buffered (ex L20-25),
the rest flushed at the turn's end (ex L26-27). Inferred: upstream checks per arriving piece (`if`, ex L21), a unit
brings up to 25 tokens, so the loop is a `while`; ex L47's warm-up call on demo tokens is not made.
One live stock session per model instance (flow_matching.py L165-169 returns the CFM's module buffers as the
stream cache): a second is refused (ConcurrencyError) until the first is closed or dropped. What the stock code
reads on the shared instance is this session's for each unit, through `duplexcadence.bind` under the model's lock;
every unit is checked against the clocks first. Step-Audio 2's HiFT draws from the default generator of its device
(hifigan_components/layers.py L314, L378, L432): each session from its own state of it (`OwnGenerator`).
"""
from __future__ import annotations

import contextlib
import weakref

import torch

from duplexcadence import bind, gate, rng
from duplexcadence.errors import ConcurrencyError, InputError
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import Capabilities, SessionStats, host_waveform

import duplexcadence.adapters.flow_hift.facts as facts
from duplexcadence.adapters.flow_hift.build import clone_recursive
from duplexcadence.adapters.flow_hift.plan import MiniCPMClocks, StepAudio2Clocks, TokenSession, geometry

class OwnGenerator:
    """One session's state of the default generator of `device`, seeded with `seed` (a fresh generator's state).
    `use()` swaps it in for a `with` body and keeps what the body drew; `scratch()` swaps in a copy, discarded after
    (warm-ups). Both raise ConcurrencyError at entry while another thread is inside one (the generator is global).
    Both bodies run inside the capture gate's device_wide(): every capture registers the default generator
    of its device (torch's CUDAGraph::capture_begin), and an eager draw from it on another thread while a capture
    records fails ("Offset increment outside graph capture encountered unexpectedly", CUDAGeneratorState::increase),
    so a draw waits for the capture in progress and holds later captures back until its body ends."""

    def __init__(self, device, seed: int):
        self.device = torch.device(device)
        self.state = torch.Generator(self.device).manual_seed(seed).get_state()   # the default's format

    def _default(self):
        if self.device.type != "cuda":
            return torch.default_generator
        torch.cuda.init()                   # default_generators is empty until CUDA is initialised in the process
        return torch.cuda.default_generators[self.device.index if self.device.index is not None
                                             else torch.cuda.current_device()]

    @contextlib.contextmanager
    def _swapped(self, state, keep: bool = False):
        if not rng.LOCK.acquire(blocking=False):
            raise ConcurrencyError("Step-Audio 2 sessions draw from the process's default generator and another "
                                   "thread holds it now (a session drawing, or a model being built): run them on "
                                   "one thread (capabilities.concurrent)")
        try:
            with gate.GATE.device_wide():
                gen = self._default()
                saved = gen.get_state()
                try:
                    gen.set_state(state)
                    yield
                finally:
                    if keep:
                        self.state = gen.get_state()
                    gen.set_state(saved)
        finally:
            rng.LOCK.release()

    def use(self):
        return self._swapped(self.state, keep=True)

    def scratch(self):
        return self._swapped(self.state.clone())

    @contextlib.contextmanager
    def held(self):
        """The generator lock, waited for with this thread's capture-gate holds set aside (duplexcadence.gate):
        a capture of a step that draws registers the default generator, so no other thread may swap it meanwhile."""
        with gate.GATE.aside():
            rng.LOCK.acquire()
        try:
            yield
        finally:
            rng.LOCK.release()


class _StockBase(TokenSession):
    """What both stock sessions share: the one-live-session claim, the checks, the unit's calls under `own()`."""

    def __init__(self, model):
        t2w, self.prompt = model.t2w, model.prompt
        self.t2w, self.n_steps, self.calls = t2w, t2w.n_timesteps, 0
        if model_state(t2w).get("stock_buffers_released"):
            raise InputError("stock session: this model's stock DiT buffers were released for a cadence-only "
                             "process (for_mode); build another model for stock sessions")
        self.specs = {r.name: r for r in facts.regions(self.variant, self.prompt.mel_frames,
                                                       facts.stock_limits(t2w.flow))}
        with model_lock(t2w):
            live = model_state(t2w).get("stock_session")
            other = live() if live is not None else None
            if other is not None and not other.closed:
                raise ConcurrencyError("a stock session is already open on this model instance: upstream "
                                       "flow_matching.py L165-169 returns the CFM's module buffers as the stream "
                                       "cache, so two stock sessions on one instance overwrite each other; close "
                                       "it first, or build another model for this one")
            model_state(t2w)["stock_session"] = weakref.ref(self)
        self.buffer: list[int] | None = None

    def run_calls(self, plan, buf) -> list:
        waves = []
        with self.own():
            try:
                for c in plan.calls:
                    waves.append(self.stream(buf[c.call.start:c.call.start + c.call.n], c.call.last_chunk))
            finally:
                self._flow, self._hift = self.t2w.stream_cache, self.t2w.hift_cache_dict
        self.calls += len(plan.calls)
        return waves

    def state(self) -> dict:
        """The stock caches under the cadence region names (estimator entries cut to the steps in use), the host
        clocks and the token buffer."""
        self.check_open("state")
        f = self._flow if self._flow is not None else self._base[0]
        return {"conformer_att": f["conformer_att_cache"], "estimator_att": f["estimator_att_cache"][:self.n_steps],
                "conformer_cnn": f["conformer_cnn_cache"], "estimator_cnn": f["estimator_cnn_cache"][:self.n_steps],
                **self.vocoder_state(), "clocks": self.clock.host(),
                "buffer": None if self.buffer is None else list(self.buffer)}

    def stats(self) -> SessionStats:
        self.check_open("stats")
        return SessionStats.of(units=self.units, calls=self.calls)

    def close(self) -> None:
        if self.closed:
            return
        with model_lock(self.t2w):
            live = model_state(self.t2w).get("stock_session")
            if live is not None and live() is self:
                del model_state(self.t2w)["stock_session"]
        self._flow = self._hift = self._base = None
        self.closed = True


class StockSession(_StockBase):
    """MiniCPM-o 4.5 on the stock `Token2wav` (model: build.Model). Raises ClockError for a voice past a stock
    table, ConcurrencyError while another stock session is open on the model."""

    capabilities = Capabilities("reset", True, False, "tokens", facts.MAX_UNIT_TOKENS)
    variant = "minicpmo45"

    def __init__(self, model):
        super().__init__(model)
        t2w, bv = self.t2w, self.t2w.bounded_vocoder
        self.clock = MiniCPMClocks(self.specs, geometry(bv))
        self._maxima = dict(bv.maxima)
        self._flow, self._hift = t2w.stream_cache, t2w.hift_cache_dict
        with self.own(t2w._stream_prompt, bv.cache), gate.work():      # the model lock first, then work()
            self._base = tuple(clone_recursive(c) for c in t2w.set_stream_cache(self.prompt.key))
        self._flow = self._hift = None

    def own(self, prompt=None, vocoder_cache=None):
        """This session's caches on the shared Token2wav and BoundedVocoder, under the model's lock."""
        t2w, bv = self.t2w, self.t2w.bounded_vocoder
        return bind.bound(bind.attr(t2w, "stream_cache", self._flow), bind.attr(t2w, "hift_cache_dict", self._hift),
                          bind.attr(t2w, "_stream_prompt", prompt or self.prompt.key),
                          bind.attr(bv, "cache", vocoder_cache or self._hift), bind.attr(bv, "maxima", self._maxima),
                          lock=model_lock(t2w))

    def stream(self, tokens, last_chunk):
        return self.t2w.stream(tokens, last_chunk=last_chunk, return_waveform=True)

    def start_turn(self) -> None:
        """Clones of the base caches and the [4218] * 3 buffer (unified L4406-4410)."""
        self.open_turn()
        with gate.work():
            self._flow, self._hift = clone_recursive(self._base[0]), clone_recursive(self._base[1])

    def vocoder_state(self) -> dict:
        h = self._hift if self._hift is not None else self._base[1]
        return {"vocoder_mel": h["mel"], "vocoder_source": h["source"], "vocoder_phase": h["phase"]}


class StepAudio2StockSession(_StockBase):
    """Step-Audio 2 mini on build.StockToken2wav (model: build.Model; its `seed` seeds this session's generator).
    Raises ClockError for a voice past a stock table, ConcurrencyError while another stock session is open on
    the model; speak raises ConcurrencyError while another thread's Step-Audio 2 session draws."""

    capabilities = Capabilities("carried", False, False, "tokens", facts.MAX_UNIT_TOKENS)
    variant = "stepaudio2"

    def __init__(self, model):
        super().__init__(model)
        self.clock = StepAudio2Clocks(self.specs, self.n_steps)
        self.rng = OwnGenerator(self.t2w.device, model.seed)
        self._flow, self._hift = None, {}
        with self.own(draw=False), gate.work():
            self.t2w.set_stream_cache(self.prompt.key)  # upstream has no inference_mode here (the flow has its own)
            self._flow, self._hift = self.t2w.stream_cache, self.t2w.hift_cache_dict

    @contextlib.contextmanager
    def own(self, draw: bool = True):
        """This session's caches on the shared StockToken2wav under the model's lock, its generator swapped in."""
        with self.rng.use() if draw else contextlib.nullcontext(), \
                bind.bound(bind.attr(self.t2w, "stream_cache", self._flow),
                           bind.attr(self.t2w, "hift_cache_dict", self._hift), lock=model_lock(self.t2w)):
            yield

    def stream(self, tokens, last_chunk):
        return host_waveform(self.t2w.stream(tokens, self.prompt.key, last_chunk=last_chunk))

    start_turn = TokenSession.open_turn      # a new response: an empty buffer (ex L5); the caches carry over

    def vocoder_state(self) -> dict:
        h = self._hift
        return {"hift_mel": h["mel"], "hift_source": h["source"], "hift_speech": h["speech"], "generator": self.rng.state}
