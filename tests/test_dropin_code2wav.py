"""duplexcadence.dropin.code2wav: Qwen3-Omni Code2Wav's callers run once on the stock module and once on
`wrap(module)`, every output compared byte for byte.

Two callers: (1) the serving window loop, as the code2wav adapter's stock session runs it (vllm-omni
`talker2code2wav_async_chunk`: each window `torch.cat`s the left context and the new frames, initial chunk 4,
left context 25; the forward's output cut at `ctx * 1920`, `.float()`), over two turns, with the drop-in as the
module it calls; (2) transformers' own `chunked_decode` (modeling L3778-3788) with 12- and 13-frame chunks.
Reduced depth in bfloat16 (the workload's dtype) on CPU; the CUDA test runs the released depth.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from duplexcadence.adapters import code2wav as adapter
from duplexcadence.adapters.code2wav.cadence import CadenceSession
from duplexcadence.adapters.code2wav.stock import StockSession
from duplexcadence.dropin import code2wav as dropin
from duplexcadence.errors import InputError, LimitError
from duplexcadence.runtime import compare_units
from torch_threads import torch_threads

#: frames per unit, each turn's last unit final: initial 4 + the rest, ramp, steady, final
TURNS, LEFT = [[12, 13, 12, 13, 5], [13, 12, 7]], 25
SPF, LOSS = 1920, 555


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):        # a loaded 2-core machine: one intra-op thread avoids spin contention
        yield


def build(device="cpu", depth="reduced", dtype="bfloat16"):
    return adapter.build_model({"dtype": dtype}, device=device, depth=depth, seed=0)


@pytest.fixture(scope="module")
def model():
    return build()


def codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN heads included)."""
    return a.dtype == b.dtype and a.shape == b.shape and bytes(a.cpu().view(torch.uint8).numpy()) == bytes(
        b.cpu().view(torch.uint8).numpy())


def serve(module, turns=TURNS) -> list:
    """The serving loop (the adapter's StockSession) on `module`: every unit's UnitOutput."""
    loop, outs = StockSession(module, {}), []
    for t, sizes in enumerate(turns):
        loop.start_turn()
        for k, n in enumerate(sizes):
            outs.append(loop.speak(codes(n, 100 * t + k), final=k == len(sizes) - 1))
    return outs


def test_serving_window_loop_through_the_drop_in_equals_stock(model):
    stock = serve(model)
    code2wav = dropin.wrap(model)
    cadence = serve(code2wav)
    assert len(stock) == len(cadence) == sum(map(len, TURNS))
    for k, (a, b) in enumerate(zip(stock, cadence)):
        compare_units("qwen3_omni window loop", k, a, b)
        assert a.info["calls"] == b.info["calls"]
    assert np.std(np.concatenate([u.waveform for u in stock])) > 1e-3
    # one cadence window per forward: the first unit of each turn is 2 windows (4 initial frames, then the rest)
    assert isinstance(code2wav.session, CadenceSession)
    assert code2wav.session.stats().units == sum(map(len, TURNS)) + len(TURNS)


def test_transformers_chunked_decode_through_the_drop_in_equals_stock(model):
    code2wav, whole = dropin.wrap(model), codes(62, 5)[None]
    with torch.inference_mode():      # windows 13, 13+13, 25+13, 25+13, 25+10
        stock = model.chunked_decode(whole, chunk_size=13, left_context_size=LEFT)
    for _ in range(2):                               # a second call is a new stream
        out = code2wav.chunked_decode(whole, chunk_size=13, left_context_size=LEFT)
        assert same_bytes(out, stock)
    assert out.shape[-1] == 62 * SPF - 5 * LOSS and code2wav.session.stats().units == 10


def test_forward_returns_the_stock_shape_and_dtype_with_an_uncomputed_head(model):
    code2wav, whole = dropin.wrap(model), codes(5, 9)[None]
    first = code2wav(whole[..., :2])                 # a new stream: the whole window is new
    second = code2wav(whole[..., :5])                # 2 frames of context (the stream so far) + 3 new
    with torch.inference_mode():
        stock = (model(whole[..., :2]), model(whole[..., :5]))
    assert same_bytes(first, stock[0]) and first.dtype == torch.bfloat16
    assert second.shape == stock[1].shape == (1, 1, 5 * SPF - LOSS) and second.dtype == torch.bfloat16
    assert second[..., :2 * SPF].isnan().all() and not second[..., 2 * SPF:].isnan().any()
    assert same_bytes(second[..., 2 * SPF:], stock[1][..., 2 * SPF:])


def test_a_rejected_window_changes_nothing(model):
    code2wav, ref = dropin.wrap(model), dropin.wrap(model)
    stream = codes(10, 11)[None]
    code2wav(stream[..., :4])
    ref(stream[..., :4])
    with pytest.raises(LimitError):                 # a new stream of 14 frames: more than 13 new
        code2wav(codes(14, 12)[None])
    with pytest.raises(InputError, match="codes"):
        code2wav(torch.full((1, 16, 12), 4096))      # ids out of range
    with pytest.raises(InputError, match="batch 1"):
        code2wav(stream.expand(2, -1, -1)[..., :12])
    assert same_bytes(code2wav(stream[..., :10]), ref(stream[..., :10]))     # the stream went on unchanged


def test_chunked_decode_bounds_are_named(model):
    code2wav = dropin.wrap(model)
    with pytest.raises(InputError, match="chunk_size 300"):
        code2wav.chunked_decode(codes(30, 1)[None])       # transformers' defaults: 300-frame chunks
    with pytest.raises(InputError, match="left_context_size 10"):
        code2wav.chunked_decode(codes(30, 1)[None], chunk_size=12, left_context_size=10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_released_window_loop_and_chunked_decode_replay_and_equal_stock():
    """Released depth in bfloat16 on the GPU: every window the loops make is captured just before its call
    (the drop-in's `prepare` of the window's signature) and replayed; bytes equal to the stock forward."""
    model = build("cuda", "released")
    stock, code2wav = serve(model), dropin.wrap(model)
    for k, (a, b) in enumerate(zip(stock, serve(code2wav))):
        compare_units("qwen3_omni window loop (cuda)", k, a, b)
    whole = codes(62, 5)[None].cuda()
    with torch.inference_mode():
        ref = model.chunked_decode(whole, chunk_size=13, left_context_size=25)
    out = code2wav.chunked_decode(whole, chunk_size=13, left_context_size=25)
    assert out.device.type == "cuda" and same_bytes(out, ref)
    stats = code2wav.session.stats()
    assert stats.replays == stats.units and stats.eager_fallbacks == 0 and stats.capture_failures == 0


def test_wrap_refuses_another_model_and_options_it_sets_itself_or_does_not_take(model):
    from duplexcadence.adapters import mimi
    with pytest.raises(InputError, match=r"^native: expected a transformers Qwen3OmniMoeCode2Wav .*got MimiModel"):
        dropin.wrap(mimi.build_model({}, device="cpu", depth="reduced", seed=0))
    for bad in ({"bogus": 1}, {"initial_frames": 4}):      # the drop-in starts every stream at 0 initial frames
        with pytest.raises(InputError, match=rf"^options: \[{list(bad)[0]!r}\] not taken by the drop-in's cadence"):
            dropin.wrap(model, **bad)
