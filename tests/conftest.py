"""Suite-wide test set-up, and the two fixtures several modules name: fake_adapter and clean_tree (at the end).
Fixtures that only a few modules share live in helper modules beside the tests, imported by name.

gc: the harnesses call gc.collect() several times per run (suite.memory's probe settles before every
sample, the measure layer after every session). A full collection walks every object the
cyclic collector tracks, and this process holds torch, transformers, moshi and stepaudio2's module objects
(~180 000 of them; ~0.2-0.5 s a collection), so the fake-adapter runs of test_suite_runner,
test_report and test_reproduce_stages spent most of their time in gc.collect(). At the start of each
test module, what is still alive after a collection (imports; session state) is moved to the collector's
permanent generation (gc.freeze): later collections skip it. Objects made afterwards, models and sessions
included, are collected as before, and reference counting frees frozen objects as usual; only cyclic
garbage among the frozen objects would never be collected. Measurements that depend on collection run
in child processes (suite.memory's probe tests, the memory stages), which this does not touch.
"""
from __future__ import annotations

import gc

import pytest


@pytest.fixture(scope="module", autouse=True)
def _freeze_long_lived_objects():
    gc.collect()
    gc.freeze()
    yield


def pytest_collection_modifyitems(config, items):
    """Every test that skips without CUDA (a skipif whose reason starts "needs CUDA") is also marked `gpu`,
    so `make test-gpu` (pytest -m gpu) selects exactly the CUDA tests."""
    for item in items:
        for mark in item.iter_markers("skipif"):
            if str(mark.kwargs.get("reason", "")).startswith("needs CUDA"):
                item.add_marker(pytest.mark.gpu)
                break


@pytest.fixture
def fake_adapter(monkeypatch):
    """The fake adapter (tests/fakes.py) registered as architecture "fake"; returns it."""
    import fakes
    return fakes.register(monkeypatch)


@pytest.fixture
def clean_tree(monkeypatch):
    """Provenance of a clean checkout (a shared working tree is dirty while others work in it)."""
    from suite.measure import env
    real = env.provenance
    monkeypatch.setattr(env, "provenance", lambda command=None, *, device="cpu": {
        **real(command, device=device), "git_dirty": False, "git_status": []})
