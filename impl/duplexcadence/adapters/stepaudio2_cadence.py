"""DuplexCadence session for Step-Audio 2 mini's tail: a conformer cache that grows every call, held at a
stable address; the same stock kernels as `stepaudio2.StockSession`, bit for bit.

Built on `flow_hift_cadence.CadenceSession` (subclass): its arena views, the stock CFM/DiT module buffers
pointed at the arena for the length of a step (`_bound`), the device-resident timestep table and the
in-place estimator trim (`_keep_estimator`, which is exactly t2w L137-141's `cat(att[..., :P],
att[..., -100:])` once L > P + 100: Step-Audio 2 trims its DiT cache as MiniCPM-o 1.0.7 does). What is
Step-Audio 2's own (t2w = stepfun-ai/Step-Audio2 @ b1bb23c token2wav.py, see `stepaudio2`):

* Regions (`stepaudio2.regions`): the conformer KV cache (layers, 1, 8, L, 128) is KeepAll up to the
  encoder's position table (5000): it is never trimmed (t2w has no conformer trim), so the arena reserves
  the bound (layers x 8 x 5000 x 128 floats: 205 MB at the released depth) once and, on the CUDA VMM
  backend, maps 2 MiB granules only as L grows (`Arena.ensure` through `conformer_view`): physical memory
  follows the clock, the address never moves. CPU: one exact preallocation of the bound (plain tensor).
* Every call writes the encoder's grown cache (a fresh `torch.cat` inside `forward_chunk`) back into the
  region's first L + advance frames; nothing else of the session is re-allocated per unit.
* HiFT state (t2w L143-160): the last 8 mel frames, 3840 source samples and 3840 speech samples live in
  three fixed arena regions with host lengths (0 before the first call); the vocoder is the stock
  `HiFTGenerator` called eagerly on stock shapes with the cross-fade of t2w L14-22 (`stepaudio2.fade_in_out`),
  so it draws from the default generator exactly as stock does (same calls, same shapes, same order).
* The position-table limit: a unit whose calls would make the conformer read past the table is rejected
  with a ClockError (region, bound, value) before any state changes (stock breaks inside the encoder).

Graphs: the flow's shape changes every call (L grows by 50), so whole-step graphs keyed by exact signature
would be captured once and never replayed within a session; this session runs the flow eagerly by default.
`graphs=True` captures only the DiT/CFM segment (`decoder.forward_chunk`: shape-invariant once the DiT
cache has reached P + 100, RNG-free: its noise is the construction-time `rand_noise` table) keyed by
(mel frames, DiT cache length), with its inputs copied into static buffers; the encoder and the vocoder
stay eager.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from duplexcadence.adapters import flow_hift as fh
from duplexcadence.adapters import stepaudio2 as sa
from duplexcadence.adapters.flow_hift_cadence import CadenceSession as _FlowCadence
from duplexcadence.adapters.flow_hift_cadence import _DeviceTimestepTable
from duplexcadence.arena import Arena
from duplexcadence.clocks import ClockError
from duplexcadence.graphs import GraphCache
from duplexcadence.runtime import InputError, UnitOutput


class CadenceSession(_FlowCadence):
    """One Step-Audio 2 session on DuplexCadence (same contract as `stepaudio2.StockSession`).

    t2w: the `stepaudio2.StockToken2wav` shared with stock sessions (same weights and noise tables).
    rng_seed: seeds the default generators when the session opens, as the stock session does.
    graphs: capture the DiT segment as CUDA graphs (CUDA only; default False: eager).
    arena_backend: "auto" (vmm on CUDA where supported, else prealloc; cpu on CPU) | "vmm" | "prealloc" | "cpu".
    Raises InputError for bad input and ClockError for a unit past the position table, both before any
    state changes.
    """

    def __init__(self, t2w: sa.StockToken2wav, prompt: fh.Prompt, *, rng_seed: int = 0,
                 graphs: bool = False, strict: bool = False, arena_backend: str = "auto"):
        self.t2w, self.prompt = t2w, prompt
        self.device = torch.device(t2w.device)
        self.n_steps = t2w.n_timesteps
        torch.manual_seed(rng_seed)                     # as StockSession (set-up draws nothing either way)
        fh.install_prompt(t2w, prompt)
        self.P = prompt.mel_frames
        flow = t2w.flow
        self.limit = sa.position_limit(flow)
        self.specs = {r.name: r for r in sa.regions(self.P, self.limit)}
        self.Lmax = self.specs["estimator_att"].policy.bound()
        self.Lconf_max = self.specs["conformer_att"].policy.bound()
        self.n_token_layers = len(flow.encoder.encoders)
        n_layers = self.n_token_layers + len(flow.encoder.up_encoders)
        dit = flow.decoder.estimator
        depth = dit.att_cache_buffer.shape[0]
        heads, dk2 = 8, 128
        dtype = next(flow.parameters()).dtype
        self.dtype = dtype

        # The stock set-up, once per session (t2w L102-115; ex L46): its caches are copied into the arena.
        t2w.set_stream_cache(prompt.key)
        base = t2w.stream_cache

        self.arena = Arena(self.device, backend=arena_backend, name="stepaudio2")
        a = self.arena
        a.declare("estimator_att", (self.n_steps, depth, 2, heads, self.Lmax, dk2), dtype)
        a.declare("estimator_cnn", (self.n_steps, depth, 2, 1024, 2), dtype)
        a.declare("conformer_cnn", (1, 512, 6), dtype)
        a.declare("dit_att_scratch", (depth, 2, heads, self.Lmax, dk2), dtype)
        a.declare("dit_cnn_scratch", (depth, 2, 1024, 2), dtype)
        a.declare("hift_mel", (1, 80, sa.MEL_CACHE_LEN), torch.float32)
        a.declare("hift_source", (1, 1, sa.SOURCE_CACHE_LEN), torch.float32)
        a.declare("hift_speech", (1, sa.SOURCE_CACHE_LEN), torch.float32)
        # Last, so the reserved-but-unmapped part of the block is its tail (KeepAll up to the table).
        a.declare("conformer_att", (n_layers, 1, heads, self.Lconf_max, dk2), dtype)
        a.allocate()
        self._est_buf = a["estimator_att"].view((self.n_steps, depth, 2, heads, self.Lmax, dk2))
        self._est_cnn = a["estimator_cnn"].view((self.n_steps, depth, 2, 1024, 2))
        self._conf_cnn = a["conformer_cnn"].view((1, 512, 6))
        self._dit_att = a["dit_att_scratch"].view((depth, 2, heads, self.Lmax, dk2))
        self._dit_cnn = a["dit_cnn_scratch"].view((depth, 2, 1024, 2))
        self._hift_mel = a["hift_mel"].view((1, 80, sa.MEL_CACHE_LEN))
        self._hift_source = a["hift_source"].view((1, 1, sa.SOURCE_CACHE_LEN))
        self._hift_speech = a["hift_speech"].view((1, sa.SOURCE_CACHE_LEN))
        self._shape_conf = (n_layers, 1, heads)
        with torch.inference_mode():
            self.conformer_view(self.P).copy_(base["conformer_att_cache"])
            self.estimator_view(self.P).copy_(base["estimator_att_cache"][: self.n_steps])
            self._est_cnn.copy_(base["estimator_cnn_cache"][: self.n_steps])
            self._conf_cnn.copy_(base["conformer_cnn_cache"])
        if base["conformer_att_cache"].shape[3] != self.P or base["estimator_att_cache"].shape[4] != self.P:
            raise RuntimeError(f"set-up caches: expected {self.P} frames, got "
                               f"{tuple(base['conformer_att_cache'].shape)} / "
                               f"{tuple(base['estimator_att_cache'].shape)}")
        del base
        t2w.stream_cache = None                        # the stock instance holds nothing of this session
        self.len_conf = self.len_est = self.P          # host clocks (mel frames)
        self.hift_len = {"mel": 0, "source": 0, "speech": 0}   # host lengths of the HiFT regions
        self.graphs = GraphCache(self.device, enabled=bool(graphs), strict=strict, arena=a, warmup=1)
        self._timestep = _DeviceTimestepTable()
        self._timestep(torch.zeros(2, device=self.device, dtype=dtype), dit.t_embedder.frequency_embedding_size)
        self._static: dict = {}
        self._tokens: dict[int, torch.Tensor] = {}
        self.buffer: list[int] | None = None
        self.turn = -1
        self.calls_made = 0
        self.closed = False

    # --- views -------------------------------------------------------------------------------------
    def state_tensors(self) -> dict:
        """Every region's logical contents now (views; clone to keep)."""
        out = super().state_tensors()
        out.update(hift_mel=self._hift_mel[..., : self.hift_len["mel"]],
                   hift_source=self._hift_source[..., : self.hift_len["source"]],
                   hift_speech=self._hift_speech[..., : self.hift_len["speech"]])
        return out

    def stats(self) -> dict:
        out = self.graphs.stats.snapshot()
        out.update(arena_backend=self.arena.backend, arena_fallback=self.arena.fallback,
                   arena_bytes_reserved=self.arena.bytes_reserved, arena_bytes_mapped=self.arena.bytes_mapped,
                   graph_pool_bytes=self.graphs.pool_bytes, graphs=len(self.graphs.entries),
                   conformer_frames=self.len_conf, estimator_frames=self.len_est,
                   position_limit=self.limit, calls=self.calls_made)
        return out

    def close(self) -> None:
        """Release the session's graphs, arena views and memory (VMM: unmap and free the range). The
        session cannot speak afterwards; stats() still answers (0 bytes mapped)."""
        if self.closed:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.graphs.entries.clear()
        self._static.clear()
        self._est_buf = self._est_cnn = self._conf_cnn = self._dit_att = self._dit_cnn = None
        self._hift_mel = self._hift_source = self._hift_speech = None
        vmm, self.arena._block = self.arena._vmm, None
        if vmm is not None:
            vmm.close()
        self.buffer = None
        self.closed = True

    # --- turn and unit -----------------------------------------------------------------------------
    def start_turn(self) -> None:
        """A new response: an empty token buffer (ex L5); the caches carry over, as upstream's do.
        Raises InputError on a closed session."""
        if self.closed:
            raise InputError("start_turn: the session is closed")
        self.buffer = []
        self.turn += 1

    def speak(self, tokens, *, final: bool = False) -> UnitOutput:
        """One SPEAK unit, as `stepaudio2.StockSession.speak` (same calls, same bytes).

        Raises InputError (bad tokens, no open turn) or ClockError (a call of this unit would read
        conformer positions past the position table: region 'conformer_att', bound, value) before any
        state changes."""
        if self.buffer is None:
            raise InputError("speak: no open turn (call start_turn first; a finalised turn is closed)")
        tokens = sa.check_unit_tokens(tokens)
        calls, rest = sa.plan_calls(self.buffer, tokens, final)
        self._check_bounds(calls)
        waves = [self._call(c.tokens, c.last_chunk) for c in calls]
        self.buffer = None if final else rest
        wave = np.concatenate(waves) if waves else np.zeros(0, np.float32)
        return UnitOutput(wave.astype(np.float32, copy=False), fh.to_pcm16(wave),
                          {"calls": [len(c.tokens) for c in calls]})

    def _check_bounds(self, calls) -> None:
        Lc, Le = self.len_conf, self.len_est
        for i, c in enumerate(calls):
            adv = sa.mel_advance(len(c.tokens), c.last_chunk)
            try:
                _, Lc = self.specs["conformer_att"].step(Lc, adv)
            except ClockError as exc:
                raise ClockError(f"{exc}: call {i} of this unit ({len(c.tokens)} tokens, last_chunk="
                                 f"{c.last_chunk}) would make the encoder read {Lc + adv} relative positions, "
                                 f"past its position table of {self.limit} (EspnetRelPositionalEncoding "
                                 f"max_len; the stock driver breaks here); the session is unchanged") from None
            _, Le = self.specs["estimator_att"].step(Le, adv)

    # --- one upstream `stream` call ----------------------------------------------------------------
    def _call(self, tokens: list[int], last_chunk: bool) -> np.ndarray:
        n = len(tokens)
        tok = self._tokens.get(n)
        if tok is None:
            tok = self._tokens[n] = torch.zeros((1, n), dtype=torch.int32, device=self.device)
        tok.copy_(torch.tensor([tokens], dtype=torch.int32))
        Lc, Le = self.len_conf, self.len_est
        adv = sa.mel_advance(n, last_chunk)
        self.arena.ensure(self.arena["conformer_att"].offset, self._conf_nbytes(Lc + adv))  # map ahead (host)
        mel = self._flow_step(tok, last_chunk, Lc, Le)
        self.len_conf = self.specs["conformer_att"].step(Lc, adv)[1]
        self.len_est = self.specs["estimator_att"].step(Le, adv)[1]
        speech = self._vocode(mel, last_chunk)
        self.calls_made += 1
        return speech.cpu().numpy().reshape(-1)

    def _conf_nbytes(self, L: int) -> int:
        return int(np.prod(self._shape_conf)) * L * 128 * torch.empty((), dtype=self.dtype).element_size()

    def _flow_step(self, tok: torch.Tensor, last_chunk: bool, Lc: int, Le: int) -> torch.Tensor:
        """flow.inference_chunk on arena views (t2w L129-136, same autocast), then the grown conformer
        cache written back at the region's base and the estimator trim of t2w L137-141 in place."""
        t2w = self.t2w
        _, _, spk, _, _ = t2w.cache[self.prompt.key]
        cache = {"conformer_cnn_cache": self._conf_cnn, "conformer_att_cache": self.conformer_view(Lc),
                 "estimator_cnn_cache": self._est_cnn, "estimator_att_cache": self.estimator_view(Le)}
        with torch.inference_mode(), self._bound(), self._graphed_decoder(Le):
            with sa.autocast_like_upstream(self.device, t2w.float16):
                mel, new = t2w.flow.inference_chunk(token=tok, spk=spk, cache=cache, last_chunk=last_chunk,
                                                    n_timesteps=self.n_steps)
            self._keep_conformer(new["conformer_att_cache"])
            self._conf_cnn.copy_(new["conformer_cnn_cache"])
            self._keep_estimator(new["estimator_att_cache"].shape[4])
        return mel

    def _keep_conformer(self, new: torch.Tensor) -> None:
        """KeepAll: the encoder's grown cache (fresh, [layers, 1, 8, L + adv, 128]) at the region's base."""
        self.conformer_view(new.shape[3]).copy_(new)

    @contextmanager
    def _graphed_decoder(self, Le: int):
        """With graphs on: route `flow.decoder.forward_chunk` through the graph cache for one step, keyed
        by (mel frames, DiT cache length); mu/spks/cond are copied into static buffers first."""
        if not self.graphs.enabled:
            yield
            return
        cfm = self.t2w.flow.decoder
        stock_forward_chunk = cfm.forward_chunk

        def forward_chunk(mu, spks, cond, n_timesteps, temperature, cnn_cache, att_cache):
            sig = ("dit", int(mu.shape[2]), Le, int(n_timesteps))
            st = self._static.get(sig)
            if st is None:
                st = self._static[sig] = (torch.empty_like(mu), torch.empty_like(spks), torch.empty_like(cond))
            st[0].copy_(mu)
            st[1].copy_(spks)
            st[2].copy_(cond)
            return self.graphs.run(sig, lambda: stock_forward_chunk(
                mu=st[0], spks=st[1], cond=st[2], n_timesteps=n_timesteps, temperature=temperature,
                cnn_cache=cnn_cache, att_cache=att_cache))

        cfm.forward_chunk = forward_chunk
        try:
            yield
        finally:
            del cfm.forward_chunk

    def _vocode(self, chunk_mel: torch.Tensor, last_chunk: bool) -> torch.Tensor:
        """t2w L143-162 with the HiFT caches in fixed arena regions (host lengths; 0 before the first call)."""
        t2w = self.t2w
        lm, ls, lsp = self.hift_len["mel"], self.hift_len["source"], self.hift_len["speech"]
        mel = torch.concat([self._hift_mel[..., :lm], chunk_mel], dim=2)
        speech, source = t2w.hift(mel, self._hift_source[..., :ls])
        if lsp > 0:
            speech = sa.fade_in_out(speech, self._hift_speech[..., :lsp], t2w.speech_window)
        with torch.inference_mode():
            lm, ls, lsp = (min(sa.MEL_CACHE_LEN, mel.shape[2]), min(sa.SOURCE_CACHE_LEN, source.shape[2]),
                           min(sa.SOURCE_CACHE_LEN, speech.shape[1]))
            self._hift_mel[..., :lm].copy_(mel[..., mel.shape[2] - lm:])
            self._hift_source[..., :ls].copy_(source[:, :, source.shape[2] - ls:])
            self._hift_speech[..., :lsp].copy_(speech[:, speech.shape[1] - lsp:])
        self.hift_len = {"mel": lm, "source": ls, "speech": lsp}
        if not last_chunk:
            speech = speech[:, :-sa.SOURCE_CACHE_LEN]
        return speech
