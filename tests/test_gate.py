"""duplexcadence.gate: work(), device_wide() and capture() holds on host threads (CPU: no device needed). The
exclusive mode's tests first (every capture alone), then the concurrent mode's (work runs beside a capture).

Every test uses its own CaptureGate, threads that signal with Events, and timeouts, so a deadlock fails the
test instead of hanging it. A short `Event.wait(SHORT)` that must time out is the check that a thread is still
blocked (nothing can signal "not yet").
"""
from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch
from torch.overrides import TorchFunctionMode

from duplexcadence import gate, graphs
from duplexcadence.adapters import mimi
from duplexcadence.adapters.mimi import schedule as ms
from duplexcadence.gate import CaptureGate, OuterLock
from threaded import Held

LONG, SHORT = 10.0, 0.2         # seconds: a deadlock bound; how long a blocked thread must stay blocked


def start(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def joined(*threads) -> bool:
    for t in threads:
        t.join(LONG)
    return not any(t.is_alive() for t in threads)


def until(condition) -> None:
    """Wait (bounded) for a condition no Event can signal: a thread blocked inside the gate."""
    deadline = time.monotonic() + LONG
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.001)


def test_a_capture_waits_for_work_in_progress_and_runs_alone():
    g, log, captured = CaptureGate("exclusive"), [], threading.Event()
    work = Held(g.work, log=log, leave_note="work ends")
    work.entered.wait(LONG)

    def capturer():
        with g.capture():
            log.append(("capture", g.counts()))
        captured.set()

    b = start(capturer)
    until(lambda: g.counts()["waiting"] == 1)
    assert not captured.wait(SHORT)                       # blocked while the other thread works
    work.let_go()
    assert joined(work.thread, b) and captured.is_set()
    assert log == ["work ends", ("capture", {"work": 0, "device_wide": 0, "waiting": 0, "capturing": True, "alone": True})]
    assert g.counts() == {"work": 0, "device_wide": 0, "waiting": 0, "capturing": False, "alone": False}


def test_work_entered_while_a_capture_waits_blocks_until_the_capture_ends():
    g, log = CaptureGate("exclusive"), []
    work = Held(g.work)
    work.entered.wait(LONG)
    cap = Held(g.capture, log=log, enter_note="capture starts", leave_note="capture ends")
    until(lambda: g.counts()["waiting"] == 1)
    late = Held(g.work, log=log, enter_note="late work", hold=False)
    assert not late.entered.wait(SHORT)                   # writer preference: no new work while a capture waits
    work.let_go()
    until(lambda: g.counts()["capturing"])
    assert not late.entered.wait(SHORT)                   # nor while it runs
    cap.let_go()
    assert joined(work.thread, cap.thread, late.thread)
    assert log == ["capture starts", "capture ends", "late work"]


def test_work_is_reentrant_even_while_a_capture_waits():
    g = CaptureGate("exclusive")
    outer, go_inner, inner = threading.Event(), threading.Event(), threading.Event()
    captured = threading.Event()

    def worker():
        with g.work():
            outer.set()
            go_inner.wait(LONG)
            with g.work():                               # a nested entry never waits for the capture
                with g.work():
                    inner.set()
            assert g.counts()["work"] == 1

    def capturer():
        with g.capture():
            captured.set()

    a = start(worker)
    outer.wait(LONG)
    b = start(capturer)
    until(lambda: g.counts()["waiting"] == 1)
    go_inner.set()
    assert inner.wait(LONG) and joined(a, b) and captured.is_set()


def test_two_threads_capturing_from_inside_their_own_work_do_not_deadlock():
    g, both_in_work, lock = CaptureGate("exclusive"), threading.Barrier(2, timeout=LONG), threading.Lock()
    active, seen, after = [0], [], []

    def session():
        with g.work():
            both_in_work.wait()                          # both hold work() before either captures
            with g.capture():
                with lock:
                    active[0] += 1
                    seen.append(active[0])
                with g.work():                           # the capture's own step: passes through
                    pass
                with lock:
                    active[0] -= 1
            after.append(g.counts()["work"] >= 1)     # its hold is back after the capture

    assert joined(start(session), start(session))
    assert seen == [1, 1] and after == [True, True]
    assert g.counts() == {"work": 0, "device_wide": 0, "waiting": 0, "capturing": False, "alone": False}


def test_synchronize_waits_for_a_capture_in_progress(monkeypatch):
    g, log, synced = CaptureGate("exclusive"), [], threading.Event()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("synchronize", str(device))))
    cap = Held(g.capture, log=log, leave_note="capture ends")
    cap.entered.wait(LONG)

    def syncer():
        g.synchronize("cuda:0")
        synced.set()

    b = start(syncer)
    assert not synced.wait(SHORT)
    cap.let_go()
    assert joined(cap.thread, b) and log == ["capture ends", ("synchronize", "cuda:0")]
    g.synchronize("cpu")                                 # off CUDA: nothing
    assert len(log) == 2


def test_exceptions_inside_work_and_capture_release_the_gate():
    g, raised = CaptureGate("exclusive"), []

    def failing():                                       # on a thread: a gate left held hangs it, not the test
        for outer, inner, exc in ((g.work, g.work, ValueError), (g.work, g.capture, KeyError),
                                  (g.capture, g.capture, None)):
            try:
                with outer(), inner():
                    raise exc("in a step")
            except Exception as e:                       # noqa: BLE001 - which one is asserted below
                raised.append(type(e).__name__ if exc else str(e))

    assert joined(start(failing))
    assert raised[:2] == ["ValueError", "KeyError"] and "do not nest" in raised[2]
    assert g.counts() == {"work": 0, "device_wide": 0, "waiting": 0, "capturing": False, "alone": False}
    ran = threading.Event()

    def other():                                         # another thread captures and works afterwards
        with g.capture():
            pass
        with g.work():
            ran.set()

    assert joined(start(other)) and ran.is_set()


def test_a_model_lock_taken_inside_work_waits_outside_it():
    # A holds the model lock and captures (GraphCache.capture's order); B, inside work(), wants the lock. With
    # B's hold kept while it waited, A's capture would wait for B and B for A.
    g = CaptureGate("exclusive")
    lock = OuterLock(g)
    a_locked, b_waiting = threading.Event(), threading.Event()
    log = []

    def a():
        with lock:
            a_locked.set()
            b_waiting.wait(LONG)
            with g.capture():
                log.append("a captures")

    def b():
        a_locked.wait(LONG)
        with g.work():
            b_waiting.set()
            with lock:
                log.append("b has the lock")
            assert g.counts()["work"] == 1             # its hold is back

    assert joined(start(a), start(b)) and log == ["a captures", "b has the lock"]
    assert lock.acquire(blocking=False)
    lock.release()


# --- the concurrent mode: work beside a capture, device-wide calls and global-mode captures not -------
def test_concurrent_mode_work_runs_beside_a_capture_in_progress():
    g = CaptureGate("concurrent")
    work = Held(g.work)
    work.entered.wait(LONG)
    cap = Held(g.capture)
    assert cap.entered.wait(LONG)                        # no wait for the work in progress
    assert g.counts() == {"work": 1, "device_wide": 0, "waiting": 0, "capturing": True, "alone": False}
    late = Held(g.work, hold=False)
    assert late.entered.wait(LONG)                       # new work enters while the capture runs
    work.let_go()
    cap.let_go()
    assert joined(work.thread, cap.thread, late.thread)
    assert g.counts() == {"work": 0, "device_wide": 0, "waiting": 0, "capturing": False, "alone": False}


def test_concurrent_mode_a_capture_and_device_wide_calls_exclude_each_other(monkeypatch):
    g, log, synced = CaptureGate("concurrent"), [], threading.Event()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("synchronize"))

    @contextlib.contextmanager
    def close_like():                                    # a close: its device-wide part inside its work
        with g.work(), g.device_wide():
            yield

    def syncer():
        g.synchronize("cuda:0")
        synced.set()

    wide = Held(close_like, log=log, leave_note="wide ends")
    wide.entered.wait(LONG)
    cap = Held(g.capture, log=log, enter_note="capture starts", leave_note="capture ends")
    until(lambda: g.counts()["waiting"] == 1)
    assert not cap.entered.wait(SHORT)                   # the capture waits for the device-wide stretch
    c = start(syncer)
    assert not synced.wait(SHORT)                        # writer preference: no new device-wide call
    wide.let_go()
    assert cap.entered.wait(LONG) and not synced.wait(SHORT)   # nor while it runs
    cap.let_go()
    assert joined(wide.thread, cap.thread, c)
    assert log == ["wide ends", "capture starts", "capture ends", "synchronize"]


def test_concurrent_mode_a_capture_alone_waits_for_work_and_holds_it_back():
    g = CaptureGate("concurrent")
    work = Held(g.work)
    work.entered.wait(LONG)
    cap = Held(lambda: g.capture(alone=True))
    until(lambda: g.counts()["waiting"] == 1)
    assert not cap.entered.wait(SHORT)
    late = Held(g.work, hold=False)
    assert not late.entered.wait(SHORT)
    work.let_go()
    assert cap.entered.wait(LONG) and g.counts()["alone"] and not late.entered.wait(SHORT)
    cap.let_go()
    assert joined(work.thread, cap.thread, late.thread) and late.entered.is_set()


def test_concurrent_mode_a_thread_in_work_wanting_device_wide_lets_a_waiting_capture_alone_run():
    # B holds work() and wants device_wide() while A waits to capture alone: kept, B's hold would block A and
    # A's wait B (device_wide waits for waiting captures). B waits with no hold; A runs; then B goes on.
    g, log = CaptureGate("concurrent"), []
    b_in_work, go = threading.Event(), threading.Event()

    def a():
        b_in_work.wait(LONG)
        with g.capture(alone=True):
            log.append("a captures")
            go.set()

    def b():
        with g.work():
            b_in_work.set()
            until(lambda: g.counts()["waiting"] == 1)
            with g.device_wide():
                log.append("b device-wide")
                assert g.counts()["work"] == 1 and g.counts()["device_wide"] == 1
            assert g.counts()["work"] == 1 and g.counts()["device_wide"] == 0

    assert joined(start(a), start(b)) and log == ["a captures", "b device-wide"]
    assert g.counts() == {"work": 0, "device_wide": 0, "waiting": 0, "capturing": False, "alone": False}


def test_captures_run_one_at_a_time_in_the_concurrent_mode():
    g, lock, active, seen = CaptureGate("concurrent"), threading.Lock(), [0], []
    barrier = threading.Barrier(3, timeout=LONG)

    def capturer():
        barrier.wait()
        for _ in range(20):
            with g.capture():
                with lock:
                    active[0] += 1
                    seen.append(active[0])
                time.sleep(0.001)
                with lock:
                    active[0] -= 1

    assert joined(*[start(capturer) for _ in range(3)]) and seen == [1] * 60


def test_mode_from_the_environment_and_set_mode(monkeypatch):
    monkeypatch.setenv(gate.ENV, "exclusive")
    assert CaptureGate().mode == "exclusive"
    monkeypatch.setenv(gate.ENV, "sometimes")
    with pytest.raises(ValueError, match="sometimes"):
        CaptureGate()
    monkeypatch.delenv(gate.ENV)
    g = CaptureGate()
    assert g.mode == "concurrent"
    with g.work():
        with pytest.raises(RuntimeError, match="in use"):
            g.set_mode("exclusive")
    g.set_mode("exclusive")
    assert g.mode == "exclusive"
    with pytest.raises(ValueError):
        g.set_mode("global")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a capture beside another thread's work")
def test_cuda_another_thread_launches_allocates_and_copies_while_a_capture_records(monkeypatch):
    """The concurrent mode's claim on a device: while the main thread records (GraphCache.capture), a worker on
    its own leased stream runs matmuls, allocates and copies to the host; the step waits inside the capture
    until the worker has finished two more such rounds (in the exclusive mode it never would: the test fails).
    No capture fails, every worker round gives the eager bytes, and each graph replays the eager result."""
    monkeypatch.setattr(gate.GATE, "mode", "concurrent")
    dev = torch.device("cuda")
    x = torch.randn(256, 256, device=dev, generator=torch.Generator(dev).manual_seed(0))
    expected = (x @ x).cpu()
    stop, rounds, errors = threading.Event(), [], []

    def worker():
        stream = graphs.STREAMS.acquire(dev)
        try:
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    with gate.work():
                        y = x @ x
                        torch.empty(1 << 20, device=dev)
                        rounds.append(torch.equal(y.cpu(), expected))
        except Exception as exc:                         # noqa: BLE001 - asserted below
            errors.append(exc)
        finally:
            stream.synchronize()
            graphs.STREAMS.release(stream)

    cache = graphs.GraphCache(dev, enabled=True, inline=False)
    a = torch.randn(128, 128, device=dev, generator=torch.Generator(dev).manual_seed(1))
    aa = a @ a                                           # this thread's cuBLAS set-up, before any capture
    t = start(worker)
    try:
        until(lambda: len(rounds) >= 1)
        for k in range(8):
            def step(k=k):
                n = len(rounds)
                deadline = time.monotonic() + LONG
                while len(rounds) < n + 2 and time.monotonic() < deadline:
                    time.sleep(0.001)
                assert len(rounds) >= n + 2, "the worker did not run beside the capture"
                return a @ a + k
            assert cache.capture(("beside", k), step)
            torch.cuda.current_stream().synchronize()
            out = cache.run(("beside", k), step)
            torch.cuda.synchronize()
            assert torch.equal(out, aa + k)
    finally:
        stop.set()
        t.join(LONG)
    assert errors == [] and rounds and all(rounds)
    assert cache.stats.captures == 8 and cache.stats.capture_failures == 0, cache.stats.failures
    cache.drop()


# --- an adapter's device work runs inside work() ----------------------------------------------------
class RecordingWork:
    """A stand-in for gate.work: counts how deep this (single) thread is inside it."""

    def __init__(self):
        self.depth = 0

    @contextlib.contextmanager
    def __call__(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1


class DeviceCalls(TorchFunctionMode):
    """Records, for each device copy (`.to(device)`, `.copy_`, `.cpu()`) and decoder kernel (conv1d, conv
    transpose), whether it ran inside work()."""

    KERNELS = ("conv1d", "conv_transpose1d")

    def __init__(self, work: RecordingWork):
        super().__init__()
        self.work, self.calls = work, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        moves = name == "to" and any(isinstance(a, (str, torch.device)) for a in (*args[1:], *kwargs.values()))
        if moves or name in ("copy_", "cpu", *self.KERNELS):
            self.calls.append((name, self.work.depth > 0))
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def mimi_model():
    return mimi.build_model({}, device="cpu", depth="reduced", seed=0)


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_a_sessions_device_work_runs_inside_work(monkeypatch, mimi_model, mode):
    work = RecordingWork()
    monkeypatch.setattr(gate, "work", work)
    codes = torch.randint(0, ms.CARDINALITY, (ms.N_Q, 2), generator=torch.Generator().manual_seed(7))
    with DeviceCalls(work) as calls:
        session = mimi.new_session(mimi_model, mode, {})
        session.start_turn()
        session.speak(codes)
        session.close()
    names = {name for name, _ in calls.calls}
    assert {"conv1d", "cpu"} <= names and (mode == "cadence" or "to" in names), names
    outside = [name for name, inside in calls.calls if not inside]
    assert outside == [], f"{len(outside)} of {len(calls.calls)} device calls outside gate.work(): {outside[:5]}"
