"""The flow's streaming state of one DuplexCadence session in its arena, shared by both variants' sessions.

Regions (sizes from the clocks, facts.regions): conformer_att [layers, 1, 8, <= bound, 128] (declared last: on
the VMM backend a KeepAll region maps granules as it grows), estimator_att [steps, slots, 2, 8, <= bound, 128]
for the Euler steps in use only, the conv caches and the DiT's per-step scratch. The stock CFM / DiT write into
their module buffers (flow_matching.py L165-169, decoder_dit.py L575-582): for one step those are this session's
views (`bound`: duplexcadence.bind under the model's lock), and `t_embedder.timestep_embedding` is
`DeviceTimestepTable` (decoder_dit.py L177-195 builds its table on the host and copies it every call, which
blocks capture). The DiT trim `cat(att[..., :P], att[..., -100:])` (token2wav.py L220-226) is a `move_tail_`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from duplexcadence import bind, gate
from duplexcadence.arena import Arena
from duplexcadence.clocks import Fixed, KeepAll, Signature
from duplexcadence.errors import InputError
from duplexcadence.graphs import GraphCache, WarmSet
from duplexcadence.payload import check_signatures, move_tail_, shown
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import SessionStats

import duplexcadence.adapters.flow_hift.facts as facts
from duplexcadence.adapters.flow_hift.plan import TokenSession
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
    """One session's flow regions over the shared `t2w`, declared in `arena` now (`attach()` after allocate);
    specs: facts.regions by name. The DiT's layer slots are its buffers' (build.load_flow)."""

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
        attribute it sets on the shared model (`owners`: (object, name) pairs) is put back afterwards. Returns the
        stream cache it made (estimator entries are arena views)."""
        with torch.inference_mode(), self.bound(*[bind.attr(obj, name, getattr(obj, name)) for obj, name in owners]):
            self.t2w.set_stream_cache(prompt_key)
            return dict(self.t2w.stream_cache)

    def load(self, base: dict) -> None:
        """Copy a voice's stream caches (stock names, estimator entries of the steps in use) into the regions."""
        with torch.inference_mode():
            self.conformer(self.P).copy_(base["conformer_att_cache"])
            self.estimator(self.P).copy_(base["estimator_att_cache"][: self.n_steps])   # (may be itself: SA2)
            self.views["estimator_cnn"].copy_(base["estimator_cnn_cache"][: self.n_steps])
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


def _whole(value, most: int | None = None) -> bool:
    """A plain int in [0, most] (no bound: None)."""
    return type(value) is int and value >= 0 and (most is None or value <= most)


def _same_kind(value, like) -> bool:
    """`value` is what the clocks put where they put `like`: a bool, a plain int >= 0, a tuple of them, or None
    where the clocks give a tuple or None."""
    def kind(v):
        return ("none" if v is None else "bool" if type(v) is bool else "int" if _whole(v)
                else "ints" if type(v) is tuple and all(_whole(x) for x in v) else "other")
    a, b = kind(value), kind(like)
    return a != "other" and (a == b or {a, b} == {"none", "ints"})


class CadenceBase(TokenSession):
    """What both cadence sessions share around their FlowState: the arena, the graph cache, static step inputs,
    prepare / state / stats / close. capture: "ahead" (graphs only from `prepare`; a step without one runs eagerly,
    counted) or "inline" (a step's first occurrence captured in `speak` after one eager run per step family; the
    session is then not `concurrent`: a capture fails another thread's device sync). Subclasses declare their
    regions between `__init__` and `finish` and give `steps` (step names), `step_for(sig)` (a signature's step),
    `steady()` (prepare(None)'s set), `regions()` and `parts` (attribute names of parts closed with the session)."""

    steps: tuple = ()
    guard = None                    # a context for warm-up steps (Step-Audio 2: a throw-away generator)
    rng = None                      # stock.OwnGenerator where a step draws (Step-Audio 2): captures hold its lock

    def __init__(self, model, capture: str, arena_backend: str):
        if capture not in ("ahead", "inline"):
            raise InputError(f"capture: expected 'ahead' or 'inline', got {shown(capture)}")
        self.inline = capture == "inline"
        if self.inline:
            self.capabilities = dataclasses.replace(self.capabilities, concurrent=False)
        self.t2w, self.prompt = model.t2w, model.prompt
        self.device, self.n_steps = torch.device(self.t2w.device), self.t2w.n_timesteps
        self.specs = {r.name: r for r in facts.regions(self.variant, self.prompt.mel_frames,
                                                       facts.stock_limits(self.t2w.flow))}
        self.arena = Arena(self.device, backend=arena_backend, name=self.variant)
        self.static: dict = {}          # static step inputs (token ids by call size; Step-Audio 2's DiT inputs)
        self.buffer: list[int] | None = None

    def finish(self, graphs, strict: bool, key) -> None:
        """Declare the flow regions (conformer last), allocate and map every bounded region (so no step maps memory,
        never inside a capture; a KeepAll region maps as it grows, in eager code), make the graph cache."""
        if graphs not in (None, True, False):
            raise InputError(f"graphs: expected None (on CUDA), True or False, got {shown(graphs)}")
        self.flow = FlowState(self.t2w, self.arena, self.specs, self.n_steps)
        self.arena.allocate()
        for name, region in self.arena.regions.items():
            if not isinstance(getattr(self.specs.get(name), "policy", None), KeepAll):
                self.arena.ensure(region.offset, region.nbytes)
        self.flow.attach()
        warmed = model_state(self.t2w).setdefault("warmed", {}).setdefault(key, WarmSet())
        self.graphs = GraphCache(self.device, enabled=graphs, strict=strict, arena=self.arena, warmup=1, warmed=warmed,
                                 warm_key=lambda sig: sig.step, lock=model_lock(self.t2w), inline=self.inline)

    def token_buffer(self, n: int, tokens=None) -> torch.Tensor:
        """The static int32 [1, n] token input of n-token calls; `tokens` (n ints) are copied into it first.
        Made and written in inference mode always (a capture inside inference mode and an update outside it
        would otherwise meet an inference tensor)."""
        with torch.inference_mode():
            if n not in self.static:
                self.static[n] = torch.zeros((1, n), dtype=torch.int32, device=self.device)
            if tokens is not None:
                self.static[n].copy_(torch.tensor([tokens], dtype=torch.int32))
        return self.static[n]

    def prepare(self, signatures=None) -> dict:
        """Capture graphs ahead of time (GraphCache.capture: recorded, not run) without changing state or clocks:
        `signatures` (from `signatures()` / `clocks()`), or None for `steady()` (the module docstrings say what
        that is). A step family not yet warmed on this host thread (`graphs.needs_warmup`) first runs once eagerly
        on the session's state, which is put back afterwards. Returns the counters' change (zeros off CUDA). Raises
        InputError for anything but Signatures of this session's steps."""
        self.check_open("prepare")
        steady, graphs = self.steady(), self.graphs
        sigs = steady if signatures is None else check_signatures(signatures)
        for sig in sigs:
            self.check_step(sig, steady)
        before = {k: getattr(graphs.stats, k) for k in SessionStats.COUNTERS}
        held = self.rng.held() if self.rng is not None and graphs.enabled else contextlib.nullcontext()
        with held, gate.work():
            for sig in sigs if graphs.enabled else ():
                if sig in graphs.entries:
                    continue
                if graphs.needs_warmup(sig):
                    with torch.inference_mode():
                        saved = {k: v.clone() for k, v in self.regions().items()}
                    try:
                        with self.guard() if self.guard else torch.inference_mode():
                            graphs.run(sig, self.step_for(sig))
                    finally:
                        with torch.inference_mode():
                            for k, v in self.regions().items():
                                v.copy_(saved[k])
                graphs.capture(sig, self.step_for(sig))
        return {k: getattr(graphs.stats, k) - before[k] for k in SessionStats.COUNTERS}

    def check_step(self, sig: Signature, steady: list) -> None:
        """Refuse a Signature no step of this session can have (InputError naming `signatures`, before anything
        runs): a step it does not run; other region or exact names than its clocks give that step (`steady`
        holds one of each); a size outside the step's range or a length that is not an int in [least, bound]
        (`step_bounds()`, the regions' declared bounds; least: a Fixed region's length, else the length a turn
        starts from, such as the voice's P mel frames); an exact value of another kind than the clocks give
        (a bool, an int, a tuple of ints, or None where they give a tuple)."""
        like = next((s for s in steady if s.step == sig.step), None)
        if sig.step not in self.steps or like is None:
            raise InputError(f"signatures: expected Signatures of steps {self.steps}, got {sig!r}")
        bound = {**{k: spec.policy.bound() for k, spec in self.specs.items()}, **self.step_bounds()}
        least = {k: spec.policy.length if isinstance(spec.policy, Fixed) else spec.initial
                 for k, spec in self.specs.items()}
        ok = ([k for k, _ in sig.lengths] == [k for k, _ in like.lengths]
              and [k for k, _ in sig.exact] == [k for k, _ in like.exact]
              and _whole(sig.size) and sig.size in bound[sig.step]
              and all(_whole(v, bound.get(k)) and v >= least.get(k, 0) for k, v in sig.lengths)
              and all(_same_kind(v, w) for (_, v), (_, w) in zip(sig.exact, like.exact))
              and sig.get("n_timesteps", self.n_steps) == self.n_steps)
        if not ok:
            raise InputError(f"signatures: {sig!r} is not a step of this session (e.g. {like!r})")

    def step_bounds(self) -> dict:
        """What the regions' specs do not bound: each step's sizes (a range) and the host-offset regions' bounds."""
        return {}

    def state(self) -> dict:
        """Region views (stock names, the logical contents), the host clocks and the token buffer."""
        self.check_open("state")
        return {**self.regions(), "clocks": self.clock.host(), "buffer": None if self.buffer is None else list(self.buffer)}

    def stats(self) -> SessionStats:
        self.check_open("stats")
        return SessionStats.of(units=self.units, graphs=self.graphs, arena=self.arena, arena_backend=self.arena.backend)

    def close(self) -> None:
        """Drop the graphs, every part's state and the arena now (the shared model stays)."""
        if self.closed:
            return
        with gate.device_wide():
            gate.synchronize(self.device)
            self.graphs.drop()
            for name in self.parts:
                getattr(self, name).close()
            self.arena.close()
            self.flow = self.graphs = self.arena = None
            self.static.clear()
        self.closed = True
