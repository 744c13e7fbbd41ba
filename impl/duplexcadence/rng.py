"""The process's default random generators, one holder at a time.

Stock constructors draw their weights and tables from the global CPU generator after `torch.manual_seed`
(flow_hift, mimi, code2wav builds), and Step-Audio 2's HiFT draws from the default generator of its device on
every unit (hifigan_components/layers.py L314, L378, L432), which each session swaps for its own state of it
(flow_hift.stock.OwnGenerator). Both go through `LOCK`: a build waits for it and leaves the default generators
(the CPU's, every initialised CUDA device's) as it found them (`seeded_build`), so opening a model changes no session's bytes and two builds on two threads
get the weights each would alone; a session's draw refuses to wait (ConcurrencyError) where another thread
holds it.
"""
from __future__ import annotations

import functools
import threading

import torch

from duplexcadence import gate

#: held while a build seeds the default generators or a session has its own state swapped into them
LOCK = threading.RLock()


def seeded_build(build):
    """Decorate an adapter's `build_model(spec, *, device, ...)`: the body runs holding LOCK, inside
    `torch.random.fork_rng` over the CPU generator, every CUDA device's where CUDA is initialised and `device`'s,
    so those default generators are as they were once it returns or raises (a CUDA not yet initialised keeps
    the seed torch queues for it); and inside the capture gate's device_wide() (no capture beside it:
    every capture registers the device's default generator, which the build seeds and may draw from)."""
    @functools.wraps(build)
    def wrapped(*args, **kwargs):
        device = torch.device(kwargs.get("device", "cpu"))
        devices = set(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else set()
        if device.type == "cuda":       # torch.manual_seed reseeds every device's generator
            devices.add(device.index if device.index is not None else torch.cuda.current_device())
        with LOCK, gate.GATE.device_wide(), torch.random.fork_rng(devices=sorted(devices)):
            return build(*args, **kwargs)
    return wrapped
