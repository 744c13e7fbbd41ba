"""suite.records.bootstrap: the two-stage draws index only real values, and their batches cover n_boot."""
import numpy as np
import pytest

from suite.records.bootstrap import hierarchical_draws, padded_table, percentile_interval


def test_draws_stay_inside_each_drawn_group():
    sizes = np.array([3, 7, 1, 5])
    batches = list(hierarchical_draws(sizes, rng=np.random.default_rng(0), n_boot=1000, chunk=300))
    assert [b[0].shape[0] for b in batches] == [300, 300, 300, 100]
    for pick, idx, drawn in batches:
        assert pick.shape == (pick.shape[0], 4) and idx.shape == drawn.shape == (pick.shape[0], 4, 7)
        assert ((pick >= 0) & (pick < 4)).all()
        assert (drawn.sum(axis=2) == sizes[pick]).all()               # as many draws as the group holds
        assert (idx[drawn] < np.broadcast_to(sizes[pick][..., None], idx.shape)[drawn]).all()


def test_every_group_and_position_is_drawn():
    sizes = np.array([2, 4])
    seen = set()
    for pick, idx, drawn in hierarchical_draws(sizes, rng=np.random.default_rng(1), n_boot=400, chunk=400):
        g = np.broadcast_to(pick[..., None], idx.shape)
        seen |= set(zip(g[drawn].tolist(), idx[drawn].tolist()))
    assert seen == {(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)}


def test_padded_table_and_interval():
    t = padded_table([np.array([1.0]), np.array([2.0, 3.0])], np.nan)
    assert t.shape == (2, 2) and t[1].tolist() == [2.0, 3.0] and t[0, 0] == 1.0 and np.isnan(t[0, 1])
    assert percentile_interval(np.arange(101.0), 0.9) == pytest.approx((5.0, 95.0))
