"""duplexcadence.graphs.StreamLeases: a stream per live holder, never torch's wrapped-around pool stream."""
from __future__ import annotations

import gc
import itertools

import pytest
import torch

from duplexcadence.graphs import STREAMS, GraphCache, StreamLeases


class _FakeStream:
    def __init__(self, ptr):
        self.cuda_stream = ptr


def _fresh_creator():
    """Like the driver path: a new address per stream."""
    counter = itertools.count(0x1000, 0x10)
    made = []

    def create(index):
        made.append(index)
        return _FakeStream(next(counter))
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
