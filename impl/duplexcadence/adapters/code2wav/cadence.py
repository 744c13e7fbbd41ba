"""DuplexCadence sessions for Qwen3-Omni Code2Wav: the stock forward on arena views, one graph per window.

* "cadence": the left context lives in an arena region at a stable address; the forward runs on an arena
  view of exactly the window's shape (contiguous [1, 16, T], torch.cat's strides); on CUDA each window
  `Signature` (schedule.Turn) is captured ahead (`prepare`) and replayed, never padded; on CPU the same code
  runs eagerly. Byte-identical to the stock session.
* "cadence_seamless" (opt-in, NOT bit-exact): keeps 555 more samples at the head of every call with left
  context (`wav[..., ctx * 1920 - 555:]`), refilling the previous call's missing tail: the slice newer
  vllm-omni keeps (qwen3_omni_code2wav.py @7374175, @02952af, `start = left_context * total_upsample -
  tail`). A turn then has 1920*F - 555 samples like one whole call; from sample 555 on, each call's bytes
  are the stock call's.

The mask. `Qwen3OmniMoeCode2WavTransformerModel.forward` (L3596-3612) builds it with
`create_sliding_window_causal_mask`, whose eager path syncs on the device (masking_utils.py L755) and which,
while a stream captures, takes its `is_tracing` branches (import_utils.py L1812): a materialised mask where
eager has None, so SDPA would run another kernel. So the builders run per window length outside any graph
with the stock forward's arguments (`PreparedMasks`), and the pre-transformer receives the mapping as its
`attention_mask` ("It may already have been prepared", L3596) through `bind`, for an eager step or a capture
only and under the model's lock: no other session's call sees it. Windows up to 72 frames (the sliding
window) get None masks, as in eager. A replay runs none of this Python and takes no lock.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from duplexcadence import bind, clocks, gate, graphs, upstream
from duplexcadence.adapters.code2wav.schedule import NUM_QUANTIZERS, SAMPLES_PER_FRAME, UNIT, Call, Turn, window
from duplexcadence.adapters.code2wav.stock import CAPABILITIES, parse_codes
from duplexcadence.arena import Arena
from duplexcadence.errors import InputError
from duplexcadence.graphs import GraphCache, WarmSet
from duplexcadence.payload import check_signatures, shown
from duplexcadence.runtime import model_lock, model_state
from duplexcadence.session import Capabilities, Session, SessionStats, check_final, host_waveform, unit_output


class PreparedMasks:
    """One session's pre-transformer mask mapping per window length, from the stock builders outside any graph
    with the stock forward's arguments (L3590-3612: embeds [1, T, hidden], no mask or cache, arange(T))."""

    def __init__(self, model):
        self.model, self.lock = model, model_lock(model)
        self.by_length: dict[int, dict] = {}

    def mapping(self, frames: int) -> dict:
        if frames not in self.by_length:
            _, hf = upstream.qwen3_omni()
            pt, weight = self.model.pre_transformer, self.model.code_embedding.weight
            kwargs = {"config": pt.config, "attention_mask": None, "past_key_values": None,
                      "inputs_embeds": torch.zeros(1, frames, pt.config.hidden_size, dtype=weight.dtype,
                                                   device=weight.device),
                      "position_ids": torch.arange(frames, device=weight.device).unsqueeze(0)}
            mapping = {"full_attention": hf.create_causal_mask(**kwargs)}
            if pt.has_sliding_layers:
                mapping["sliding_attention"] = hf.create_sliding_window_causal_mask(**kwargs)
            self.by_length[frames] = mapping
        return self.by_length[frames]

    @contextlib.contextmanager
    def installed(self, frames: int):
        """Inside: the shared pre-transformer's `forward` takes this mapping (bind.attr), under the model lock."""
        pt = self.model.pre_transformer
        forward = functools.partial(type(pt).forward, pt, attention_mask=self.mapping(frames))
        with bind.bound(bind.attr(pt, "forward", forward), lock=self.lock):
            yield


class CadenceSession(Session):
    """The stock forward on arena views: context in "codes.context" [16, C], the window assembled in
    "codes.window" [1, 16, ctx + new] from it and "io.new", kept float32 samples in "io.wave"; after each call
    the newest min(ctx + new, C) frames are copied into the context. seamless: module docstring. spec:
    left_context, initial_frames, capture ("ahead": graphs only from `prepare`, an uncaptured window runs
    eagerly and is counted; "inline": capture on first use), graphs (bool; default CUDA), arena_backend."""

    capabilities = Capabilities(graphs=True, **CAPABILITIES)

    def __init__(self, model, spec: dict | None = None, *, seamless: bool = False):
        spec = spec or {}
        graphs.check_options(spec.get("graphs"))
        if spec.get("capture", "ahead") not in ("ahead", "inline"):
            raise InputError(f"spec['capture']: expected 'ahead' or 'inline', got {shown(spec['capture'])}")
        self.model, self.device = model, next(model.parameters()).device
        self._clock = Turn(spec, seamless, max_frames=model.config.max_position_embeddings)
        c, most = self._clock.left_context, UNIT.policy.bound()
        default_backend = "cpu" if self.device.type == "cpu" else "prealloc"   # a few KiB: exact prealloc
        self.arena = Arena(self.device, backend=spec.get("arena_backend", default_backend), name="code2wav")
        self.arena.declare("codes.context", (NUM_QUANTIZERS, c), torch.int64)
        self.arena.declare("codes.window", (1, NUM_QUANTIZERS, c + most), torch.int64)
        self.arena.declare("io.new", (NUM_QUANTIZERS, most), torch.int64)
        self.arena.declare("io.wave", (1, 1, most * SAMPLES_PER_FRAME), torch.float32)
        with gate.work():
            self.arena.allocate()
            self.graphs = GraphCache(self.device, arena=self.arena, enabled=spec.get("graphs"), warmup=1,
                                     inline=spec.get("capture") == "inline", lock=model_lock(model),
                                     warmed=model_state(model).setdefault("code2wav.warmed", WarmSet()))
            self.masks = PreparedMasks(model)
            self._host = torch.empty(NUM_QUANTIZERS * most, dtype=torch.int64, pin_memory=self.device.type == "cuda")
        self.graph_bytes: dict = {}           # signature -> pool bytes its capture took
        self.calls_per_phase: dict[str, int] = {}

    def region(self, name: str, shape) -> torch.Tensor:
        return self.arena[name].view(shape)

    def start_turn(self) -> None:
        """A new turn: the left context is cleared (zeroed; the clock says it holds 0 frames)."""
        self.check_open("start_turn")
        self._clock.start_turn()
        with gate.work():
            self.region("codes.context", (NUM_QUANTIZERS, self._clock.left_context)).zero_()

    def clocks(self) -> Turn:
        self.check_open("clocks")
        return self._clock.copy()

    # -- the step: stock forward on arena views (capturable; reads context + io.new only) -------------
    def _step(self, sig):
        ctx, keep, shape = sig.get("context"), sig.get("keep"), window(sig)
        self.masks.mapping(shape[-1])                          # built here, outside any capture

        def step():
            with self.masks.installed(shape[-1]), torch.inference_mode():
                win = self.region("codes.window", shape)
                win[0, :, :ctx].copy_(self.region("codes.context", (NUM_QUANTIZERS, ctx)))
                win[0, :, ctx:].copy_(self.region("io.new", (NUM_QUANTIZERS, sig.size)))
                wav = self.model(win)
                out = self.region("io.wave", (1, 1, wav.shape[-1] - keep))
                out.copy_(wav[..., keep:])     # bf16 -> float32, exact: the same values as stock's .float()
            return out
        return step

    def speak(self, payload, *, final: bool = False):
        """One SPEAK unit, byte-identical to the stock session (default) over the same schedule. Raises
        InputError (bad codes, no open turn; LimitError past 13 frames) before anything changes."""
        self.check_open("speak")
        final = check_final(final)
        codes = parse_codes(payload)
        clock = self._clock.copy()
        with clocks.argument("codes"):
            calls = clock.calls(int(codes.shape[1]), final)
        waves, info = [], []
        with gate.work():
            for k, call in enumerate(calls):
                sig = clock.signature(call)
                host = self._host[:NUM_QUANTIZERS * call.new].view(NUM_QUANTIZERS, call.new)
                host.copy_(codes[:, call.offset:call.offset + call.new])       # the call's one H2D copy
                self.region("io.new", (NUM_QUANTIZERS, call.new)).copy_(host, non_blocking=host.is_pinned())
                waves.append(host_waveform(self.graphs.run(sig, self._step(sig))))
                info.append(self._clock.info(call, waves[-1].size))
                if not (final and k == len(calls) - 1):           # context <- the newest frames of the window
                    kept = min(call.ctx + call.new, clock.left_context)
                    self.region("codes.context", (NUM_QUANTIZERS, kept)).copy_(
                        self.region("codes.window", window(sig))[0, :, call.ctx + call.new - kept:])
                self.calls_per_phase[call.phase] = self.calls_per_phase.get(call.phase, 0) + 1
        self._clock = clock
        return unit_output(waves, frames=int(codes.shape[1]), calls=info)

    def prepare(self, signatures=None) -> dict:
        """Capture window signatures ahead, changing neither context nor clocks (a step writes only the window
        and io.wave). None: every window of a turn of 12- and 13-frame units (Turn.turn_signatures: 11 at
        C = 25, initial 4); a shorter final unit's once its payload is known (`signatures(n, final=True)`).
        A window's first capture on a host thread follows one eager warm-up run there. Pool bytes per signature:
        stats().detail. Returns the counters' change; no-op on CPU. Raises InputError for a signature the
        session's schedule cannot run."""
        self.check_open("prepare")
        before = self.stats()
        sigs = self._clock.turn_signatures() if signatures is None else sorted(set(check_signatures(signatures)))
        for sig in sigs:
            ctx = sig.get("context")
            if (sig.step != "window" or not isinstance(ctx, int) or not 0 <= ctx <= self._clock.left_context
                    or not 1 <= sig.size <= UNIT.policy.bound()
                    or sig != self._clock.signature(Call("", ctx, sig.size, 0))):
                raise InputError(f"signatures: {sig!r} is not a window of this session's schedule")
        with gate.work():
            for sig in sigs if self.graphs.enabled else ():
                pool = self.graphs.pool_bytes
                if not self.graphs.capture(sig, self._step(sig)) and sig not in self.graphs.eager_only:
                    self.graphs.run(sig, self._step(sig))           # warm-up: writes the window and io.wave only
                    self.graphs.capture(sig, self._step(sig))
                if sig in self.graphs:
                    self.graph_bytes.setdefault(sig, self.graphs.pool_bytes - pool)
        after = self.stats()
        return {k: getattr(after, k) - getattr(before, k) for k in (*SessionStats.COUNTERS, "graphs", "graph_bytes")}

    def state(self) -> dict:
        """The left context region (int64 [16, ctx], an arena view) and the host clocks."""
        self.check_open("state")
        ctx = self._clock.ctx or 0
        return {"codes": self.region("codes.context", (NUM_QUANTIZERS, ctx)), "ctx": self._clock.ctx,
                "frames": self._clock.frames, "units": self._clock.units, "turn": self._clock.turn}

    def stats(self) -> SessionStats:
        self.check_open("stats")
        return SessionStats.of(units=self._clock.units, graphs=self.graphs, arena=self.arena,
                               mode="cadence_seamless" if self._clock.seamless else "cadence",
                               arena_backend=self.arena.backend, calls_per_phase=dict(self.calls_per_phase),
                               graph_bytes_per_signature={repr(s): b for s, b in self.graph_bytes.items()})

    def close(self) -> None:
        """Free the graphs, the arena, the masks and the pinned staging buffer now."""
        if not self.closed:
            with gate.device_wide():
                self.graphs.drop()
                self.arena.close()
                self.graphs, self.masks, self._host, self.graph_bytes = None, None, None, {}
        super().close()

