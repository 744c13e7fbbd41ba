"""duplexcadence.adapters.mimi "stock_graphs" (moshi's CUDAGraphed path) beside other sessions, on the CPU.

moshi's graphs are off without CUDA, but the rules are the same: sessions of one model keep their own streams
(interleaved, each equals itself alone), and a unit that may capture holds the process's capture gate
exclusively (it waits for other threads' work() to end and runs alone). Reduced config (test_adapter_mimi.py).
"""
from __future__ import annotations

import contextlib
import threading
import time

import pytest

from reduced_mimi import model, random_units  # noqa: F401  (tests/ is on sys.path under pytest; model: a fixture)
from session_state import digest
from torch_threads import one_thread  # noqa: F401  (autouse: this module's tests at one intra-op thread)
from duplexcadence import bind, gate
from duplexcadence.adapters import mimi

LONG, SHORT = 10.0, 0.2         # seconds: a deadlock bound; how long a blocked thread must stay blocked
FRAMES = (5, 4, 6)


@pytest.fixture(scope="module")
def units():
    return random_units(FRAMES, seed=4321)


@pytest.fixture(scope="module")
def alone(model, units):
    """Every unit's float32 bytes from one stock_graphs session alone on the model, closed after."""
    with mimi.new_session(model, "stock_graphs", {}) as session:
        return [session.speak(codes).waveform.tobytes() for codes in units]


def until(condition) -> None:
    """Wait (bounded) for a condition no Event can signal: a thread blocked inside the gate."""
    deadline = time.monotonic() + LONG
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.001)


def model_streaming_states(model) -> list:
    return [m._streaming_state for m in model.modules() if hasattr(m, "_streaming_state")]


def test_sessions_of_one_model_interleaved_each_equal_alone(model, units, alone):
    """Two stock_graphs sessions and a stock and a cadence session open on one model, units interleaved: each
    stock_graphs session's bytes equal one alone, the other's state is unchanged by a unit, and no streaming
    state is left on the shared model."""
    first, second = (mimi.new_session(model, "stock_graphs", {}) for _ in range(2))
    others = [mimi.new_session(model, mode, {}) for mode in ("stock", "cadence")]
    got = {id(first): [], id(second): []}
    for codes in units:
        for session, other in ((first, second), (second, first)):
            before = digest(other)
            got[id(session)].append(session.speak(codes).waveform.tobytes())
            assert digest(other) == before
            for o in others:
                o.speak(codes)
    assert got[id(first)] == alone and got[id(second)] == alone
    assert all(s is None for s in model_streaming_states(model)) and bind.live() == 0
    for s in (first, second, *others):
        s.close()


@pytest.mark.parametrize("caller_in_work", [False, True], ids=["plain", "caller-inside-work"])
def test_speak_waits_for_other_threads_work_and_runs_alone(model, units, alone, caller_in_work):
    """While another thread is inside gate.work(), a stock session speaks beside it but a stock_graphs unit
    waits (nothing changed meanwhile) and runs once that thread leaves, with no other holder, bytes as alone.
    A caller that is itself inside work() does not deadlock: its hold is set aside while it waits."""
    in_work, leave, spoke = threading.Event(), threading.Event(), threading.Event()
    seen, got = [], []

    def worker():
        with gate.work():
            in_work.set()
            leave.wait(LONG)

    def speaker(session):
        with gate.work() if caller_in_work else contextlib.nullcontext():
            got.append(session.speak(units[0]).waveform.tobytes())
        spoke.set()

    session = mimi.new_session(model, "stock_graphs", {})
    hold = threading.Thread(target=worker, daemon=True)
    hold.start()
    try:
        assert in_work.wait(LONG)
        with mimi.new_session(model, "stock", {}) as stock:     # a stock session is not held back
            assert stock.speak(units[0]).waveform.tobytes() == alone[0]
        before = digest(session)
        orig = session.own.installed

        def installed(**kw):                                    # what the gate looks like while the unit decodes
            seen.append(gate.GATE.counts())
            return orig(**kw)
        session.own.installed = installed
        t = threading.Thread(target=speaker, args=(session,), daemon=True)
        t.start()
        until(lambda: gate.GATE.counts()["waiting"] == 1)
        assert not spoke.wait(SHORT) and got == [] and seen == []
        assert digest(session) == before and session.stats().units == 0
        leave.set()
        hold.join(LONG)
        t.join(LONG)
        assert spoke.is_set() and got == [alone[0]]
        assert seen == [{"work": 0, "device_wide": 0, "waiting": 0, "capturing": True, "alone": True}]
        assert gate.GATE.counts() == {"work": 0, "device_wide": 0, "waiting": 0, "capturing": False, "alone": False}
    finally:
        leave.set()
    session.close()

