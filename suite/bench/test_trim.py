"""The DiT estimator-cache trim of one steady flow call, stock vs in place, side by side, on CPU.

Steady shape (minicpmo45, P = 300 mel frames): a 28-token call grows the cache
[steps, 16, 2, 8, L, 128] float32 from P + 100 to L = P + 150 frames. Stock
`Token2wav._trim_estimator_cache` (minicpmo-utils 1.0.7 token2wav.py L220-226) then builds a new
[steps, 16, 2, 8, P + 100, 128] tensor with torch.cat; DuplexCadence moves the last 100 frames down inside
the arena buffer instead (`duplexcadence.payload.move_tail_`). The stock function is called on a stand-in
that holds just the attribute it reads.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from duplexcadence import upstream
from duplexcadence.payload import move_tail_

PROMPT_FRAMES = 300
TAIL = 100                    # frames kept after the prompt (token2wav.py L221: limit = P + 100)
GROWN = PROMPT_FRAMES + TAIL + 50
STEPS = [5, 10]               # the simple-demo server and the HF-style model file


def grown_cache(steps: int) -> torch.Tensor:
    """The estimator cache after a steady call: [steps, 16, 2, 8, P + 150, 128], each frame holding its
    own index (so the kept frames can be read back), every page written."""
    frames = torch.arange(GROWN, dtype=torch.float32).view(1, 1, 1, 1, GROWN, 1)
    return frames.expand(steps, 16, 2, 8, GROWN, 128).contiguous()


#: Frame indices the stock trim keeps: the first P, then the last 100 (token2wav.py L223-225).
KEPT = torch.cat([torch.arange(PROMPT_FRAMES), torch.arange(GROWN - TAIL, GROWN)]).to(torch.float32)


@pytest.mark.parametrize("steps", STEPS)
def test_stock_cat_trim(benchmark, steps):
    benchmark.group = f"estimator trim, {steps} steps"
    holder = SimpleNamespace(stream_cache={})
    grown = grown_cache(steps)

    def reset():
        holder.stream_cache["estimator_att_cache"] = grown

    trim = upstream.stepaudio2().Token2wav._trim_estimator_cache
    benchmark.pedantic(trim, args=(holder, PROMPT_FRAMES), setup=reset, rounds=5, warmup_rounds=1)
    out = holder.stream_cache["estimator_att_cache"]
    assert out.shape[4] == PROMPT_FRAMES + TAIL and torch.equal(out[-1, -1, -1, -1, :, -1], KEPT)


@pytest.mark.parametrize("steps", STEPS)
def test_inplace_shift_trim(benchmark, steps):
    benchmark.group = f"estimator trim, {steps} steps"
    grown = grown_cache(steps)
    buf = torch.empty_like(grown)
    base = buf.data_ptr()

    def reset():                                 # untimed: the buffer as the steady call left it
        buf.copy_(grown)

    benchmark.pedantic(move_tail_, args=(buf, PROMPT_FRAMES, GROWN, TAIL, 4), setup=reset, rounds=5, warmup_rounds=1)
    assert buf.data_ptr() == base and torch.equal(buf[-1, -1, -1, -1, :PROMPT_FRAMES + TAIL, -1], KEPT)
