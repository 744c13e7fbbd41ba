"""Step-Audio 2's HiFT call (t2w L143-162) on arena state, the stock `HiFTGenerator.forward` up to its istft as
one graphed step ("hift" Signature: plan.py).

Regions: the HiFT caches of t2w L156-160, the last 8 mel frames ``hift_mel`` [1, 80, 8], 3840 source samples
``hift_source`` [1, 1, 3840] and 3840 speech samples ``hift_speech`` [1, 3840] (host lengths, 0 before the
first call), the static HiFT input ``hift_in_mel`` (viewed contiguous [1, 80, T], as stock's concat) and the
step's outputs ``hift_out_mag`` / ``hift_out_phase`` [1, 9, 120 T + 1] and ``hift_out_source`` [1, 1, <= 3840]
(same sizes and strides as stock's tensors; read after the replay, so nothing that outlives it is left in the
session's graph pool). Per call:

* eager, before the step: `concat(cache mel, chunk mel)` (t2w L147) written into ``hift_in_mel``;
* the step: `hift(mel_in, cache_source)` (hifigan.py L237-249: F0 predictor, the NSF source with its random
  draws, `decode` L203-232) with the instance's `_istft` bound to a stand-in that hands back decode's
  (magnitude, phase) (the step ends there; decode's clamp of the placeholder is discarded);
* eager, after it: the stock `_istft` (torch.istft's NOLA check syncs; called as the class function), decode's
  clamp (L234), the cross-fade (t2w L152-153, build.fade_in_out) and the cache updates (L156-160).

Two host-to-device copies inside the call would block capture: `stft_window.to(x.device)` in `_stft`
(hifigan.py L190; a plain CPU attribute) and `torch.FloatTensor([[range(1, harmonic_num + 2)]]).to(f0.device)`
in `SineGen2.forward` (layers.py L366). Both are constants: during the step `DeviceConstants` answers
`Tensor.to` of a small CPU tensor onto another device with one device copy per distinct content and arguments,
kept per model (made by the step family's eager warm-up), the bytes of stock's fresh copy.

Random draws: SineGen2's `torch.rand(..., device=f0.device)` (layers.py L314) and `torch.randn_like` (L378),
SourceModuleHnNSF2's `torch.randn_like(uv)` (L432), all on the default generator of the HiFT's device (the
session swaps its own state in: stock.OwnGenerator). Replay consumes it exactly as eager does: a captured RNG
kernel reads the generator's seed and offset at replay and the graph advances the offset by the total of its
kernels' increments (ATen/cuda/CUDAGeneratorImpl.h Note [CUDA Graph-safe RNG states] L22-61,
`replay_prologue` L144; CUDAGraph.cpp `CUDAGraph::replay`; "graphed execution is bitwise identical to eager
execution as long as RNG ops are enqueued from a single thread"); capture itself draws nothing.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from duplexcadence import bind
from duplexcadence.runtime import model_lock, model_state

from duplexcadence.adapters.flow_hift import facts
from duplexcadence.adapters.flow_hift.build import fade_in_out

#: The longest HiFT input: 8 cached mel frames + the longest call (a flush of 27 tokens: 54 frames).
MAX_FRAMES = facts.MEL_CACHE_LEN + facts.VARIANT["stepaudio2"].max_advance


def _arg_key(value):
    """One `Tensor.to` argument as a key; a tensor argument by device and dtype only (its values are not read)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.device), str(value.dtype))
    return repr(value)


class DeviceConstants(TorchFunctionMode):
    """`Tensor.to` of a CPU tensor of <= `max_numel` elements onto another device returns one cached device copy
    per distinct (dtype, shape, bytes, arguments); other calls pass through. Raises RuntimeError on a miss while
    the current CUDA stream captures (the copy would sync): run the step eagerly once first."""

    def __init__(self, cache: dict, max_numel: int = 4096):
        super().__init__()
        self.cache, self.max_numel = cache, max_numel

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        src = args[0] if args else None
        if (func is not torch.Tensor.to or not isinstance(src, torch.Tensor) or src.device.type != "cpu"
                or src.numel() > self.max_numel or src.requires_grad):
            return func(*args, **kwargs)
        key = (src.dtype, tuple(src.shape), src.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
               tuple(_arg_key(a) for a in args[1:]), tuple(sorted((k, _arg_key(v)) for k, v in kwargs.items())))
        out = self.cache.get(key)
        if out is not None:
            return out
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"DeviceConstants: a host-to-device copy of {tuple(src.shape)} {src.dtype} first "
                               f"seen during capture (it would sync); run the step eagerly once")
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.device != src.device:
            self.cache[key] = out
        return out


class GraphedHiFT:
    """One session's HiFT regions (declared in `arena` now; `attach()` after allocate) over the shared
    build.StockToken2wav `t2w`."""

    def __init__(self, t2w, arena):
        self.t2w, self.hift, self.arena = t2w, t2w.hift, arena
        n_freq = self.hift.istft_params["n_fft"] // 2 + 1
        frames = MAX_FRAMES * facts.HOP_SAMPLES // self.hift.istft_params["hop_len"] + 1
        self.shapes = {"hift_mel": (1, 80, facts.MEL_CACHE_LEN), "hift_source": (1, 1, facts.SOURCE_CACHE_LEN),
                       "hift_speech": (1, facts.SOURCE_CACHE_LEN), "hift_in_mel": (80 * MAX_FRAMES,),
                       "hift_out_mag": (n_freq * frames,), "hift_out_phase": (n_freq * frames,),
                       "hift_out_source": (1, 1, facts.SOURCE_CACHE_LEN)}
        for name, shape in self.shapes.items():
            arena.declare(name, shape, torch.float32)
        with model_lock(t2w):
            self.constants = model_state(t2w).setdefault("device_constants", {})
        self.views = {}

    def attach(self) -> None:
        self.views = {name: self.arena[name].view(shape) for name, shape in self.shapes.items()}

    def state(self, lengths: dict) -> dict:
        v = self.views
        return {name: v[name][..., :lengths[name]] for name in ("hift_mel", "hift_source", "hift_speech")}

    def close(self) -> None:
        self.__dict__.clear()

    def vocode(self, chunk_mel: torch.Tensor, cp, graphs) -> torch.Tensor:
        """t2w L143-162 for one call (plan.CallPlan, its "hift" Signature): the flow's mel [1, 80, n] -> speech
        [1, S] float32 as stock's, the caches updated in the arena."""
        sig, v = cp.steps[1], self.views
        T, lm, lsp = sig.size, sig.get("hift_mel"), cp.before["hift_speech"]
        with torch.inference_mode():
            mel_in = v["hift_in_mel"][: 80 * T].view(1, 80, T)
            mel_in[:, :, :lm].copy_(v["hift_mel"][..., :lm])
            mel_in[:, :, lm:].copy_(chunk_mel)
        mag, phase, src_tail = graphs.run(sig, self.step(sig))
        with torch.inference_mode():
            speech = type(self.hift)._istft(self.hift, mag, phase)                      # stock, eager (L195-201)
            speech = torch.clamp(speech, -self.hift.audio_limit, self.hift.audio_limit)  # decode's last line (L234)
        if lsp > 0:
            speech = fade_in_out(speech, v["hift_speech"][..., :lsp], self.t2w.speech_window)
        after = cp.after
        with torch.inference_mode():
            v["hift_mel"][..., :after["hift_mel"]].copy_(mel_in[..., T - after["hift_mel"]:])
            v["hift_source"][..., :after["hift_source"]].copy_(src_tail)
            v["hift_speech"][..., :after["hift_speech"]].copy_(speech[:, speech.shape[1] - after["hift_speech"]:])
        return speech if cp.call.last_chunk else speech[:, :-facts.SOURCE_CACHE_LEN]

    def step(self, sig):
        """The step of a "hift" Signature: `hift(mel_in, hift_source[..., :ls])` up to decode's `_istft`, its
        magnitude / phase and the source's last `keep_source` samples written into arena regions (views
        returned). Reads arena views and the model's device constants only."""
        T, ls, keep, v = sig.size, sig.get("hift_source"), sig.get("keep_source"), self.views

        def run():
            seen = {}

            def istft_input(magnitude, phase):
                seen["out"] = (magnitude, phase)
                return magnitude.new_zeros(1, 1)      # discarded: the stock _istft runs eagerly after the step

            with torch.inference_mode(), DeviceConstants(self.constants), \
                    bind.bound(bind.attr(self.hift, "_istft", istft_input), lock=model_lock(self.t2w)):
                _, source = self.hift(v["hift_in_mel"][: 80 * T].view(1, 80, T), v["hift_source"][..., :ls])
                if "out" not in seen:
                    raise RuntimeError("HiFT decode did not reach _istft (hifigan.py L233)")
                outs = []
                for t, name in zip(seen["out"], ("hift_out_mag", "hift_out_phase")):
                    if not t.is_contiguous() or t.numel() > v[name].numel():
                        raise RuntimeError(f"HiFT istft input {tuple(t.shape)} strides {t.stride()}: expected a "
                                           f"contiguous tensor of <= {v[name].numel()} elements")
                    outs.append(v[name].as_strided(t.shape, t.stride()))
                    outs[-1].copy_(t)
                tail = v["hift_out_source"][..., :keep]
                tail.copy_(source[:, :, source.shape[2] - keep:])
            return outs[0], outs[1], tail
        return run
