"""duplexcadence.arena: regions at 256-byte aligned offsets of one block, exact-shape views at a base that
never moves, order errors, the CPU backend; prealloc and vmm on CUDA (vmm's own tests: test_vmm.py).

The layout used throughout, by hand (offsets round up to a multiple of 256 bytes):
  mel    float32 [80, 101] = 32320 B at 0       -> ends 32320
  tokens int64   [3]       =    24 B at 32512   -> ends 32536   (127 x 256)
  flags  bool    [5]       =     5 B at 32768   -> ends 32773   (128 x 256)
  half   float16 [7]       =    14 B at 33024   -> ends 33038   (129 x 256)
"""
from __future__ import annotations

import pytest
import torch

from duplexcadence.arena import ALIGN, Arena, ArenaError
from duplexcadence.errors import InputError

OFFSETS = {"mel": 0, "tokens": 32512, "flags": 32768, "half": 33024}
END = 33038

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: device arena backends")


def _declare(arena: Arena) -> Arena:
    arena.declare("mel", (80, 101), torch.float32)
    arena.declare("tokens", (3,), torch.int64)
    arena.declare("flags", (5,), torch.bool)
    arena.declare("half", (7,), torch.float16)
    return arena


def _vmm_ok() -> bool:
    try:
        from duplexcadence import vmm
        return torch.cuda.is_available() and vmm.supported(torch.device("cuda"))
    except ImportError:
        return False


# --- layout --------------------------------------------------------------------------------------
def test_offsets_are_256_byte_aligned_and_packed_in_declaration_order():
    a = _declare(Arena("cpu"))
    assert ALIGN == 256
    assert {n: r.offset for n, r in a.regions.items()} == OFFSETS
    assert [a[n].capacity for n in OFFSETS] == [8080, 3, 5, 7]
    assert [a[n].nbytes for n in OFFSETS] == [32320, 24, 5, 14]
    assert a.bytes_reserved == END


def test_cpu_backend_views_have_exact_shapes_at_fixed_addresses():
    a = _declare(Arena("cpu")).allocate()
    assert a.backend == "cpu" and a.fallback is None
    base = a.base
    assert base == a["mel"].data_ptr()
    mel = a["mel"].view((80, 101))
    assert mel.shape == (80, 101) and mel.dtype == torch.float32 and mel.is_contiguous()
    assert mel.device.type == "cpu"
    for name, offset in OFFSETS.items():
        assert a[name].data_ptr() == base + offset
        assert a[name].view((1,)).data_ptr() == base + offset
    assert a["tokens"].view((1, 3)).dtype == torch.int64
    assert a["flags"].view((5,)).dtype == torch.bool
    assert a["mel"].view((2, 50)).shape == (2, 50)           # smaller than the bound, same base
    assert a["mel"].view((2, 50)).data_ptr() == base
    assert a["mel"].view((3, 0)).shape == (3, 0)
    assert a.base == base                                     # no view moved it
    assert a.bytes_mapped == END


def test_views_of_one_region_alias_and_regions_do_not_overlap():
    a = _declare(Arena("cpu")).allocate()
    full = a["mel"].view((80, 101))
    full.copy_(torch.arange(8080, dtype=torch.float32).reshape(80, 101))
    flat = a["mel"].view((8080,))
    assert flat[8079].item() == 8079.0 and flat[101].item() == 101.0
    a["tokens"].view((3,)).fill_(-1)
    a["flags"].view((5,)).fill_(True)
    a["half"].view((7,)).fill_(2.5)
    assert torch.equal(a["mel"].view((8080,)), torch.arange(8080, dtype=torch.float32))
    assert a["tokens"].view((3,)).tolist() == [-1, -1, -1]
    assert a["flags"].view((5,)).tolist() == [True] * 5
    assert a["half"].view((7,)).tolist() == [2.5] * 7


def test_a_view_past_the_regions_capacity_is_an_arena_error():
    a = _declare(Arena("cpu")).allocate()
    with pytest.raises(ArenaError, match=r"'mel'.*\(81, 101\).*8181.*8080"):
        a["mel"].view((81, 101))
    with pytest.raises(ArenaError, match=r"'tokens'"):
        a["tokens"].view((4,))
    assert isinstance(ArenaError("x"), ValueError)


def test_bytes_mapped_never_exceeds_bytes_reserved():
    """Physical memory behind the arena cannot exceed the address space it holds: a 40-byte region's CPU
    block is max(40, 256) = 256 bytes, so that is what the arena holds."""
    a = Arena("cpu")
    a.declare("tail", (10,), torch.float32)
    a.allocate()
    assert a.bytes_reserved >= 40
    assert a.bytes_mapped <= a.bytes_reserved


# --- order errors, backends, close ---------------------------------------------------------------
def test_declare_and_allocate_out_of_order_are_arena_errors():
    a = Arena("cpu", name="s1")
    a.declare("x", (4,), torch.float32)
    with pytest.raises(ArenaError, match=r"'s1'.*'x' declared twice"):
        a.declare("x", (4,), torch.float32)
    with pytest.raises(ArenaError, match="not allocated"):
        a.base
    with pytest.raises(ArenaError, match="allocate"):
        a["x"].view((4,))
    a.allocate()
    with pytest.raises(ArenaError, match=r"declare\('y'\) after allocate"):
        a.declare("y", (4,), torch.float32)
    with pytest.raises(ArenaError, match="allocate\\(\\) called twice"):
        a.allocate()
    with pytest.raises(KeyError):
        a["y"]


@pytest.mark.parametrize("device, backend", [
    pytest.param("cpu", "vmm", id="vmm-on-cpu"),
    pytest.param("cpu", "prealloc", id="prealloc-on-cpu"),
    pytest.param("cuda", "cpu", id="cpu-on-cuda"),
    pytest.param("cpu", "malloc", id="unknown"),
])
def test_a_backend_that_does_not_fit_the_device_is_an_input_error_naming_arena_backend(device, backend):
    with pytest.raises(InputError, match=rf"^arena_backend: .*{backend!r}"):
        Arena(device, backend)


def test_close_is_idempotent_and_the_arena_is_unusable_after():
    a = _declare(Arena("cpu")).allocate()
    a.close()
    a.close()
    assert a.bytes_mapped == 0
    with pytest.raises(ArenaError):
        a.base
    with pytest.raises(ArenaError):
        a["mel"].view((1,))


def test_an_arena_without_regions_still_allocates_a_block():
    a = Arena("cpu").allocate()
    assert a.regions == {} and a.bytes_reserved == 256      # the smallest block: one 256-byte alignment unit
    assert isinstance(a.base, int) and a.base != 0


# --- CUDA ----------------------------------------------------------------------------------------
@needs_cuda
def test_cuda_prealloc_views_are_on_the_device_at_fixed_offsets():
    a = _declare(Arena("cuda", backend="prealloc")).allocate()
    try:
        assert a.backend == "prealloc" and a.base % ALIGN == 0
        for name, offset in OFFSETS.items():
            assert a[name].view((1,)).data_ptr() == a.base + offset
        mel = a["mel"].view((80, 101))
        assert mel.device.type == "cuda" and mel.shape == (80, 101)
        mel.copy_(torch.arange(8080, dtype=torch.float32, device="cuda").reshape(80, 101))
        a["tokens"].view((3,)).fill_(7)
        assert torch.equal(a["mel"].view((8080,)).cpu(), torch.arange(8080, dtype=torch.float32))
        assert a.bytes_mapped == a.bytes_reserved == END
        with pytest.raises(ArenaError):
            a["half"].view((8,))
    finally:
        a.close()
    assert a.bytes_mapped == 0


@needs_cuda
def test_cuda_auto_backend_is_vmm_where_the_driver_supports_it():
    a = _declare(Arena("cuda")).allocate()
    try:
        assert a.backend == ("vmm" if _vmm_ok() else "prealloc")
        if a.backend == "vmm":
            assert a.fallback is None
        base = a.base
        a["mel"].view((80, 101)).fill_(1.0)
        assert a.base == base
    finally:
        a.close()


@pytest.mark.skipif(not _vmm_ok(), reason="needs CUDA with cuda-python and virtual memory management")
def test_cuda_vmm_arena_maps_on_demand_at_a_stable_base():
    """small: float32 [1024] = 4096 B at 0; big: float32 [5 MiB / 4] at 4096, so the arena spans
    4096 + 5 MiB bytes: three 2 MiB granules, of which only the first is mapped until `big` is viewed."""
    mib = 1 << 20
    a = Arena("cuda", backend="vmm")
    a.declare("small", (1024,), torch.float32)
    a.declare("big", (5 * mib // 4,), torch.float32)
    a.allocate()
    try:
        assert a.bytes_reserved >= 4096 + 5 * mib
        assert a.bytes_mapped == 2 * mib
        base = a.base
        small = a["small"].view((1024,))
        small.fill_(5.0)
        assert a.bytes_mapped == 2 * mib and small.data_ptr() == base
        a["big"].view((mib // 4,))                       # 4096 + 1 MiB: still the first granule
        assert a.bytes_mapped == 2 * mib
        big = a["big"].view((5 * mib // 4,))
        assert a.bytes_mapped == 6 * mib
        big.fill_(3.0)
        assert a.base == base and a["small"].view((1024,)).data_ptr() == base
        assert big.data_ptr() == base + 4096
        assert torch.equal(small.cpu(), torch.full((1024,), 5.0))
        assert bool((big == 3.0).all())
    finally:
        a.close()
    assert a.bytes_mapped == 0


@pytest.mark.skipif(not _vmm_ok(), reason="needs CUDA with cuda-python and virtual memory management")
def test_cuda_vmm_bytes_mapped_never_exceeds_bytes_reserved():
    """A 4096 + 5 MiB arena reserves three 2 MiB granules of address space; mapping them all must not
    report more physical memory than address space."""
    mib = 1 << 20
    a = Arena("cuda", backend="vmm")
    a.declare("big", (4096 // 4 + 5 * mib // 4,), torch.float32)
    a.allocate()
    try:
        a["big"].view((4096 // 4 + 5 * mib // 4,))
        assert a.bytes_mapped == 6 * mib
        assert a.bytes_mapped <= a.bytes_reserved
    finally:
        a.close()
