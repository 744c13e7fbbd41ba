"""The flow's streaming state of one DuplexCadence session in its arena, shared by both variants' sessions.

Regions (sizes from the clocks, facts.regions): conformer_att [layers, 1, 8, <= bound, 128] (declared last:
on the VMM backend a KeepAll region maps granules only as it grows), estimator_att [steps, slots, 2, 8,
<= P + 100 + max advance, 128] for the Euler steps in use only, the conv caches, and the DiT's per-step
scratch [slots, 2, 8, ..., 128] / [slots, 2, 1024, 2]. The stock CFM / DiT write into their module buffers
`att_cache_buffer` / `cnn_cache_buffer` (flow_matching.py L165-169, decoder_dit.py L575-582); for one step
those buffers are this session's views (`bound`, through `duplexcadence.bind` under the model's lock), and
`t_embedder.timestep_embedding` is `DeviceTimestepTable` (decoder_dit.py L177-195 builds its frequency table
on the host and copies it every call, which blocks capture; the same expression, moved to the device once).
The stock DiT trim `cat(att[..., :P], att[..., -100:])` (token2wav.py L220-226, t2w L137-141) is an in-place
`move_tail_`, leaving the stock newest-first layout at a fixed address.
"""
from __future__ import annotations

import math

import torch

from duplexcadence import bind
from duplexcadence.payload import move_tail_
from duplexcadence.runtime import model_lock
from duplexcadence.session import SessionStats

from duplexcadence.adapters.flow_hift import facts


CAPTURE = ("ahead", "inline")


def check_capture(capture) -> bool:
    """A cadence session's `capture` option: "ahead" (graphs only from `prepare`; the default) or "inline"
    (capture a step's first occurrence inside `speak`, after one eager run per step family). Returns
    GraphCache's `inline`; ValueError for anything else."""
    if capture not in CAPTURE:
        raise ValueError(f"capture: expected one of {CAPTURE}, got {capture!r}")
    return capture == "inline"


class DeviceTimestepTable:
    """`TimestepEmbedder.timestep_embedding(t, dim, max_period)` with its frequency table built once per
    (device, dtype, dim): the host expression of decoder_dit.py L186-195, moved once. Same bytes."""

    def __init__(self):
        self.tables = {}

    def __call__(self, t, dim, max_period=10000):
        half = dim // 2
        key = (t.device, t.dtype, dim, max_period)
        freqs = self.tables.get(key)
        if freqs is None:
            freqs = self.tables[key] = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half) / half).to(t)
        args = t[:, None] * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
        return embedding


class FlowState:
    """One session's flow regions. Declare with the arena open (`__init__`), `attach()` after `allocate()`.

    t2w: the shared stock model (Token2wav / StockToken2wav); specs: facts.regions by name; n_steps: Euler
    steps. The DiT's layer slots come from its buffers (16 at the released depth, whatever the DiT depth:
    the stock caches carry all 16; `build.load_flow` sizes reduced models' buffers to their layers)."""

    def __init__(self, t2w, arena, specs: dict, n_steps: int):
        flow = t2w.flow
        self.t2w, self.arena, self.n_steps, self.P = t2w, arena, n_steps, specs["estimator_att"].initial
        self.token_layers = len(flow.encoder.encoders)
        self.layers = self.token_layers + len(flow.encoder.up_encoders)
        self.slots = flow.decoder.estimator.att_cache_buffer.shape[0]
        self.dtype = next(flow.parameters()).dtype
        self.Le_max = specs["estimator_att"].policy.bound()
        self.Lc_max = specs["conformer_att"].policy.bound()
        s, e = self.n_steps, self.slots
        self.shapes = {"estimator_att": (s, e, 2, 8, self.Le_max, 128), "estimator_cnn": (s, e, 2, 1024, 2),
                       "conformer_cnn": (1, 512, 6), "dit_att_scratch": (e, 2, 8, self.Le_max, 128),
                       "dit_cnn_scratch": (e, 2, 1024, 2), "conformer_att": (self.layers, 1, 8, self.Lc_max, 128)}
        for name, shape in self.shapes.items():
            arena.declare(name, shape, self.dtype)
        self.timestep = DeviceTimestepTable()
        self.views = {}

    def attach(self) -> None:
        for name in ("estimator_att", "estimator_cnn", "conformer_cnn", "dit_att_scratch", "dit_cnn_scratch"):
            self.views[name] = self.arena[name].view(self.shapes[name])
        dit = self.t2w.flow.decoder.estimator
        self.timestep(torch.zeros(2, device=self.arena.device, dtype=self.dtype), dit.t_embedder.frequency_embedding_size)

    def conformer(self, L: int) -> torch.Tensor:
        """The conformer KV cache as stock holds it: contiguous [layers, 1, 8, L, 128] (maps VMM granules)."""
        return self.arena["conformer_att"].view((self.layers, 1, 8, L, 128))

    def estimator(self, L: int) -> torch.Tensor:
        """The DiT KV cache of the steps in use: [steps, slots, 2, 8, L, 128], a slice as stock's is."""
        return self.views["estimator_att"][:, :, :, :, :L, :]

    def cache(self, Lc: int, Le: int) -> dict:
        """The stream cache `inference_chunk` takes (flow.py L172-229), on arena views."""
        return {"conformer_cnn_cache": self.views["conformer_cnn"], "conformer_att_cache": self.conformer(Lc),
                "estimator_cnn_cache": self.views["estimator_cnn"], "estimator_att_cache": self.estimator(Le)}

    def state(self, Lc: int, Le: int) -> dict:
        return {"conformer_att": self.conformer(Lc), "estimator_att": self.estimator(Le),
                "conformer_cnn": self.views["conformer_cnn"], "estimator_cnn": self.views["estimator_cnn"]}

    def bound(self, *extra: bind.Patch):
        """The CFM / DiT buffers and the timestep table pointed at this session for the body (plus `extra`),
        under the model's lock."""
        cfm = self.t2w.flow.decoder
        dit, v = cfm.estimator, self.views
        return bind.bound(bind.buffer(cfm, "att_cache_buffer", v["estimator_att"]),
                          bind.buffer(cfm, "cnn_cache_buffer", v["estimator_cnn"]),
                          bind.buffer(dit, "att_cache_buffer", v["dit_att_scratch"]),
                          bind.buffer(dit, "cnn_cache_buffer", v["dit_cnn_scratch"]),
                          bind.attr(dit.t_embedder, "timestep_embedding", self.timestep), *extra,
                          lock=model_lock(self.t2w))

    def set_up(self, prompt_key: str, *owners) -> dict:
        """`t2w.set_stream_cache(prompt_key)` on this session's views (its DiT KV lands in the arena); every
        attribute it sets on the shared model (`owners`: (object, name) pairs) is put back afterwards.
        Returns the stream cache dict it made (estimator entries are arena views: copy before the next step)."""
        keep = [bind.attr(obj, name, getattr(obj, name)) for obj, name in owners]
        with torch.inference_mode(), self.bound(*keep):
            self.t2w.set_stream_cache(prompt_key)
            out = dict(self.t2w.stream_cache)
        if out["conformer_att_cache"].shape[3] != self.P or out["estimator_att_cache"].shape[4] != self.P:
            raise RuntimeError(f"set-up caches: expected {self.P} frames, got {tuple(out['conformer_att_cache'].shape)}"
                               f" / {tuple(out['estimator_att_cache'].shape)}")
        return out

    def load(self, base: dict) -> None:
        """Copy a voice's stream caches (stock names, estimator entries of the steps in use) into the regions."""
        with torch.inference_mode():
            self.conformer(self.P).copy_(base["conformer_att_cache"])
            for name, dst in (("estimator_att_cache", self.estimator(self.P)),
                              ("estimator_cnn_cache", self.views["estimator_cnn"])):
                src = base[name][: self.n_steps]
                if src.data_ptr() != dst.data_ptr() or src.stride() != dst.stride():
                    dst.copy_(src)
            self.views["conformer_cnn"].copy_(base["conformer_cnn_cache"])

    def keep(self, new: dict, Lc: int, trim_conformer: bool) -> None:
        """After `inference_chunk`: its grown conformer cache (a fresh tensor) into the region (trimmed as
        Token2wav._trim_conformer_cache L228-247 when `trim_conformer`: prompt + last 100 mel frames, token-rate
        layers at token rate, repacked as [cache, cache]), its conv cache, and the DiT trim in place."""
        conf, L = new["conformer_att_cache"], new["conformer_att_cache"].shape[3]
        P, tail, d = self.P, facts.TAIL_FRAMES, self.token_layers
        if not trim_conformer or L <= P + tail:
            self.conformer(L).copy_(conf)
        else:
            out, half, lhalf = self.conformer(P + tail), (P + tail) // 2, L // 2
            out[:d, :, :, : P // 2].copy_(conf[:d, :, :, : P // 2])
            out[:d, :, :, P // 2: half].copy_(conf[:d, :, :, lhalf - tail // 2: lhalf])
            out[:d, :, :, half:].copy_(out[:d, :, :, :half])
            out[d:, :, :, :P].copy_(conf[d:, :, :, :P])
            out[d:, :, :, P:].copy_(conf[d:, :, :, L - tail:])
        self.views["conformer_cnn"].copy_(new["conformer_cnn_cache"])
        Le = new["estimator_att_cache"].shape[4]
        if Le > P + tail:
            move_tail_(self.views["estimator_att"], P, Le, tail, dim=4)


def capture_ahead(graphs, signatures, step_for, state, guard=None) -> dict:
    """Capture `signatures` (GraphCache.capture: recorded, not run) without changing the session. A step family
    not yet warmed in this process (`graphs.warmed`) first runs once eagerly on the session's state, which is
    put back afterwards: `state()` gives every live region view; `guard()` wraps the warm-up (Step-Audio 2:
    a throw-away generator). step_for(sig): the step's zero-argument callable. Returns the counters' change."""
    before = {k: getattr(graphs.stats, k) for k in SessionStats.COUNTERS}
    for sig in signatures if graphs.enabled else ():
        if sig in graphs.entries:
            continue
        if graphs.warm_key(sig) not in graphs.warmed:
            with torch.inference_mode():
                saved = {k: v.clone() for k, v in state().items()}
            try:
                with guard() if guard else torch.inference_mode():
                    graphs.run(sig, step_for(sig))
            finally:
                with torch.inference_mode():
                    for k, v in state().items():
                        v.copy_(saved[k])
        graphs.capture(sig, step_for(sig))
    return {k: getattr(graphs.stats, k) - before[k] for k in SessionStats.COUNTERS}
