"""flow_hift.istft: torch.istft's ops with the envelope made ahead, byte for byte against torch.istft and the stock
`_istft` of both vocoders (n_fft 16, hop 4: facts.VOCODER_YAML / HIFT_CONFIG) and a few other sizes; NOLA
failures raise as torch's; a session makes each envelope once, outside its steps. On CUDA: the istft captured in a
CUDA graph replays torch.istft's bytes."""
from __future__ import annotations

import importlib
import os
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from reduced_flow_hift import reduced_model, token_maker  # noqa: E402
from duplexcadence import graphs as graph_cache, upstream  # noqa: E402
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.flow_hift import build, facts, istft  # noqa: E402

SIZES = [pytest.param(16, 4, id="vocoders-16-4"), pytest.param(20, 5, id="20-5"),
         pytest.param(64, 16, id="64-16"), pytest.param(1024, 256, id="1024-256")]
tokens_for = token_maker(7000)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def hann(n_fft: int, device="cpu") -> torch.Tensor:
    """The vocoders' window: `get_window("hann", n_fft, fftbins=True)` as float32 (generator.py L661)."""
    from scipy.signal import get_window
    return torch.from_numpy(get_window("hann", n_fft, fftbins=True).astype(np.float32)).to(device)


def random_spec(gen, n_fft, frames, channels, device):
    shape = (channels, n_fft // 2 + 1, frames) if channels else (n_fft // 2 + 1, frames)
    mag = torch.rand(shape, generator=gen) * 3
    phase = torch.randn(shape, generator=gen) * 3
    return torch.complex(mag * torch.cos(phase), mag * torch.sin(phase)).to(device)


def check_many(n_fft, hop, device, trials=60):
    gen, window = torch.Generator().manual_seed(n_fft * 1000 + hop), hann(n_fft, device)
    for trial in range(trials):
        frames = int(torch.randint(2, 300, (), generator=gen))
        spec = random_spec(gen, n_fft, frames, (0, 1, 2)[trial % 3], device)
        env = istft.envelope(window, n_fft, hop, frames)
        ref = torch.istft(spec, n_fft, hop, n_fft, window=window)
        got = istft.istft(spec, n_fft, hop, window, env)
        assert same_bytes(ref, got), (n_fft, hop, frames, tuple(spec.shape))


@pytest.mark.parametrize("n_fft,hop", SIZES)
def test_replica_equals_torch_istft(n_fft, hop):
    check_many(n_fft, hop, "cpu")


@pytest.mark.parametrize("cls", [pytest.param("causal", id="minicpmo45-causal"), pytest.param("hift", id="stepaudio2")])
def test_stand_in_equals_the_stock_istft(cls):
    """StockIstft's `_istft` against the upstream class's own `_istft` (clip, cos, sin, complex, istft)."""
    upstream.stepaudio2()
    klass = (importlib.import_module("stepaudio2.causal_vocoder.generator").CausalHiFTGenerator if cls == "causal"
             else build.hift_class())
    params = {"n_fft": 16, "hop_len": 4}
    model = SimpleNamespace(istft_params=params, stft_window=hann(16))
    stock, gen = klass._istft.__get__(model), torch.Generator().manual_seed(3)
    ours = istft.StockIstft(params, hann(16))
    for frames in (2, 3, 121, 1921, 4801):
        mag = torch.exp(torch.randn(1, 9, frames, generator=gen) * 3)      # > 1e2 at times: the clip matters
        phase = torch.sin(torch.randn(1, 9, frames, generator=gen))
        assert same_bytes(stock(mag, phase), ours.for_samples(4 * (frames - 1))(mag, phase)), frames
    with pytest.raises(RuntimeError, match="decode made 5 STFT frames, the plan 4"):
        ours.for_samples(12)(mag[..., :5], phase[..., :5])


def test_nola_failure_raises_as_torch():
    """A window whose envelope has a zero (periodic Hann at hop = n_fft): torch.istft and `envelope` both raise
    RuntimeError; a bad envelope shape is refused."""
    window, spec = hann(16), random_spec(torch.Generator().manual_seed(1), 16, 6, 1, "cpu")
    with pytest.raises(RuntimeError, match="window overlap add min"):
        torch.istft(spec, 16, 16, 16, window=window)
    with pytest.raises(RuntimeError, match="window overlap add min"):
        istft.envelope(window, 16, 16, 6)
    with pytest.raises(ValueError, match="envelope"):
        istft.istft(spec, 16, 4, window, istft.envelope(window, 16, 4, 5))


def test_bad_arguments_are_value_errors_that_say_what_was_expected():
    """Checked with `if` and raised (an `assert` would vanish under python -O): the envelope's n_fft, hop and
    window, istft's spec and window, and a stand-in's sample count."""
    window, spec = hann(16), random_spec(torch.Generator().manual_seed(2), 16, 6, 1, "cpu")
    env = istft.envelope(window, 16, 4, 6)
    for args in ((window, 1, 1, 6), (window, 16, 0, 6), (window, 16, 17, 6), (hann(8), 16, 4, 6)):
        with pytest.raises(ValueError, match=r"^envelope: expected n_fft >= 2, 0 < hop <= n_fft and a window"):
            istft.envelope(*args)
    for bad_spec, bad_window in ((spec.real, window), (spec[:, :5], window), (spec, hann(8))):
        with pytest.raises(ValueError, match=r"^istft: expected a complex spec \[C, 9, frames\]"):
            istft.istft(bad_spec, 16, 4, bad_window, env)
    with pytest.raises(ValueError, match=r"^samples: expected a multiple of the hop \(4\), got 6"):
        istft.StockIstft({"n_fft": 16, "hop_len": 4}, window).for_samples(6)


@pytest.mark.parametrize("variant", facts.VARIANTS)
def test_a_session_makes_each_envelope_once_outside_its_steps(variant):
    """A turn of full units and a final flush: `envelope` runs once per distinct frame count, never while a step
    runs; the step's istft runs once per decode."""
    counts, inside, frames_made = {"envelope": 0, "istft": 0, "in_step": 0}, [0], []
    real_env, real_istft, real_run = istft.envelope, istft.istft, graph_cache.GraphCache.run

    def envelope(window, n_fft, hop, frames):
        counts["envelope"] += 1
        counts["in_step"] += inside[0]
        frames_made.append(frames)
        return real_env(window, n_fft, hop, frames)

    def counted_istft(*args):
        counts["istft"] += 1
        return real_istft(*args)

    def run(self, signature, step):
        def flagged():
            inside[0] += 1
            try:
                return step()
            finally:
                inside[0] -= 1
        return real_run(self, signature, flagged)

    model = reduced_model(variant)
    with mock.patch.object(istft, "envelope", envelope), mock.patch.object(istft, "istft", counted_istft), \
            mock.patch.object(graph_cache.GraphCache, "run", run), fh.new_session(model, "cadence") as s:
        for turn in range(2):
            s.start_turn()
            for u, n in enumerate((25, 25, 25, 5)):
                s.speak(tokens_for(10 * turn + u, n), final=u == 3)
    assert counts["in_step"] == 0
    assert counts["envelope"] == len(set(frames_made)) >= 2
    assert counts["istft"] > counts["envelope"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: cuFFT and graph capture")
@pytest.mark.parametrize("n_fft,hop", SIZES)
def test_replica_on_cuda_and_in_a_cuda_graph(n_fft, hop):
    check_many(n_fft, hop, "cuda", trials=30)
    window = hann(n_fft, "cuda")
    for frames, channels in ((121, 1), (4801, 1), (37, 2)):
        gen = torch.Generator().manual_seed(frames)
        spec = random_spec(gen, n_fft, frames, channels, "cuda")
        env = istft.envelope(window, n_fft, hop, frames)
        static = spec.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            istft.istft(static, n_fft, hop, window, env)          # warm-up: the cuFFT plan
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = istft.istft(static, n_fft, hop, window, env)
        for trial in range(3):
            spec = random_spec(gen, n_fft, frames, channels, "cuda")
            static.copy_(spec)
            graph.replay()
            torch.cuda.synchronize()
            assert same_bytes(torch.istft(spec, n_fft, hop, n_fft, window=window), out), (frames, trial)
