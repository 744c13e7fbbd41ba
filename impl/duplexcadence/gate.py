"""The process's capture gate: which host threads' CUDA work may run while a CUDA-graph capture is recorded.

Why. While a stream captures, other threads' CUDA calls can meet the capture. `cudaStreamCaptureModeThreadLocal`
(CUDA Runtime API, cudaThreadExchangeStreamCaptureMode: "Concurrent capture sequences in other threads are
ignored"; torch.cuda.graph's `capture_error_mode="thread_local"`: "will only error for actions in the current
thread") lets other threads launch kernels, replay graphs, copy on their own streams and allocate while one
thread captures. It does not make a device-wide call legal: `torch.cuda.synchronize()` (cudaDeviceSynchronize) on
any thread during a capture fails with cudaErrorStreamCaptureUnsupported ("operation not permitted when stream is
capturing") and invalidates the capture, and so does `torch.cuda.empty_cache()` (cudaFree synchronizes the
device); two captures at once fail each other (torch.cuda.graph's own `__enter__` calls `torch.cuda.synchronize()`
and `empty_cache()` before `capture_begin`, torch/cuda/graphs.py); a capture in torch's default global mode (moshi's
CUDAGraphed, utils/compile.py L261-271) makes every other thread's potentially unsafe call an error.

Three kinds of hold, one gate per process (`GATE`):
- `work()` (shared, reentrant per thread) wraps every stretch of a session's CUDA work (open, start_turn, speak,
  prepare, close).
- `device_wide()` (shared, reentrant) wraps the calls no capture may meet: device synchronize, empty_cache,
  freeing graphs, mapping and unmapping VMM memory, and eager draws from or seeding of a device's default
  generator (every capture registers it, torch's CUDAGraph::capture_begin; a draw from another thread meanwhile
  fails: flow_hift.stock.OwnGenerator, rng.seeded_build). `synchronize(device)` is torch.cuda.synchronize inside it.
- `capture(alone=False)` (one at a time) wraps each capture. It waits until no other thread is inside
  device_wide(), and new device_wide() entries wait while a capture waits or runs (writer preference: captures do
  not starve). A capture `alone=True` (a global-mode capture) also waits until no other thread is inside work(),
  and holds new work() back the same way.

Mode (`DUPLEXCADENCE_CAPTURE_GATE`, `set_mode`): "concurrent" (the default) as above; "exclusive" makes every
capture `alone`, so a capture runs while no other thread of the process is inside work() (each capture then
stalls every session's unit in progress: the comparison this mode exists for).

Waits. A thread that waits for the gate (or, through `aside` or an OuterLock, for another lock) sets all of its
holds aside while it waits and takes them back together after, so a capture waiting for them can run; a
capturing thread's own work() and device_wide() entries pass through.

Lock order. The gate's holds are the innermost waits: a thread never waits for a model lock with its holds kept.
Take the model lock first, then work(); a model lock taken inside work() (runtime.model_lock, an `OuterLock`)
sets the thread's holds aside while it waits, so the lock is in effect taken outside them. A lock a capture step
takes (moshi's switches) is taken only inside work() and never held while waiting for the gate. A capture step
takes no model lock its thread does not hold already. Errors: RuntimeError for capture() inside the same
thread's capture (captures do not nest), ValueError for an unknown mode; an exception inside a hold releases it.
"""
from __future__ import annotations

import contextlib
import os
import threading

import torch


MODES = ("concurrent", "exclusive")
ENV = "DUPLEXCADENCE_CAPTURE_GATE"


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"capture gate mode: expected one of {MODES}, got {mode!r} (from {ENV} or set_mode)")
    return mode


class CaptureGate:
    """work() and device_wide() holds against capture() holds, over the threads of one process (module docstring).
    mode: "concurrent" or "exclusive" (None: the environment's DUPLEXCADENCE_CAPTURE_GATE, default concurrent)."""

    def __init__(self, mode: str | None = None):
        self.mode = check_mode(mode if mode is not None else os.environ.get(ENV, "concurrent"))
        self._cond = threading.Condition(threading.Lock())
        self._work = 0              # threads inside work() now
        self._wide = 0              # threads inside device_wide() now
        self._waiting = 0           # captures waiting
        self._waiting_alone = 0     # of them, captures alone
        self._capturing = None      # the thread id of the capture in progress
        self._alone = False         # whether that capture runs alone
        self._local = threading.local()

    def set_mode(self, mode: str) -> None:
        """Change the mode; RuntimeError while any thread holds the gate or a capture waits or runs."""
        check_mode(mode)
        with self._cond:
            if self._work or self._wide or self._waiting or self._capturing is not None:
                raise RuntimeError(f"set_mode({mode!r}): the gate is in use ({self._counts()})")
            self.mode = mode

    def _depths(self) -> tuple[int, int]:
        return getattr(self._local, "work", 0), getattr(self._local, "wide", 0)

    def _free_for(self, work: int, wide: int) -> bool:   # under _cond: may a thread hold these now?
        if wide and (self._capturing is not None or self._waiting):
            return False
        return not (work and ((self._capturing is not None and self._alone) or self._waiting_alone))

    def _take(self, work: int, wide: int) -> None:       # hold work() / device_wide() at these depths (0: none)
        if work or wide:
            with self._cond:
                self._cond.wait_for(lambda: self._free_for(work, wide))
                self._work += bool(work)
                self._wide += bool(wide)
        self._local.work, self._local.wide = work, wide

    def _drop(self) -> tuple[int, int]:                  # drop this thread's holds; their depths
        work, wide = self._depths()
        if work or wide:
            self._local.work = self._local.wide = 0
            with self._cond:
                self._work -= bool(work)
                self._wide -= bool(wide)
                self._cond.notify_all()
        return work, wide

    @contextlib.contextmanager
    def _hold(self, kind: int):                          # kind 0: work(), 1: device_wide()
        if self._capturing == threading.get_ident():
            yield                                        # the capturing thread's own step
            return
        depths = list(self._depths())
        if depths[kind]:
            depths[kind] += 1
            setattr(self._local, ("work", "wide")[kind], depths[kind])
            try:
                yield
            finally:
                setattr(self._local, ("work", "wide")[kind], depths[kind] - 1)
            return
        saved = self._drop()                             # wait with no hold kept, then take them all at once
        want = list(saved)
        want[kind] = 1
        self._take(*want)
        try:
            yield
        finally:
            self._drop()
            self._take(*saved)

    def work(self):
        return self._hold(0)

    def device_wide(self):
        return self._hold(1)

    @contextlib.contextmanager
    def aside(self):
        """This thread's holds set aside for the body (a wait for another lock), taken back after."""
        saved = self._drop() if self._capturing != threading.get_ident() else (0, 0)
        try:
            yield
        finally:
            self._take(*saved)

    @contextlib.contextmanager
    def capture(self, alone: bool = False):
        me = threading.get_ident()
        if self._capturing == me:
            raise RuntimeError("capture(): this thread is capturing already (CUDA captures do not nest)")
        alone = bool(alone) or self.mode == "exclusive"
        with self.aside():
            with self._cond:
                self._waiting += 1
                self._waiting_alone += alone
                try:
                    self._cond.wait_for(lambda: self._capturing is None and not self._wide
                                        and not (alone and self._work))
                finally:
                    self._waiting -= 1
                    self._waiting_alone -= alone
                    self._cond.notify_all()
                self._capturing, self._alone = me, alone
            try:
                yield
            finally:
                with self._cond:
                    self._capturing, self._alone = None, False
                    self._cond.notify_all()

    def _counts(self) -> dict:
        return {"work": self._work, "device_wide": self._wide, "waiting": self._waiting,
                "capturing": self._capturing is not None, "alone": self._alone}

    def counts(self) -> dict:
        """{"work", "device_wide": threads inside each now, "waiting": captures waiting, "capturing": bool,
        "alone": whether the capture in progress runs alone} (tests, diagnostics)."""
        with self._cond:
            return self._counts()

    def synchronize(self, device=None) -> None:
        """torch.cuda.synchronize(device) once no capture waits or runs (inside device_wide()); no-op off CUDA."""
        if device is not None and torch.device(device).type != "cuda":
            return
        with self.device_wide():
            torch.cuda.synchronize(device)


class OuterLock:
    """A reentrant lock (threading.RLock) that waits outside the gate: taken inside work() or device_wide(), the
    thread's holds are set aside while it waits (module docstring, lock order). A context manager; `gate` None = the process's GATE."""

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


#: The process's gate; `work`, `device_wide`, `capture` and `synchronize` are its methods (every session and the
#: suite use them).
GATE = CaptureGate()
work, device_wide, capture, synchronize = GATE.work, GATE.device_wide, GATE.capture, GATE.synchronize
