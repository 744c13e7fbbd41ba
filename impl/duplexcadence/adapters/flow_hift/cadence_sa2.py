"""Step-Audio 2 mini's tail on DuplexCadence: the kernels of stock.StepAudio2StockSession, bit for bit.

Shared with MiniCPM-o by composition: flowstate (the flow's regions and bindings, the in-place DiT trim: t2w
L137-141's `cat(att[..., :P], att[..., -100:])`). Its own (t2w = stepfun-ai/Step-Audio2 @ b1bb23c token2wav.py):
the conformer region is KeepAll up to the position table (never trimmed: 205 MB reserved at the released depth,
VMM-mapped as it grows; a unit past the table is a ClockError before anything changes, where the stock driver
breaks in the encoder). The encoder runs eagerly (it grows every call); the DiT segment (`decoder.forward_chunk`,
routed for the call, mu / spks / cond in static buffers) is a "dit" step and the HiFT call (its istft included)
a "hift" step (hift_graph), bounded sets (the DiT cache stops at P + 100). The session's own generator state is
swapped in for every unit (stock.OwnGenerator), as its stock session does.

`prepare(None)` captures what the clocks say the next full units need from the current state: "dit" at DiT
lengths up to P + 100, the first and steady "hift": for the workload's voice (P = 258) 3 + 2 graphs, all a 60 s
session of full units needs. Not in it: flush calls (2-27 tokens: "dit" of 4-54 frames, "hift" of 12-62), known
once a turn's final count is; the workload's whole script reaches 12 signatures.
"""
from __future__ import annotations

import torch

from duplexcadence import bind, gate, graphs as graph_cache
from duplexcadence.clocks import Signature
from duplexcadence.session import Capabilities, host_waveform

import duplexcadence.adapters.flow_hift.facts as facts
from duplexcadence.adapters.flow_hift.build import autocast_like_upstream
from duplexcadence.adapters.flow_hift.flowstate import CadenceBase
from duplexcadence.adapters.flow_hift.hift_graph import GraphedHiFT
from duplexcadence.adapters.flow_hift.plan import StepAudio2Clocks, steady_signatures
from duplexcadence.adapters.flow_hift.stock import OwnGenerator


class StepAudio2CadenceSession(CadenceBase):
    """One Step-Audio 2 session on DuplexCadence (model: build.Model; its `seed` seeds the session's generator).
    Options as cadence.CadenceSession (no noise). Raises ClockError for a voice past a stock table, InputError for
    a bad option; speak raises ConcurrencyError while another thread's Step-Audio 2 session draws."""

    capabilities = Capabilities("carried", False, True, "tokens", facts.MAX_UNIT_TOKENS)
    variant = "stepaudio2"
    steps, parts = ("dit", "hift"), ("hift",)

    def __init__(self, model, *, graphs: bool | None = None, capture: str = "ahead", strict: bool = False,
                 arena_backend: str = "auto"):
        graph_cache.check_options(graphs, strict)
        with gate.work():
            super().__init__(model, capture, arena_backend)
            self.clock = StepAudio2Clocks(self.specs, self.n_steps)
            self.rng = OwnGenerator(self.device, model.seed)
            self.guard = self.rng.scratch
            self.hift = GraphedHiFT(self.t2w, self.arena)
            self.finish(graphs, strict, (self.variant, self.n_steps))
            self.hift.attach()
            # the stock set-up, once per session (t2w L102-115, ex L46), its DiT KV landing in the arena
            self.flow.load(self.flow.set_up(self.prompt.key, (self.t2w, "stream_cache"), (self.t2w, "hift_cache_dict")))

    start_turn = CadenceBase.open_turn     # a new response: an empty buffer (ex L5); the caches carry over

    def steady(self) -> list:
        return steady_signatures(self.clock)

    def step_bounds(self) -> dict:
        frames = facts.mel_advance(facts.CALL_TOKENS, True)      # the most mel frames one call adds
        return {"dit": range(1, frames + 1), "hift": range(1, facts.MEL_CACHE_LEN + frames + 1),
                "hift_mel": facts.MEL_CACHE_LEN, "hift_source": facts.SOURCE_CACHE_LEN}

    def regions(self) -> dict:
        h = self.clock.host()
        return {**self.flow.state(h["conformer_att"], h["estimator_att"]), **self.hift.state(h)}


    def state(self) -> dict:
        """As CadenceBase.state, with the session's generator state."""
        return {**super().state(), "generator": self.rng.state}

    def run_calls(self, plan, buf) -> list:
        """The unit's calls with the session's generator swapped in (ConcurrencyError first, while another
        thread's Step-Audio 2 session draws)."""
        with self.rng.use():
            return [self._call(buf[c.call.start:c.call.start + c.call.n], c) for c in plan.calls]

    def step_for(self, sig: Signature):
        return self.dit_step(sig) if sig.step == "dit" else self.hift.step(sig)

    def dit_step(self, sig: Signature):
        """The step of a "dit" Signature: the stock `CausalConditionalCFM.forward_chunk` (flow_matching.py
        L176-205, called as the class function) on the static inputs and the arena's DiT caches."""
        cfm = self.t2w.flow.decoder
        if sig not in self.static:
            dtype = self.flow.dtype
            self.static[sig] = (torch.zeros((1, 80, sig.size), dtype=dtype, device=self.device),
                                 torch.zeros((1, 80), dtype=dtype, device=self.device),
                                 torch.zeros((1, 80, sig.size), dtype=dtype, device=self.device))
        mu, spks, cond = self.static[sig]
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
        self.token_buffer(n, tokens)
        Lc, Le = cp.before["conformer_att"], cp.before["estimator_att"]
        step = self.dit_step(dit_sig)
        mu_s, spks_s, cond_s = self.static[dit_sig]

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
                mel, new = t2w.flow.inference_chunk(token=self.token_buffer(n), spk=spk, cache=self.flow.cache(Lc, Le),
                                                    last_chunk=cp.call.last_chunk, n_timesteps=self.n_steps)
            self.flow.keep(new, Lc, trim_conformer=False)
        return host_waveform(self.hift.vocode(mel, cp, self.graphs))
