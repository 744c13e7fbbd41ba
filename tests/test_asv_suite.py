"""suite/asv: every registry workload has a benchmark class, impossible combinations are skipped (asv:
NotImplementedError from setup) before anything is built, and one reduced CPU combination (Moshi's Mimi
decoder, cadence mode: the smallest model) runs its setup, timed unit and track methods once.
No timing is checked here; asv does the timing (suite/asv/README.md)."""
from __future__ import annotations

import importlib

import pytest
import torch

import workloads
from duplexcadence import runtime
from suite.asv import bench_speak, common
from torch_threads import torch_threads  # tests/ is on sys.path under pytest

WITH_ADAPTER = [n for n in workloads.names() if workloads.get(n).architecture in runtime.ADAPTERS]


# --- coverage --------------------------------------------------------------------------------------
def test_every_workload_has_exactly_one_benchmark_class():
    listed = [w for cls in bench_speak.FAMILIES for w in cls.params[0]]
    assert WITH_ADAPTER and sorted(listed) == sorted(WITH_ADAPTER)
    for cls in bench_speak.FAMILIES:
        assert cls.param_names[:2] == ["workload", "mode"] and cls.param_names[-1] == "device"
        assert len(cls.params) == len(cls.param_names) and cls.params[-1] == ["cpu", "cuda"]
        assert {workloads.get(w).architecture for w in cls.params[0]} == {cls.ARCHITECTURE}
    assert bench_speak.FlowHift.params[2] == [5, 10]


def test_missing_workloads_names_the_uncovered_ones():
    assert common.missing_workloads(WITH_ADAPTER, bench_speak.FAMILIES) == []
    assert common.missing_workloads(WITH_ADAPTER + ["newmodel"], bench_speak.FAMILIES) == ["newmodel"]
    assert common.missing_workloads(["moshi", "qwen3_omni"], (bench_speak.FlowHift,)) == ["moshi", "qwen3_omni"]


def test_import_fails_for_a_workload_without_a_class(monkeypatch):
    class NewDecoder:                       # a registry entry of an architecture no class benchmarks
        name, architecture = "newmodel", "newarch"

    monkeypatch.setitem(runtime.ADAPTERS, "newarch", "duplexcadence.adapters.newarch")
    monkeypatch.setitem(workloads._REGISTRY, "newmodel", NewDecoder)
    try:
        with pytest.raises(NotImplementedError, match=r"Missing benchmarks for workloads \['newmodel'\]"):
            importlib.reload(bench_speak)
    finally:
        monkeypatch.undo()
        importlib.reload(bench_speak)


# --- skips, before anything is built ----------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on a machine without CUDA")
@pytest.mark.parametrize("cls, params", [
    pytest.param(bench_speak.FlowHift, ("minicpmo45", "cadence", 10, "cuda"), id="flow_hift"),
    pytest.param(bench_speak.Mimi, ("moshi", "cadence", "cuda"), id="mimi"),
    pytest.param(bench_speak.Code2Wav, ("qwen3_omni", "stock", "cuda"), id="code2wav"),
])
def test_cuda_skips_without_cuda(cls, params):
    with pytest.raises(NotImplementedError, match="no CUDA device"):
        cls().setup(*params)
    assert common._WARM is None


@pytest.mark.parametrize("cls, params, match", [
    pytest.param(bench_speak.FlowHift, ("minicpmo45", "stock", 5, "cpu"),
                 r"runs 10 Euler steps, not 5 \(5 steps: workload 'minicpmo45_5step'\)", id="steps"),
    pytest.param(bench_speak.Mimi, ("moshi", "stock_graphs", "cpu"), "off without CUDA", id="stock_graphs-cpu"),
])
def test_impossible_combinations_skip(cls, params, match):
    with pytest.raises(NotImplementedError, match=match):
        cls().setup(*params)
    assert common._WARM is None


def test_unimplemented_variant_skips():
    adapter = runtime.adapter("flow_hift")
    if "stepaudio2" in getattr(adapter, "VARIANTS", ()):
        pytest.skip("the flow_hift adapter implements the stepaudio2 variant now")
    with pytest.raises(NotImplementedError, match="no 'stepaudio2' variant"):
        bench_speak.FlowHift().setup("stepaudio2_mini", "stock", 10, "cpu")


# --- helpers that read adapters' stats and schedules -------------------------------------------------
@pytest.mark.parametrize("stats, captures, fallbacks", [
    pytest.param({"captures": 3, "eager_fallbacks": 1, "graphs": 3}, 3, 1, id="flow_hift-top-level"),
    pytest.param({"graphs": {"captures": 2, "eager_fallbacks": 4}}, 2, 4, id="nested"),
    pytest.param({"mode": "stock_graphs", "moshi_graphs_captured": 2}, 2, 0, id="moshi-own"),
    pytest.param({}, 0, 0, id="stock"),
])
def test_graph_counts(stats, captures, fallbacks):
    assert common.graph_counts(stats) == {"captures": captures, "eager_fallbacks": fallbacks}


def test_check_steady_rejects_a_timed_unit_that_is_not_steady():
    common.check_steady("w", "m", [("ramp", 1), ("steady", 1), ("steady", 1)])
    with pytest.raises(RuntimeError, match="not steady"):
        common.check_steady("w", "m", [("ramp", 1), ("ramp", 2), ("steady", 2)])
    with pytest.raises(RuntimeError, match="not steady"):     # steady, but a new shape: a new graph
        common.check_steady("w", "m", [("ramp", 1), ("steady", 2), ("steady", 2)])


# --- one reduced CPU combination, run once ------------------------------------------------------------
@pytest.fixture
def two_threads():
    with torch_threads(2):      # the count before is back after the test
        yield


def test_reduced_cpu_combination_runs_setup_time_and_tracks(two_threads):
    params = ("moshi", "cadence", "cpu")
    bench = bench_speak.Mimi()
    try:
        bench.setup(*params)
        warm = bench.warm
        assert warm.depth == "reduced" and [p for p, _ in warm.plan[-2:]] == ["steady", "steady"]
        warmup, steady = common.turn_payloads(workloads.get("moshi"))
        assert len(warmup) == 3 and len(steady) == 8 and len(steady[0]) == 13   # 8 codebooks x 13 frames
        frames = warm.session.stats()["frames"]
        assert frames == sum(len(p[0]) for p in warmup) + 13

        bench.setup(*params)                  # asv calls setup before every sample: reused, not rebuilt
        assert bench.warm is warm
        assert bench.time_steady_unit(*params) is None
        assert warm.session.stats()["frames"] == frames + 13

        assert bench.track_arena_mib(*params) == warm.session.arena.bytes_mapped / 2**20 > 0
        assert bench.track_graphs_captured(*params) == 0          # CPU: graphs are off, every step eager
        assert bench.track_eager_fallbacks(*params) == 0
        assert bench.track_peak_mib(*params) > 0
        for name in ("track_peak_mib", "track_arena_mib", "track_graphs_captured", "track_eager_fallbacks"):
            assert getattr(bench_speak.Mimi, name).unit
    finally:
        common.drop_warm()
    assert common._WARM is None


def test_make_asv_names_one_environment_whatever_the_checkout_path():
    """asv names an `existing` environment after its python's path: `make asv` passes a wrapper at one fixed
    path (ASV_PYTHON) that execs the checkout's venv python, so clones at other paths add to one history line."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(["make", "-n", "asv", "VENV=/some/clone/.venv"], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    assert "--environment existing:/tmp/duplexcadence-asv/python " in out
    assert 'exec "%s" "$@"' in out and '"/some/clone/.venv/bin/python"' in out
    assert "/some/clone/.venv/bin/python --set-commit-hash" not in out       # not the venv's own path
