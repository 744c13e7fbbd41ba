"""Memory over open/close cycles: one sample after every session close, and the rule that says it is flat.

A sample (`MemorySampler.sample`) holds the process's resident set size and, on CUDA, torch's allocated and
reserved bytes and the driver's used memory (NVML, else cudaMemGetInfo: it sees CUDA VMM arenas and graph
pools, which torch's allocator statistics cannot), all MiB, beside the counts that explain memory without
being growth: how many sessions of each kind are open at the sample and how many threads are inside a
session call of each kind (their unit's temporaries). On CUDA torch's cache is emptied first, once no capture
is in progress (`memory.release_cached`; torch.cuda.graph empties it before every capture too): blocks no tensor uses go back
to the driver, so reserved and driver figures are what tensors, graph pools, arenas and the context hold,
not how full the cache happened to be. Nothing collects garbage: what a close does not free stays.

The rule (`flatness`, `RULE`): over the last `window` samples (cycles), fit memory by least squares on the
cycle index and those counts; growth = the cycle coefficient x (window - 1), what the fit says memory grew
over the window with the open sessions' share taken out. A series is flat when (1) growth <= GROWTH_PCT % of
the window's median and (2) it shows no monotone trend: the medians of the count-adjusted series in
QUARTERS consecutive parts of the window do not rise at every step (strictly: a single step up, such as an
allocator taking one more segment, is judged by its growth alone) while the last exceeds the first by more
than TREND_PCT % of the median. Fewer samples than the window: not shown flat (the target needs that many).

Quiescent samples (`MemorySampler.sample_quiet`, `quiet_flatness`): a sample taken while no session is open
(the stress parks every thread after its close until all have closed, every --quiesce-every closes) holds
no session's state, so no count needs to explain it: what a close did not give back is all it can show.
Each carries the number of closes before it; over the last `window` closes (further back where they hold
fewer than 2 x QUARTERS samples: a drain lets every thread finish its session, so with T threads up to
K + T - 1 closes lie between two samples), memory is fitted on that number alone, and growth (the slope times
window - 1), the quarter medians and both bounds are judged as above. The per-close fit cannot tell a
leak from open sessions that hold more state the further they are into their scripts (the counts say how
many are open, not how far along); the quiescent fit has nothing to tell apart. Each quiescent sample also
reads what the host side is made of (`heap.host_heap_mib`: the C heap's bytes in use and its free bytes kept,
torch's pinned host blocks on CUDA), fitted the same way and recorded beside the verdict, not in it: an RSS
that rises while the heap in use stays flat is the allocator keeping memory, one that rises with it is held.
"""
from __future__ import annotations

import collections
import os
import threading
import tracemalloc

import numpy as np
import torch

from suite.measure.heap import host_heap_mib, trim_heap
from suite.measure.memory import MIB, DeviceMemory, library_caches, release_cached, rss_mib

WINDOW = 100            # cycles the target is stated over
GROWTH_PCT = 2.0        # most growth over the window, % of its median
TREND_PCT = 0.5         # a rise of the quarter medians above this, % of the median, at every step: a trend
QUARTERS = 4
RULE = (f"flat: over the last {WINDOW} closes (or --window), the cycle coefficient of a least-squares fit of "
        f"memory on the cycle index and the counts of open sessions and in-call threads per kind, times "
        f"(window - 1), is <= {GROWTH_PCT:g}% of the window's median; and the count-adjusted series' "
        f"{QUARTERS} quarter medians do not rise at every step (strictly) by more than {TREND_PCT:g}% of the median "
        f"from the first to the last")
QUIET_RULE = (f"flat: over the samples taken with no session open in the last {WINDOW} closes (or --window), "
              f"or the last {2 * QUARTERS} such samples where those are fewer, the slope of a least-squares fit of "
              f"memory on the closes before each sample, times "
              f"(window - 1), is <= {GROWTH_PCT:g}% of those samples' median; and their {QUARTERS} quarter medians "
              f"do not rise at every step (strictly) by more than {TREND_PCT:g}% of the median from the first to "
              f"the last")


#: The host heap's parts are judged against at least this level: torch's pinned host blocks are 0 MiB in a process
#: that never pins, and a percentage of nothing says nothing.
HOST_LEVEL_FLOOR_MIB = 1.0


#: Site tables PythonSites keeps: the fewest quiescent samples the quiet rule judges, and one before them.
SITES_KEPT = 2 * QUARTERS + 1


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout
TRACE_FRAMES = 8           # Python frames kept per traced allocation: enough to reach this checkout's caller


def _site(traceback) -> str:
    """An allocation's line, innermost first ("file:line"); where that is outside this checkout (a library's
    own line), followed by "<- " and the innermost line inside it that led there, if any."""
    def own(frame) -> bool:                       # this checkout's code, not a package installed inside it
        return frame.filename.startswith(ROOT) and "-packages" + os.sep not in frame.filename

    def name(frame) -> str:
        path = os.path.relpath(frame.filename, ROOT) if own(frame) else os.sep.join(frame.filename.split(os.sep)[-3:])
        return f"{path}:{frame.lineno}"
    frames = list(reversed(traceback))            # tracemalloc orders a traceback oldest first
    inner = frames[0]
    if own(inner):
        return name(inner)
    caller = next((f for f in frames if own(f)), None)
    return name(inner) + (f" <- {name(caller)}" if caller is not None else "")


class PythonSites:
    """Python's own allocations by source line (tracemalloc, `_site`), one table per quiescent sample, the last
    SITES_KEPT kept: which lines hold the Python heap that grows between samples (the tables' own allocations,
    made in this module, left out). Objects allocated before
    `start()` are not traced; native allocations (torch's host tensors, the CUDA driver) are not Python's and
    are not seen. Tracing slows every Python allocation, so the run it watches is slower."""

    def __init__(self, top: int):
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise ValueError(f"top: expected an int >= 1 (sites to report), got {top!r}")
        self.top = top
        self.tables: collections.deque = collections.deque(maxlen=SITES_KEPT)

    @staticmethod
    def start() -> None:
        tracemalloc.start(TRACE_FRAMES)

    @staticmethod
    def stop() -> None:
        tracemalloc.stop()

    def take(self, closes: int) -> float | None:
        """Record this sample's table; returns the traced MiB now (None when tracing is off)."""
        if not tracemalloc.is_tracing():
            return None
        sites: dict[str, tuple[int, int]] = {}
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, __file__)])  # not its own
        for s in snapshot.statistics("traceback"):
            size, n = sites.get(key := _site(s.traceback), (0, 0))
            sites[key] = (size + s.size, n + s.count)
        traced = tracemalloc.get_traced_memory()[0] / MIB
        self.tables.append((int(closes), traced, sites))
        return traced

    def growth(self, window: int) -> dict | None:
        """The `top` lines whose traced bytes grew most from the oldest kept table within `window` closes of the
        last one (the oldest kept where none is) to the last: {"from_closes", "to_closes", "traced_mib": [from,
        to], "top": [{"site", "kib", "blocks"}]}; None with fewer than two tables."""
        if len(self.tables) < 2:
            return None
        last_closes, last_mib, last = self.tables[-1]
        first_closes, first_mib, first = next((t for t in list(self.tables)[:-1] if t[0] >= last_closes - window),
                                              self.tables[0])
        rows = sorted(((site, size - first.get(site, (0, 0))[0], n - first.get(site, (0, 0))[1])
                       for site, (size, n) in last.items()), key=lambda r: -r[1])[:self.top]
        return {"from_closes": first_closes, "to_closes": last_closes, "traced_mib": [first_mib, last_mib],
                "top": [{"site": s, "kib": d / 1024, "blocks": n} for s, d, n in rows if d > 0]}


class MemorySampler:
    """Samples after every close, in the closing thread (thread-safe): `sample(cycle_counts)` appends one row.
    device: the sessions' device (CUDA adds alloc / reserved / driver series). `series()` returns the columns."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.driver = DeviceMemory(self.device) if self.cuda else None
        self.lock = threading.Lock()
        self.rows: list[dict] = []
        self.quiet: list[dict] = []
        self.python_sites: PythonSites | None = None     # set to trace Python's allocations at quiescent samples
        self.trim_heap = False          # set to hand malloc's free pages back at each quiescent sample (sample_quiet)

    def now(self) -> dict:
        """Memory now, MiB: rss_mib, and on CUDA (after emptying torch's cache) alloc_mib, reserved_mib,
        driver_used_mib."""
        out = {"rss_mib": rss_mib()}
        if self.cuda:
            release_cached(self.device)        # never beside another thread's capture
            out.update(alloc_mib=torch.cuda.memory_allocated(self.device) / MIB,
                       reserved_mib=torch.cuda.memory_reserved(self.device) / MIB,
                       driver_used_mib=self.driver.used_mib())
        return out

    def sample(self, counts: dict[str, int]) -> None:
        """One row: memory now and `counts` (regressor name -> count, e.g. "open:moshi/stock")."""
        row = {**self.now(), "counts": dict(counts)}
        with self.lock:
            self.rows.append(row)

    def sample_quiet(self, closes: int, open_sessions: int, high_water: dict | None = None) -> None:
        """One quiescent row: memory now, the closes before it, how many sessions were open (0 by the stress's
        construction; recorded so that a record shows it) and `high_water` (name -> the most sessions of a kind
        open at once so far, not judged). With `trim_heap` set, then heap.trim_heap and the host part's
        "rss_trimmed_mib", RSS after it (not judged): the judged rss_mib is then read before each sample's trim,
        so it holds what malloc kept since the previous sample only."""
        row = {**self.now(), "closes": int(closes), "open_sessions": int(open_sessions),
               "host": host_heap_mib(self.device), "caches": library_caches(self.device),
               "high_water": dict(high_water or {})}
        if self.trim_heap:
            trimmed = trim_heap()
            if trimmed is not None:
                row["host"]["rss_trimmed_mib"] = trimmed
        traced = self.python_sites.take(closes) if self.python_sites is not None else None
        if traced is not None:
            row["host"]["python_traced_mib"] = traced
        with self.lock:
            self.quiet.append(row)

    def quiet_series(self) -> dict:
        """{"closes": [closes before each quiescent sample], "open_sessions": [...], "memory": {name: [MiB]} (the
        series the rule judges), "host": {name: [MiB]} (heap.host_heap_mib at each sample: what RSS is made of,
        not judged), "caches": {name: [entries]} (memory.library_caches: caches that grow with new shapes),
        "high_water": {name: [sessions]} (the most of a kind open at once before each sample)}."""
        parts_of = ("host", "caches", "high_water")
        with self.lock:
            rows = list(self.quiet)
        keys = [k for k in (rows[0] if rows else {}) if k not in ("closes", "open_sessions", *parts_of)]
        parts = {part: sorted({k for r in rows for k in r.get(part, {})}) for part in parts_of}
        return {"closes": [r["closes"] for r in rows], "open_sessions": [r["open_sessions"] for r in rows],
                "memory": {k: [r[k] for r in rows] for k in keys},
                **{part: {k: [r.get(part, {}).get(k, 0 if part == "high_water" else None) for r in rows] for k in names}
                   for part, names in parts.items()}}

    def series(self) -> dict:
        """{"memory": {name: [MiB per cycle]}, "counts": {name: [count per cycle]}} (a count absent from a row
        is 0)."""
        with self.lock:
            rows = list(self.rows)
        names = sorted({k for r in rows for k in r["counts"]})
        memory = {k: [r[k] for r in rows] for k in (rows[0] if rows else {}) if k != "counts"}
        return {"memory": memory, "counts": {k: [r["counts"].get(k, 0) for r in rows] for k in names}}

    @property
    def driver_source(self) -> str | None:
        return self.driver.source if self.driver is not None else None


def flatness(values, counts: dict[str, list] | None = None, *, window: int = WINDOW,
             growth_pct: float = GROWTH_PCT, trend_pct: float = TREND_PCT) -> dict:
    """Is one memory series (MiB per cycle) flat over its last `window` cycles (module docstring)? counts:
    regressor name -> one count per cycle, as long as `values`. Returns {"flat", "reason", "cycles", "window",
    "median_mib", "slope_mib_per_cycle" (the fit's cycle coefficient), "raw_slope_mib_per_cycle" (cycle
    alone), "growth_mib", "growth_pct", "quarter_medians_mib", "trend", "regressors" (the counts that varied
    and were fitted)}. Raises ValueError for a window < QUARTERS * 2 or counts of another length."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 2 * QUARTERS:
        raise ValueError(f"window: expected an int >= {2 * QUARTERS}, got {window!r}")
    y_all = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    counts = counts or {}
    for name, col in counts.items():
        if len(col) != len(y_all):
            raise ValueError(f"counts[{name!r}]: expected {len(y_all)} values (one per cycle), got {len(col)}")
    out = {"flat": False, "cycles": int(len(y_all)), "window": window}
    if len(y_all) < window:
        return {**out, "reason": f"{len(y_all)} cycles < window {window}: flatness not shown"}
    y = y_all[-window:]
    if not np.all(np.isfinite(y)):
        return {**out, "reason": "a sample in the window is missing"}
    x = np.arange(window, dtype=np.float64)
    regressors = {n: np.asarray(c[-window:], dtype=np.float64) for n, c in sorted(counts.items())}
    regressors = {n: c for n, c in regressors.items() if np.ptp(c) > 0}
    names = list(regressors)
    while True:      # a count collinear with the rest (or the cycle index) is dropped, last name first
        design = np.column_stack([np.ones(window), x, *(regressors[n] for n in names)])
        if np.linalg.matrix_rank(design) == design.shape[1] or not names:
            break
        names.pop()
    coef = np.linalg.lstsq(design, y, rcond=None)[0]
    raw = np.polyfit(x, y, 1)[0]
    adjusted = y - sum((coef[2 + i] * (regressors[n] - regressors[n].mean()) for i, n in enumerate(names)),
                       np.zeros(window))
    return {**out, **_verdict(y, adjusted, float(coef[1]), window, growth_pct, trend_pct),
            "raw_slope_mib_per_cycle": float(raw), "regressors": names}


def _verdict(y: np.ndarray, adjusted: np.ndarray, slope: float, window: int, growth_pct: float,
             trend_pct: float, level_floor_mib: float = 0.0) -> dict:
    """The two bounds of the rule on samples y (MiB), their adjusted series and the fitted slope (MiB per
    cycle): flat, reason, median_mib, slope_mib_per_cycle, growth_mib, growth_pct, quarter_medians_mib, trend.
    The percentages are of the median, or of level_floor_mib where the median is below it."""
    level = max(float(np.median(y)), level_floor_mib)
    growth = float(slope * (window - 1))
    pct = 100.0 * growth / level if level > 0 else (0.0 if growth <= 0 else float("inf"))
    medians = [float(np.median(part)) for part in np.array_split(adjusted, QUARTERS)]
    rise = medians[-1] - medians[0]
    trend = bool(all(b > a for a, b in zip(medians, medians[1:])) and level > 0
                 and rise > trend_pct / 100.0 * level)
    reasons = []
    if pct > growth_pct:
        reasons.append(f"growth {growth:.1f} MiB over {window} cycles = {pct:.2f}% > {growth_pct:g}% of "
                       f"{level:.1f} MiB")
    if trend:
        reasons.append(f"monotone trend: quarter medians {[round(m, 1) for m in medians]} MiB rise at every "
                       f"step, {rise:.1f} MiB > {trend_pct:g}% of {level:.1f} MiB")
    return {"flat": not reasons, "reason": "; ".join(reasons) or "flat", "median_mib": level,
            "slope_mib_per_cycle": slope, "growth_mib": growth, "growth_pct": pct, "quarter_medians_mib": medians,
            "trend": trend}


def quiet_flatness(closes, values, *, window: int = WINDOW, growth_pct: float = GROWTH_PCT,
                   trend_pct: float = TREND_PCT, level_floor_mib: float = 0.0) -> dict:
    """Is one series of quiescent samples flat over the last `window` closes, or its last 2 x QUARTERS samples
    where those closes hold fewer (module docstring)? closes: the closes before each sample (non-decreasing);
    values: MiB, as many. Returns flatness's fields (regressors empty), "samples" (how many were judged) and
    "span_closes" (the closes from the first judged sample to the last). Raises ValueError for a window <
    QUARTERS * 2, lengths that differ or closes that decrease."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 2 * QUARTERS:
        raise ValueError(f"window: expected an int >= {2 * QUARTERS}, got {window!r}")
    x_all = np.asarray(closes, dtype=np.float64)
    y_all = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    if len(x_all) != len(y_all):
        raise ValueError(f"closes and values: expected one close count per sample, got {len(x_all)} and "
                         f"{len(y_all)}")
    if np.any(np.diff(x_all) < 0):
        raise ValueError(f"closes: expected a non-decreasing count, got {list(closes)}")
    last = int(x_all[-1]) if len(x_all) else 0
    out = {"flat": False, "cycles": last, "window": window, "regressors": []}
    if last < window:
        return {**out, "samples": 0, "reason": f"{last} closes < window {window}: flatness not shown"}
    n = max(int(np.count_nonzero(x_all > last - window)), 2 * QUARTERS)
    x, y = x_all[-n:], y_all[-n:]
    out.update(samples=int(len(y)), span_closes=int(np.ptp(x)) if len(x) else 0)
    if len(y) < 2 * QUARTERS or np.ptp(x) == 0:
        return {**out, "reason": f"{len(y)} quiescent samples < {2 * QUARTERS}: flatness not shown (a longer "
                                 f"--seconds or a smaller --quiesce-every takes more)"}
    if not np.all(np.isfinite(y)):
        return {**out, "reason": "a sample in the window is missing"}
    slope = float(np.polyfit(x, y, 1)[0])
    return {**out, **_verdict(y, y, slope, window, growth_pct, trend_pct, level_floor_mib),
            "raw_slope_mib_per_cycle": slope}


def judge(series: dict, window: int = WINDOW) -> dict:
    """`flatness` of every memory series of `MemorySampler.series()`, with its counts: {name: result}."""
    return {name: flatness(values, series["counts"], window=window) for name, values in series["memory"].items()}


def judge_quiet(series: dict, window: int = WINDOW, part: str = "memory") -> dict:
    """`quiet_flatness` of every series of `MemorySampler.quiet_series()[part]` ("memory": the judged ones;
    "host": the host heap's parts, a diagnosis, each judged against at least HOST_LEVEL_FLOOR_MIB): {name: result}."""
    floor = HOST_LEVEL_FLOOR_MIB if part == "host" else 0.0
    return {name: quiet_flatness(series["closes"], values, window=window, level_floor_mib=floor)
            for name, values in series.get(part, {}).items()}
