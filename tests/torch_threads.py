"""torch's intra-op thread count for a test module, restored when the module is done.

torch.set_num_threads is process-wide: a module that sets it and leaves it changes every later module in
the same pytest process. Modules that run at a fixed count hold it for their own tests only:

    @pytest.fixture(scope="module", autouse=True)
    def two_threads():
        with torch_threads(2):
            yield
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
