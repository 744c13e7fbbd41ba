"""The process's capture gate: a CUDA-graph capture runs while no other host thread issues CUDA work.

Why. While a stream captures, other threads' CUDA calls meet the capture. `cudaStreamCaptureModeThreadLocal`
(CUDA Runtime API, cudaThreadExchangeStreamCaptureMode: "Concurrent capture sequences in other threads are
ignored") only keeps the capturing thread's own unsafe calls from being checked against other threads; it does
not make a device-wide call legal: `torch.cuda.synchronize()` (cudaDeviceSynchronize) on any thread during a
capture fails with cudaErrorStreamCaptureUnsupported ("operation not permitted when stream is capturing") and
invalidates the capture; torch refuses pageable host<->device copies while a capture is underway ("Cannot copy
between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned"); and torch.cuda.graph's
own `__enter__` calls `torch.cuda.synchronize()` and `empty_cache()` before `capture_begin` (torch/cuda/graphs.py,
`graph.__enter__`, torch 2.13 L437-466), so two captures at once fail each other. The rule: a capture runs while
no other thread of the process is inside a stretch of CUDA work.

`work()` (shared, reentrant per thread) wraps every stretch of a session's CUDA work (open, start_turn, speak,
prepare, close); `capture()` (exclusive) wraps each capture: it waits until no other thread is inside work(),
and new work() entries wait while a capture waits or runs (writer preference: captures do not starve). A thread
inside work() that captures sets its own hold aside while it waits and takes it back after, so threads that
capture from inside speak do not deadlock; inside its capture, the thread's work() entries pass through.
`synchronize(device)` is torch.cuda.synchronize inside work(): it waits for a capture in progress.

Lock order. work() and capture() are the innermost waits: a thread never waits for a model lock with its hold
kept. Take the model lock first, then work(); a model lock taken inside work() (runtime.model_lock, an
`OuterLock`) sets the thread's hold aside while it waits, so the lock is in effect taken outside work(). A lock
a capture step takes (moshi's switches) is taken only inside work() and never held while waiting for the gate.
A capture step takes no model lock its thread does not hold already. Errors: RuntimeError for capture() inside
the same thread's capture (captures do not nest); an exception inside work() or capture() releases the gate.
"""
from __future__ import annotations

import contextlib
import threading

import torch


class CaptureGate:
    """Shared work() holds against exclusive capture() holds, over the threads of one process (module docstring)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._holders = 0           # threads inside work() now
        self._waiting = 0           # captures waiting for the holders to leave
        self._capturing = None      # the thread id of the capture in progress
        self._local = threading.local()

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def _enter(self, depth: int) -> None:        # hold work() at `depth` (0: none) once no capture waits or runs
        if depth:
            with self._cond:
                self._cond.wait_for(lambda: self._capturing is None and not self._waiting)
                self._holders += 1
            self._local.depth = depth

    def _leave(self) -> int:                     # drop this thread's hold; its depth (0: it held none)
        depth = self._depth()
        if depth:
            self._local.depth = 0
            with self._cond:
                self._holders -= 1
                self._cond.notify_all()
        return depth

    @contextlib.contextmanager
    def work(self):
        if self._capturing == threading.get_ident():
            yield                                    # the capturing thread's own step
            return
        depth = self._depth()
        if depth:
            self._local.depth = depth + 1
        else:
            self._enter(1)
        try:
            yield
        finally:
            if depth:
                self._local.depth = depth
            else:
                self._leave()

    @contextlib.contextmanager
    def aside(self):
        """This thread's work() hold set aside for the body (a wait for another lock), taken back after."""
        depth = self._leave() if self._capturing != threading.get_ident() else 0
        try:
            yield
        finally:
            self._enter(depth)

    @contextlib.contextmanager
    def capture(self):
        me = threading.get_ident()
        if self._capturing == me:
            raise RuntimeError("capture(): this thread is capturing already (CUDA captures do not nest)")
        with self.aside():
            with self._cond:
                self._waiting += 1
                try:
                    self._cond.wait_for(lambda: self._capturing is None and not self._holders)
                finally:
                    self._waiting -= 1
                    self._cond.notify_all()
                self._capturing = me
            try:
                yield
            finally:
                with self._cond:
                    self._capturing = None
                    self._cond.notify_all()

    def counts(self) -> dict:
        """{"holders": threads inside work(), "waiting": captures waiting, "capturing": bool} (tests, diagnostics)."""
        with self._cond:
            return {"holders": self._holders, "waiting": self._waiting, "capturing": self._capturing is not None}

    def synchronize(self, device=None) -> None:
        """torch.cuda.synchronize(device) once no capture is in progress (inside work()); no-op off CUDA."""
        if device is not None and torch.device(device).type != "cuda":
            return
        with self.work():
            torch.cuda.synchronize(device)


class OuterLock:
    """A reentrant lock (threading.RLock) that waits outside work(): taken inside work(), the thread's hold is set
    aside while it waits (module docstring, lock order). A context manager; `gate` None = the process's GATE."""

    def __init__(self, gate: CaptureGate | None = None):
        self._lock, self._gate = threading.RLock(), gate

    def acquire(self, blocking: bool = True) -> bool:
        got = self._lock.acquire(blocking=False)
        if not got and blocking:
            with (self._gate or GATE).aside():
                got = self._lock.acquire()
        return got

    def release(self) -> None:
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


#: The process's gate; `work`, `capture` and `synchronize` are its methods (every session and the suite use them).
GATE = CaptureGate()
work, capture, synchronize = GATE.work, GATE.capture, GATE.synchronize
