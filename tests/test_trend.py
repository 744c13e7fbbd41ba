"""suite.measure.trend: the memory-flatness rule on hand-made samples (values and counts written here, the
expected verdicts from the rule's own numbers: 2% growth over the window, quarter medians rising by more than
0.5%), and the sampler's columns."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from suite.measure import heap, memory, trend

W = trend.WINDOW


def noise(n, sd, seed=0):
    return np.random.default_rng(seed).normal(0.0, sd, n)


def test_a_flat_noisy_series_is_flat():
    f = trend.flatness(1000.0 + noise(150, 5.0))
    assert f["flat"] and not f["trend"] and abs(f["growth_pct"]) < 1.0, f
    assert f["cycles"] == 150 and f["window"] == W


def test_a_leak_of_half_a_mib_per_cycle_is_not_flat():
    # 0.5 MiB per cycle on 1000 MiB: 49.5 MiB over 100 cycles = ~4.9% > 2%
    f = trend.flatness(1000.0 + 0.5 * np.arange(150) + noise(150, 2.0))
    assert not f["flat"] and "growth" in f["reason"], f
    assert 0.45 < f["slope_mib_per_cycle"] < 0.55 and 4.0 < f["growth_pct"] < 6.0


def test_open_sessions_explain_swings_and_a_leak_under_them_is_still_found():
    rng = np.random.default_rng(3)
    live = rng.integers(0, 4, 150)                       # sessions of one kind open at each close
    swings = 1000.0 + 300.0 * live + noise(150, 2.0)     # 300 MiB per open session: not growth
    counts = {"open:a/stock": live.tolist(), "open:b/cadence": [2] * 150}
    f = trend.flatness(swings, counts)
    assert f["flat"] and abs(f["growth_mib"]) < 3.0, f
    assert f["regressors"] == ["open:a/stock"]            # a count that never changes is not fitted
    leak = trend.flatness(swings + 0.5 * np.arange(150), counts)
    assert not leak["flat"] and 0.45 < leak["slope_mib_per_cycle"] < 0.55, leak


def test_a_slow_staircase_under_the_growth_bound_is_a_monotone_trend():
    # +4 MiB every 25 cycles: ~1.6% over the window (under 2%), quarter medians 1000, 1004, 1008, 1012 (> 0.5%)
    steps = 1000.0 + 4.0 * (np.arange(W) // 25)
    f = trend.flatness(steps)
    assert f["growth_pct"] <= trend.GROWTH_PCT and f["trend"] and not f["flat"], f
    assert "monotone trend" in f["reason"]
    assert f["quarter_medians_mib"] == [1000.0, 1004.0, 1008.0, 1012.0]


def test_one_step_up_is_judged_by_its_growth_alone():
    # an allocator taking one more 8 MiB segment mid-window: quarter medians 1000, 1000, 1008, 1008 (not a
    # rise at every step); the fit's growth is ~12 MiB = 1.2% <= 2%
    f = trend.flatness(1000.0 + 8.0 * (np.arange(W) >= W // 2))
    assert not f["trend"] and f["flat"] and 1.0 < f["growth_pct"] < 1.5, f
    big = trend.flatness(1000.0 + 40.0 * (np.arange(W) >= W // 2))      # 40 MiB kept for good: ~6%
    assert not big["flat"] and not big["trend"] and "growth" in big["reason"], big


def test_a_rise_within_the_trend_bound_is_flat():
    steps = 1000.0 + 1.0 * (np.arange(W) // 25)           # quarter medians rise by 3 MiB in all: 0.3%
    f = trend.flatness(steps)
    assert f["flat"] and not f["trend"], f


def test_only_the_last_window_counts_and_memory_given_back_is_flat():
    warm_up = np.linspace(500.0, 1000.0, 60)               # first cycles: caches fill
    f = trend.flatness(np.concatenate([warm_up, 1000.0 + noise(W, 3.0)]))
    assert f["flat"], f
    assert trend.flatness(1200.0 - 1.0 * np.arange(W))["flat"]    # falling: nothing grows


def test_too_few_cycles_are_not_shown_flat():
    f = trend.flatness([1000.0] * (W - 1))
    assert not f["flat"] and f["reason"] == f"{W - 1} cycles < window {W}: flatness not shown"
    assert trend.flatness([1000.0] * 10, window=10)["flat"]


def test_a_missing_sample_is_not_flat():
    values = [1000.0] * W
    values[50] = None
    assert trend.flatness(values)["reason"] == "a sample in the window is missing"


@pytest.mark.parametrize("window", [0, 7, 2.5, True])
def test_bad_window(window):
    with pytest.raises(ValueError, match="window: expected an int >= 8"):
        trend.flatness([1.0] * 20, window=window)


def test_counts_must_have_one_value_per_cycle():
    with pytest.raises(ValueError, match=r"counts\['open:x'\]: expected 20 values"):
        trend.flatness([1.0] * 20, {"open:x": [0] * 19}, window=10)


def test_the_sampler_gives_columns_and_judge_every_series():
    sampler = trend.MemorySampler("cpu")
    for k in range(12):
        sampler.sample({"open:a/stock": k % 2} if k % 3 else {})
    s = sampler.series()
    assert list(s["memory"]) == ["rss_mib"] and len(s["memory"]["rss_mib"]) == 12
    assert all(v > 0 for v in s["memory"]["rss_mib"])
    assert s["counts"] == {"open:a/stock": [0 if k % 3 == 0 else k % 2 for k in range(12)]}
    judged = trend.judge(s, window=10)
    assert list(judged) == ["rss_mib"] and judged["rss_mib"]["cycles"] == 12
    assert trend.MemorySampler("cpu").series() == {"memory": {}, "counts": {}}


def test_a_cuda_sample_empties_the_cache_only_while_no_capture_runs(monkeypatch):
    # An empty_cache beside another thread's capture invalidates that capture (duplexcadence.gate); the sampler
    # runs in the closing thread while other sessions capture.
    import threading

    import torch

    from duplexcadence import gate
    from suite.measure import memory

    log = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append(("empty_cache", gate.GATE.counts())))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    sampler = trend.MemorySampler("cpu")
    sampler.cuda, sampler.device = True, torch.device("cuda", 0)
    sampler.driver = type("Driver", (), {"used_mib": lambda self: 1.0})()
    capturing, finish, sampled = threading.Event(), threading.Event(), threading.Event()

    def capturer():
        with gate.capture():
            capturing.set()
            finish.wait(10)
            log.append("capture ends")

    def closer():
        sampler.sample({})
        sampled.set()

    a = threading.Thread(target=capturer, daemon=True)
    a.start()
    assert capturing.wait(10)
    b = threading.Thread(target=closer, daemon=True)
    b.start()
    assert not sampled.wait(0.3)                         # waits for the capture
    finish.set()
    a.join(10), b.join(10)
    assert sampled.is_set() and log[0] == "capture ends" and "synchronize" in log
    assert log[-1] == ("empty_cache", {"work": 0, "device_wide": 1, "waiting": 0, "capturing": False, "alone": False})
    assert sampler.series()["memory"]["driver_used_mib"] == [1.0]
    log.clear()
    memory.release_cached("cpu")                          # off CUDA: nothing
    assert log == []


# A fresh interpreter: a capture that fails leaves torch's allocator counting it for the rest of the process
# (pytorch/pytorch#180395, torch < 2.12), which would change every later CUDA test in this one.
_SAMPLES_BESIDE_CAPTURES = """
import threading
import torch
from duplexcadence.graphs import GraphCache
from duplexcadence.clocks import signature
from suite.measure import trend

sampler, stop = trend.MemorySampler("cuda"), threading.Event()

def closer():                     # what a stress thread does after every close
    while not stop.is_set():
        junk = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")   # something for empty_cache to free
        del junk
        sampler.sample({})

t = threading.Thread(target=closer, daemon=True)
t.start()
x, failures, captures = torch.zeros(4096, device="cuda"), 0, 0
for k in range(200):
    cache = GraphCache("cuda", inline=False)
    step = lambda: torch.mul(x, 2.0).add_(1.0).sum()
    cache.capture(signature("sampled", k + 1), step)
    failures += cache.stats.capture_failures
    captures += cache.stats.captures
    cache.drop()
stop.set()
t.join(30)
assert (failures, captures) == (0, 200) and len(sampler.rows) > 0, (failures, captures, len(sampler.rows))
"""


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA: graph captures")
def test_cuda_samples_after_closes_never_invalidate_another_threads_capture():
    import os
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _SAMPLES_BESIDE_CAPTURES], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr[-3000:]


# --- quiescent samples ------------------------------------------------------------------------------------
def test_quiescent_samples_judge_only_what_closes_leave_and_find_a_leak_between_them():
    closes = np.arange(10, 301, 10)                                    # a sample every 10 closes, 300 in all
    flat = trend.quiet_flatness(closes, 1000.0 + noise(len(closes), 2.0))
    assert flat["flat"] and flat["samples"] == 10 and flat["cycles"] == 300 and flat["regressors"] == [], flat
    # 0.5 MiB per close on 1000 MiB: 49.5 MiB over 100 closes = ~4.9% > 2%
    leak = trend.quiet_flatness(closes, 1000.0 + 0.5 * closes + noise(len(closes), 0.5))
    assert not leak["flat"] and "growth" in leak["reason"], leak
    assert 0.45 < leak["slope_mib_per_cycle"] < 0.55 and 4.0 < leak["growth_pct"] < 6.0


def test_quiescent_growth_before_the_window_is_not_counted_and_too_few_samples_are_not_shown():
    closes = np.arange(10, 301, 10)
    warm = 1000.0 + np.minimum(closes, 150) * 2.0                       # grows until close 150, then holds
    assert trend.quiet_flatness(closes, warm)["flat"]
    sparse = trend.quiet_flatness(np.arange(20, 301, 20), np.full(15, 1000.0))   # 5 in the last 100 closes
    assert sparse["flat"] and sparse["samples"] == 8 and sparse["span_closes"] == 140, sparse
    sparse_leak = trend.quiet_flatness(np.arange(20, 301, 20), 1000.0 + 0.5 * np.arange(20, 301, 20))
    assert not sparse_leak["flat"] and 0.49 < sparse_leak["slope_mib_per_cycle"] < 0.51, sparse_leak
    few = trend.quiet_flatness(np.arange(25, 176, 30), np.full(6, 1000.0))          # 6 samples in all
    assert not few["flat"] and "6 quiescent samples < 8" in few["reason"], few
    short = trend.quiet_flatness([10, 20, 30], [1.0, 1.0, 1.0])
    assert not short["flat"] and "30 closes < window" in short["reason"]


@pytest.mark.parametrize("closes, values, match", [
    ([10, 20], [1.0], "one close count per sample"),
    ([20, 10], [1.0, 1.0], "non-decreasing"),
])
def test_quiescent_samples_of_another_shape_are_refused(closes, values, match):
    with pytest.raises(ValueError, match=match):
        trend.quiet_flatness(closes, values)


def test_the_sampler_keeps_quiescent_rows_apart():
    s = trend.MemorySampler("cpu")
    s.sample({"open:a": 1})
    s.sample_quiet(5, 0)
    s.sample_quiet(9, 0)
    q = s.quiet_series()
    assert q["closes"] == [5, 9] and q["open_sessions"] == [0, 0] and list(q["memory"]) == ["rss_mib"]
    assert len(s.series()["memory"]["rss_mib"]) == 1
    assert set(trend.judge_quiet(q, window=8)) == {"rss_mib"}
    heap_parts = {"heap_in_use_mib", "heap_free_mib"} if heap.HEAP_READABLE else set()
    assert set(q["host"]) == heap_parts and all(len(v) == 2 for v in q["host"].values())
    assert set(trend.judge_quiet(q, window=8, part="host")) == heap_parts
    assert q["caches"] == {}                              # no per-shape library cache is read off CUDA


def test_a_host_part_near_zero_is_judged_against_one_mib_and_a_judged_series_is_not():
    closes = list(range(10, 161, 15))
    pinned = [0.0, 0.002, 0.0, 0.001, 0.003, 0.0, 0.002, 0.003, 0.0, 0.002, 0.003]
    q = {"closes": closes, "memory": {"rss_mib": pinned}, "host": {"pinned_mib": pinned}}
    assert trend.judge_quiet(q, window=40, part="host")["pinned_mib"]["flat"]
    assert not trend.judge_quiet(q, window=40)["rss_mib"]["flat"]        # no floor where the verdict is made
    growing = {"closes": closes, "host": {"pinned_mib": [0.5 * i for i in range(len(closes))]}}
    assert not trend.judge_quiet(growing, window=40, part="host")["pinned_mib"]["flat"]


@pytest.mark.skipif(not heap.HEAP_READABLE, reason="needs glibc >= 2.33 (mallinfo2) to read the C heap")
def test_host_heap_sees_a_malloc_and_its_free():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = heap.host_heap_mib()["heap_in_use_mib"]
    block = libc.malloc(64 * 2**20)
    try:
        ctypes.memset(block, 1, 64 * 2**20)
        held = heap.host_heap_mib()["heap_in_use_mib"]
    finally:
        libc.free(block)
    after = heap.host_heap_mib()["heap_in_use_mib"]
    assert 63.0 < held - before < 66.0, (before, held)
    assert abs(after - before) < 2.0, (before, after)
    assert "pinned_mib" not in heap.host_heap_mib("cpu")


@pytest.mark.skipif(not (heap.HEAP_TRIMMABLE and heap.HEAP_READABLE),
                    reason="needs glibc (malloc_trim, mallinfo2) to hand the heap's free pages back")
def test_trim_heap_hands_back_what_malloc_kept_after_a_free_and_the_sampler_records_it():
    """64 MiB in 4 KiB blocks, freed but for the last (so free() cannot shrink the heap's top itself): RSS stays
    up until trim_heap, which hands most of it back; a sampler with trim_heap records RSS after the trim in its
    host part, beside the judged rss_mib read before it."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    heap.trim_heap()
    blocks = [libc.malloc(4096) for _ in range(16384)]
    for b in blocks:
        ctypes.memset(b, 1, 4096)
    for b in blocks[:-1]:
        libc.free(b)
    try:
        kept = memory.rss_mib()
        s = trend.MemorySampler("cpu")
        s.trim_heap = True
        s.sample_quiet(3, 0)
        q = s.quiet_series()
        after = q["host"]["rss_trimmed_mib"][0]
        assert q["memory"]["rss_mib"][0] > after + 40.0, (q["memory"]["rss_mib"], after)
        assert kept - after > 40.0, (kept, after)
        assert set(trend.judge_quiet(q, window=8)) == {"rss_mib"}        # the trimmed series is not judged
    finally:
        libc.free(blocks[-1])
