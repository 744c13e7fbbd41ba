"""A torch dispatch mode that records the large tensors the ops run inside it make."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class BigAllocs(TorchDispatchMode):
    """Records (op, shape) for every tensor an op makes of at least `threshold` elements (views excepted) in
    `big`; use as a context manager."""

    def __init__(self, threshold):
        super().__init__()
        self.threshold, self.big = threshold, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and t.numel() >= self.threshold:
                    self.big.append((str(func), tuple(t.shape)))
        return out
