"""The reduced Mimi decoder (2 transformer layers, the released 8 x 250 x 64 ring KV caches) that the mimi test
modules share: a module fixture `model` (a module imports it by name: `from reduced_mimi import model`) and seeded
random code units."""
from __future__ import annotations

import pytest
import torch

from duplexcadence.adapters import mimi
from duplexcadence.adapters.mimi import schedule as ms


@pytest.fixture(scope="module")
def model():
    """One reduced Mimi model on the CPU (seed 0) for the importing module's tests."""
    return mimi.build_model({}, device="cpu", depth="reduced", seed=0)


def random_units(frames, seed: int) -> list[torch.Tensor]:
    """Codes int64 [N_Q, n] in [0, CARDINALITY) for each n in `frames`, drawn from one generator seeded `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, ms.CARDINALITY, (ms.N_Q, f), generator=gen) for f in frames]
