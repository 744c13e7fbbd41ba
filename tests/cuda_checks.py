"""What the CUDA tests share: a skip mark for tests that need new driver streams, the allocator segments of a graph
pool, the allocated bytes once the allocator has settled, and the check that closing a session gives its device
memory back at once."""
from __future__ import annotations

import gc

import pytest
import torch


def has_cuda_python() -> bool:
    """Whether cuda-python's driver bindings import (StreamLeases makes new driver streams through them)."""
    try:
        from cuda.bindings import driver  # noqa: F401
        return True
    except ImportError:
        return False


def needs_fresh_streams(what: str) -> pytest.MarkDecorator:
    """Skip without CUDA and cuda-python; the reason starts "needs CUDA" (conftest marks such tests gpu)."""
    return pytest.mark.skipif(not (torch.cuda.is_available() and has_cuda_python()),
                              reason=f"needs CUDA and cuda-python: {what}")


def pool_segments(pool) -> list:
    """The allocator segments that belong to graph pool `pool` (memory_snapshot's segment_pool_id)."""
    return [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == tuple(pool)]


def settle() -> None:
    """Collect garbage, wait for the device and empty the cache (a graph pool no graph uses any more gives its
    segments back here)."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def settled_allocated() -> int:
    """torch's allocated device bytes once settled (settle())."""
    settle()
    return torch.cuda.memory_allocated()


def check_close_gives_the_memory_back(open_session, warm, use) -> None:
    """A first session of `open_session()` is warmed (warm(session)) and closed: process-wide lazy state settles
    there. A second one, once use(session) ran, holds more device memory than before it opened; its close gives
    exactly that back at once, with the cycle collector off."""
    first = open_session()
    warm(first)
    first.close()
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    session = open_session()
    use(session)
    assert torch.cuda.memory_allocated() > before
    gc.disable()
    try:
        session.close()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before
    finally:
        gc.enable()
