"""The process's C heap (glibc malloc): what it holds and what it keeps after a free, read without changing it
(`host_heap_mib`, mallinfo2), and handing its free pages back to the kernel (`trim_heap`, malloc_trim). Where RSS
grows, these tell memory still allocated from memory malloc keeps. Off glibc (musl, glibc < 2.33) the readers
return nothing rather than guess."""
from __future__ import annotations

import ctypes

import torch

from suite.measure.memory import MIB, rss_mib


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc(name: str, restype, argtypes):
    """The C library's function `name` with its types set, or None where it has none."""
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = restype, argtypes
    return fn


_MALLINFO2 = _libc("mallinfo2", _Mallinfo2, [])
#: Whether this C library lets host_heap_mib read the heap (glibc >= 2.33).
HEAP_READABLE = _MALLINFO2 is not None
_MALLOC_TRIM = _libc("malloc_trim", ctypes.c_int, [ctypes.c_size_t])
#: Whether this C library can hand malloc's free pages back to the kernel (glibc malloc_trim).
HEAP_TRIMMABLE = _MALLOC_TRIM is not None


def trim_heap() -> float | None:
    """glibc `malloc_trim(0)`: the free memory malloc keeps in its arenas (host_heap_mib's heap_free_mib) goes back
    to the kernel where whole pages are free; nothing still allocated moves. Returns RSS after it, MiB (None where
    the C library has no malloc_trim or /proc is absent)."""
    if _MALLOC_TRIM is None:
        return None
    _MALLOC_TRIM(0)
    return rss_mib()


def host_heap_mib(device=None) -> dict:
    """What the process's C heap holds now, MiB, read without changing it: "heap_in_use_mib", the bytes malloc
    has handed out and not had back (glibc mallinfo2: uordblks + hblkhd, every arena and mmapped chunk), and
    "heap_free_mib", the bytes free inside malloc's arenas that it keeps rather than returns to the kernel
    (fordblks); on a CUDA `device` also "pinned_mib", the bytes torch's pinned host allocator holds
    (torch.cuda.host_memory_stats "allocated_bytes.current", its cached blocks included). RSS rising while
    heap_in_use_mib and pinned_mib stay flat is the allocator keeping freed memory, not something still
    referenced. {} (or the pinned figure alone) where the C library has no mallinfo2 (glibc < 2.33, musl)."""
    out = {}
    if _MALLINFO2 is not None:
        m = _MALLINFO2()
        out = {"heap_in_use_mib": (m.uordblks + m.hblkhd) / MIB, "heap_free_mib": m.fordblks / MIB}
    if device is not None and torch.device(device).type == "cuda":
        out["pinned_mib"] = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) / MIB
    return out
