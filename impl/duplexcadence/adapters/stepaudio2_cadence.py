"""DuplexCadence session for Step-Audio 2 mini's tail: a conformer cache that grows every call, held at a
stable address; the same stock kernels as `stepaudio2.StockSession`, bit for bit.

Built on `flow_hift_cadence.CadenceSession` (subclass): its arena views, the stock CFM/DiT module buffers
pointed at the arena for the length of a step and of the session's set-up (`_bound`; so a cadence-only
process frees the stock 16-step buffers, `flow_hift.for_mode`), the device-resident timestep table and the
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
`graphs=True` (or "dit") captures only the DiT/CFM segment (`decoder.forward_chunk`: shape-invariant once
the DiT cache has reached P + 100, RNG-free: its noise is the construction-time `rand_noise` table) keyed by
(mel frames, DiT cache length), with its inputs copied into static buffers; the encoder and the vocoder
stay eager.

`graphs="dit+hift"` (opt-in) also captures the HiFT vocoder call (`HiFTGenerator.forward`, hifigan.py
L237-249: f0 predictor, the NSF source module with its random draws, `decode` L203-232) up to decode's
`_istft` call (L233), one graph per exact signature ("hift", T, lm, ls, lsn): T = mel frames into the
HiFT (lm cached + the chunk's), lm = cached mel frames (0 or 8), ls = cached source samples (0 or 3840),
lsn = source samples kept for the next call (min(3840, 480 T)). Per call:

* eager, before the graph: the HiFT's mel input (stock: `concat(cache mel, chunk mel)`, t2w L147) is
  written into the static arena buffer `hift_in_mel`, viewed contiguous [1, 80, T] as the stock concat is;
  cache_source is the arena's own `hift_source` region (a static address; stock passes its `.clone()`,
  same bytes);
* in the graph: `hift(mel_in, cache_source)` with the instance attribute `hift._istft` patched for the
  step to hand back decode's (magnitude, phase) [1, 9, 120 T + 1] and return a placeholder (the step
  ends there; decode's clamp of the placeholder is discarded). magnitude, phase and the source's last
  lsn samples are written into arena regions (`hift_out_mag`, `hift_out_phase`, `hift_out_source`, same
  sizes and strides as stock's tensors): they are read after the replay, and all graphs of a session
  share one memory pool, so nothing that outlives the replay is left in the pool;
* eager, after the graph: the stock `hift._istft` (torch.istft's NOLA check syncs the host, so it cannot
  be captured), decode's clamp (hifigan.py L234, one line of glue), the cross-fade (t2w L152-153) and the
  cache updates (L156-160) from the arena outputs.

Two host-to-device copies inside the HiFT call would block capture: `stft_window.to(x.device)` in `_stft`
(hifigan.py L190; `stft_window` is a plain CPU attribute, not a buffer) and
`torch.FloatTensor([[range(1, harmonic_num + 2)]]).to(f0.device)` in `SineGen2.forward` (layers.py L366).
Both are constants: during the step `_DeviceConstants` (a TorchFunctionMode) answers `Tensor.to` of a
small CPU tensor to another device with one device copy per distinct (dtype, shape, bytes, arguments),
made eagerly the first time (each signature's first call runs eagerly: GraphCache warmup=1), same bytes
as stock's fresh copy. A miss during capture raises (the capture fails and that signature stays eager,
counted in `capture_failures`).

Random draws: SineGen2 draws `torch.rand(..., device=f0.device)` (layers.py L314) and
`torch.randn_like(sine_waves)` (L378), SourceModuleHnNSF2 `torch.randn_like(uv)` (L432): all on the
default generator of the HiFT's device (the CUDA default generator on the GPU; nothing on the CPU
generator is drawn and copied over), so all of them can be inside the graph. Why replay consumes the
generator exactly as eager does (read in the torch 2.13 headers installed here, ATen/cuda/
CUDAGeneratorImpl.h and CUDAGraph.h, and pytorch/pytorch aten/src/ATen/cuda/CUDAGraph.cpp
`CUDAGraph::replay`): Note [CUDA Graph-safe RNG states] (CUDAGeneratorImpl.h L22-61) -- "A CUDA graph
containing multiple RNG ops behaves like a single giant kernel from the perspective of ops external to
the graph": during capture every RNG kernel's PhiloxCudaState (`philox_cuda_state(increment)`, L178)
holds a pointer to a device tensor with the initial offset plus an intra-graph offset that starts at 0
when capture begins and grows by the same per-kernel increment eager adds to the generator; at capture
end the total becomes the graph's whole-graph increment (`CUDAGeneratorState::capture_epilogue`, L143),
and the generator state is registered with the graph (`register_generator_state`, CUDAGraph.h L69-70;
`captured_generator_states_`, L132-135; `CUDAGraph::capture_begin`: "default generator is always
registered", the current device's). Every `CUDAGraph::replay()` first calls
`replay_prologue(capture id, wholegraph_increment)` (CUDAGeneratorImpl.h L144) on each registered state:
it fills the seed/offset tensors with the generator's current seed and offset, then advances the offset
by the whole-graph total. So kernel k of a replay draws at (current offset +
increments of kernels 0..k-1), eager's offset, and after the replay the generator sits where eager leaves
it; the note: "graphed execution is bitwise identical to eager execution as long as RNG ops are enqueued
from a single thread" (L58-61). Capture itself launches nothing and does not move the offset; GraphCache
replays right after capturing, so capture + replay = one eager call, and a signature's first call runs
eagerly (warmup=1). The GPU check (suite/gpu/stepaudio2_check.py) records the offset after every unit.

On the CPU (tests) "dit+hift" runs the same routing eagerly (GraphCache disabled): static input copies,
the patched `_istft`, arena outputs, eager istft; the same bytes and generator state as stock.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from duplexcadence.adapters import flow_hift as fh
from duplexcadence.adapters import stepaudio2 as sa
from duplexcadence.adapters.flow_hift_cadence import CadenceSession as _FlowCadence
from duplexcadence.adapters.flow_hift_cadence import PREPARE_SEED, _DeviceTimestepTable, flow_layout
from duplexcadence.arena import Arena
from duplexcadence.clocks import ClockError
from duplexcadence.graphs import GraphCache
from duplexcadence.errors import InputError
from duplexcadence.session import UnitOutput

GRAPH_MODES = {False: None, None: None, True: "dit", "dit": "dit", "dit+hift": "dit+hift"}
#: The longest HiFT input: 8 cached mel frames + the longest call (a flush of 27 tokens: 54 frames).
HIFT_MAX_FRAMES = sa.MEL_CACHE_LEN + sa.MAX_ADVANCE      # 62


def _arg_key(value):
    """A hashable key for one `Tensor.to` argument; a tensor argument counts by its device and dtype only
    (`.to(other)` copies onto other's device and dtype; its values are never read: no sync)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.device), str(value.dtype))
    return repr(value)


class _DeviceConstants(TorchFunctionMode):
    """For one HiFT step: `Tensor.to` of a small CPU tensor onto another device returns one cached device
    copy per distinct (dtype, shape, bytes, arguments) instead of a fresh host-to-device copy.

    cache: dict kept by the session (the copies must outlive the step: graphs read them at replay).
    Used for `stft_window.to(x.device)` (hifigan.py L190) and the harmonic multipliers
    `torch.FloatTensor([[1..9]]).to(f0.device)` (layers.py L366): constants, so the cached copy has the
    bytes stock's fresh copy has. Tensors over `max_numel` elements, CPU->CPU and other calls pass through.
    Raises RuntimeError on a miss while the current CUDA stream is capturing (the copy would sync).
    """

    def __init__(self, cache: dict, max_numel: int = 4096):
        super().__init__()
        self.cache = cache
        self.max_numel = max_numel

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        src = args[0] if args else None
        if func is not torch.Tensor.to or not isinstance(src, torch.Tensor) or src.device.type != "cpu" \
                or src.numel() > self.max_numel or src.requires_grad:
            return func(*args, **kwargs)
        key = (src.dtype, tuple(src.shape), src.detach().contiguous().reshape(-1).view(torch.uint8)
               .numpy().tobytes(), tuple(_arg_key(a) for a in args[1:]),
               tuple(sorted((k, _arg_key(v)) for k, v in kwargs.items())))
        out = self.cache.get(key)
        if out is not None:
            return out
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"_DeviceConstants: a host-to-device copy of {tuple(src.shape)} {src.dtype} "
                               f"was first seen during capture (it would sync); run the step eagerly once")
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.device != src.device:
            self.cache[key] = out
        return out


def _check_calls(calls) -> None:
    """Refuse a flush call of 1 token (InputError), before any state changes: upstream's pre-lookahead
    layer then returns a conformer conv cache 5 frames wide where every call expects 6 (the assertion
    `cnn_cache.shape[2] == 2 + up_layer.stride * 2`, stepaudio2 cosyvoice2/transformer/upsample_encoder_v2.py
    L425), so stock streams that call and fails on the session's next one; the fixed 6-frame conv-cache
    region here cannot hold it."""
    for c in calls:
        if len(c.tokens) == 1:
            raise InputError("tokens: the turn would end in a call of 1 token (expected 0 or >= 2 tokens left at "
                             "the final unit): upstream's conformer conv cache comes out 5 frames wide after it "
                             "and the next call fails (upsample_encoder_v2.py L425)")


class CadenceSession(_FlowCadence):
    """One Step-Audio 2 session on DuplexCadence (same contract as `stepaudio2.StockSession`).

    t2w: the `stepaudio2.StockToken2wav` shared with stock sessions (same weights and noise tables).
    rng_seed: seeds the default generators when the session opens, as the stock session does.
    graphs: False (default: eager); True or "dit": capture the DiT segment as CUDA graphs (CUDA only);
    "dit+hift": the DiT segment and the HiFT call up to its istft (module docstring; on the CPU the same
    routing runs eagerly). Raises ValueError for another value.
    arena_backend: "auto" (vmm on CUDA where supported, else prealloc; cpu on CPU) | "vmm" | "prealloc" | "cpu".
    Raises InputError for bad input and ClockError for a unit past the position table, both before any
    state changes. draws_default_generator: True, as stock (the same draws from the default generators).
    """

    #: What start_turn does to the state (duplex_session.turn_state): nothing; the caches carry over
    #: turns, as stock's.
    turn_state = "carried"

    draws_default_generator = True

    def __init__(self, t2w: sa.StockToken2wav, prompt: fh.Prompt, *, rng_seed: int = 0,
                 graphs: bool | str = False, strict: bool = False, arena_backend: str = "auto"):
        if not (graphs is None or isinstance(graphs, (bool, str))) or graphs not in GRAPH_MODES:
            raise ValueError(f"graphs: expected one of False, True, 'dit', 'dit+hift', got {graphs!r}")
        self.graph_mode = GRAPH_MODES[graphs]
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
        dit = flow.decoder.estimator
        self.n_token_layers, n_layers, depth, heads, dk2, dtype = flow_layout(flow)
        self.dtype = dtype

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
        hift = t2w.hift
        if self.graph_mode == "dit+hift":    # static HiFT input and outputs (flat; viewed per call)
            self._n_freq = hift.istft_params["n_fft"] // 2 + 1
            self._up = int(hift.m_source.l_sin_gen.upsample_scale)             # samples per mel frame (480)
            frames = HIFT_MAX_FRAMES * self._up // hift.istft_params["hop_len"] + 1   # STFT frames (center)
            a.declare("hift_in_mel", (80 * HIFT_MAX_FRAMES,), torch.float32)
            a.declare("hift_out_mag", (self._n_freq * frames,), torch.float32)
            a.declare("hift_out_phase", (self._n_freq * frames,), torch.float32)
            a.declare("hift_out_source", (1, 1, sa.SOURCE_CACHE_LEN), torch.float32)
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
        if self.graph_mode == "dit+hift":
            self._hift_in = a["hift_in_mel"].view((a["hift_in_mel"].capacity,))
            self._hift_mag = a["hift_out_mag"].view((a["hift_out_mag"].capacity,))
            self._hift_phase = a["hift_out_phase"].view((a["hift_out_phase"].capacity,))
            self._hift_src_out = a["hift_out_source"].view((1, 1, sa.SOURCE_CACHE_LEN))
            self._constants: dict = {}
        self._timestep = _DeviceTimestepTable()
        self._timestep(torch.zeros(2, device=self.device, dtype=dtype), dit.t_embedder.frequency_embedding_size)
        # The stock set-up, once per session (t2w L102-115; ex L46), run with the stock CFM/DiT buffers bound
        # to this session's arena views (`_bound`), as MiniCPM-o's voice_base: the set-up's DiT KV lands in
        # the arena directly, and a cadence-only process can free the stock 16-step buffers
        # (flow_hift.for_mode). The fresh conformer caches are copied into the arena.
        with self._bound():
            t2w.set_stream_cache(prompt.key)
        base = t2w.stream_cache
        with torch.inference_mode():
            self.conformer_view(self.P).copy_(base["conformer_att_cache"])
            for name, dst in (("estimator_att_cache", self.estimator_view(self.P)),
                              ("estimator_cnn_cache", self._est_cnn)):
                src = base[name][: self.n_steps]
                if src.data_ptr() != dst.data_ptr() or src.stride() != dst.stride():
                    dst.copy_(src)             # the set-up wrote elsewhere: copy (else it is already here)
            self._conf_cnn.copy_(base["conformer_cnn_cache"])
        if base["conformer_att_cache"].shape[3] != self.P or base["estimator_att_cache"].shape[4] != self.P:
            raise RuntimeError(f"set-up caches: expected {self.P} frames, got "
                               f"{tuple(base['conformer_att_cache'].shape)} / "
                               f"{tuple(base['estimator_att_cache'].shape)}")
        del base
        t2w.stream_cache = None                        # the stock instance holds nothing of this session
        self.len_conf = self.len_est = self.P          # host clocks (mel frames)
        self.hift_len = {"mel": 0, "source": 0, "speech": 0}   # host lengths of the HiFT regions
        enabled = self.graph_mode == "dit" or (self.graph_mode == "dit+hift" and self.device.type == "cuda")
        self.graphs = GraphCache(self.device, enabled=enabled, strict=strict, arena=a, warmup=1)
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
        out.update(graph_mode=self.graph_mode, arena_backend=self.arena.backend,
                   arena_fallback=self.arena.fallback,
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
        self._hift_in = self._hift_mag = self._hift_phase = self._hift_src_out = None
        self.__dict__.pop("_constants", None)
        vmm, self.arena._block = self.arena._vmm, None
        if vmm is not None:
            vmm.close()
        self.buffer = None
        self.closed = True

    def prepare(self, turns: int = 0, units: int = 0) -> dict:
        """Not available here: the MiniCPM-o session's synthetic turns are undone by its start_turn, but
        Step-Audio 2's caches carry over between turns (nothing restores them), so synthetic turns would
        change every later unit (and the inherited prepare() cleared the host clocks); `rehearse` runs the
        real turn shapes and restores a snapshot instead. Raises InputError, the session unchanged."""
        raise InputError("prepare: Step-Audio 2 sessions have no synthetic warm-up turns (their caches carry "
                         "over between turns, so a synthetic turn would change every later unit)")

    def rehearse(self, turns, *, freeze: bool = False, passes: int = 2) -> dict:
        """Capture the graphs the given turns will need, before the live cadence, and leave the session
        exactly as it was (state, clocks and the default generators).

        turns: the turns the session will speak next, in order, each a sequence of token counts per SPEAK
        unit, the last one final (e.g. the session script's turns, `suite.duplex_session.script_turns`).
        Unlike MiniCPM-o's rehearsal they run in order from the current state: the DiT signature holds the
        estimator cache length, which depends on every earlier call, since Step-Audio 2's caches carry
        over turns (upstream never resets them). Before the first pass the session's regions (state_tensors,
        cloned: at most the arena's mapped bytes again, freed on return), host clocks, open-turn buffer and
        the CPU and device default generators are saved; after every pass they are put back in place (the
        same addresses: captured graphs stay valid), so nothing of the rehearsal reaches a real unit. A pass
        that still ran first-occurrence (warm-up) calls is followed by another, up to `passes`. The arena
        keeps the pages the rehearsal mapped (the demand the same turns reach live). freeze: then close
        the graph set (a later new signature runs eagerly, counted as an eager fallback). Token ids come
        from a fixed seeded sequence (shapes depend on counts only).
        Returns the graph counters' change, the turns run and whether the set is frozen. Raises ValueError
        for bad turns (not a sequence of sequences of ints in [0, MAX_UNIT_TOKENS], or a call `speak` would
        refuse: a 1-token flush, a call after a first flush of 2-3 tokens), passes or freeze and InputError
        while a turn is open or after close(), before anything runs; ClockError when a turn passes the position table (the session
        restored first; graphs captured before it are kept)."""
        bad = ValueError(f"turns: expected a non-empty sequence of non-empty token-count sequences (ints in "
                         f"[0, {sa.MAX_UNIT_TOKENS}] per unit, no call `speak` would refuse: a 1-token flush, a "
                         f"call after a first flush of 2-3 tokens), got {turns!r}")
        try:
            shapes = [tuple(t) for t in turns] if not isinstance(turns, (str, bytes)) else None
        except TypeError:
            raise bad from None
        if not shapes or any(not t or any(
                isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= sa.MAX_UNIT_TOKENS
                for n in t) for t in shapes):
            raise bad
        speech = self.hift_len["speech"]      # the calls every turn will make (same plan and checks as speak)
        for counts in shapes:
            buf = []
            for k, n in enumerate(counts):
                calls, buf = sa.plan_calls(buf, [0] * int(n), k == len(counts) - 1)
                for c in calls:
                    if len(c.tokens) == 1 or 0 < speech < sa.SOURCE_CACHE_LEN:
                        raise bad
                    speech = sa.SOURCE_CACHE_LEN if speech else \
                        min(sa.SOURCE_CACHE_LEN, sa.mel_advance(len(c.tokens), c.last_chunk) * sa.HOP_SAMPLES)
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"passes: expected an int >= 1, got {passes!r}")
        if not isinstance(freeze, (bool, np.bool_)):
            raise ValueError(f"freeze: expected a bool, got {freeze!r} ({type(freeze).__name__})")
        if self.closed:
            raise InputError("rehearse: the session is closed")
        if self.buffer is not None:
            raise InputError("rehearse: a turn is open (rehearse before start_turn or after a final unit)")
        saved = self._snapshot()
        gen = torch.Generator().manual_seed(PREPARE_SEED)
        total = None
        try:
            for _ in range(passes):
                before = self.graphs.stats.snapshot()
                try:
                    for counts in shapes:
                        self.start_turn()
                        for k, n in enumerate(counts):
                            self.speak(torch.randint(0, fh.VOCAB_SIZE, (int(n),), generator=gen).tolist(),
                                       final=k == len(counts) - 1)
                finally:
                    self._restore(saved)
                after = self.graphs.stats.snapshot()
                delta = {k: after[k] - before[k] for k in ("captures", "replays", "eager_runs", "warmup_runs",
                                                           "eager_fallbacks", "capture_failures")}
                total = delta if total is None else {k: total[k] + delta[k] for k in delta}
                if not delta["warmup_runs"]:
                    break
        finally:
            del saved
        if freeze:
            self.graphs.close()
        total["turns"] = [list(t) for t in shapes]
        total["frozen"] = self.graphs.closed
        return total

    def _snapshot(self) -> dict:
        """Everything a unit reads and changes: region contents (clones), host clocks, the turn buffer,
        counters and the default generators (CPU and this device's)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        with torch.inference_mode():
            regions = {k: v.clone() for k, v in self.state_tensors().items()}
        return {"regions": regions, "len_conf": self.len_conf, "len_est": self.len_est,
                "hift_len": dict(self.hift_len), "buffer": None if self.buffer is None else list(self.buffer),
                "turn": self.turn, "calls_made": self.calls_made, "rng_cpu": torch.get_rng_state(),
                "rng_dev": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None}

    def _restore(self, saved: dict) -> None:
        """Put a `_snapshot` back, in place (the regions keep their addresses)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.len_conf, self.len_est = saved["len_conf"], saved["len_est"]
        self.hift_len = dict(saved["hift_len"])
        self.buffer = None if saved["buffer"] is None else list(saved["buffer"])
        self.turn, self.calls_made = saved["turn"], saved["calls_made"]
        with torch.inference_mode():
            for k, v in self.state_tensors().items():
                v.copy_(saved["regions"][k])
        torch.set_rng_state(saved["rng_cpu"])
        if saved["rng_dev"] is not None:
            torch.cuda.set_rng_state(saved["rng_dev"], self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def concurrent(self) -> bool:
        """False: every call patches the shared CFM's forward_chunk and binds its buffers (`_bound`)."""
        return False

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

        Raises InputError (bad tokens, no open turn, a turn that would end in a 1-token call: see
        `_check_calls`; a call after a first flush of 2-3 tokens: see `_check_fade`) or ClockError (a call
        of this unit would read conformer positions past the position table: region 'conformer_att',
        bound, value) before any state changes."""
        if self.buffer is None:
            raise InputError("speak: no open turn (call start_turn first; a finalised turn is closed)")
        final = fh.check_final(final)
        tokens = sa.check_unit_tokens(tokens)
        calls, rest = sa.plan_calls(self.buffer, tokens, final)
        _check_calls(calls)
        self._check_fade(calls)
        self._check_bounds(calls)
        waves = [self._call(c.tokens, c.last_chunk) for c in calls]
        self.buffer = None if final else rest
        wave = np.concatenate(waves) if waves else np.zeros(0, np.float32)
        return UnitOutput(wave.astype(np.float32, copy=False), fh.to_pcm16(wave),
                          {"calls": [len(c.tokens) for c in calls]})

    def _check_fade(self, calls) -> None:
        """InputError before any change when a call would cross-fade over a cached speech tail shorter than
        the fade (3840 samples): after a session whose first vocoder call was a flush of 2 or 3 tokens
        (1920 / 2880 samples), upstream's fade (t2w L14-22) fails on the next call, in stock after its flow
        state has advanced; here the unit is refused and the session keeps its state (it cannot speak
        again, as stock cannot)."""
        lsp = self.hift_len["speech"]
        if calls and 0 < lsp < sa.SOURCE_CACHE_LEN:
            raise InputError(f"speak: the cached speech tail holds {lsp} samples, the cross-fade needs "
                             f"{sa.SOURCE_CACHE_LEN} (the session's first call was a flush of "
                             f"{lsp // (2 * sa.HOP_SAMPLES)} tokens); upstream's fade fails here too "
                             f"(token2wav.py L14-22), so this session cannot speak again")

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
        if not (self.graphs.enabled or self.graph_mode == "dit+hift"):
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
        if self.graph_mode == "dit+hift":
            return self._vocode_graphed(chunk_mel, last_chunk)
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

    # --- graphs="dit+hift": the HiFT call up to its istft as a graph --------------------------------
    def _vocode_graphed(self, chunk_mel: torch.Tensor, last_chunk: bool) -> torch.Tensor:
        """t2w L143-162 with `hift(mel, cache_source)` (hifigan.py L237-249) routed through the graph cache.

        chunk_mel: the flow's mel [1, 80, n] (n = 2(k-3) or 2k frames). Returns speech [1, S] float32 as
        stock's `vocode`. Raises RuntimeError if 8 + n exceeds HIFT_MAX_FRAMES (62; cannot happen for calls
        of <= 28 tokens) before the HiFT state changes (the flow's state has already advanced)."""
        t2w, hift = self.t2w, self.t2w.hift
        lm, ls, lsp = self.hift_len["mel"], self.hift_len["source"], self.hift_len["speech"]
        n = int(chunk_mel.shape[2])
        T = lm + n
        if T > HIFT_MAX_FRAMES:
            raise RuntimeError(f"HiFT input of {T} mel frames ({lm} cached + {n}): the arena's static buffer "
                               f"holds {HIFT_MAX_FRAMES}")
        lsn = min(sa.SOURCE_CACHE_LEN, T * self._up)
        with torch.inference_mode():
            mel_in = self._hift_in[: 80 * T].view(1, 80, T)        # contiguous, as stock's concat
            mel_in[:, :, :lm].copy_(self._hift_mel[..., :lm])
            mel_in[:, :, lm:].copy_(chunk_mel)
        sig = ("hift", T, lm, ls, lsn)
        mag, phase, src_tail = self.graphs.run(sig, lambda: self._hift_step(mel_in, ls, lsn))
        with torch.inference_mode():
            speech = hift._istft(mag, phase)                                    # stock, eager (L195-201)
            speech = torch.clamp(speech, -hift.audio_limit, hift.audio_limit)  # decode's last line (L234)
        if lsp > 0:
            speech = sa.fade_in_out(speech, self._hift_speech[..., :lsp], t2w.speech_window)
        with torch.inference_mode():
            lm, lsp = min(sa.MEL_CACHE_LEN, T), min(sa.SOURCE_CACHE_LEN, speech.shape[1])
            self._hift_mel[..., :lm].copy_(mel_in[..., T - lm:])
            self._hift_source[..., :lsn].copy_(src_tail)
            self._hift_speech[..., :lsp].copy_(speech[:, speech.shape[1] - lsp:])
        self.hift_len = {"mel": lm, "source": lsn, "speech": lsp}
        if not last_chunk:
            speech = speech[:, :-sa.SOURCE_CACHE_LEN]
        return speech

    def _hift_step(self, mel_in: torch.Tensor, ls: int, lsn: int):
        """The captured HiFT segment: `hift(mel_in, hift_source[..., :ls])` up to decode's `_istft` call.

        mel_in: the static input view [1, 80, T]; ls: cached source samples; lsn: source samples to keep.
        Reads arena views and the session's device constants; writes magnitude and phase [1, 9, 120 T + 1]
        (strides as stock's) and the source's last lsn samples [1, 1, lsn] into arena regions and returns
        those views. Host state after the step is as before (the `_istft` patch is removed; the constant
        cache only memoises). Raises RuntimeError if decode never reached `_istft` or a layout differs."""
        hift = self.t2w.hift
        seen = {}

        def istft_input(magnitude, phase):
            seen["out"] = (magnitude, phase)
            return magnitude.new_zeros(1, 1)        # discarded: the stock _istft runs eagerly after the step

        hift._istft = istft_input
        try:
            with _DeviceConstants(self._constants):
                _, source = hift(mel_in, self._hift_source[..., :ls])
        finally:
            del hift._istft
        if "out" not in seen:
            raise RuntimeError("HiFT decode did not reach _istft (hifigan.py L233)")
        outs = []
        for (t, flat) in zip(seen["out"], (self._hift_mag, self._hift_phase)):
            if not t.is_contiguous() or t.numel() > flat.numel():
                raise RuntimeError(f"HiFT istft input {tuple(t.shape)} strides {t.stride()}: expected a "
                                   f"contiguous tensor of <= {flat.numel()} elements")
            out = flat.as_strided(t.shape, t.stride())
            out.copy_(t)
            outs.append(out)
        src_tail = self._hift_src_out[..., :lsn]
        src_tail.copy_(source[:, :, source.shape[2] - lsn:])
        return outs[0], outs[1], src_tail
