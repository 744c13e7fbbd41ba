"""MiniCPM-o 4.5's tail on DuplexCadence: the stock kernels on arena state, in-place trims, exact-shape graph replay.

`inference_chunk` (flow.py L172-229) and the causal vocoder run as they ship on the arena (flowstate.FlowState,
causal_vocoder.ArenaVocoder); the stock trims (token2wav.py L220-247) are shifts in it. The clocks (plan) give a
"flow" step per stream call (`inference_chunk` and the trims; token ids in a static buffer; the mel into the
arena's `flow_mel`) and a "vocoder" step per 16-frame block; `speak` runs them with those keys.

`prepare(None)` captures the full-unit turn start, ramp and steady shapes (flow at lengths P, P + 50, P + 100) and
the vocoder blocks they lead to: for the workload's 6 s voice (P = 300) 3 flow and 5 vocoder graphs (pool bytes:
`stats().graph_bytes`, CUDA). Not in it: units of fewer than 25 tokens (calls of 8-27 tokens) and final flushes
(3-7 tokens, the finalize block), known once a unit's count is: `prepare(self.signatures(n, final))`.
Many threads (`capabilities.concurrent`): a replay touches no Python state of the shared model; eager steps and
captures hold the model's lock, and a step repoints shared modules only through `duplexcadence.bind` under it;
the voice's base caches are made once per model, voice and step count under the lock, shared read-only.
"""
from __future__ import annotations

import torch

from duplexcadence import gate, graphs as graph_cache
from duplexcadence.clocks import Signature
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import Capabilities, host_waveform

import duplexcadence.adapters.flow_hift.facts as facts
from duplexcadence.adapters.flow_hift.causal_vocoder import ArenaVocoder
from duplexcadence.adapters.flow_hift.flowstate import CadenceBase
from duplexcadence.adapters.flow_hift.plan import MiniCPMClocks, geometry, steady_signatures


class CadenceSession(CadenceBase):
    """One MiniCPM-o 4.5 session on DuplexCadence; same units, same bytes as stock.StockSession.

    model: build.Model (its Token2wav and voice are shared with every session). graphs: None = on CUDA only;
    capture: "ahead" | "inline" (flowstate.CadenceBase); strict: a step without a graph raises SignatureError;
    arena_backend: "auto" | "vmm" | "prealloc" | "cpu"; noise: "host" | "device" (causal_vocoder). Raises
    ClockError (a LimitError) for a voice past a stock table, InputError for a bad option."""

    capabilities = Capabilities("reset", True, True, "tokens", facts.MAX_UNIT_TOKENS)
    variant = "minicpmo45"
    steps, parts = ("flow", "vocoder"), ("vocoder",)

    def __init__(self, model, *, graphs: bool | None = None, capture: str = "ahead", strict: bool = False,
                 arena_backend: str = "auto", noise: str = "host"):
        graph_cache.check_options(graphs, strict)
        with gate.work():
            self.vocoder = ArenaVocoder(model.t2w, noise=noise)
            super().__init__(model, capture, arena_backend)
            self.clock = MiniCPMClocks(self.specs, geometry(self.t2w.bounded_vocoder))
            self.vocoder.declare(self.arena)
            self.arena.declare("flow_mel", (1, self.vocoder.channels, 2 * facts.CHUNK_TOKENS), torch.float32)
            self.finish(graphs, strict, (self.variant, self.n_steps, noise))
            self.vocoder.attach(self.arena, self.graphs)
            self._base = self._voice_base()

    def _voice_base(self) -> dict:
        """The voice's stream caches after `Token2wav.set_stream_cache` (token2wav.py L188-204; the demo clones them
        once per voice, unified L4398-4404): made once per (model, voice, steps) on this session's arena, the
        estimator caches cut to the steps in use; shared read-only by the voice's sessions."""
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

    def start_turn(self) -> None:
        """Restore the voice's base caches into the arena (in place), reset the vocoder, buffer [4218] * 3."""
        self.open_turn()
        with gate.work():
            self.flow.load(self._base)
            self.vocoder.reset()

    def steady(self) -> list:
        clock = self.clock.copy()
        clock.start_turn()
        return steady_signatures(clock)

    def step_bounds(self) -> dict:
        g = self.clock.vocoder.g
        return {"flow": range(1, facts.CALL_TOKENS + 1), "vocoder": range(g.mel_cap + 1), "vocoder_source": g.src_cap}

    def regions(self) -> dict:
        h = self.clock.host()
        return {**self.flow.state(h["conformer_att"], h["estimator_att"]),
                **self.vocoder.state(h["vocoder_mel"], h["vocoder_source"])}


    def run_calls(self, plan, buf) -> list:
        waves = []
        for cp in plan.calls:
            if cp.call.n:
                tokens = buf[cp.call.start:cp.call.start + cp.call.n]
                self.token_buffer(cp.call.n, tokens)
                mel = self.graphs.run(cp.steps[0], self.step_for(cp.steps[0]))
            else:       # an empty final call only flushes the vocoder (token2wav.py L271-273)
                mel = self.vocoder.mel[:, :, :0]
            waves.append(host_waveform(self.vocoder.stream(mel, cp)))
        return waves

    def step_for(self, sig: Signature):
        return self.flow_step(sig) if sig.step == "flow" else self.vocoder.block_step(sig)

    def flow_step(self, sig: Signature):
        """The step of a "flow" Signature: `flow.inference_chunk` on arena views (under token2wav.py L265-268's
        autocast), the stock trims in place, the mel into `flow_mel` (returned: that view [1, 80, frames])."""
        t2w, tok = self.t2w, self.token_buffer(sig.size)
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
