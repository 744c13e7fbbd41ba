"""Step-Audio 2 mini's tail on DuplexCadence: the same stock kernels as stock.StepAudio2StockSession, bit for bit,
with a conformer cache that grows every call held at a stable address.

What it shares with MiniCPM-o's session is composed, not inherited: flowstate.FlowState (the flow's arena
regions, the CFM / DiT buffers and timestep table bound for a step, the in-place DiT trim, which is exactly t2w
L137-141's `cat(att[..., :P], att[..., -100:])`). Step-Audio 2's own (t2w = stepfun-ai/Step-Audio2 @ b1bb23c
token2wav.py):

* the conformer region is KeepAll up to the encoder's position table (facts.regions): never trimmed (t2w has no
  conformer trim), so the arena reserves the bound once (layers x 8 x 5000 x 128 floats: 205 MB at the released
  depth) and, on the CUDA VMM backend, maps 2 MiB granules only as it grows; every call writes the encoder's
  grown cache (a fresh `torch.cat` in `forward_chunk`) back at the region's base. A unit that would read past the
  table is refused with a ClockError before anything changes (the stock driver breaks inside the encoder);
* the encoder runs eagerly (its shape grows 50 frames a call); the DiT segment (`decoder.forward_chunk`, its
  noise the construction-time `rand_noise`) is routed for the call through the graph cache as a "dit" step
  (mu / spks / cond copied into static buffers first), and the HiFT call up to its istft is a "hift" step
  (hift_graph.GraphedHiFT); both are bounded sets: the DiT cache stops at P + 100 frames;
* the HiFT draws from the default generator of its device: the session swaps its own state in for every unit
  (stock.OwnGenerator), as its stock session does, so sessions interleaved on one thread do not share draws.

`prepare(None)` captures what the clocks say the next full units need from the session's current state: the
"dit" steps at DiT lengths up to P + 100 and the first and steady "hift" steps (the caches carry over turns,
so after the first turn this is the steady pair): for the workload's voice (P = 258) 3 "dit" and 2 "hift"
graphs, all a 60 s session of full units needs (the DiT cache stops growing at P + 100). Not in it: flush calls
(2-27 tokens at a turn's end: "dit" of 4-54 frames, "hift" of 12-62), known once a turn's final count is; the
workload's whole script reaches 12 signatures.
"""
from __future__ import annotations

import torch

from duplexcadence import bind
from duplexcadence.arena import Arena
from duplexcadence.clocks import Signature
from duplexcadence.graphs import GraphCache
from duplexcadence.payload import check_tokens
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import Capabilities, Session, SessionStats, check_final, host_waveform, unit_output

from duplexcadence.adapters.flow_hift import facts
from duplexcadence.adapters.flow_hift.build import autocast_like_upstream
from duplexcadence.adapters.flow_hift.flowstate import FlowState, capture_ahead, check_capture
from duplexcadence.adapters.flow_hift.hift_graph import GraphedHiFT
from duplexcadence.adapters.flow_hift.plan import StepAudio2Clocks, steady_signatures
from duplexcadence.adapters.flow_hift.stock import OwnGenerator


class StepAudio2CadenceSession(Session):
    """One Step-Audio 2 session on DuplexCadence (model: build.Model; its `seed` seeds the session's generator).

    graphs: None = on CUDA only; capture: "ahead" | "inline"; strict: a step without a graph raises
    SignatureError; arena_backend as cadence.CadenceSession. Raises ClockError for a voice past a stock table,
    ValueError for a bad option; speak raises InputError / ClockError before anything changes and
    ConcurrencyError while another thread's Step-Audio 2 session draws from the default generator."""

    capabilities = Capabilities("carried", False, True, "tokens", facts.MAX_UNIT_TOKENS)

    def __init__(self, model, *, graphs: bool | None = None, capture: str = "ahead", strict: bool = False,
                 arena_backend: str = "auto"):
        inline = check_capture(capture)
        t2w, self.prompt = model.t2w, model.prompt
        self.t2w, self.device, self.n_steps = t2w, torch.device(t2w.device), t2w.n_timesteps
        specs = {r.name: r for r in facts.regions("stepaudio2", self.prompt.mel_frames, facts.stock_limits(t2w.flow))}
        self._clock = StepAudio2Clocks(specs, self.n_steps)
        self.rng = OwnGenerator(self.device, model.seed)
        self.arena = Arena(self.device, backend=arena_backend, name="stepaudio2")
        self.hift = GraphedHiFT(t2w, self.arena)
        self.flow = FlowState(t2w, self.arena, specs, self.n_steps)     # conformer_att last: the unmapped tail
        self.arena.allocate()
        self.flow.attach()
        self.hift.attach()
        warmed = model_state(t2w).setdefault("warmed", {}).setdefault(("stepaudio2", self.n_steps), set())
        self.graphs = GraphCache(self.device, enabled=graphs, strict=strict, arena=self.arena, warmup=1,
                                 warmed=warmed, warm_key=lambda sig: sig.step, lock=model_lock(t2w), inline=inline)
        self._static: dict = {}
        self._tokens: dict[int, torch.Tensor] = {}
        # the stock set-up, once per session (t2w L102-115, ex L46), its DiT KV landing in the arena
        self.flow.load(self.flow.set_up(self.prompt.key, (t2w, "stream_cache"), (t2w, "hift_cache_dict")))
        self._buffer: list[int] | None = None
        self.units = 0

    def clocks(self) -> StepAudio2Clocks:
        self._check_open("clocks")
        return self._clock.copy()

    def start_turn(self) -> None:
        """A new response: an empty token buffer (ex L5); the caches carry over, as upstream's do."""
        self._check_open("start_turn")
        self._clock.start_turn()
        self._buffer = []

    def speak(self, tokens, *, final: bool = False):
        """One SPEAK unit, as stock.StepAudio2StockSession.speak (same calls, same bytes, same generator state)."""
        self._check_open("speak")
        final = check_final(final)
        tokens = check_tokens(tokens, vocab=facts.VOCAB_SIZE, max_count=facts.MAX_UNIT_TOKENS)
        clock = self._clock.copy()
        plan = clock.plan(len(tokens), final)
        buf = self._buffer + tokens
        with self.rng.use():
            waves = [self._call(buf[c.call.start:c.call.start + c.call.n], c) for c in plan.calls]
        self._clock, self._buffer = clock, (None if final else buf[plan.rest:])
        self.units += 1
        return unit_output(waves, calls=[c.call.n for c in plan.calls])

    def prepare(self, signatures=None) -> dict:
        """Capture graphs ahead of time without changing state, clocks or the generator (module docstring: what
        None captures). signatures: "dit" / "hift" Signatures. A step family's first capture in this process
        follows one eager warm-up on this session's state (and a throw-away copy of its generator), put back
        afterwards. Returns the counters' change (zeros off CUDA). Raises ValueError for another step."""
        self._check_open("prepare")
        sigs = list(steady_signatures(self._clock) if signatures is None else signatures)
        for sig in sigs:
            if not isinstance(sig, Signature) or sig.step not in ("dit", "hift"):
                raise ValueError(f"signatures: expected 'dit' or 'hift' Signatures, got {sig!r}")
        return capture_ahead(self.graphs, sigs, self.step_for, self._regions, guard=self.rng.scratch)

    def state(self) -> dict:
        """Region views, the host clocks, the token buffer and the session's generator state."""
        self._check_open("state")
        return {**self._regions(), "generator": self.rng.state, "clocks": self._clock.host(),
                "buffer": None if self._buffer is None else list(self._buffer)}

    def stats(self) -> SessionStats:
        self._check_open("stats")
        return SessionStats.of(units=self.units, graphs=self.graphs, arena=self.arena, arena_backend=self.arena.backend)

    def close(self) -> None:
        """Drop the graphs, the static buffers and the arena now (VMM: unmap and free the range)."""
        if self.closed:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.graphs.drop()
        self.hift.close()
        self.arena.close()
        self.flow = self.hift = self.graphs = self.arena = None
        self._static.clear()
        self._tokens.clear()
        self.closed = True

    # --- steps -------------------------------------------------------------------------------------------
    def _regions(self) -> dict:
        h = self._clock.host()
        return {**self.flow.state(h["conformer_att"], h["estimator_att"]), **self.hift.state(h)}

    def step_for(self, sig: Signature):
        return self.dit_step(sig) if sig.step == "dit" else self.hift.step(sig)

    def dit_step(self, sig: Signature):
        """The step of a "dit" Signature: the stock `CausalConditionalCFM.forward_chunk` (flow_matching.py
        L176-205, called as the class function) on the static inputs and the arena's DiT caches."""
        cfm = self.t2w.flow.decoder
        if sig not in self._static:
            dtype = self.flow.dtype
            self._static[sig] = (torch.zeros((1, 80, sig.size), dtype=dtype, device=self.device),
                                 torch.zeros((1, 80), dtype=dtype, device=self.device),
                                 torch.zeros((1, 80, sig.size), dtype=dtype, device=self.device))
        mu, spks, cond = self._static[sig]
        Le, views = sig.get("estimator_att"), self.flow.views

        def step():
            with torch.inference_mode(), self.flow.bound():
                return type(cfm).forward_chunk(cfm, mu=mu, spks=spks, cond=cond, n_timesteps=sig.get("n_timesteps"),
                                               temperature=1.0, cnn_cache=views["estimator_cnn"],
                                               att_cache=self.flow.estimator(Le))
        return step

    def _call(self, tokens: list[int], cp):
        """One upstream `stream` call (t2w L118-162) on the arena, the DiT segment and the HiFT as graphed steps."""
        t2w, dit_sig, n = self.t2w, cp.steps[0], cp.call.n
        if n not in self._tokens:
            self._tokens[n] = torch.zeros((1, n), dtype=torch.int32, device=self.device)
        self._tokens[n].copy_(torch.tensor([tokens], dtype=torch.int32))
        Lc, Le = cp.before["conformer_att"], cp.before["estimator_att"]
        step = self.dit_step(dit_sig)
        mu_s, spks_s, cond_s = self._static[dit_sig]

        def routed(mu, spks, cond, n_timesteps, temperature, cnn_cache, att_cache):
            if tuple(mu.shape) != tuple(mu_s.shape) or temperature != 1.0 or n_timesteps != self.n_steps:
                raise RuntimeError(f"DiT call {tuple(mu.shape)} does not match its signature {dit_sig!r}")
            mu_s.copy_(mu)
            spks_s.copy_(spks)
            cond_s.copy_(cond)
            return self.graphs.run(dit_sig, step)

        spk = t2w.cache[self.prompt.key][2]
        with torch.inference_mode(), self.flow.bound(bind.attr(t2w.flow.decoder, "forward_chunk", routed)):
            with autocast_like_upstream(self.device, t2w.float16):
                mel, new = t2w.flow.inference_chunk(token=self._tokens[n], spk=spk, cache=self.flow.cache(Lc, Le),
                                                    last_chunk=cp.call.last_chunk, n_timesteps=self.n_steps)
            self.flow.keep(new, Lc, trim_conformer=False)
        return host_waveform(self.hift.vocode(mel, cp, self.graphs))
