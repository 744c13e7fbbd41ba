"""duplexcadence.vmm: one reserved CUDA virtual range, 2 MiB granules mapped on demand behind a tensor whose
data_ptr never moves, graphs captured on it replayed after it grew, memory given back at close.

The CUDA part needs cuda-python (the 'gpu' extra) and a device with virtual memory management (the H200:
2 MiB granularity, shared/DESIGN.md section 8); it skips elsewhere with the reason.
"""
from __future__ import annotations

import pytest
import torch

from duplexcadence import vmm
from duplexcadence.arena import Arena
from duplexcadence.clocks import signature
from duplexcadence.graphs import GraphCache

MIB = 1 << 20


def _vmm_ok() -> bool:
    try:
        return torch.cuda.is_available() and vmm.supported(torch.device("cuda"))
    except ImportError:
        return False


needs_vmm = pytest.mark.skipif(not _vmm_ok(), reason="needs CUDA with cuda-python and virtual memory management")


def test_vmm_is_not_supported_off_cuda():
    assert vmm.supported(torch.device("cpu")) is False
    assert issubclass(vmm.VMMError, RuntimeError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer on a host without CUDA")
def test_vmm_is_not_supported_without_a_cuda_device():
    assert vmm.supported(torch.device("cuda")) is False


@needs_vmm
def test_cuda_ensure_maps_granules_on_demand():
    r = vmm.Reservation(5 * MIB, torch.device("cuda"))
    try:
        assert r.granularity == 2 * MIB
        assert r.size == 6 * MIB and r.mapped_bytes == 0
        t = r.tensor()                                   # maps the first granule
        assert r.mapped_bytes == 2 * MIB
        assert t.data_ptr() == r.base and t.numel() == 6 * MIB and t.dtype == torch.uint8
        assert t.device.type == "cuda"
        r.ensure(0, 2 * MIB)                             # ends on the granule boundary
        assert r.mapped_bytes == 2 * MIB
        r.ensure(0, 0)
        assert r.mapped_bytes == 2 * MIB
        r.ensure(2 * MIB - 1, 2)                         # straddles into the second granule
        assert r.mapped_bytes == 4 * MIB
        r.ensure(5 * MIB, 1)
        assert r.mapped_bytes == 6 * MIB
        r.ensure(0, 6 * MIB)
        assert r.mapped_bytes == 6 * MIB
        with pytest.raises(vmm.VMMError, match="past the reservation"):
            r.ensure(6 * MIB - 1, 2)
        assert t.data_ptr() == r.base
    finally:
        r.close()
    assert r.mapped_bytes == 0


@needs_vmm
def test_cuda_contents_and_address_survive_growth():
    r = vmm.Reservation(6 * MIB, torch.device("cuda"))
    try:
        t = r.tensor()
        ptr = t.data_ptr()
        head = t[:MIB].view(torch.int32)
        head.copy_(torch.arange(MIB // 4, dtype=torch.int32, device="cuda"))
        for g in (1, 2):                                  # map the rest, one granule at a time
            r.ensure(g * 2 * MIB, 2 * MIB)
            t[g * 2 * MIB:(g + 1) * 2 * MIB].fill_(g)
            assert t.data_ptr() == ptr and head.data_ptr() == ptr
        torch.cuda.synchronize()
        assert torch.equal(head.cpu(), torch.arange(MIB // 4, dtype=torch.int32))
        assert int(t[2 * MIB:4 * MIB].sum()) == 2 * MIB
        assert int(t[4 * MIB:].sum()) == 2 * 2 * MIB
    finally:
        r.close()


@needs_vmm
def test_cuda_a_graph_captured_on_a_view_replays_correctly_after_growth():
    """small: float32 [1024] at 0 (first granule); big: float32 [5 MiB / 4] at 4096, mapped only after the
    capture. The graph adds 1 to `small`; its replays after the arena grew still hit the same memory."""
    a = Arena("cuda", backend="vmm")
    a.declare("small", (1024,), torch.float32)
    a.declare("big", (5 * MIB // 4,), torch.float32)
    a.allocate()
    cache = GraphCache("cuda", arena=a, inline=False)
    try:
        small = a["small"].view((1024,))
        small.zero_()
        sig = signature("add_one", 1024)

        def step():
            return small.add_(1.0)

        assert cache.capture(sig, step) is True
        torch.cuda.synchronize()
        assert int(torch.count_nonzero(small)) == 0          # recorded, not run
        assert a.bytes_mapped == 2 * MIB
        big = a["big"].view((5 * MIB // 4,))                 # maps the second and third granules
        assert a.bytes_mapped == 6 * MIB
        big.fill_(3.0)
        cache.run(sig, step)
        cache.run(sig, step)
        torch.cuda.synchronize()
        assert torch.equal(small.cpu(), torch.full((1024,), 2.0))
        assert bool((big == 3.0).all())
        assert cache.stats.captures == 1 and cache.stats.replays == 2 and cache.stats.eager_fallbacks == 0
    finally:
        cache.drop()
        del cache
        a.close()


@needs_vmm
def test_cuda_close_gives_the_physical_memory_back():
    torch.cuda.init()
    torch.empty(1, device="cuda")                            # the context exists before the first reading
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    r = vmm.Reservation(64 * MIB, torch.device("cuda"))
    r.ensure(0, 64 * MIB)
    free1 = torch.cuda.mem_get_info()[0]
    r.close()
    free2 = torch.cuda.mem_get_info()[0]
    assert r.mapped_bytes == 0
    assert free0 - free1 >= 62 * MIB                         # 32 granules mapped (2 MiB slack for others)
    assert free2 - free1 >= 62 * MIB                         # and given back
