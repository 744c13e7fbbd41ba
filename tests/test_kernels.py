"""suite.measure.kernels: the GPU timeline of one profiled call and its gaps' causes, and the count of kernels
that only move data, from hand-made trace events (microseconds, as kineto writes them); a CUDA part on a real
trace."""
from __future__ import annotations

import random

import pytest
import torch

from suite.measure import kernels
from suite.measure.kernels import GAP_CAUSES, UNIT_MARK, data_movement, unit_timeline


def mark(ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": UNIT_MARK, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def kernel(ts, dur, corr=None, name="ampere_sgemm_128x64_nn"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def memcpy(ts, dur, corr, direction="DtoH"):
    return {"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {direction} (Device -> Pageable)", "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def api(name, ts, dur, corr=None):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {"correlation": corr}}


def op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def causes_us(tl):
    return {k: round(v * 1000, 3) for k, v in tl["by_cause"].items()}


def test_empty_trace_has_no_time_and_no_gaps():
    tl = unit_timeline([])
    assert (tl["wall_ms"], tl["kernel_busy_ms"], tl["gaps"], tl["by_cause"]) == (0.0, 0.0, 0, {})
    assert tl["tail_over_kernel_busy_x"] is None


def test_a_unit_without_gpu_work_is_one_gap_of_host_time():
    tl = unit_timeline([mark(0, 40), op("aten::empty", 10, 5)])
    assert [g["kind"] for g in tl["gap_list"]] == ["whole"]
    assert causes_us(tl) == {"python": 35.0, "eager_op": 5.0}
    assert tl["tail_over_kernel_busy_x"] is None


def test_graph_launch_latency_queued_kernels_and_the_sync_after():
    # one graph: launched at 10-20 us, its kernels run 30-40 and 42-50; the host syncs 20-55
    ev = [mark(0, 100), api("cudaGraphLaunch", 10, 10, corr=1), kernel(30, 10, corr=1), kernel(42, 8, corr=1),
          api("cudaStreamSynchronize", 20, 35)]
    tl = unit_timeline(ev)
    assert [(g["kind"], g["ms"]) for g in tl["gap_list"]] == [("before", 0.03), ("between", 0.002), ("after", 0.05)]
    assert causes_us(tl) == {"python": 55.0, "graph_launch": 20.0, "sync": 5.0, "queued": 2.0}
    assert [g["cause"] for g in tl["gap_list"]] == ["graph_launch", "queued", "python"]
    assert [g["after_sync"] for g in tl["gap_list"]] == [False, True, True]
    assert tl["after_sync_ms"] == 0.052
    assert (tl["wall_ms"], tl["kernel_busy_ms"], tl["gpu_busy_ms"]) == (0.1, 0.018, 0.018)
    assert tl["tail_over_kernel_busy_x"] == pytest.approx(100 / 18, abs=1e-4)
    assert tl["graph_launches"] == 1 and tl["kernels"] == 2


def test_an_eager_op_with_a_host_read_inside_names_the_op():
    # aten::istft 0-80 launches a kernel (5-8 -> 10-20), reads a value back (aten::item 30-50: a D2H copy
    # 31-35 -> 36-38, then a sync to 50), launches another kernel (52-55 -> 60-70); python after it
    ev = [mark(0, 100), op("aten::istft", 0, 80), op("aten::item", 30, 20), op("aten::_local_scalar_dense", 30, 20),
          api("cudaLaunchKernel", 5, 3, corr=2), kernel(10, 10, corr=2),
          api("cudaMemcpyAsync", 31, 4, corr=5), memcpy(36, 2, corr=5), api("cudaStreamSynchronize", 35, 15),
          api("cudaLaunchKernel", 52, 3, corr=7), kernel(60, 10, corr=7)]
    tl = unit_timeline(ev)
    assert causes_us(tl) == {"eager_op": 40.0, "python": 20.0, "sync": 13.0, "d2h_copy": 5.0}
    assert tl["by_cause_op"]["sync"] == {"aten::istft": 0.013}
    assert tl["by_cause_op"]["eager_op"] == {"aten::istft": 0.04}
    assert tl["by_cause_op"]["python"] == {"-": 0.02}
    assert [g["cause"] for g in tl["gap_list"]] == ["eager_op", "eager_op", "sync", "python"]
    assert [g["after_sync"] for g in tl["gap_list"]] == [False, False, True, False]
    assert tl["gap_list"][1]["ops"] == ["aten::istft"]
    assert tl["kernel_busy_ms"] == 0.02 and tl["gpu_busy_ms"] == 0.022
    assert tl["wall_ms"] == pytest.approx(tl["gpu_busy_ms"] + tl["gaps_ms"])


@pytest.mark.parametrize("name,gpu_name,cause", [
    pytest.param("cudaStreamBeginCapture", "", "capture", id="capture"),
    pytest.param("cudaGraphInstantiateWithFlags", "", "capture", id="instantiate"),
    pytest.param("cudaDeviceSynchronize", "", "sync", id="device-sync"),
    pytest.param("cudaMemcpy", "", "sync", id="sync-memcpy"),
    pytest.param("cuMemcpyDtoH_v2", "", "sync", id="driver-suffix"),
    pytest.param("cudaMalloc", "", "alloc", id="malloc"),
    pytest.param("cuMemMap", "", "alloc", id="vmm-map"),
    pytest.param("cudaMemcpyAsync", "Memcpy HtoD (Pageable -> Device)", "h2d_copy", id="h2d"),
    pytest.param("cudaMemcpyAsync", "Memcpy DtoH (Device -> Pinned)", "d2h_copy", id="d2h"),
    pytest.param("cudaMemcpyAsync", "Memcpy DtoD (Device -> Device)", "d2d_copy", id="d2d"),
    pytest.param("cudaMemcpyAsync", "", "copy", id="copy-direction-unknown"),
    pytest.param("cudaMemsetAsync", "", "memset", id="memset"),
    pytest.param("cudaGraphLaunch", "", "graph_launch", id="graph"),
    pytest.param("cudaLaunchKernel_ptsz", "", "eager_op", id="kernel-launch"),
    pytest.param("cudaEventRecord", "", "cuda_api", id="other-api"),
])
def test_api_cause(name, gpu_name, cause):
    assert kernels.api_cause(name, gpu_name) == cause


@pytest.mark.parametrize("host,expected", [
    pytest.param([api("cudaStreamBeginCapture", 10, 20)], {"capture": 20.0, "python": 30.0}, id="capture"),
    pytest.param([api("cudaMalloc", 10, 10), api("cudaStreamSynchronize", 15, 15)],
                 {"alloc": 5.0, "sync": 15.0, "python": 30.0}, id="sync-over-alloc"),
    pytest.param([op("aten::copy_", 0, 50), api("cudaMemcpyAsync", 20, 10, corr=9)],
                 {"eager_op": 30.0, "h2d_copy": 10.0, "python": 10.0}, id="api-inside-op"),
    pytest.param([op("aten::cat", 20, 20), op("aten::stack", 30, 20, tid=2)], {"eager_op": 30.0, "python": 20.0},
                 id="ops-on-two-threads"),
])
def test_host_events_overlapping_a_gap_share_it_by_priority(host, expected):
    # the GPU: a kernel 0-10, then nothing launched from this trace until a kernel at 60-70 (no correlation)
    ev = [mark(0, 70), kernel(0, 10), kernel(60, 10), memcpy(90, 1, corr=9, direction="HtoD"), *host]
    tl = unit_timeline(ev)
    assert causes_us(tl) == expected
    assert tl["gap_list"][0]["ms"] == 0.05
    for cause, per_op in tl["by_cause_op"].items():
        assert sum(per_op.values()) == pytest.approx(tl["by_cause"][cause], abs=1e-9)


def test_nested_ops_are_named_by_the_outermost():
    ev = [mark(0, 30), op("aten::stft", 0, 20), op("aten::view", 2, 3), op("aten::linalg_norm", 6, 10),
          op("aten::sum", 7, 2), kernel(25, 5)]
    tl = unit_timeline(ev)
    assert tl["by_cause_op"]["eager_op"] == {"aten::stft": 0.02}
    assert tl["by_cause_op"]["python"] == {"-": 0.005}


def test_without_a_mark_the_span_is_the_extent_of_the_events_and_a_span_can_be_given():
    ev = [op("aten::add", 0, 5), kernel(10, 10), kernel(30, 10)]
    assert unit_timeline(ev)["wall_ms"] == 0.04
    tl = unit_timeline(ev, span=(10, 35))
    assert (tl["wall_ms"], tl["kernel_busy_ms"], tl["gaps_ms"]) == (0.025, 0.015, 0.01)


def test_random_traces_split_wall_into_gpu_busy_and_gaps_and_gaps_into_causes():
    rng = random.Random(7)
    for _ in range(30):
        ev, t = [mark(0, 2000)], 0.0
        for corr in range(60):
            t += rng.uniform(0, 20)
            dur = rng.uniform(1, 10)
            ev.append(rng.choice([api("cudaLaunchKernel", t, 3, corr), api("cudaGraphLaunch", t, 8, corr),
                                  api("cudaMemcpyAsync", t, 4, corr)]))
            ev.append(kernel(t + rng.uniform(-5, 30), dur, corr) if ev[-1]["name"] != "cudaMemcpyAsync"
                      else memcpy(t + rng.uniform(4, 30), dur, corr, rng.choice(["HtoD", "DtoH"])))
            if rng.random() < 0.3:
                ev.append(op(rng.choice(["aten::cat", "aten::istft", "aten::item"]), t - 2, rng.uniform(1, 40)))
            if rng.random() < 0.1:
                ev.append(api("cudaStreamSynchronize", t + 3, rng.uniform(1, 30)))
        tl = unit_timeline(ev)
        assert tl["wall_ms"] == pytest.approx(tl["gpu_busy_ms"] + tl["gaps_ms"], abs=1e-3)
        assert sum(tl["by_cause"].values()) == pytest.approx(tl["gaps_ms"], abs=1e-3)
        assert set(tl["by_cause"]) <= set(GAP_CAUSES)
        for cause, per_op in tl["by_cause_op"].items():
            assert sum(per_op.values()) == pytest.approx(tl["by_cause"][cause], abs=1e-3)
        assert tl["kernel_busy_ms"] <= tl["gpu_busy_ms"] + 1e-9


def test_unit_timeline_rejects_malformed_events():
    with pytest.raises(ValueError, match=r"events\[1\].*ts"):
        unit_timeline([mark(0, 10), {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": "x", "dur": 1}])
    with pytest.raises(ValueError, match="events: expected a list"):
        unit_timeline({"traceEvents": []})


@pytest.mark.parametrize("name,kind", [
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<float, unsigned int, 3, 128, 1>(...)",
     "cat"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda"
     "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}> >(int, ...)", "copy"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_put_kernel_impl"
     "<at::native::OpaqueType<4> >(...)", "index_put"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl"
     "<at::native::OpaqueType<4> >(...)", "index"),
    ("void at::native::_scatter_gather_elementwise_kernel<128, 8, ...>(int, ...)", "scatter_gather"),
    ("void at::native::(anonymous namespace)::reflection_pad1d_out_kernel<float>(...)", "pad"),
    ("ampere_sgemm_128x64_nn", None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>", None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>", None),
])
def test_movement_kind_from_kernel_names(name, kind):
    assert kernels.movement_kind(name) == kind


def test_data_movement_counts_kernels_copies_and_fills():
    ev = [kernel(0, 2, name="CatArrayBatchedCopy_contig"), kernel(3, 4, name="CatArrayBatchedCopy"),
          kernel(8, 1, name="direct_copy_kernel_cuda"), kernel(10, 5, name="ampere_sgemm"),
          kernel(16, 1, name="FillFunctor<float>"), memcpy(20, 1, corr=1, direction="DtoD"),
          memcpy(22, 1, corr=2, direction="DtoH"), {"ph": "X", "cat": "gpu_memset", "name": "Memset", "ts": 30, "dur": 1}]
    out = data_movement(ev)
    assert (out["kernels"], out["movement_kernels"], out["memcpy_dtod"], out["fills"]) == (5, 3, 1, 2)
    assert out["by_kind"]["cat"] == {"count": 2, "ms": 0.006} and out["by_kind"]["copy"]["count"] == 1
    assert out["movement_share"] == 0.6 and out["movement_ms"] == 0.007
    assert data_movement([])["movement_share"] is None


def test_trace_call_off_cuda_runs_the_call_unprofiled():
    out, events, wall = kernels.trace_call(lambda x: x + 1, 2, device="cpu")
    assert (out, events) == (3, None) and wall >= 0
    assert kernels.profile_call(lambda: 5, device="cpu") == (5, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a real kineto trace")
def test_cuda_trace_of_a_graph_replay_and_eager_work():
    x = torch.randn(256, 256, device="cuda")
    static = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                      # warm-up off the default stream, as torch's docs do
        static.copy_(x @ x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.copy_((x @ x).relu())

    def unit():
        graph.replay()
        y = torch.cat([static, static]) * 2
        return float(y.sum().item())

    out, events, wall = kernels.trace_call(unit, device="cuda")
    assert isinstance(out, float) and events and wall > 0
    tl = unit_timeline(events)
    assert tl["graph_launches"] == 1 and tl["kernels"] >= 5 and tl["kernel_busy_ms"] > 0
    assert tl["wall_ms"] == pytest.approx(tl["gpu_busy_ms"] + tl["gaps_ms"], abs=1e-3)
    assert sum(tl["by_cause"].values()) == pytest.approx(tl["gaps_ms"], abs=1e-3)
    assert set(tl["by_cause"]) <= set(GAP_CAUSES)
    assert data_movement(events)["by_kind"]["cat"]["count"] >= 1
