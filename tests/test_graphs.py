"""duplexcadence.graphs: GraphCache dispatch (eager on CPU, inline=False, capture ahead of time, warm-up by
family, strict mode, ArenaMoved, drop) and StreamLeases (a stream per live holder, never torch's
wrapped-around pool stream); on CUDA, a capture stream handed from a dropped cache to a new one keeps no
block of the first cache's graph pool (its cuBLAS workspace is primed outside it).
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import threading

import pytest
import torch

from cuda_checks import needs_fresh_streams, pool_segments, settle  # tests/ is on sys.path under pytest
from duplexcadence import graphs
from duplexcadence.arena import Arena
from duplexcadence.clocks import signature
from duplexcadence.errors import InputError
from duplexcadence.graphs import (STREAMS, ArenaMoved, GraphCache, GraphEntry, SignatureError, StreamLeases, WarmSet,
                                  prime_workspace)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture")


fresh_streams = needs_fresh_streams("a driver stream that no earlier test ran a GEMM on")


class _FakeStream:
    def __init__(self, ptr):
        self.cuda_stream = ptr


_ADDRESSES = itertools.count(0x1000, 0x10)     # one sequence for every test: a stream's address never comes back


def _fresh_creator():
    """Like the driver path: a new address per stream, in this process."""
    made = []

    def create(index):
        made.append(index)
        return _FakeStream(next(_ADDRESSES))
    return create, made


def test_live_leases_never_share_a_stream_and_released_ones_are_reused():
    create, made = _fresh_creator()
    leases = StreamLeases(create)
    held = [leases.acquire("cuda:0") for _ in range(40)]
    assert len({s.cuda_stream for s in held}) == 40 and leases.leased() == 40 and len(made) == 40
    leases.release(held[7])
    again = leases.acquire("cuda:0")
    assert again is held[7] and len(made) == 40            # a free one first, no new stream
    other = leases.acquire("cuda:1")                        # free lists are per device
    assert other.cuda_stream not in {s.cuda_stream for s in held} and made[-1] == 1


def test_release_of_a_stream_not_leased_is_an_error():
    create, _ = _fresh_creator()
    leases = StreamLeases(create)
    s = leases.acquire("cuda:0")
    leases.release(s)
    with pytest.raises(ValueError, match="is not leased"):
        leases.release(s)
    with pytest.raises(ValueError, match="device: expected a CUDA device, got cpu"):
        leases.acquire("cpu")


def test_a_wrapped_around_pool_stream_is_refused_and_nothing_is_leased():
    """torch.cuda.Stream() (the fallback without cuda-python) cycles through 32 streams per device."""
    pool = itertools.cycle([_FakeStream(0x2000 + i) for i in range(32)])
    leases = StreamLeases(lambda index: next(pool))
    held = [leases.acquire("cuda:0") for _ in range(32)]
    with pytest.raises(RuntimeError, match="already leased.*install cuda-python"):
        leases.acquire("cuda:0")
    assert leases.leased() == 32
    leases.release(held[0])
    assert leases.acquire("cuda:0") is held[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture streams")
def test_cuda_live_graph_caches_capture_on_distinct_streams_past_torchs_pool_of_32():
    before = STREAMS.leased()
    caches = [GraphCache("cuda") for _ in range(40)]
    assert len({c.capture_stream.cuda_stream for c in caches}) == 40
    assert STREAMS.leased() == before + 40
    del caches
    gc.collect()
    assert STREAMS.leased() == before                     # given back with the caches


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch's stream pool")
def test_cuda_torch_stream_pool_wraps_around_which_is_why_leases_exist():
    """The premise of StreamLeases: torch.cuda.Stream() repeats addresses within 33 calls (c10 stream pool)."""
    ptrs = [torch.cuda.Stream().cuda_stream for _ in range(33)]
    assert len(set(ptrs)) < 33


def test_a_finalizer_run_by_a_collection_inside_acquire_does_not_deadlock():
    """A GraphCache-like holder in a reference cycle is freed by the cyclic collector, which may run inside
    acquire() (any allocation under the lock): its finalizer must not take the lock again."""
    import threading
    import weakref

    create, _ = _fresh_creator()
    leases = StreamLeases(lambda index: (gc.collect(), create(index))[1])   # a collection under the lock

    class Holder:
        def __init__(self):
            self.stream = leases.acquire("cuda:0")
            weakref.finalize(self, leases.release_later, self.stream)
            self.me = self                                   # a cycle: only the collector frees it

    h = Holder()
    first = h.stream.cuda_stream
    del h
    got = []
    t = threading.Thread(target=lambda: got.append(leases.acquire("cuda:0")), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "acquire() deadlocked on a finalizer's release"
    assert leases.leased() == 1 and got[0].cuda_stream != first     # the collected one is free again
    assert leases.acquire("cuda:0").cuda_stream == first


def test_concurrent_acquires_from_many_threads_never_share_a_stream():
    create, made = _fresh_creator()
    leases = StreamLeases(create)
    got, start = [], threading.Barrier(8)

    def worker():
        start.wait()
        mine = [leases.acquire("cuda:0") for _ in range(25)]
        got.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 200 and len({s.cuda_stream for s in got}) == 200
    assert leases.leased() == 200 and len(made) == 200
    for s in got:
        leases.release(s)
    assert leases.leased() == 0


def test_a_thread_gets_back_a_free_stream_it_primed_before_any_other():
    """Every (host thread, capture stream) pair keeps a cuBLAS workspace for the life of the process: a thread
    that primed a stream gets that one back when it is free, another thread gets the newest free one."""
    create, made = _fresh_creator()
    leases = StreamLeases(create)
    a, b, c = (leases.acquire("cuda:0") for _ in range(3))
    graphs._primed_here().add(a.cuda_stream)                   # what prime_workspace records for this thread
    for s in (a, b, c):
        leases.release(s)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("other", leases.acquire("cuda:0")))
    t.start()
    t.join()
    assert got["other"] is c                                   # nothing primed there: the newest free one
    assert leases.acquire("cuda:0") is a and len(made) == 3    # this thread: the stream it primed


def test_release_later_queues_the_stream_until_the_next_call():
    create, made = _fresh_creator()
    leases = StreamLeases(create)
    a, b = leases.acquire("cuda:0"), leases.acquire("cuda:0")
    leases.release_later(a)
    assert leases.leased() == 1                              # leased() gives the queued one back first
    assert leases.acquire("cuda:0") is a and len(made) == 2  # reused, not a new stream
    leases.release_later(b)
    leases.release(a)                                        # release() drains the queue too
    assert leases.leased() == 0


# --- GraphCache dispatch on CPU --------------------------------------------------------------------
class _Counter:
    """A step: counts its runs and whether the cache's lock was held while it ran."""

    def __init__(self, lock=None):
        self.runs, self.locked, self.lock = 0, [], lock

    def __call__(self):
        self.runs += 1
        self.locked.append(self.lock.held if self.lock is not None else None)
        return f"out{self.runs}"


class _FlagLock:
    """A context-manager lock that says whether it is held (a fake of the model's RLock)."""

    def __init__(self):
        self.held, self.entered = False, 0

    def __enter__(self):
        self.held = True
        self.entered += 1

    def __exit__(self, *exc):
        self.held = False


class _FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def _dispatch_cache(**kw) -> GraphCache:
    """A CPU GraphCache switched to the CUDA dispatch (`enabled`), for the host-side paths that never reach a
    capture: warm-up runs, inline=False fallbacks, strict refusals, replays of a fake entry, drop."""
    cache = GraphCache("cpu", **kw)
    cache.enabled = True
    return cache


def test_cpu_cache_runs_every_step_eagerly_under_the_lock_and_counts_it():
    lock = _FlagLock()
    cache = GraphCache("cpu", lock=lock)
    assert cache.enabled is False and cache.pool is None and cache.capture_stream is None
    step = _Counter(lock)
    a, b = signature("flow", 28, {"conformer_att": 300}), signature("flow", 28, {"conformer_att": 350})
    assert [cache.run(a, step), cache.run(b, step), cache.run(a, step)] == ["out1", "out2", "out3"]
    assert step.locked == [True, True, True] and not lock.held
    assert cache.capture(a, step) is False and step.runs == 3          # nothing to capture on, nothing run
    assert a not in cache and cache.entries == {}
    s = cache.stats
    assert (s.eager_runs, s.captures, s.replays, s.eager_fallbacks, s.warmup_runs) == (3, 0, 0, 0, 0)
    assert s.snapshot()["eager_runs"] == 3


def test_graphs_on_a_cpu_device_are_refused_as_input_naming_the_option():
    with pytest.raises(InputError, match=r"spec\['graphs'\]: True needs a CUDA device, got cpu"):
        GraphCache("cpu", enabled=True)


def test_inline_false_never_captures_in_run_and_counts_eager_fallbacks():
    lock = _FlagLock()
    cache = _dispatch_cache(inline=False, lock=lock)
    step = _Counter(lock)
    sig = signature("vocoder", 10, {"history": 120})
    assert cache.run(sig, step) == "out1" and cache.run(sig, step) == "out2"
    assert step.locked == [True, True]
    s = cache.stats
    assert (s.eager_fallbacks, s.captures, s.eager_runs, s.warmup_runs) == (2, 0, 0, 0)
    assert sig not in cache and cache.entries == {}


def test_a_warm_up_is_counted_once_per_family_with_warm_key():
    warmed = WarmSet()
    cache = _dispatch_cache(inline=False, warmup=1, warmed=warmed, warm_key=lambda sig: sig.step)
    step = _Counter()
    f28, f29 = signature("flow", 28, {"conformer_att": 300}), signature("flow", 29, {"conformer_att": 350})
    voc = signature("vocoder", 10)
    assert cache.capture(f28, step) is False and step.runs == 0       # the family is not warm yet
    cache.run(f28, step)                                             # the one warm-up of "flow"
    assert cache.stats.warmup_runs == 1 and "flow" in warmed and "vocoder" not in warmed
    cache.run(f29, step)                                             # same family: no second warm-up
    assert cache.stats.warmup_runs == 1 and cache.stats.eager_fallbacks == 1
    cache.run(voc, step)
    assert cache.stats.warmup_runs == 2 and "vocoder" in warmed
    other = _dispatch_cache(inline=False, warmup=1, warmed=warmed, warm_key=lambda sig: sig.step)
    other.run(signature("flow", 30), step)                           # warmed on this thread already
    assert other.stats.warmup_runs == 0 and other.stats.eager_fallbacks == 1
    assert step.runs == 4


def test_a_warm_up_on_one_host_thread_does_not_warm_another():
    """torch makes cuBLAS / cuDNN handles per host thread, lazily: a family warmed on one thread must still
    run eagerly once on a new thread before that thread captures it."""
    warmed, step = WarmSet(), _Counter()
    first = _dispatch_cache(inline=False, warmup=1, warmed=warmed, warm_key=lambda sig: sig.step)
    first.run(signature("window", 12), step)
    assert first.stats.warmup_runs == 1 and not first.needs_warmup(signature("window", 13))
    seen = {}

    def other_thread():
        other = _dispatch_cache(inline=False, warmup=1, warmed=warmed, warm_key=lambda sig: sig.step)
        seen["needs"] = other.needs_warmup(signature("window", 13))
        seen["captured"] = other.capture(signature("window", 13), step)      # refused: not warm here
        other.run(signature("window", 13), step)
        seen["stats"] = (other.stats.warmup_runs, other.stats.eager_fallbacks)
        seen["after"] = other.needs_warmup(signature("window", 14))
        seen["families"] = "window" in warmed

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen == {"needs": True, "captured": False, "stats": (1, 0), "after": False, "families": True}
    assert not first.needs_warmup(signature("window", 14))                # this thread's warm-up still holds


def test_a_capture_runs_with_autograd_off(monkeypatch):
    """A graph holds its outputs: an output with autograd history would keep every intermediate of the step
    allocated in the pool (a step over modules whose parameters require grad). The capture itself is faked
    on the CPU; the cache's own code around it is what runs."""
    class FakeCUDAGraph:
        def replay(self):
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: 0)
    monkeypatch.setattr(graphs, "prime_workspace", lambda stream: None)
    layer = torch.nn.Linear(4, 4)
    assert layer.weight.requires_grad
    cache = _dispatch_cache(inline=True)
    grad_on = []

    def step():
        grad_on.append(torch.is_grad_enabled())
        return layer(torch.ones(1, 4))

    out = cache.run(signature("window", 4), step)
    assert cache.stats.captures == 1 and grad_on == [False]
    assert out.grad_fn is None and not out.requires_grad
    assert cache.entries[signature("window", 4)].outputs is out


def test_without_warm_key_every_signature_warms_up_warmup_times():
    cache = _dispatch_cache(inline=False, warmup=2)
    step = _Counter()
    a, b = signature("flow", 28), signature("flow", 29)
    for _ in range(3):
        cache.run(a, step)
    cache.run(b, step)
    assert cache.stats.warmup_runs == 3 and cache.stats.eager_fallbacks == 1 and step.runs == 4


def test_strict_mode_refuses_an_uncaptured_signature_after_close():
    cache = _dispatch_cache(inline=False, strict=True, warmup=1)
    step = _Counter()
    sig = signature("flow", 28)
    cache.run(sig, step)                                   # before close: a warm-up, not an error
    cache.close()
    with pytest.raises(SignatureError, match=r"Signature\(flow, size=29\).*not captured before close"):
        cache.run(signature("flow", 29), step)
    assert issubclass(SignatureError, KeyError) and step.runs == 1
    lenient = _dispatch_cache(inline=False, warmup=1)
    lenient.close()
    lenient.run(sig, step)                                 # no warm-up after close either: a fallback
    assert lenient.stats.warmup_runs == 0 and lenient.stats.eager_fallbacks == 1


def test_a_replay_checks_the_arena_base_and_takes_no_lock():
    arena = Arena("cpu")
    arena.declare("kv", (64,), torch.float32)
    arena.allocate()
    lock = _FlagLock()
    cache = _dispatch_cache(arena=arena, lock=lock, inline=False)
    step = _Counter(lock)
    here, moved = signature("decode", 1, {"kv": 10}), signature("decode", 1, {"kv": 11})
    graph, stale = _FakeGraph(), _FakeGraph()
    cache.entries[here] = GraphEntry(here, graph, "static out", arena.base)
    cache.entries[moved] = GraphEntry(moved, stale, "stale out", arena.base + 256)
    assert cache.run(here, step) == "static out" and cache.run(here, step) == "static out"
    assert graph.replays == 2 and cache.stats.replays == 2
    assert lock.entered == 0 and step.runs == 0
    with pytest.raises(ArenaMoved, match=f"{arena.base + 256:#x}.*{arena.base:#x}"):
        cache.run(moved, step)
    assert stale.replays == 0 and step.runs == 0 and cache.stats.replays == 2


def test_drop_forgets_every_graph_and_later_steps_run_eagerly():
    cache = _dispatch_cache()
    sig = signature("decode", 1)
    cache.entries[sig] = GraphEntry(sig, _FakeGraph(), "static out", 0)
    step = _Counter()
    cache.drop()
    assert cache.closed and cache.entries == {} and cache.pool is None and sig not in cache
    assert cache.run(sig, step) == "out1" and cache.stats.eager_fallbacks == 1
    assert cache.capture(sig, step) is False and step.runs == 1


# --- GraphCache on CUDA ----------------------------------------------------------------------------
def _add_one(x):
    def step():
        return x.add_(1.0)
    return step


@needs_cuda
def test_cuda_capture_records_without_running_and_replay_runs():
    x = torch.zeros(1024, device="cuda")
    cache = GraphCache("cuda", inline=False)
    sig, step = signature("add_one", 1024), _add_one(x)
    assert cache.capture(sig, step) is True and sig in cache
    torch.cuda.synchronize()
    assert int(torch.count_nonzero(x)) == 0                  # recorded, not run
    assert cache.capture(sig, step) is True                  # already there: nothing recorded again
    out = cache.run(sig, step)
    torch.cuda.synchronize()
    assert out.data_ptr() == x.data_ptr() and torch.equal(x.cpu(), torch.ones(1024))
    cache.run(sig, step)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.full((1024,), 2.0))
    s = cache.stats
    assert (s.captures, s.replays, s.eager_fallbacks, s.eager_runs) == (1, 2, 0, 0)
    cache.drop()


@needs_cuda
def test_cuda_a_failed_capture_leaves_the_default_generator_drawing_and_the_next_capture_working():
    """A step that reads a value back to the host cannot be captured: the capture fails, is counted and the
    signature stays eager; the device's default generator, which every capture registers, is out of capture
    mode again at once (an eager draw from it works; a generator of the test's own draws what it drew before),
    and the next capture of another signature succeeds and replays."""
    x = torch.zeros(16, device="cuda")
    cache = GraphCache("cuda", inline=False)

    def reads_back():
        return float(x.sum())                            # a host read: illegal while capturing

    assert cache.capture(signature("read", 16), reads_back) is False
    assert cache.stats.capture_failures == 1 and signature("read", 16) in cache.eager_only, cache.stats.failures
    gen = torch.Generator("cuda").manual_seed(3)
    want = torch.rand(8, device="cuda", generator=gen).cpu()
    torch.rand(8, device="cuda")                         # the default generator: refused if still capturing
    sig, step = signature("add_one", 16), _add_one(x)
    assert cache.capture(sig, step) is True
    cache.run(sig, step)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(16))
    assert torch.equal(torch.rand(8, device="cuda", generator=gen.manual_seed(3)).cpu(), want)
    cache.drop()


@needs_cuda
def test_cuda_inline_false_runs_an_uncaptured_step_eagerly_and_counts_it():
    x = torch.zeros(16, device="cuda")
    cache = GraphCache("cuda", inline=False)
    sig = signature("add_one", 16)
    cache.run(sig, _add_one(x))
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(16))
    assert cache.stats.eager_fallbacks == 1 and cache.stats.captures == 0 and sig not in cache
    cache.drop()


@needs_cuda
def test_cuda_inline_captures_on_first_use_and_runs_it_once():
    x = torch.zeros(16, device="cuda")
    cache = GraphCache("cuda")
    sig, step = signature("add_one", 16), _add_one(x)
    cache.run(sig, step)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(16)) and cache.stats.captures == 1 and sig in cache
    replays = cache.stats.replays
    cache.run(sig, step)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.full((16,), 2.0)) and cache.stats.replays == replays + 1
    assert cache.stats.captures == 1
    cache.drop()


@needs_cuda
def test_cuda_a_family_warmed_once_captures_its_other_signatures_ahead():
    x = torch.zeros(16, device="cuda")
    cache = GraphCache("cuda", inline=False, warmup=1, warmed=set(), warm_key=lambda sig: sig.step)
    step = _add_one(x)
    a, b = signature("add_one", 16, {"kv": 1}), signature("add_one", 16, {"kv": 2})
    assert cache.capture(a, step) is False                   # not warm: nothing recorded, nothing run
    cache.run(a, step)                                       # the family's warm-up runs eagerly
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(16)) and cache.stats.warmup_runs == 1
    assert cache.capture(b, step) is True
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(16))              # captured without running
    cache.run(b, step)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.full((16,), 2.0)) and cache.stats.replays == 1
    cache.drop()


@needs_cuda
def test_cuda_strict_mode_and_arena_moved():
    arena = Arena("cuda", backend="prealloc")
    arena.declare("kv", (16,), torch.float32)
    arena.allocate()
    other = Arena("cuda", backend="prealloc")
    other.declare("kv", (16,), torch.float32)
    other.allocate()
    x = arena["kv"].view((16,))
    x.zero_()
    cache = GraphCache("cuda", strict=True, arena=arena, inline=False)
    sig, step = signature("add_one", 16), _add_one(x)
    assert cache.capture(sig, step)
    cache.close()
    with pytest.raises(SignatureError):
        cache.run(signature("add_one", 17), step)
    cache.arena = other                                      # as if the session's arena had moved
    with pytest.raises(ArenaMoved):
        cache.run(sig, step)
    torch.cuda.synchronize()
    assert int(torch.count_nonzero(x)) == 0                  # neither ran anything
    cache.arena = arena
    cache.run(sig, step)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(16))
    cache.drop()
    arena.close()
    other.close()


@needs_cuda
def test_cuda_drop_runs_later_steps_eagerly():
    x = torch.zeros(16, device="cuda")
    cache = GraphCache("cuda", inline=False)
    sig, step = signature("add_one", 16), _add_one(x)
    assert cache.capture(sig, step)
    cache.drop()
    assert cache.entries == {} and cache.pool is None and cache.capture(sig, step) is False
    cache.run(sig, step)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.ones(16)) and cache.stats.eager_fallbacks == 1


@fresh_streams
def test_cuda_prime_workspace_counts_what_it_reserves_and_runs_once_per_stream():
    leases = StreamLeases()                                  # a new driver stream: never primed
    stream = leases.acquire("cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved, allocated, primed = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated(),
                                   graphs.PRIMED_BYTES[0])
    prime_workspace(stream)
    grew = torch.cuda.memory_reserved() - reserved
    assert graphs.PRIMED_BYTES[0] - primed == grew
    assert torch.cuda.memory_allocated() > allocated         # the stream's workspace stays allocated
    after = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), graphs.PRIMED_BYTES[0])
    prime_workspace(stream)
    assert (torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), graphs.PRIMED_BYTES[0]) == after
    prime_workspace(None)
    leases.release(stream)


@fresh_streams
def test_cuda_a_stream_handed_from_a_dropped_cache_keeps_no_block_of_its_pool(monkeypatch):
    """A session-like user captures two cuBLAS GEMMs (cublas and the cuBLASLt bias path) on its leased capture
    stream and is dropped; its stream goes to a new cache, whose replay gives eager's bytes, and nothing of
    the first cache's graph pool stays allocated: the stream's workspace was made outside it."""
    monkeypatch.setattr(graphs, "STREAMS", StreamLeases())   # a stream no earlier test ran a GEMM on
    gen = torch.Generator().manual_seed(22)
    a, b, w = (torch.randn(shape, generator=gen).cuda() for shape in ((192, 256), (256, 320), (320, 128)))
    bias = torch.randn(128, generator=gen).cuda()

    def step():
        return torch.addmm(bias, torch.mm(a, b), w)

    expected = step()
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    sig = signature("gemm", 192)

    def one_cache(before_capture, while_held) -> tuple:
        """A new cache: before_capture(stream, pool), capture and replay (eager's bytes), while_held(pool) with the
        replay's output alive, then drop it; once settled, no segment of its pool is left. Returns (stream, pool)."""
        cache = GraphCache("cuda", inline=False)
        stream, pool = cache.capture_stream.cuda_stream, tuple(cache.pool)
        before_capture(stream, pool)
        assert cache.capture(sig, step) is True
        out = cache.run(sig, step)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int32), expected.view(torch.int32))
        while_held(pool)
        del out
        cache.drop()
        del cache
        settle()
        assert pool_segments(pool) == []
        return stream, pool

    def first_held(pool):
        assert pool_segments(pool), "the graph's output should live in its pool while the cache does"

    stream, pool = one_cache(lambda stream, pool: None, first_held)

    def second_before(stream2, pool2):
        assert stream2 == stream                             # the dropped cache's stream, handed on
        assert pool2 != pool

    def second_held(pool2):
        assert graphs.PRIMED_BYTES[0] == primed              # primed once, by the first holder

    allocated, primed = torch.cuda.memory_allocated(), graphs.PRIMED_BYTES[0]
    one_cache(second_before, second_held)
    assert torch.cuda.memory_allocated() == allocated


@needs_cuda
def test_cuda_graph_bytes_count_the_pool_even_when_it_reuses_cached_segments():
    """A step that allocates a 4 MiB intermediate inside the graph: the pool holds at least that much, also
    when the allocator already had free cached memory (so memory_reserved did not grow during capture)."""
    x = torch.zeros(1 << 20, device="cuda")
    torch.empty(8 << 20, dtype=torch.uint8, device="cuda")     # freed at once: cached, not released
    cache = GraphCache("cuda", inline=False)

    def step():
        y = x * 2.0                                             # 4 MiB from the graph's pool
        x.copy_(y + 1.0)
        return x

    assert cache.capture(signature("scale", 1 << 20), step)
    assert cache.pool_bytes >= 4 << 20
    cache.drop()


def test_a_stream_another_live_thread_primed_stays_its_own_until_that_thread_ends():
    """A thread that took another live thread's primed stream would make a new (thread, stream) cuBLAS
    workspace pair and leave the owner to make another: a new stream is made instead, and a thread that
    ended gives its streams to anyone."""
    create, made = _fresh_creator()
    leases = StreamLeases(create)
    owned, done, leave = {}, threading.Event(), threading.Event()

    def owner():
        s = leases.acquire("cuda:0")
        graphs._note_primed(s)                                 # what prime_workspace records for this thread
        leases.release(s)
        owned["s"] = s
        done.set()
        leave.wait(10)

    t = threading.Thread(target=owner)
    t.start()
    done.wait(10)
    other = leases.acquire("cuda:0")
    assert other is not owned["s"] and len(made) == 2         # the owner is alive: a new stream, not its own
    leases.release(other)
    leave.set()
    t.join(10)
    again = leases.acquire("cuda:0")
    assert again in (owned["s"], other) and len(made) == 2    # the owner ended: its stream is free for anyone
    assert leases.acquire("cuda:0") in (owned["s"], other) and len(made) == 2
