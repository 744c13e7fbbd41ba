"""A session's state() as a value the tests can keep and compare: copied, compared byte for byte, digested.

Tensors count as equal only with the same dtype, the same shape and the same raw bytes (read on the host, in
logical order whatever the strides), so -0.0 differs from 0.0 and a NaN equals only a NaN of the same payload.
Other values (host clocks, counters, token buffers) compare with ==.
"""
from __future__ import annotations

import hashlib

import torch


def snapshot(session) -> dict:
    """session.state() with every tensor cloned (a cadence session's region views change in place)."""
    return {k: v.clone() if torch.is_tensor(v) else v for k, v in session.state().items()}


def raw(tensor: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...], bytes]:
    """(dtype, shape, bytes): the tensor copied to the host, its elements in logical order as bytes."""
    host = tensor.detach().cpu().contiguous()
    return host.dtype, tuple(host.shape), host.reshape(-1).view(torch.uint8).numpy().tobytes()


def same_value(a, b) -> bool:
    """Tensors: same dtype, shape and bytes; anything else: a == b."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and raw(a) == raw(b)
    return a == b


def same_state(a: dict, b: dict) -> bool:
    """Two states (snapshots, or a snapshot and a live state()) hold the same keys and the same values."""
    return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)


def digest(session) -> str:
    """sha256 over session.state(): every key, each tensor's dtype, shape and bytes, every other value's repr."""
    h = hashlib.sha256()
    for name, value in sorted(session.state().items()):
        h.update(name.encode())
        if torch.is_tensor(value):
            dtype, shape, data = raw(value)
            h.update(f"{dtype}{shape}".encode())
            h.update(data)
        else:
            h.update(repr(value).encode())
    return h.hexdigest()
