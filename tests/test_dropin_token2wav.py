"""duplexcadence.dropin.token2wav: MiniCPM-o 4.5's duplex token loop run once on the stock stepaudio2 Token2wav
and once on `wrap(model)`, every call's output compared byte for byte.

The loop is the demo's (OpenBMB/minicpm-o-4_5-pytorch-simple-demo @c7e1660 MiniCPMO45/modeling_minicpmo_unified.py
L5446-5525, as the flow_hift adapter's stock session drives it): per turn a buffer of [4218] * 3; each unit's
tokens appended; `while len(buf) >= 8: n = min(28, len(buf)); stream(buf[:n]); buf = buf[min(25, n - 3):]`;
at the end of the turn `stream(buf, last_chunk=True)`. Its turn reset differs by one line: stock restores
clones of the voice's base caches (L4398-4410), the drop-in is told with `set_stream_cache(prompt)`.
Reduced depth, 2 Euler steps on CPU; the CUDA test runs the released depth with 10.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from duplexcadence.adapters.flow_hift.build import clone_recursive  # noqa: E402
from duplexcadence.adapters.flow_hift.cadence import CadenceSession  # noqa: E402
from duplexcadence.dropin import token2wav as dropin  # noqa: E402
from duplexcadence.errors import InputError  # noqa: E402
from duplexcadence.runtime import open_model  # noqa: E402
from torch_threads import torch_threads  # noqa: E402

VOICE = Path(__file__).resolve().parents[1] / "workloads" / "data" / "voice_prompts" / "ljspeech_LJ001-0001_24k.wav"
#: speech tokens per SPEAK unit, per turn: full units, a short one (a call of fewer than 28), the final flush
TURNS = [[25, 25, 11], [25, 6]]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


def build(device="cpu", depth="reduced", steps=2):
    return open_model("minicpmo45", device=device, depth=depth, voice_prompt=str(VOICE), prompt_seconds=2.0,
                      n_timesteps=steps)


@pytest.fixture(scope="module")
def model():
    return build()


def unit_tokens(t: int, k: int, n: int) -> list[int]:
    return torch.randint(0, 6561, (n,), generator=torch.Generator().manual_seed(100 * t + k)).tolist()


def duplex_loop(t2w, reset, turns=TURNS) -> list:
    """The demo's token loop (module docstring) on `t2w`; reset(t2w) opens a turn. Every call's output: float32
    [1, S] (return_waveform), the turn's final call as int16 bytes."""
    outs = []
    for t, sizes in enumerate(turns):
        reset(t2w)
        buf = [4218] * 3
        for k, n in enumerate(sizes):
            buf += unit_tokens(t, k, n)
            while len(buf) >= 8:
                n_call = min(28, len(buf))
                outs.append(t2w.stream(buf[:n_call], return_waveform=True))
                buf = buf[min(25, n_call - 3):]
        outs.append(t2w.stream(buf, last_chunk=True))
    return outs


def stock_reset(model):
    """The demo's turn reset: clones of the voice's base caches, made once (each of the pair set_stream_cache
    returns cloned at once: its stream cache is views of the CFM's buffers, which every call overwrites)."""
    base = [clone_recursive(cache) for cache in model.t2w.set_stream_cache(model.prompt.key)]

    def reset(t2w):
        t2w.stream_cache, t2w.hift_cache_dict = clone_recursive(base[0]), clone_recursive(base[1])
    return reset


def assert_outputs_equal(stock: list, cadence: list) -> None:
    assert len(stock) == len(cadence) > 0
    for k, (a, b) in enumerate(zip(stock, cadence)):
        assert type(a) is type(b), k
        if isinstance(a, bytes):
            assert a == b, f"call {k}: int16 PCM differs"
        else:
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape, k
            assert a.tobytes() == b.tobytes(), f"call {k}: max |diff| {np.abs(a - b).max()}"
    assert np.std(np.concatenate([a.reshape(-1) for a in stock if not isinstance(a, bytes)])) > 1e-3


def test_minicpmo_duplex_loop_through_the_drop_in_equals_stock(model):
    stock = duplex_loop(model.native.t2w, stock_reset(model.native))
    token2wav = dropin.wrap(model)
    cadence = duplex_loop(token2wav, lambda t2w: t2w.set_stream_cache(model.native.prompt.key))
    assert_outputs_equal(stock, cadence)
    # calls of 28, 28, 14 tokens and a final 3; 28, 9 and a final 3: each one unit of the session; the turn's
    # first call gives 1 s (3840 zeros first, token2wav.py L213-217)
    assert len(stock) == 7 and stock[0].shape == (1, 24000) and not stock[0][0, :3840].any()
    assert isinstance(token2wav.session, CadenceSession) and token2wav.session.stats().units == len(stock)


def test_calls_the_loop_would_not_make_are_refused_and_change_nothing(model):
    token2wav, ref = dropin.wrap(model), dropin.wrap(model)
    with pytest.raises(InputError, match="set_stream_cache"):
        token2wav.stream([4218] * 3 + [1] * 5)
    for t2w in (token2wav, ref):
        t2w.set_stream_cache(str(VOICE))             # the voice by its path, as stock's prompt_wav
    tokens = [4218] * 3 + unit_tokens(0, 0, 25)
    for bad in ([1, 2, 3] + tokens[3:],             # not the carried tokens
                tokens[:7],                          # too few for a non-final call
                tokens + [5],                        # more than 28
                tokens[:3] + [7000] * 25):           # an id past the vocabulary
        with pytest.raises(InputError):
            token2wav.stream(bad, return_waveform=True)
    with pytest.raises(InputError, match="fewer than 8"):
        token2wav.stream(tokens[:9], last_chunk=True)
    for bad, match in ((None, r"^generated_speech_tokens: expected a sequence of ints in \[0, 6561\), got NoneType"),
                       (5, r"^generated_speech_tokens: expected a sequence .*got int"),
                       (tokens[:3] + [6561] + tokens[4:], r"^generated_speech_tokens\[3\]: token id 6561 outside")):
        with pytest.raises(InputError, match=match):
            token2wav.stream(bad)
    with pytest.raises(InputError, match=r"^last_chunk: expected a bool, got 'yes'"):
        token2wav.stream(tokens, last_chunk="yes")
    with pytest.raises(InputError, match="prompt_wav"):
        token2wav.set_stream_cache("another_voice.wav")
    a, b = token2wav.stream(tokens, return_waveform=True), ref.stream(tokens, return_waveform=True)
    assert a.tobytes() == b.tobytes()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_released_duplex_loop_replays_and_equals_stock():
    """Released depth, 10 Euler steps on the GPU: every call's flow and vocoder steps captured before it runs
    (prepare at wrap for full units, the drop-in's prepare of a shorter or final call's signatures) and replayed."""
    model = build("cuda", "released", 10)
    stock = duplex_loop(model.native.t2w, stock_reset(model.native))
    token2wav = dropin.wrap(model)
    cadence = duplex_loop(token2wav, lambda t2w: t2w.set_stream_cache(model.native.prompt.key))
    assert_outputs_equal(stock, cadence)
    stats = token2wav.session.stats()
    assert stats.units == len(stock) and stats.replays > 0
    assert stats.eager_fallbacks == 0 and stats.capture_failures == 0


def test_wrap_refuses_a_model_that_is_not_minicpmo45_and_an_unknown_option(model):
    other = open_model("stepaudio2_mini", device="cpu", depth="reduced", voice_prompt=str(VOICE), prompt_seconds=2.0,
                       n_timesteps=2)
    with pytest.raises(InputError, match=r"^model: expected open_model\('minicpmo45', \.\.\.\) .*'stepaudio2'"):
        dropin.wrap(other)
    with pytest.raises(InputError, match=r"^options: \['bogus'\] not taken by the drop-in's cadence session"):
        dropin.wrap(model, bogus=1)
