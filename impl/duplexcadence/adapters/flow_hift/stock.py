"""The stock sessions: the upstream code as it ships, driven as each model's own serving loop drives it.

MiniCPM-o 4.5 (`StockSession`): `Token2wav.set_stream_cache` once per voice, its caches deep-cloned as the base
(unified L4398-4404); every turn starts from clones of the base and a [4218] * 3 token buffer (L4406-4410);
each SPEAK unit makes the stream calls of the duplex loop (L5446-5525, facts.plan_calls), the turn's final unit
flushes with `last_chunk=True`. Step-Audio 2 (`StepAudio2StockSession`, the driver of stepfun-ai/Step-Audio2 @
b1bb23c, build.StockToken2wav): `set_stream_cache` once per session (ex L46), every turn (response) starts with
an empty buffer (ex L5) on the same caches (ex L59, L69), a call whenever 28 tokens are buffered (ex L20-25),
the rest flushed at the end of the turn (ex L26-27). Inferred: upstream checks its buffer per arriving piece of
tokens (`if`, ex L21), a unit here brings up to 25 at once, so the loop is a `while` (what per-token arrival
gives); ex L47's warm-up call on 28 demo tokens (whose state leaks into the first response) is not made.

One live stock session per model instance: upstream `flow_matching.py` L165-169 returns the CFM's module buffers
as the stream cache, so two stock sessions on one instance overwrite each other's caches; a second is refused
(ConcurrencyError) until the first is closed (or collected). The per-session attributes the stock code reads on
the shared instance (`stream_cache`, `hift_cache_dict`, the vocoder's cache) are this session's for each unit,
through `duplexcadence.bind` under the model's lock. Both sessions check every unit against the clocks
(plan.py) before it runs: a unit the stock code would fail on, or that would cross a stock table, is a clear
error and changes nothing. Step-Audio 2's HiFT draws from the default generator of its device
(hifigan_components/layers.py L314, L378, L432); each session draws from its own state of it (`OwnGenerator`).
"""
from __future__ import annotations

import contextlib
import threading
import weakref

import torch

from duplexcadence import bind
from duplexcadence.errors import ConcurrencyError, InputError
from duplexcadence.payload import check_tokens
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import Capabilities, Session, SessionStats, check_final, host_waveform, unit_output

from duplexcadence.adapters.flow_hift import facts
from duplexcadence.adapters.flow_hift.build import clone_recursive
from duplexcadence.adapters.flow_hift.plan import MiniCPMClocks, StepAudio2Clocks, VocoderGeometry

_GENERATOR = threading.RLock()


class OwnGenerator:
    """One session's state of the default generator of `device`, seeded with `seed` (made by swapping the default
    generator's state out and back: nothing global changes). `use()` swaps it in for a `with` body and keeps what
    the body drew; `scratch()` swaps in a copy, discarded afterwards (warm-up steps). Both raise ConcurrencyError
    at entry while another thread is inside one (the default generator is the process's)."""

    def __init__(self, device, seed: int):
        self.device = torch.device(device)
        with self._swapped(None):
            self._default().manual_seed(seed)
            self.state = self._default().get_state()

    def _default(self):
        if self.device.type != "cuda":
            return torch.default_generator
        return torch.cuda.default_generators[self.device.index if self.device.index is not None
                                             else torch.cuda.current_device()]

    @contextlib.contextmanager
    def _swapped(self, state, keep: bool = False):
        if not _GENERATOR.acquire(blocking=False):
            raise ConcurrencyError("Step-Audio 2 sessions draw from the process's default generator and another "
                                   "thread's session is drawing now: run them on one thread (capabilities.concurrent)")
        try:
            gen = self._default()
            saved = gen.get_state()
            if state is not None:
                gen.set_state(state)
            try:
                yield
            finally:
                if keep:
                    self.state = gen.get_state()
                gen.set_state(saved)
        finally:
            _GENERATOR.release()

    def use(self):
        return self._swapped(self.state, keep=True)

    def scratch(self):
        return self._swapped(self.state.clone())


class _StockBase(Session):
    """What both stock sessions share: the one-live-session claim, the clocks, the unit loop."""

    variant = ""

    def __init__(self, model):
        t2w, self.prompt = model.t2w, model.prompt
        self.t2w, self.n_steps, self.units, self.calls = t2w, t2w.n_timesteps, 0, 0
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
        self._buffer: list[int] | None = None

    def clocks(self):
        self._check_open("clocks")
        return self._clock.copy()

    def speak(self, tokens, *, final: bool = False):
        """One SPEAK unit: <= 25 speech token ids @ 25 Hz -> the float32 waveform @ 24 kHz the stock calls return
        (concatenated) and its int16 PCM. Raises InputError / ClockError before anything runs."""
        self._check_open("speak")
        final = check_final(final)
        tokens = check_tokens(tokens, vocab=facts.VOCAB_SIZE, max_count=facts.MAX_UNIT_TOKENS)
        clock = self._clock.copy()
        plan = clock.plan(len(tokens), final)
        buf = self._buffer + tokens
        waves = self._run([(buf[c.call.start:c.call.start + c.call.n], c.call.last_chunk) for c in plan.calls])
        self._clock, self._buffer = clock, (None if final else buf[plan.rest:])
        self.units += 1
        self.calls += len(plan.calls)
        return unit_output(waves, calls=[c.call.n for c in plan.calls])

    def stats(self) -> SessionStats:
        self._check_open("stats")
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
        self._clock = MiniCPMClocks(self.specs, VocoderGeometry.of(bv))
        self._maxima = dict(bv.maxima)
        with bind.bound(*self._own(t2w.stream_cache, t2w.hift_cache_dict, t2w._stream_prompt, bv.cache),
                        lock=model_lock(t2w)):
            self._base = tuple(clone_recursive(c) for c in t2w.set_stream_cache(self.prompt.key))
        self._flow = self._hift = None

    def _own(self, flow, hift, prompt, vocoder_cache):
        t2w, bv = self.t2w, self.t2w.bounded_vocoder
        return (bind.attr(t2w, "stream_cache", flow), bind.attr(t2w, "hift_cache_dict", hift),
                bind.attr(t2w, "_stream_prompt", prompt), bind.attr(bv, "cache", vocoder_cache),
                bind.attr(bv, "maxima", self._maxima))

    def start_turn(self) -> None:
        """Clones of the base caches and the [4218] * 3 buffer (unified L4406-4410)."""
        self._check_open("start_turn")
        self._flow, self._hift = clone_recursive(self._base[0]), clone_recursive(self._base[1])
        self._clock.start_turn()
        self._buffer = list(facts.VARIANT["minicpmo45"].start_buffer)

    def _run(self, calls):
        t2w, waves = self.t2w, []
        with bind.bound(*self._own(self._flow, self._hift, self.prompt.key, self._hift), lock=model_lock(t2w)):
            try:
                for tokens, last in calls:
                    waves.append(t2w.stream(tokens, last_chunk=last, return_waveform=True))
            finally:
                self._flow, self._hift = t2w.stream_cache, t2w.hift_cache_dict
        return waves

    def state(self) -> dict:
        """The stock caches under the cadence region names (estimator entries cut to the steps in use), the host
        clocks and the token buffer; before the first turn, the voice's base."""
        self._check_open("state")
        flow, hift = (self._flow, self._hift) if self._flow is not None else self._base
        return {"conformer_att": flow["conformer_att_cache"], "estimator_att": flow["estimator_att_cache"][:self.n_steps],
                "conformer_cnn": flow["conformer_cnn_cache"], "estimator_cnn": flow["estimator_cnn_cache"][:self.n_steps],
                "vocoder_mel": hift["mel"], "vocoder_source": hift["source"], "vocoder_phase": hift["phase"],
                "clocks": self._clock.host(), "buffer": None if self._buffer is None else list(self._buffer)}


class StepAudio2StockSession(_StockBase):
    """Step-Audio 2 mini on build.StockToken2wav (model: build.Model; its `seed` seeds this session's generator).
    Raises ClockError for a voice past a stock table, ConcurrencyError while another stock session is open on
    the model or another thread's Step-Audio 2 session holds the default generator."""

    capabilities = Capabilities("carried", False, False, "tokens", facts.MAX_UNIT_TOKENS)
    variant = "stepaudio2"

    def __init__(self, model):
        super().__init__(model)
        t2w = self.t2w
        self._clock = StepAudio2Clocks(self.specs, self.n_steps)
        self.rng = OwnGenerator(t2w.device, model.seed)
        with bind.bound(bind.attr(t2w, "stream_cache", None), bind.attr(t2w, "hift_cache_dict", {}),
                        lock=model_lock(t2w)):
            t2w.set_stream_cache(self.prompt.key)       # upstream has no inference_mode here (the flow has its own)
            self._flow, self._hift = t2w.stream_cache, t2w.hift_cache_dict

    def start_turn(self) -> None:
        """A new response: an empty token buffer (ex L5); the caches carry over."""
        self._check_open("start_turn")
        self._clock.start_turn()
        self._buffer = []

    def _run(self, calls):
        t2w, waves = self.t2w, []
        with self.rng.use(), bind.bound(bind.attr(t2w, "stream_cache", self._flow),
                                  bind.attr(t2w, "hift_cache_dict", self._hift), lock=model_lock(t2w)):
            try:
                for tokens, last in calls:
                    waves.append(host_waveform(t2w.stream(tokens, self.prompt.key, last_chunk=last)))
            finally:
                self._flow, self._hift = t2w.stream_cache, t2w.hift_cache_dict
        return waves

    def state(self) -> dict:
        """The stock caches under the cadence region names, the host clocks, the token buffer, the generator."""
        self._check_open("state")
        f, h = self._flow, self._hift
        return {"conformer_att": f["conformer_att_cache"], "estimator_att": f["estimator_att_cache"][:self.n_steps],
                "conformer_cnn": f["conformer_cnn_cache"], "estimator_cnn": f["estimator_cnn_cache"][:self.n_steps],
                "hift_mel": h["mel"], "hift_source": h["source"], "hift_speech": h["speech"],
                "generator": self.rng.state, "clocks": self._clock.host(),
                "buffer": None if self._buffer is None else list(self._buffer)}
