"""torch's intra-op thread count for a test module, restored when the module is done.

torch.set_num_threads is process-wide: a module that sets it and leaves it changes every later module in
the same pytest process. Modules that run at a fixed count hold it for their own tests only:

    @pytest.fixture(scope="module", autouse=True)
    def two_threads():
        with torch_threads(2):
            yield

The two counts most modules use are such fixtures here, `one_thread` and `two_threads`; a module imports the one
it runs at (pytest finds a fixture in the module's namespace: `from torch_threads import one_thread`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body with `torch.set_num_threads(n)`; the previous count is back afterwards, raise or not."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The importing module's tests at one intra-op thread (on a loaded 2-core machine, one thread avoids spin
    contention between the two)."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module", autouse=True)
def two_threads() -> Iterator[None]:
    """The importing module's tests at two intra-op threads."""
    with torch_threads(2):
        yield
