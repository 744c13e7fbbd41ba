"""Arena on CPU: declare + allocate + view of one flow_hift cadence session (once per session), and the
per-call region view (every flow call takes one).

Layout: the regions of a MiniCPM-o cadence session on the released flow (10 conformer layers, 16 DiT layer
slots, 8 heads x 128) at 5 Euler steps and the minicpmo45 prompt (P = 300 mel frames), each sized from its
clock bound (P + 150 frames): about 374 MB, zero-filled by allocate().
"""
from __future__ import annotations

import pytest
import torch

from duplexcadence.arena import Arena

PROMPT_FRAMES = 300
STEPS = 5
LAYERS, DIT_SLOTS, HEADS, DK2 = 10, 16, 8, 128


def layout() -> dict:
    L = PROMPT_FRAMES + 150                       # the HeadTail bound: P + 100 kept + the 50-frame advance
    return {"conformer_att": (LAYERS, 1, HEADS, L, DK2),
            "estimator_att": (STEPS, DIT_SLOTS, 2, HEADS, L, DK2),
            "estimator_cnn": (STEPS, DIT_SLOTS, 2, 1024, 2),
            "conformer_cnn": (1, 512, 6),
            "dit_att_scratch": (DIT_SLOTS, 2, HEADS, L, DK2), "dit_cnn_scratch": (DIT_SLOTS, 2, 1024, 2)}


def open_arena(shapes: dict) -> tuple[Arena, list]:
    arena = Arena("cpu", name="flow_hift")
    for name, shape in shapes.items():
        arena.declare(name, shape, torch.float32)
    arena.allocate()
    return arena, [arena[name].view(shape) for name, shape in shapes.items()]


@pytest.mark.benchmark(group="arena (CPU)")
def test_declare_allocate_view(benchmark):
    shapes = layout()
    arena, views = benchmark.pedantic(open_arena, args=(shapes,), rounds=5, warmup_rounds=1)
    assert [tuple(v.shape) for v in views] == list(shapes.values())
    assert all(v.data_ptr() == arena[n].data_ptr() for n, v in zip(shapes, views))


@pytest.mark.benchmark(group="arena (CPU)")
def test_region_view_per_call(benchmark):
    shapes = layout()
    arena, _ = open_arena(shapes)
    steady = (LAYERS, 1, HEADS, PROMPT_FRAMES + 100, DK2)     # the conformer cache a steady call reads
    view = benchmark(arena["conformer_att"].view, steady)
    assert tuple(view.shape) == steady and view.data_ptr() == arena["conformer_att"].data_ptr()
