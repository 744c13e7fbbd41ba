"""GraphCache dispatch, per call on CPU and per unit on CUDA.

CPU: every cadence step on CPU goes through `GraphCache.run` on its eager path (graphs are CUDA only);
timed next to calling the same step directly. CUDA (skipped without): the replay of a captured step per
unit, 1 graph per unit (flow_hift: one flow call) or 13 (mimi: one graph per codec frame), through
`GraphCache.run` (signature lookup + arena-base check + replay) next to bare `CUDAGraph.replay()`; each
unit ends in torch.cuda.synchronize(). The step is a trivial kernel on an arena view, so the figure is
the dispatch, not the model.
"""
from __future__ import annotations

import pytest
import torch

from duplexcadence.arena import Arena
from duplexcadence.graphs import GraphCache

SIGNATURE = ("flow", 28, False, 400, 400)      # a steady flow_hift call: tokens, last_chunk, lengths
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")


def step():
    return None


@pytest.mark.benchmark(group="graph dispatch per call, CPU")
def test_cpu_direct_call(benchmark):
    benchmark(step)


@pytest.mark.benchmark(group="graph dispatch per call, CPU")
def test_cpu_graph_cache_eager(benchmark):
    cache = GraphCache("cpu")
    benchmark(cache.run, SIGNATURE, step)
    assert cache.stats.eager_runs > 0 and cache.stats.captures == cache.stats.replays == 0


@pytest.fixture
def captured():
    """A GraphCache on a CUDA arena with one captured step (x += 1 on a 1024-float region)."""
    arena = Arena("cuda", backend="prealloc", name="bench")
    arena.declare("x", (1024,), torch.float32)
    arena.allocate()
    x = arena["x"].view((1024,))
    cache = GraphCache("cuda", arena=arena)

    def add_one():
        return x.add_(1.0)

    cache.run(SIGNATURE, add_one)                # captures, replays once
    torch.cuda.synchronize()
    return cache, add_one


@needs_cuda
@pytest.mark.parametrize("graphs_per_unit", [1, 13], ids=["1-graph", "13-graphs"])
def test_cuda_graph_cache_replay_per_unit(benchmark, captured, graphs_per_unit):
    benchmark.group = f"CUDA replay per unit, {graphs_per_unit} graph(s)"
    cache, add_one = captured

    def unit():
        for _ in range(graphs_per_unit):
            cache.run(SIGNATURE, add_one)
        torch.cuda.synchronize()

    benchmark(unit)
    assert cache.stats.captures == 1 and cache.stats.eager_fallbacks == 0 and cache.stats.replays > 1


@needs_cuda
@pytest.mark.parametrize("graphs_per_unit", [1, 13], ids=["1-graph", "13-graphs"])
def test_cuda_bare_replay_per_unit(benchmark, captured, graphs_per_unit):
    benchmark.group = f"CUDA replay per unit, {graphs_per_unit} graph(s)"
    cache, _ = captured
    graph = cache.entries[SIGNATURE].graph

    def unit():
        for _ in range(graphs_per_unit):
            graph.replay()
        torch.cuda.synchronize()

    benchmark(unit)
