"""The vocoders' `_istft` as capturable step code: torch.istft's own ops, the window envelope made ahead of time.

torch.istft is aten/src/ATen/native/SpectralOps.cpp `istft` (pytorch main; the `unfold_backward` form): for a
complex input [C, n_fft / 2 + 1, frames] it runs `as_complex(input.transpose(1, 2))`, `_fft_c2r(.., by_n, n_fft)`
(= `torch.fft.irfft(x, n=n_fft, dim=-1, norm="backward")`), `y_tmp = input * window.view({1, 1, n_fft})`,
`y = unfold_backward(y_tmp, {C, L}, 1, n_fft, hop)` (L = n_fft + hop (frames - 1)), the envelope
`unfold_backward(window.pow(2).expand({1, frames, n_fft}), {1, L}, 1, n_fft, hop)`, both sliced
[n_fft / 2, -(n_fft / 2)] (center), the NOLA check `window_envelop.abs().min().lt(1e-11)` read on the host
(`at::is_scalar_tensor_true`: a sync, and no capture), `y / window_envelop`, squeeze for a 2-D input. `istft`
below runs the same ops with the envelope given; `envelope` makes it (with the NOLA check) once per frame count,
outside any step: it depends only on (window, n_fft, hop, frames), and a step's Signature fixes the frames.
Bytes equal torch.istft's: tests/test_istft.py (torch 2.13.0+cpu; its CUDA case replays a captured graph).
Only what the two vocoders call (center=True, onesided, length None, normalized False, win_length == n_fft).
"""
from __future__ import annotations

import torch


def envelope(window: torch.Tensor, n_fft: int, hop: int, frames: int) -> torch.Tensor:
    """torch.istft's window envelope for `frames` STFT frames: [1, hop (frames - 1)] on the window's device, a view
    sliced as istft's. One host read (the NOLA check); RuntimeError where torch.istft raises it, ValueError for
    n_fft < 2, a hop outside [1, n_fft] or a window that is not [n_fft]."""
    if not (n_fft >= 2 and 0 < hop <= n_fft and tuple(window.shape) == (n_fft,)):
        raise ValueError(f"envelope: expected n_fft >= 2, 0 < hop <= n_fft and a window [n_fft], got n_fft={n_fft}, "
                         f"hop={hop}, window {tuple(window.shape)}")
    length, half = n_fft + hop * (frames - 1), n_fft // 2
    env = torch.ops.aten.unfold_backward(window.pow(2).expand(1, frames, n_fft), [1, length], 1, n_fft, hop)
    env = env[:, half:length - half]
    lowest = env.abs().min()
    if bool(lowest.lt(1e-11)):          # the one host read
        raise RuntimeError(f"istft(n_fft={n_fft}, hop={hop}, frames={frames}): window overlap add min: "
                           f"{float(lowest)} (NOLA condition failed)")
    return env


def istft(spec: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor, env: torch.Tensor) -> torch.Tensor:
    """`torch.istft(spec, n_fft, hop, n_fft, window=window)` without host reads: spec complex [C, n_fft / 2 + 1,
    frames] (or 2-D) -> real [C, hop (frames - 1)] (or 1-D); env from `envelope(window, n_fft, hop, frames)`.
    Raises ValueError for a spec that is not complex [C, n_fft / 2 + 1, frames], a window that is not [n_fft] or
    an envelope for another frame count."""
    x = spec.unsqueeze(0) if spec.dim() == 2 else spec
    if not (spec.is_complex() and x.dim() == 3 and x.shape[1] == n_fft // 2 + 1 and tuple(window.shape) == (n_fft,)):
        raise ValueError(f"istft: expected a complex spec [C, {n_fft // 2 + 1}, frames] and a window [{n_fft}], got "
                         f"{spec.dtype} {tuple(spec.shape)} and {tuple(window.shape)}")
    C, F, frames = x.shape
    length, half = n_fft + hop * (frames - 1), n_fft // 2
    if tuple(env.shape) != (1, length - 2 * half):
        raise ValueError(f"istft: envelope {tuple(env.shape)} for {frames} frames, expected {(1, length - 2 * half)}")
    y = torch.fft.irfft(x.transpose(1, 2), n=n_fft, dim=-1, norm="backward") * window.view(1, 1, n_fft)
    y = torch.ops.aten.unfold_backward(y, [C, length], 1, n_fft, hop)[:, half:length - half] / env
    return y.squeeze(0) if spec.dim() == 2 else y


class StockIstft:
    """A vocoder's stock `_istft` (causal generator.py L499-505 and hifigan.py L195-201, the same lines:
    `clip(magnitude, max=1e2)`, cos, sin, `complex`, `torch.istft(.., n_fft, hop_len, n_fft, window=stft_window
    .to(device))`) for steps: `window` is the step's device copy of `stft_window`; envelopes are kept per frame
    count (one session's: a graph holds their addresses)."""

    def __init__(self, istft_params: dict, window: torch.Tensor):
        self.n_fft, self.hop, self.window, self.envelopes = istft_params["n_fft"], istft_params["hop_len"], window, {}

    def for_samples(self, samples: int):
        """Outside the step: a stand-in for `_istft` whose output is `samples` long (its envelope made now, once per
        count). The stand-in raises RuntimeError if decode hands it another frame count (a plan that is wrong).
        Raises ValueError for a sample count that is not a whole number of hops."""
        frames = samples // self.hop + 1
        if samples != self.hop * (frames - 1):
            raise ValueError(f"samples: expected a multiple of the hop ({self.hop}), got {samples}")
        if frames not in self.envelopes:
            self.envelopes[frames] = envelope(self.window, self.n_fft, self.hop, frames)
        env = self.envelopes[frames]

        def _istft(magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
            if magnitude.shape[-1] != frames:
                raise RuntimeError(f"_istft: decode made {magnitude.shape[-1]} STFT frames, the plan {frames}")
            magnitude = torch.clip(magnitude, max=1e2)
            real = magnitude * torch.cos(phase)
            img = magnitude * torch.sin(phase)
            return istft(torch.complex(real, img), self.n_fft, self.hop, self.window, env)
        return _istft
