"""tests/torch_threads.py: a module's thread count is its own; the count before it is back afterwards."""
from __future__ import annotations

import pytest
import torch

from torch_threads import torch_threads  # tests/ is on sys.path under pytest


@pytest.fixture
def before():
    start = torch.get_num_threads()
    other = 3 if start != 3 else 4          # a count none of the users set (they set 1 or 2)
    torch.set_num_threads(other)
    yield other
    torch.set_num_threads(start)


def test_sets_the_count_and_restores_the_previous_one(before):
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


def test_restores_when_the_body_raises(before):
    with pytest.raises(RuntimeError, match="body"):
        with torch_threads(2):
            raise RuntimeError("body")
    assert torch.get_num_threads() == before
