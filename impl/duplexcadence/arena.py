"""A session's streaming state at addresses that never move, sized from its clocks.

All regions of one session are packed into one block: each region gets a fixed byte offset and a
capacity equal to the most its clocks let it hold (clocks.bounds), never a stock static constant.
`Region.view(shape)` returns a contiguous tensor of exactly `shape` at the region's base address, so a
kernel sees the stock shape and (contiguous) strides; the base never changes for the session's life,
which is what lets a CUDA graph captured on it be replayed.

Backends:
* ``cpu``: one torch uint8 block in host memory.
* ``prealloc``: one exact-size cudaMalloc'd block (torch's allocator) on the GPU.
* ``vmm``: one reserved CUDA virtual address range (cuMemAddressReserve); physical memory is mapped in
  2 MiB granules (cuMemCreate + cuMemMap + cuMemSetAccess, through cuda-python) only as the clocks
  demand, so a growing region costs what it holds, at an address that does not move. Mapping is host work: do it ahead of the unit
  that needs it (`ensure`), never inside a captured graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from duplexcadence.errors import InputError
from duplexcadence.payload import shown

ALIGN = 256          # bytes: every region starts on a 256-byte boundary (cudaMalloc's alignment)


class ArenaError(ValueError):
    """A region request exceeds its declared bound, or the arena is used out of order."""


@dataclass
class Region:
    """One region's place in the arena. capacity: elements; offset: bytes from the arena base."""
    name: str
    dtype: torch.dtype
    capacity: int
    offset: int
    arena: "Arena"

    @property
    def nbytes(self) -> int:
        return self.capacity * _itemsize(self.dtype)

    def view(self, shape) -> torch.Tensor:
        """A contiguous tensor of `shape` at this region's base. Raises ArenaError if it does not fit."""
        shape = tuple(int(s) for s in shape)
        numel = math.prod(shape)
        if numel > self.capacity:
            raise ArenaError(f"region {self.name!r}: shape {shape} needs {numel} elements, the arena "
                             f"reserved {self.capacity} (from its clocks' bound)")
        self.arena.ensure(self.offset, numel * _itemsize(self.dtype))
        flat = self.arena._block[self.offset:self.offset + numel * _itemsize(self.dtype)]
        return flat.view(self.dtype).view(shape)

    def data_ptr(self) -> int:
        return self.arena.base + self.offset


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class Arena:
    """Per-session block of memory holding every region of the session at a stable address.

    Declare regions (`declare`), then `allocate()` once. device: where the block lives; backend (a session's
    `arena_backend` option): "auto" (vmm on CUDA when the driver supports it, else prealloc; cpu on CPU),
    "prealloc", "vmm", "cpu". Raises InputError naming `arena_backend` for another backend or one that does not
    fit the device.
    """

    def __init__(self, device: str | torch.device = "cpu", backend: str = "auto", name: str = "session"):
        self.device = torch.device(device)
        self.auto = backend == "auto"
        self.fallback: str | None = None
        if backend == "auto":
            backend = "cpu" if self.device.type == "cpu" else ("vmm" if _vmm_supported(self.device)
                                                              else "prealloc")
        if backend not in ("cpu", "prealloc", "vmm"):
            raise InputError(f"arena_backend: expected 'auto', 'cpu', 'prealloc' or 'vmm', got {shown(backend)}")
        if (backend == "cpu") != (self.device.type == "cpu"):
            raise InputError(f"arena_backend: {backend!r} does not match device {self.device} ('cpu' is for the "
                             f"CPU, 'prealloc' and 'vmm' for CUDA)")
        self.backend = backend
        self.name = name
        self.regions: dict[str, Region] = {}
        self._size = 0
        self._block: torch.Tensor | None = None
        self._vmm = None

    def declare(self, name: str, capacity_shape, dtype: torch.dtype) -> Region:
        """Reserve room for a region of at most `capacity_shape` elements of `dtype`."""
        if self._block is not None:
            raise ArenaError(f"arena {self.name!r}: declare({name!r}) after allocate()")
        if name in self.regions:
            raise ArenaError(f"arena {self.name!r}: region {name!r} declared twice")
        capacity = math.prod(int(s) for s in capacity_shape)
        offset = -(-self._size // ALIGN) * ALIGN
        region = Region(name, dtype, capacity, offset, self)
        self._size = offset + region.nbytes
        self.regions[name] = region
        return region

    def __getitem__(self, name: str) -> Region:
        return self.regions[name]

    def allocate(self) -> "Arena":
        """Allocate (cpu/prealloc) or reserve (vmm) the whole block. Call once, after every declare."""
        if self._block is not None:
            raise ArenaError(f"arena {self.name!r}: allocate() called twice")
        size = max(self._size, ALIGN)
        if self.backend == "vmm":
            from duplexcadence import vmm
            try:
                self._vmm = vmm.Reservation(size, self.device)
                self._block = self._vmm.tensor()
            except Exception as exc:   # a driver without VMM: exact preallocation, recorded
                if not self.auto:
                    raise
                self.fallback = f"vmm unavailable ({type(exc).__name__}: {exc}); exact preallocation"
                self.backend, self._vmm = "prealloc", None
                self._block = torch.zeros(size, dtype=torch.uint8, device=self.device)
        else:
            self._block = torch.zeros(size, dtype=torch.uint8, device=self.device)
        return self

    @property
    def base(self) -> int:
        if self._block is None:
            raise ArenaError(f"arena {self.name!r}: not allocated")
        return self._block.data_ptr()

    @property
    def bytes_reserved(self) -> int:
        """Bytes of address space the arena holds: before allocate() its regions' bounds, aligned; after,
        the block (cpu / prealloc) or the whole reservation (vmm, whole granules)."""
        if self._vmm is not None:
            return self._vmm.size
        return self._size if self._block is None else self._block.numel()

    @property
    def bytes_mapped(self) -> int:
        """Bytes of physical memory behind the arena (vmm: mapped granules; else all of it)."""
        if self._vmm is not None:
            return self._vmm.mapped_bytes
        return 0 if self._block is None else self._block.numel()

    def close(self) -> None:
        """Give the arena's memory back (vmm: unmap, release and free the range; else drop the block).
        Views taken from it must not be used afterwards; graphs captured on it must be dropped first.
        Calling it twice is harmless."""
        if self._block is None:
            return
        self._block = None
        if self._vmm is not None:
            self._vmm.close()
            self._vmm = None

    def ensure(self, offset: int, nbytes: int) -> None:
        """Make [offset, offset + nbytes) backed by physical memory (vmm maps granules; host work)."""
        if self._block is None:
            raise ArenaError(f"arena {self.name!r}: allocate() before use")
        if self._vmm is not None:
            self._vmm.ensure(offset, nbytes)


def _vmm_supported(device: torch.device) -> bool:
    try:
        from duplexcadence import vmm
        return vmm.supported(device)
    except Exception:
        return False
