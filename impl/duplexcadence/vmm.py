"""CUDA virtual memory for the arena: reserve an address range once, map 2 MiB granules on demand.

Driver API through cuda-python (`cuda.bindings.driver`): cuMemAddressReserve, cuMemCreate, cuMemMap,
cuMemSetAccess; the range is exposed to torch through `__cuda_array_interface__` (torch.as_tensor shares
the memory, no copy), so the tensor's data_ptr() is the reserved base and never changes while mappings
grow behind it. Probed on the H200: 2 MiB granularity, ~0.2 ms per granule mapped.
torch's allocator statistics cannot see these mappings; measure them at the driver.
"""
from __future__ import annotations

import torch

from duplexcadence import gate


class VMMError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the CUresult."""


def _cu():
    from cuda.bindings import driver
    return driver


def _check(result, call: str):
    cu = _cu()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise VMMError(f"{call} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def _prop(device_index: int):
    cu = _cu()
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device_index
    return prop


def supported(device: torch.device) -> bool:
    """True where cuda-python is importable and the device supports virtual memory management."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    cu = _cu()
    torch.cuda.init()
    index = device.index if device.index is not None else torch.cuda.current_device()
    dev = _check(cu.cuDeviceGet(index), "cuDeviceGet")
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    return bool(_check(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))


class _Interface:
    def __init__(self, ptr: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


class Reservation:
    """One reserved virtual range of `size` bytes (rounded up to the granularity) on `device`."""

    def __init__(self, size: int, device: torch.device):
        cu = _cu()
        torch.cuda.init()
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.prop = _prop(self.index)
        flag = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        self.granularity = int(_check(cu.cuMemGetAllocationGranularity(self.prop, flag),
                                      "cuMemGetAllocationGranularity"))
        self.size = -(-size // self.granularity) * self.granularity
        self.base = int(_check(cu.cuMemAddressReserve(self.size, 0, 0, 0), "cuMemAddressReserve"))
        self.handles: dict[int, object] = {}     # granule index -> physical allocation handle

    @property
    def mapped_bytes(self) -> int:
        return len(self.handles) * self.granularity

    def tensor(self) -> torch.Tensor:
        """A uint8 tensor over the whole reserved range (touch only mapped parts). The first granule is
        mapped first: torch checks the pointer's attributes, which an unmapped address does not have."""
        self.ensure(0, 1)
        return torch.as_tensor(_Interface(self.base, self.size), device=self.device)

    def ensure(self, offset: int, nbytes: int) -> None:
        """Map every granule overlapping [offset, offset + nbytes). Host-side, inside gate.device_wide() when a
        granule is new (no capture meets a mapping); never inside a capture."""
        if nbytes <= 0:
            return
        if offset + nbytes > self.size:
            raise VMMError(f"range [{offset}, {offset + nbytes}) past the reservation of {self.size} bytes")
        first, last = offset // self.granularity, (offset + nbytes - 1) // self.granularity
        new = [g for g in range(first, last + 1) if g not in self.handles]
        if new:
            with gate.device_wide():
                self._map(new)

    def _map(self, granules: list[int]) -> None:
        cu = _cu()
        for g in granules:
            handle = _check(cu.cuMemCreate(self.granularity, self.prop, 0), "cuMemCreate")
            addr = self.base + g * self.granularity
            _check(cu.cuMemMap(addr, self.granularity, 0, handle, 0), "cuMemMap")
            desc = cu.CUmemAccessDesc()
            desc.location = self.prop.location
            desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            _check(cu.cuMemSetAccess(addr, self.granularity, [desc], 1), "cuMemSetAccess")
            self.handles[g] = handle

    def close(self) -> None:
        """Unmap and release every granule and free the range. The tensor must no longer be used."""
        cu = _cu()
        with gate.device_wide():
            gate.synchronize(self.device)
            for g, handle in self.handles.items():
                _check(cu.cuMemUnmap(self.base + g * self.granularity, self.granularity), "cuMemUnmap")
                _check(cu.cuMemRelease(handle), "cuMemRelease")
            self.handles.clear()
            _check(cu.cuMemAddressFree(self.base, self.size), "cuMemAddressFree")
