"""suite/asv: every registry workload has a benchmark class, impossible combinations are skipped (asv:
NotImplementedError from setup) before anything is built, and a benchmark class on the fake adapter of
tests/fakes.py (the session protocol) runs its setup, timed unit and track methods once.
No timing is checked here; asv does the timing (suite/asv/README.md)."""
from __future__ import annotations

import dataclasses

import importlib

import pytest
import torch

import workloads
from duplexcadence import runtime
from suite.asv import bench_speak, common
import fakes

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


def test_a_variant_no_released_model_selects_is_refused_and_step_audio_2_is_served():
    from suite.stages import plan
    sa2 = workloads.get("stepaudio2_mini")
    assert plan.skip_reason(sa2, "verify") is None and "stepaudio2" in plan.served_variants("flow_hift")
    other = dataclasses.replace(sa2, spec={**sa2.spec, "variant": "not_released"})
    assert "serves no 'not_released' variant" in plan.skip_reason(other, "verify")


# --- the steady unit from the session's clocks ---------------------------------------------------------------
def test_check_steady_rejects_a_timed_unit_that_is_not_steady():
    common.check_steady("w", "m", [("a",), ("b",), ("b",), ("b",)])
    with pytest.raises(RuntimeError, match="not steady"):
        common.check_steady("w", "m", [("a",), ("a",), ("b",), ("b",)])
    with pytest.raises(RuntimeError, match="not steady"):
        common.check_steady("w", "m", [("b",), ("b",), ("c",)])


class FakeBench(common.SpeakUnit):
    ARCHITECTURE = "fake"
    params = [["fake"], ["stock", "cadence"], ["cpu"]]
    param_names = ["workload", "mode", "device"]

    def bind(self, workload, mode, device):
        return workload, mode, None, device


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    fakes.register(monkeypatch)
    wl = fakes.file_workload(tmp_path, turns=2, speak_per_turn=6, listen_per_turn=1)
    wl.euler_steps = None
    monkeypatch.setattr(workloads, "get", lambda name: wl)
    return wl


def test_a_combination_runs_setup_time_and_tracks(fake_registry):
    """The timed unit replays: setup prepared the voice and the steady unit's signatures (from the clocks)."""
    params = ("fake", "cadence", "cpu")
    bench = FakeBench()
    try:
        bench.setup(*params)
        warm = bench.warm
        assert warm.depth == "reduced" and warm.plan[-1] == warm.plan[-2] == warm.plan[-3]
        warmup, steady = common.turn_payloads(fake_registry)
        assert len(warmup) == 3 and len(steady) == 25
        before = warm.stats()
        bench.setup(*params)                  # asv calls setup before every sample: reused, not rebuilt
        assert bench.warm is warm
        assert bench.time_steady_unit(*params) is None
        after = warm.stats()
        assert after.units == before.units + 1 and after.replays == before.replays + 1
        assert bench.track_eager_fallbacks(*params) == before.eager_fallbacks
        assert bench.track_graphs_captured(*params) == after.captures > 0
        assert bench.track_arena_mib(*params) == 0          # the fake maps no arena
        assert bench.track_peak_mib(*params) is not None
        for name in ("track_peak_mib", "track_arena_mib", "track_graphs_captured", "track_eager_fallbacks"):
            assert getattr(FakeBench, name).unit
    finally:
        common.drop_warm()
    assert common._WARM is None


def test_a_timed_unit_that_would_meet_a_new_signature_is_refused(fake_registry, monkeypatch):
    monkeypatch.setattr(common, "WARMUP_UNITS", 1)            # history 0, 1 only: the steady unit is still ramping
    with pytest.raises(RuntimeError, match="not steady"):
        FakeBench().setup("fake", "cadence", "cpu")
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
