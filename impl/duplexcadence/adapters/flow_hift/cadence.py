"""MiniCPM-o 4.5's tail on DuplexCadence: arena state, in-place trims, exact-shape graph replay, the stock kernels.

`CausalMaskedDiffWithXvec.inference_chunk` (flow.py L172-229) and the causal vocoder (causal_vocoder.py) run as
they ship, on this session's arena views (flowstate.FlowState, causal_vocoder.ArenaVocoder); the stock trims
(token2wav.py L220-247) are shifts inside the arena. The host clocks (plan.MiniCPMClocks) give every step's
Signature: one "flow" step per stream call (the whole `inference_chunk` plus the trims: one graph on CUDA;
token ids copied into a static buffer before it; its mel written into the arena's `flow_mel`, read block by
block by the vocoder) and one "vocoder" step per 16-frame block. `speak` runs those signatures and nothing
else; graphs come only from `prepare` (capture="ahead", the default): a step without a graph runs eagerly and
is counted (`eager_fallbacks`).

`prepare(None)` captures the full-unit turn start, ramp and steady shapes (three flow signatures at conformer /
DiT lengths P, P + 50, P + 100) and the vocoder blocks they lead to (the block plan repeats from the fourth
unit): `plan.steady_signatures`; for the workload's 6 s voice (P = 300) 3 flow and 5 vocoder graphs (their pool
bytes are measured on CUDA, `stats().graph_bytes`). Not in it:
units of fewer than 25 tokens (turn starts and ends of short TTS output: flush calls of 8-27 tokens) and the
final-flush shapes (3-7 tokens, and the vocoder's finalize block), which depend on the counts a turn ends with;
`prepare(self.signatures(n, final))` captures those as soon as a unit's count is known.

Sessions of one model on many host threads (`capabilities.concurrent`): a replay touches no Python state of the
shared model; every eager step and capture holds the model's lock (GraphCache `lock`), and everything a step
repoints on the shared modules (CFM / DiT buffers, the timestep table, the vocoder's STFT window and `_istft`)
goes through `duplexcadence.bind` under that lock for exactly the step; the voice's base caches are made once
per model, voice and step count under the lock, and shared read-only.
"""
from __future__ import annotations

import torch

from duplexcadence.arena import Arena
from duplexcadence.clocks import Signature
from duplexcadence.graphs import GraphCache
from duplexcadence.payload import check_tokens
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import Capabilities, Session, SessionStats, check_final, host_waveform, unit_output

from duplexcadence.adapters.flow_hift import facts
from duplexcadence.adapters.flow_hift.causal_vocoder import ArenaVocoder
from duplexcadence.adapters.flow_hift.flowstate import FlowState, capture_ahead, check_capture
from duplexcadence.adapters.flow_hift.plan import MiniCPMClocks, VocoderGeometry, steady_signatures

class CadenceSession(Session):
    """One MiniCPM-o 4.5 session on DuplexCadence; same units, same bytes as stock.StockSession.

    model: build.Model (its Token2wav and voice are shared with every session). graphs: None = on CUDA only;
    strict: a step without a graph raises SignatureError instead of running eagerly; arena_backend: "auto" |
    "vmm" | "prealloc" | "cpu"; noise: "host" | "device" (causal_vocoder). Raises ClockError (a LimitError)
    for a voice past a stock table, ValueError for a bad option, before anything is allocated."""

    capabilities = Capabilities("reset", True, True, "tokens", facts.MAX_UNIT_TOKENS)

    def __init__(self, model, *, graphs: bool | None = None, capture: str = "ahead", strict: bool = False,
                 arena_backend: str = "auto", noise: str = "host"):
        inline = check_capture(capture)
        t2w, self.prompt = model.t2w, model.prompt
        self.t2w, self.device, self.n_steps = t2w, torch.device(t2w.device), t2w.n_timesteps
        specs = {r.name: r for r in facts.regions("minicpmo45", self.prompt.mel_frames, facts.stock_limits(t2w.flow))}
        self._clock = MiniCPMClocks(specs, VocoderGeometry.of(t2w.bounded_vocoder))
        self.vocoder = ArenaVocoder(t2w, noise=noise)
        self.arena = Arena(self.device, backend=arena_backend, name="minicpmo45")
        self.vocoder.declare(self.arena)
        self.flow = FlowState(t2w, self.arena, specs, self.n_steps)
        self.arena.declare("flow_mel", (1, self.vocoder.channels, 2 * facts.CHUNK_TOKENS), self.flow.dtype)
        self.arena.allocate()
        self.flow.attach()
        warmed = model_state(t2w).setdefault("warmed", {}).setdefault(("minicpmo45", self.n_steps, noise), set())
        self.graphs = GraphCache(self.device, enabled=graphs, strict=strict, arena=self.arena, warmup=1,
                                 warmed=warmed, warm_key=lambda sig: sig.step, lock=model_lock(t2w), inline=inline)
        self.vocoder.attach(self.arena, self.graphs)
        self._tokens: dict[int, torch.Tensor] = {}
        self._base = self._voice_base()
        self._buffer: list[int] | None = None
        self.units = 0

    def _voice_base(self) -> dict:
        """The voice's stream caches after `Token2wav.set_stream_cache` (token2wav.py L188-204; the demo clones
        them once per voice, unified L4398-4404): made once per (model, voice, steps) on this session's arena,
        the estimator caches cut to the steps in use; shared read-only by the voice's sessions."""
        t2w, bv = self.t2w, self.t2w.bounded_vocoder
        with model_lock(t2w):
            bases = model_state(t2w).setdefault("voice_base", {})
            key = (self.prompt.key, self.n_steps)
            if key not in bases:
                cache = self.flow.set_up(self.prompt.key, (t2w, "stream_cache"), (t2w, "hift_cache_dict"),
                                         (t2w, "_stream_prompt"), (bv, "cache"), (bv, "maxima"))
                bases[key] = {k: (v[:self.n_steps] if k.startswith("estimator") else v).clone()
                              for k, v in cache.items()}
            return bases[key]

    # --- the protocol ----------------------------------------------------------------------------------
    def clocks(self) -> MiniCPMClocks:
        self._check_open("clocks")
        return self._clock.copy()

    def start_turn(self) -> None:
        """Restore the voice's base caches into the arena (in place), reset the vocoder, buffer [4218] * 3."""
        self._check_open("start_turn")
        self.flow.load(self._base)
        self.vocoder.reset()
        self._clock.start_turn()
        self._buffer = list(facts.VARIANT["minicpmo45"].start_buffer)

    def speak(self, tokens, *, final: bool = False):
        """One SPEAK unit: <= 25 speech token ids @ 25 Hz -> float32 waveform @ 24 kHz and int16 PCM, the calls of
        the duplex loop (facts.plan_calls). Raises InputError (bad tokens, no open turn) or ClockError before
        anything changes."""
        self._check_open("speak")
        final = check_final(final)
        tokens = check_tokens(tokens, vocab=facts.VOCAB_SIZE, max_count=facts.MAX_UNIT_TOKENS)
        clock = self._clock.copy()
        plan = clock.plan(len(tokens), final)
        buf = self._buffer + tokens
        waves = [self._call(buf[c.call.start:c.call.start + c.call.n], c) for c in plan.calls]
        self._clock, self._buffer = clock, (None if final else buf[plan.rest:])
        self.units += 1
        return unit_output(waves, calls=[c.call.n for c in plan.calls])

    def prepare(self, signatures=None) -> dict:
        """Capture graphs ahead of time without changing state or clocks (module docstring: what None captures).
        signatures: "flow" / "vocoder" Signatures from `signatures()` / `clocks()`. A step family's first capture
        in this process follows one eager warm-up on this session's state, put back afterwards. Returns the
        counters' change (zeros off CUDA). Raises ValueError for a signature of another step."""
        self._check_open("prepare")
        if signatures is None:
            clock = self._clock.copy()
            clock.start_turn()
            signatures = steady_signatures(clock)
        sigs = list(signatures)
        for sig in sigs:
            if not isinstance(sig, Signature) or sig.step not in ("flow", "vocoder"):
                raise ValueError(f"signatures: expected 'flow' or 'vocoder' Signatures, got {sig!r}")
        return capture_ahead(self.graphs, sigs, self.step_for, self._regions)

    def state(self) -> dict:
        """Region views (stock names of the logical contents), the host clocks and the token buffer."""
        self._check_open("state")
        host = self._clock.host()
        return {**self._regions(), "clocks": host, "buffer": None if self._buffer is None else list(self._buffer)}

    def stats(self) -> SessionStats:
        self._check_open("stats")
        return SessionStats.of(units=self.units, graphs=self.graphs, arena=self.arena,
                               arena_backend=self.arena.backend, noise=self.vocoder.noise)

    def close(self) -> None:
        """Drop the graphs, the vocoder's state and the arena now (the model and the voice base stay)."""
        if self.closed:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.graphs.drop()
        self.vocoder.close()
        self.arena.close()
        self.flow = self.vocoder = self.graphs = self.arena = self._base = None
        self._tokens.clear()
        self.closed = True

    # --- steps -------------------------------------------------------------------------------------------
    def _regions(self) -> dict:
        h = self._clock.host()
        return {**self.flow.state(h["conformer_att"], h["estimator_att"]),
                **self.vocoder.state(h["vocoder_mel"], h["vocoder_source"])}

    def _token_buffer(self, n: int) -> torch.Tensor:
        if n not in self._tokens:
            self._tokens[n] = torch.zeros((1, n), dtype=torch.int32, device=self.device)
        return self._tokens[n]

    def _call(self, tokens: list[int], cp):
        if cp.call.n:
            self._token_buffer(cp.call.n).copy_(torch.tensor([tokens], dtype=torch.int32))
            mel = self.graphs.run(cp.steps[0], self.step_for(cp.steps[0]))
        else:       # an empty final call only flushes the vocoder (token2wav.py L271-273)
            mel = self.vocoder.mel[:, :, :0]
        return host_waveform(self.vocoder.stream(mel, cp))

    def step_for(self, sig: Signature):
        """The zero-argument step of `sig` (graph-capturable; reads every length from `sig`)."""
        return self.flow_step(sig) if sig.step == "flow" else self.vocoder.block_step(sig)

    def flow_step(self, sig: Signature):
        """`flow.inference_chunk` on arena views (under token2wav.py L265-268's autocast), then the stock trims
        in place; the mel into `flow_mel`, returned as that arena view [1, 80, frames]."""
        t2w, tok = self.t2w, self._token_buffer(sig.size)
        spk = t2w.cache[self.prompt.key][2]
        Lc, Le, last = sig.get("conformer_att"), sig.get("estimator_att"), sig.get("last_chunk")

        def step():
            with torch.inference_mode(), self.flow.bound():
                with torch.amp.autocast("cuda", dtype=torch.float16, enabled=t2w.float16):
                    mel, new = t2w.flow.inference_chunk(token=tok, spk=spk, cache=self.flow.cache(Lc, Le),
                                                        last_chunk=last, n_timesteps=self.n_steps)
                self.flow.keep(new, Lc, trim_conformer=True)
                out = self.arena["flow_mel"].view(tuple(mel.shape))
                out.copy_(mel)
            return out
        return step
