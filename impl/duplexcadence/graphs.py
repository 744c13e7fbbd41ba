"""CUDA-graph capture and replay keyed by an exact shape signature; eager fallback; counters.

One graph per distinct signature (a hashable tuple of exact lengths from the clocks: never padded,
no masks added, no sessions batched together). The first call with a new signature captures the step
and replays it once; later calls replay. A graph bakes in addresses: the step must read and write only
arena views and tensors it allocates itself (which live in the graph's private pool), and the cache
checks on every replay that the arena's base is the one it captured with (one int compare).

The step function must not change host state (Python attributes, host counters): during capture its
Python runs once and its kernels are recorded, not run; at replay only the kernels run. Host clocks
advance outside the step, in the adapter. Anything not capturable (torch.istft's NOLA check, `.item()`,
`.cpu()`, host-to-device copies of fresh CPU tensors) stays outside, between graph segments.

All graphs of a session share one memory pool, so a graph's intermediates may sit where another graph's
output lives. An output is therefore safe only until the next replay of any graph of the session: an
output that must outlive other replays (e.g. the flow's mel, read block by block while the vocoder's
graphs replay) is written into the arena by the step and returned as an arena view.

On CPU (or with enabled=False) every call runs eagerly and is counted as such; the same code path runs
on both devices.

Sessions on one model, many host threads: a replay touches no Python state of the shared model (only its
kernels run), but an eager run or a capture runs the step's Python, which may point shared module buffers
at this session's arena for the step. `lock` (one per model, shared by its sessions' caches) is held for
exactly those runs, never for a replay. `warmed` (a WarmSet shared by the sessions of one model) records,
per host thread, the step families whose warm-up runs already happened: the warm-up exists for
lazy initialisations that must not meet a capture, and torch makes some of them per thread (the cuBLAS and
cuDNN handles of aten/src/ATen/cuda/CublasHandlePool.cpp and aten/src/ATen/cudnn/Handle.cpp), so a session
captures a family on its first occurrence only on a thread that has already run that family eagerly.
Every capture runs with autograd off (torch.no_grad): a graph holds its outputs, and outputs with autograd
history would keep every intermediate of the step allocated in the pool. Mirrors the idea of vLLM's CudagraphDispatcher (capture keyed by a descriptor) and
moshi's CUDAGraphed (utils/compile.py L190-280), without padding and with many keys.
"""
from __future__ import annotations

import collections
import contextlib
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch

from duplexcadence import gate
from duplexcadence.errors import InputError
from duplexcadence.payload import shown


class StreamLeases:
    """CUDA streams that no two holders share at once: each `acquire(device)` returns a stream no other
    live lease holds, created fresh (cuda-python driver API, `cuStreamCreate` non-blocking, wrapped in
    `torch.cuda.ExternalStream`) when none is free; `release(stream)` makes it available again. Streams
    are never destroyed, so a stream's address never comes back as another stream's: at most as many
    streams as leases were ever held at once (one per live session), for the life of the process.

    Why not `torch.cuda.Stream()`: it hands out torch's per-device pool of 32 streams round-robin (c10
    CUDAStream.cpp, kStreamsPerPool; pytorch/pytorch#9938), so the 33rd stream of a process is the first
    again. A captured cuBLAS call keeps the workspace of (cuBLAS handle, capture stream)
    (aten/src/ATen/cuda/CublasHandlePool.cpp), and every session's graphs are captured from the same
    host thread (one handle): two live sessions with the same pool stream share one workspace, and their
    graphs replayed at once on different streams race on it (non-finite vocoder audio, depending on timing).

    A free stream this host thread has already primed (`prime_workspace`) is handed out first, then a free
    one that no other live thread primed; a stream another live thread primed is left to that thread and a
    new stream made instead. Each (thread, stream) pair a thread captures on keeps a cuBLAS and a cuBLASLt
    workspace for the life of the process, so a thread taking another's stream makes a new pair and leaves
    the owner to make one too: the pairs would grow towards threads x streams. With this order they stay at
    what each thread holds at once, summed over threads. A thread that ended gives its streams to any thread
    (its cuBLAS handle goes back to torch's pool for the next thread).

    Without cuda-python, `acquire` falls back to torch's pool and raises RuntimeError when the stream it
    gets is already leased (instead of sharing it). Thread-safe. Garbage-collector callbacks
    (weakref.finalize) must give streams back with `release_later`, which takes no lock: a collection can
    run inside `acquire` or `release` while this thread holds the (non-reentrant) lock."""

    def __init__(self, create=None):
        self._create = create or _new_driver_stream
        self._lock = threading.Lock()
        self._free: dict[int, list] = {}
        self._leased: dict[int, int] = {}      # cuda_stream address -> device index, while leased
        self._returned = collections.deque()   # streams given back by finalizers, not yet processed

    def acquire(self, device) -> "torch.cuda.Stream":
        """A stream on `device` (torch.device or str, CUDA) that no other live lease holds. Raises
        ValueError for a device that is not CUDA, RuntimeError where the fallback (no cuda-python) gets
        torch's pool stream back while it is still leased, or where the driver refuses a new stream."""
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {device}")
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            self._drain()
            free = self._free.setdefault(index, [])
            mine = [k for k, s in enumerate(free) if _is_primed(s)]
            open_ = mine or [k for k, s in enumerate(free) if not _primed_by_another_live_thread(s)]
            stream = free.pop(open_[-1]) if open_ else self._create(index)
            if stream.cuda_stream in self._leased:
                raise RuntimeError(f"stream {stream.cuda_stream:#x} on cuda:{index} is already leased: torch's "
                                   f"stream pool has wrapped around (32 per device); install cuda-python "
                                   f"(the 'gpu' extra) for a stream per session")
            self._leased[stream.cuda_stream] = index
            return stream

    def release(self, stream) -> None:
        """Give a stream back once its holder's work is done (nothing queued on it, no graph captured on it
        still replaying): the next holder may capture or run on it at once. Raises ValueError for a stream
        that is not leased."""
        with self._lock:
            self._drain()
            self._give_back(stream)

    def release_later(self, stream) -> None:
        """`release` for garbage-collector callbacks: queues the stream (no lock taken, so safe while this
        thread is inside `acquire`/`release`); the next `acquire`, `release` or `leased` gives it back."""
        self._returned.append(stream)

    def leased(self) -> int:
        """How many streams are leased now."""
        with self._lock:
            self._drain()
            return len(self._leased)

    def _give_back(self, stream) -> None:
        index = self._leased.pop(stream.cuda_stream, None)
        if index is None:
            raise ValueError(f"stream {stream.cuda_stream:#x} is not leased")
        self._free.setdefault(index, []).append(stream)

    def _drain(self) -> None:
        """Give back the streams queued by `release_later` (call with the lock held)."""
        while self._returned:
            self._give_back(self._returned.popleft())


def _new_driver_stream(index: int) -> "torch.cuda.Stream":
    """A new non-blocking stream on device `index`'s primary context (the one torch uses), else one of
    torch's pool streams where cuda-python is missing (StreamLeases then refuses a wrapped-around one)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return torch.cuda.Stream(torch.device("cuda", index))
    torch.cuda.init()

    def check(result, call):
        err, *rest = result
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{call} failed: {err}")
        return rest[0] if rest else None

    dev = check(cu.cuDeviceGet(index), "cuDeviceGet")
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")    # kept: streams live on
    check(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        raw = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
    finally:
        check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
    return torch.cuda.ExternalStream(int(raw), device=torch.device("cuda", index))


#: The process's stream leases: GraphCache capture streams, suite.measure.duplex per-session streams.
STREAMS = StreamLeases()


class SignatureError(KeyError):
    """A step's signature was not captured and the cache is closed in strict mode."""


class ArenaMoved(RuntimeError):
    """A graph was replayed against an arena at another address than it was captured on."""


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    eager_runs: int = 0          # graphs disabled (CPU) or signature marked eager
    eager_fallbacks: int = 0     # unseen signature after close(), or a failed capture
    capture_failures: int = 0
    warmup_runs: int = 0         # eager first occurrences of a signature (warmup > 0)
    failures: list = field(default_factory=list)

    def snapshot(self) -> dict:
        return {"captures": self.captures, "replays": self.replays, "eager_runs": self.eager_runs,
                "warmup_runs": self.warmup_runs, "eager_fallbacks": self.eager_fallbacks,
                "capture_failures": self.capture_failures, "failures": [f[:300] for f in self.failures[:3]]}


@dataclass
class GraphEntry:
    signature: Hashable
    graph: "torch.cuda.CUDAGraph"
    outputs: object
    arena_base: int


def check_options(graphs, strict=False) -> None:
    """A session's `graphs` (None: on CUDA) and `strict` options, checked before it allocates anything. Raises
    InputError naming the option for anything but a bool (or None for graphs)."""
    for name, value in (("graphs", graphs), ("strict", strict)):
        if not (isinstance(value, bool) or (value is None and name == "graphs")):
            raise InputError(f"spec[{name!r}]: expected {'None (graphs on CUDA), ' if name == 'graphs' else ''}"
                             f"True or False, got {shown(value)} ({type(value).__name__})")


class GraphCache:
    """Graphs of one session (one arena), keyed by signature.

    device: the session's device; graphs are used only on CUDA and when `enabled` (default: CUDA).
    strict: after `close()`, an unseen signature raises SignatureError instead of running eagerly.
    arena: the session's Arena; its base address is checked on every replay.
    warmup: eager runs of a new signature before it is captured; warmed: a WarmSet shared across the caches
    of one model (see the module docstring), None = per cache; warm_key: what a warm-up is counted under
    (default the signature itself; e.g. `lambda s: s.step` warms a whole step family with one eager run,
    after which every signature of that family can be captured ahead); lock: a context manager (the model's
    runtime.model_lock, a gate.OuterLock) held around every eager run and capture, None = no lock. Every call
    runs inside gate.work(); a capture inside gate.capture(), freeing the graphs (`drop`) inside gate.device_wide().
    inline: True captures a new signature inside `run` (after its warm-up); False never captures there:
    an uncaptured signature runs eagerly and counts as an eager fallback, and graphs come only from
    `capture` (ahead of time, outside any timed unit).
    """

    def __init__(self, device, *, enabled: bool | None = None, strict: bool = False, arena=None,
                 warmup: int = 0, warmed: "WarmSet | None" = None, lock=None, warm_key=None, inline: bool = True):
        self.device = torch.device(device)
        check_options(enabled, strict)
        self.enabled = (self.device.type == "cuda") if enabled is None else enabled
        if self.enabled and self.device.type != "cuda":
            raise InputError(f"spec['graphs']: True needs a CUDA device, got {self.device} (None: graphs where "
                             f"the device is CUDA)")
        self.strict = strict
        self.arena = arena
        self.warmup = warmup            # eager runs of a signature before it is captured (lazy inits)
        self._seen = threading.local()  # per host thread: eager warm-up runs by warm_key
        self.warmed = warmed
        self.warm_key = warm_key or (lambda sig: sig)
        self.inline = inline
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.entries: dict[Hashable, GraphEntry] = {}
        self.eager_only: set = set()
        self.closed = False
        self.stats = GraphStats()
        self.pool = torch.cuda.graph_pool_handle() if self.enabled else None
        # Its own capture stream, leased for the cache's life: a captured cuBLAS call keeps the workspace
        # of (handle, capture stream), so caches sharing a capture stream (torch.cuda.graph's default one
        # per process, or torch's 32-stream pool wrapping around) share one workspace and corrupt each
        # other when replayed at the same time on different streams (StreamLeases).
        self.capture_stream = STREAMS.acquire(self.device) if self.enabled else None
        if self.capture_stream is not None:     # back to the leases when the cache (and its graphs) go
            weakref.finalize(self, STREAMS.release_later, self.capture_stream)
        self.pool_bytes = 0

    def close(self) -> None:
        """No more captures: the set of graphs is final for this session."""
        self.closed = True

    def __contains__(self, signature) -> bool:
        return signature in self.entries

    def run(self, signature: Hashable, step: Callable[[], object]):
        """Run `step` (a zero-argument callable over arena views) for `signature`: replay its graph,
        capture it on first use, or run it eagerly. Returns the step's outputs; for a graph these are
        the same static tensors every replay, so copy what must outlive the next replay."""
        with gate.work():
            if not self.enabled or signature in self.eager_only:
                self.stats.eager_runs += 1
                with self.lock:
                    return step()
            entry = self.entries.get(signature)
            if entry is not None:
                base = self.arena.base if self.arena is not None else 0
                if base != entry.arena_base:
                    raise ArenaMoved(f"graph {signature!r} captured on arena base {entry.arena_base:#x}, "
                                     f"replayed on {base:#x}")
                entry.graph.replay()
                self.stats.replays += 1
                return entry.outputs
            with self.lock:
                if self.needs_warmup(signature):
                    key, seen = self.warm_key(signature), self._seen_here()
                    seen[key] = seen.get(key, 0) + 1
                    if self.warmed is not None and seen[key] >= self.warmup:
                        self.warmed.add(key)
                    self.stats.warmup_runs += 1
                    return step()
                if self.closed or not self.inline:
                    if self.strict and self.closed:
                        raise SignatureError(f"signature {signature!r} was not captured before close() "
                                             f"(known: {len(self.entries)})")
                    self.stats.eager_fallbacks += 1
                    return step()
                return self._capture(signature, step)

    def _seen_here(self) -> dict:
        seen = getattr(self._seen, "runs", None)
        if seen is None:
            seen = self._seen.runs = {}
        return seen

    def needs_warmup(self, signature) -> bool:
        """True while `signature` has had fewer than `warmup` eager runs on this host thread, here or (with
        `warmed`) in any cache sharing the set; never after close()."""
        key = self.warm_key(signature)
        if self.closed or self._seen_here().get(key, 0) >= self.warmup:
            return False
        return self.warmed is None or key not in self.warmed

    def capture(self, signature: Hashable, step: Callable[[], object]) -> bool:
        """Capture `signature` ahead of time without running it: the step's kernels are recorded, not run,
        so the session's state is unchanged (the step must not change host state either). For signatures
        the clocks predict before they are needed (`Session.prepare`). A signature whose warm-up has not
        run on this host thread (warmup > 0) is not captured here: capturing a first occurrence can meet lazy
        initialisations that must run eagerly once. Returns True if a graph now exists for it."""
        if not self.enabled or signature in self.entries:
            return signature in self.entries
        if self.closed or signature in self.eager_only:
            return False
        with self.lock, gate.work():
            if self.needs_warmup(signature):
                return False
            return self._capture(signature, step, replay=False) is not _FAILED

    def _capture(self, signature, step, replay: bool = True):
        graph, exc = torch.cuda.CUDAGraph(), None
        # one capture at a time, no device-wide call beside it (duplexcadence.gate; in its exclusive mode no
        # other thread's CUDA work at all); thread_local: this thread's own unsafe calls are the only ones
        # checked against it, so other threads launch, replay and allocate while it records
        with gate.capture():
            try:
                prime_workspace(self.capture_stream)
                before = torch.cuda.memory_reserved(self.device)
                with torch.cuda.graph(graph, pool=self.pool, stream=self.capture_stream,
                                      capture_error_mode="thread_local"), torch.no_grad():
                    outputs = step()
            except Exception as failure:  # an uncapturable op: this signature runs eagerly from now on
                # the failed graph goes now, while no other capture runs (its traceback's frames hold it)
                exc, graph = failure.with_traceback(None), None
                end_generator_capture(self.capture_stream)
        if exc is not None:
            self.stats.capture_failures += 1
            self.stats.failures.append(f"{signature!r}: {type(exc).__name__}: {exc}")
            self.eager_only.add(signature)
            gate.synchronize(self.device)
            self.pool = torch.cuda.graph_pool_handle()     # never reuse a pool a failed capture touched
            if not replay:
                return _FAILED
            self.stats.eager_fallbacks += 1
            return step()
        grown = max(0, torch.cuda.memory_reserved(self.device) - before)
        self.pool_bytes = max(self.pool_bytes + grown, pool_segment_bytes(self.device, self.pool))
        base = self.arena.base if self.arena is not None else 0
        self.entries[signature] = GraphEntry(signature, graph, outputs, base)
        self.stats.captures += 1
        if replay:
            graph.replay()
        return outputs

    def drop(self) -> None:
        """Free every graph of this cache now (a closing session): entries and pool references go, so the
        pool's blocks return to the allocator once no other reference holds them."""
        self.closed = True
        with gate.device_wide():
            self.entries.clear()
        self.eager_only.clear()
        self.pool = None


def pool_segment_bytes(device, pool) -> int:
    """Bytes of the allocator segments that belong to graph pool `pool` (torch.cuda.memory_snapshot's
    segment_pool_id), i.e. what the pool holds whether its blocks came from new or cached segments.
    0 off CUDA or for no pool."""
    if pool is None or torch.device(device).type != "cuda":
        return 0
    want = tuple(pool)
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", ())) == want)


_FAILED = object()
_PRIMED = threading.local()      # per host thread: the cuda_stream addresses it primed
#: Device bytes the allocator reserved while priming capture streams (their cuBLAS workspaces).
PRIMED_BYTES = [0]


def _primed_here() -> set:
    primed = getattr(_PRIMED, "streams", None)
    if primed is None:
        primed = _PRIMED.streams = set()
    return primed


def _is_primed(stream) -> bool:
    """Whether this host thread has primed `stream` (prime_workspace)."""
    return stream.cuda_stream in _primed_here()


_PRIMERS: dict[int, list] = {}   # cuda_stream address -> the host threads that primed it
_PRIMERS_LOCK = threading.Lock()


def _note_primed(stream) -> None:
    """Record that this host thread primed `stream` (its own set, and the process-wide primers)."""
    _primed_here().add(stream.cuda_stream)
    with _PRIMERS_LOCK:
        _PRIMERS.setdefault(stream.cuda_stream, []).append(threading.current_thread())


def _primed_by_another_live_thread(stream) -> bool:
    """Whether a host thread other than this one that is still alive primed `stream` (dead ones are dropped)."""
    me = threading.current_thread()
    with _PRIMERS_LOCK:
        primers = [t for t in _PRIMERS.get(stream.cuda_stream, ()) if t.is_alive()]
        if primers:
            _PRIMERS[stream.cuda_stream] = primers
        else:
            _PRIMERS.pop(stream.cuda_stream, None)
    return any(t is not me for t in primers)


class WarmSet:
    """The step families warmed on each host thread, for the caches of one model (GraphCache's `warmed`):
    `key in s` and `s.add(key)` see only the calling thread's families. Kept in thread-local storage, so a
    thread's entries go when the thread ends."""

    def __init__(self):
        self._local = threading.local()

    def _here(self) -> set:
        families = getattr(self._local, "families", None)
        if families is None:
            families = self._local.families = set()
        return families

    def __contains__(self, key) -> bool:
        return key in self._here()

    def add(self, key) -> None:
        self._here().add(key)


def end_generator_capture(stream) -> None:
    """Take the device's default generator out of capture mode after a failed capture, inside the same
    gate.capture(). Every capture registers that generator and sets it capturing (torch's
    CUDAGraph::capture_begin); a capture whose end fails raises before its epilogue clears that, and until
    another capture ends the generator refuses every eager draw and every replay of a graph that draws
    ("Offset increment outside graph capture encountered unexpectedly"). An empty capture on `stream` runs
    the epilogue; nothing is recorded or kept."""
    empty = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # torch warns that the graph is empty
        with torch.cuda.graph(empty, stream=stream, capture_error_mode="thread_local"):
            pass


def prime_workspace(stream) -> None:
    """Make the cuBLAS / cuBLASLt workspace of (this thread's handle, `stream`) outside any graph pool.

    torch keeps one workspace per (cuBLAS handle, stream), allocated from the caching allocator the first
    time a GEMM runs on that pair (aten/src/ATen/cuda/CublasHandlePool.cpp). If that first GEMM is inside
    a capture, the workspace lands in the capturing session's private pool and outlives it: a stream
    handed to the next session would keep a dead session's pool block. So before a thread first captures on
    a stream, small float32 and bfloat16 GEMMs (plain and with bias, the cuBLASLt path) run on it eagerly;
    the bytes this reserves are added to PRIMED_BYTES. No-op for None or off CUDA."""
    if stream is None:
        return
    if stream.cuda_stream in _primed_here():
        return
    _note_primed(stream)
    device = stream.device
    before = torch.cuda.memory_reserved(device)
    with torch.cuda.stream(stream):
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.ones(16, 16, device=device, dtype=dtype)
            torch.mm(a, a)
            torch.addmm(a[0], a, a)
    stream.synchronize()
    PRIMED_BYTES[0] += max(0, torch.cuda.memory_reserved(device) - before)
