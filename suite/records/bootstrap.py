"""The hierarchical bootstrap's draws and its percentile interval (numpy only, no torch).

A paired run's values come in groups (one per fresh process, pairs within each): processes differ by a few
percent on a lent host, pairs within one process much less. Each resample therefore draws len(groups) groups
with replacement, then within each drawn group as many values as it holds, with replacement (the two-stage
bootstrap of Davison & Hinkley 1997, section 3.8). `hierarchical_draws` yields those draws in batches as
indices into a [groups, width] table padded past each group's size; the statistic (a median, a fitted line)
is the caller's.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np


def hierarchical_draws(sizes: np.ndarray, *, rng: np.random.Generator, n_boot: int,
                       chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Draws of `n_boot` resamples over groups of `sizes` ([groups], each >= 1), `chunk` resamples per batch
    (bounds memory; the draws, not their distribution, depend on it). Yields per batch of m resamples
    (pick, idx, drawn): pick [m, groups] the groups drawn, idx [m, groups, width] the positions drawn within
    each, drawn [m, groups, width] True for a draw and False for padding past the drawn group's size; the
    value of a draw is table[pick[..., None], idx] for a table [groups, width] of the groups' values."""
    sizes = np.asarray(sizes, dtype=np.int64)
    n_groups, width = sizes.size, int(sizes.max())
    for start in range(0, n_boot, chunk):
        m = min(chunk, n_boot - start)
        pick = rng.integers(0, n_groups, size=(m, n_groups))
        n = sizes[pick][..., None]                                            # [m, groups, 1]
        idx = np.minimum((rng.random((m, n_groups, width)) * n).astype(np.int64), n - 1)
        yield pick, idx, np.arange(width) < n


def padded_table(groups: list[np.ndarray], fill: float) -> np.ndarray:
    """[groups, width] float64: each group's values in its row, `fill` past its size (width: the largest)."""
    table = np.full((len(groups), max(g.size for g in groups)), fill, dtype=np.float64)
    for i, g in enumerate(groups):
        table[i, :g.size] = g
    return table


def percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """The two-sided `confidence` percentile interval of the resampled statistic `values`."""
    tail = (1.0 - confidence) / 2 * 100.0
    lo, hi = np.percentile(values, [tail, 100.0 - tail])
    return float(lo), float(hi)
