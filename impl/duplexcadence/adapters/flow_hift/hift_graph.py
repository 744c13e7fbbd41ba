"""Step-Audio 2's HiFT call (t2w L143-162) on arena state: `HiFTGenerator.forward` up to its istft as a "hift" step.

Regions: the HiFT caches of t2w L156-160 (``hift_mel`` [1, 80, 8], ``hift_source`` [1, 1, 3840], ``hift_speech``
[1, 3840]; host lengths), the static input ``hift_in_mel`` (viewed [1, 80, T], as stock's concat) and the step's
outputs ``hift_out_mag`` / ``hift_out_phase`` [1, 9, 120 T + 1], ``hift_out_source`` [1, 1, <= 3840] (as stock's;
read after the replay, so nothing that outlives it sits in the graph pool). Eager: the mel input (t2w L147); the
step: `hift(mel_in, cache_source)` (hifigan.py L237-249, `decode` L203-232) with the instance's `_istft` bound to
a stand-in returning (magnitude, phase); eager: the stock `_istft` (NOLA check; as the class function), decode's
clamp (L234), the cross-fade (t2w L152-153), the cache updates (L156-160). Constant host-to-device copies
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
        """t2w L143-162 for one call (plan.CallPlan): the flow's mel [1, 80, n] -> speech [1, S] float32 as stock's."""
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
        """The step of a "hift" Signature: `hift(mel_in, hift_source[..., :ls])` up to decode's `_istft`; magnitude,
        phase and the source's last `keep_source` samples written into arena regions (their views returned)."""
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
                mag, phase = (v[name][: t.numel()].view(t.shape).copy_(t)      # contiguous, as stock's
                              for t, name in zip(seen["out"], ("hift_out_mag", "hift_out_phase")))
                tail = v["hift_out_source"][..., :keep].copy_(source[:, :, source.shape[2] - keep:])
            return mag, phase, tail
        return run
