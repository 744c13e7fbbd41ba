"""Step-Audio 2's HiFT call (t2w L143-162) on arena state: `HiFTGenerator.forward` through its istft, the cross-fade and
the cache updates as one "hift" step.

Regions: the HiFT caches of t2w L156-160 (``hift_mel`` [1, 80, 8], ``hift_source`` [1, 1, 3840], ``hift_speech``
[1, 3840]; host lengths), the static input ``hift_in_mel`` (viewed [1, 80, T], as stock's concat) and the step's
output ``hift_out_speech`` [1, 480 T] (the call's speech; copied to the host before the next "hift" step). Eager:
the mel input (t2w L147). The step: `hift(mel_in, cache_source)` (hifigan.py L237-249, `decode` L203-234) with
the instance's `_istft` (L195-201) bound to istft.StockIstft (the same ops; the envelope and its NOLA check made
outside the step, once per frame count: no host read, no window copy), so decode's clamp (L234) runs in it; the
cross-fade (t2w L152-153) and the cache updates (L156-160), which read only the step's lengths (the cached
speech tail is as long as the cached source: plan.StepAudio2Clocks). Constant host-to-device copies
(`stft_window.to(x.device)`, hifigan.py L190; `torch.FloatTensor([[range(1, harmonic_num + 2)]]).to(f0.device)`,
layers.py L366) come from `DeviceConstants`, one device copy per content and model. Random draws (layers.py L314,
L378, L432) use the default generator of the HiFT's device (the session's state: stock.OwnGenerator); a replay
consumes it as eager does (ATen/cuda/CUDAGeneratorImpl.h Note [CUDA Graph-safe RNG states] L22-61,
`replay_prologue` L144: "bitwise identical to eager execution as long as RNG ops are enqueued from a single
thread"); capture draws nothing.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from duplexcadence import bind
from duplexcadence.runtime import model_lock, model_state

import duplexcadence.adapters.flow_hift.facts as facts
from duplexcadence.adapters.flow_hift.build import fade_in_out
from duplexcadence.adapters.flow_hift.istft import StockIstft

#: The longest HiFT input: 8 cached mel frames + the longest call (a flush of 27 tokens: 54 frames).
MAX_FRAMES = facts.MEL_CACHE_LEN + facts.VARIANT["stepaudio2"].max_advance


def _arg_key(value):
    """A `Tensor.to` argument as a key (a tensor by device and dtype: its values are not read)."""
    return ("tensor", str(value.device), str(value.dtype)) if isinstance(value, torch.Tensor) else repr(value)


class DeviceConstants(TorchFunctionMode):
    """`Tensor.to` of a small CPU tensor onto another device: one cached device copy per (dtype, shape, bytes,
    arguments); other calls pass through. RuntimeError on a miss while capturing (run the step eagerly first)."""

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
    """One session's HiFT regions over the shared build.StockToken2wav (declared now, `attach()` after allocate)."""

    def __init__(self, t2w, arena):
        self.t2w, self.hift, self.arena = t2w, t2w.hift, arena
        self.shapes = {"hift_mel": (1, 80, facts.MEL_CACHE_LEN), "hift_source": (1, 1, facts.SOURCE_CACHE_LEN),
                       "hift_speech": (1, facts.SOURCE_CACHE_LEN), "hift_in_mel": (80 * MAX_FRAMES,),
                       "hift_out_speech": (1, MAX_FRAMES * facts.HOP_SAMPLES)}
        for name, shape in self.shapes.items():
            arena.declare(name, shape, torch.float32)
        with model_lock(t2w):
            self.constants = model_state(t2w).setdefault("device_constants", {})
        self.views = {}

    def attach(self) -> None:
        self.views = {name: self.arena[name].view(shape) for name, shape in self.shapes.items()}
        self.istft = StockIstft(self.hift.istft_params, self.hift.stft_window.to(self.views["hift_mel"].device))

    def state(self, lengths: dict) -> dict:
        v = self.views
        return {name: v[name][..., :lengths[name]] for name in ("hift_mel", "hift_source", "hift_speech")}

    def close(self) -> None:
        self.__dict__.clear()

    def vocode(self, chunk_mel: torch.Tensor, cp, graphs) -> torch.Tensor:
        """t2w L143-162 for one call (plan.CallPlan): the flow's mel [1, 80, n] -> speech [1, S] float32 as stock's,
        a view of ``hift_out_speech``: valid until the session's next "hift" step (copy it out before)."""
        sig, v = cp.steps[1], self.views
        T, lm = sig.size, sig.get("hift_mel")
        assert (cp.before["hift_speech"], cp.after["hift_mel"]) == (sig.get("hift_source"), min(facts.MEL_CACHE_LEN, T))
        with torch.inference_mode():
            mel_in = v["hift_in_mel"][: 80 * T].view(1, 80, T)
            mel_in[:, :, :lm].copy_(v["hift_mel"][..., :lm])
            mel_in[:, :, lm:].copy_(chunk_mel)
        speech = graphs.run(sig, self.step(sig))
        return speech if cp.call.last_chunk else speech[:, :-facts.SOURCE_CACHE_LEN]

    def step(self, sig):
        """The step of a "hift" Signature: `hift(mel_in, hift_source[..., :ls])` (its `_istft` bound to
        istft.StockIstft, the envelope made here, outside the step), the cross-fade with the cached speech tail,
        the cache updates; returns the speech [1, 480 T], written into ``hift_out_speech``."""
        T, ls, keep, v = sig.size, sig.get("hift_source"), sig.get("keep_source"), self.views
        kept_mel, stand_in = min(facts.MEL_CACHE_LEN, T), self.istft.for_samples(T * facts.HOP_SAMPLES)

        def run():
            mel_in = v["hift_in_mel"][: 80 * T].view(1, 80, T)
            with torch.inference_mode(), DeviceConstants(self.constants), \
                    bind.bound(bind.attr(self.hift, "_istft", stand_in), lock=model_lock(self.t2w)):
                speech, source = self.hift(mel_in, v["hift_source"][..., :ls])
                if ls > 0:      # the cached tail holds as many samples as the cached source (plan.StepAudio2Clocks)
                    speech = fade_in_out(speech, v["hift_speech"][..., :ls], self.t2w.speech_window)
                out = v["hift_out_speech"][:, :speech.shape[1]].copy_(speech)
                v["hift_mel"][..., :kept_mel].copy_(mel_in[..., T - kept_mel:])
                v["hift_source"][..., :keep].copy_(source[:, :, source.shape[2] - keep:])
                v["hift_speech"][..., :keep].copy_(speech[:, speech.shape[1] - keep:])
            return out
        return run
