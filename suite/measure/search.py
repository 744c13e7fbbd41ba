"""Sessions per GPU by a search: the largest session count N whose run has zero missed units, bracketed.

From a start count the search grows (N -> max(N + 1, ceil(grow * N)), up to `max_sessions`) while runs are
clean, or shrinks (N -> max(1, floor(N / grow))) while they miss, then bisects between the largest clean count
and the smallest count that missed or was refused (admission: it did not fit the device). It stops when the
bracket is exact (hi = lo + 1), when one session alone misses, at `max_sessions`, or when the wall-time budget
would run out before the next count ends (`estimate_s`: what the harness expects the count to take); the
first count always runs. Each stop leaves the bracket it has, with the reason. Nothing here measures: the
harness records each count's outcome (`record`). The clock is injectable for tests.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

OUTCOMES = ("clean", "missed", "refused")


@dataclass(frozen=True)
class Bracket:
    """lo: the largest count with zero misses below hi (0: one session alone missed; None: no clean count yet);
    hi: the smallest count that missed or was refused (None: none did: lo is a lower bound)."""
    lo: int | None
    hi: int | None

    @property
    def exact(self) -> bool:
        """lo is the largest count with zero misses: hi = lo + 1."""
        return self.lo is not None and self.hi is not None and self.hi - self.lo == 1

    def to_dict(self) -> dict:
        return {"lo": self.lo, "hi": self.hi, "exact": self.exact}


class SessionSearch:
    """The search (module docstring). start: the first count (>= 1); grow: the factor (> 1); max_sessions: the
    largest count it may try (None: no cap); budget_s: wall seconds for all its counts (None: no budget),
    measured from construction on `clock` (seconds, monotonic). Raises ValueError for a bad argument."""

    def __init__(self, start: int, *, grow: float = 2.0, max_sessions: int | None = None,
                 budget_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        for name, value, low in (("start", start, 1), ("max_sessions", max_sessions, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
        if max_sessions is not None and start > max_sessions:
            raise ValueError(f"start: {start} is above max_sessions {max_sessions}")
        if isinstance(grow, bool) or not isinstance(grow, (int, float)) or not math.isfinite(grow) or grow <= 1:
            raise ValueError(f"grow: expected a finite number > 1, got {grow!r}")
        if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float))
                                     or not math.isfinite(budget_s) or budget_s <= 0):
            raise ValueError(f"budget_s: expected a positive number of seconds or None, got {budget_s!r}")
        self.start, self.grow, self.max_sessions, self.budget_s = start, float(grow), max_sessions, budget_s
        self.clock, self.t0 = clock, clock()
        self.tried: list[dict] = []          # in order: {"sessions", "outcome", "seconds", "reason"}
        self.stopped: str | None = None

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.t0

    def outcome(self, n: int) -> str | None:
        return next((t["outcome"] for t in reversed(self.tried) if t["sessions"] == n), None)

    def record(self, n: int, outcome: str, seconds: float | None = None, reason: str | None = None) -> None:
        """The outcome of count n: "clean" (zero misses), "missed" or "refused" (did not fit; reason says why)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome: expected one of {OUTCOMES}, got {outcome!r}")
        self.tried.append({"sessions": n, "outcome": outcome, "seconds": seconds, "reason": reason})

    def bracket(self) -> Bracket:
        clean = {t["sessions"] for t in self.tried if t["outcome"] == "clean"}
        bad = {t["sessions"] for t in self.tried if t["outcome"] != "clean"}
        hi = min(bad, default=None)
        lo = max((c for c in clean if hi is None or c < hi), default=None)
        if lo is None and hi == 1:
            lo = 0
        return Bracket(lo, hi)

    def candidate(self) -> tuple[int | None, str | None]:
        """(the next count, None) or (None, why the search ends), from the outcomes alone."""
        if not self.tried:
            return self.start, None
        b = self.bracket()
        if b.hi is None:
            if self.max_sessions is not None and b.lo >= self.max_sessions:
                return None, f"max_sessions: {b.lo} sessions ran clean, the most --max-sessions allows"
            n = max(b.lo + 1, math.ceil(b.lo * self.grow))
            return (n if self.max_sessions is None else min(n, self.max_sessions)), None
        if b.lo is None:
            return max(1, min(b.hi - 1, math.floor(b.hi / self.grow))), None
        if b.lo == 0:
            return None, "one session alone missed"
        if b.exact:
            return None, "bracketed"
        return (b.lo + b.hi) // 2, None

    def next(self, estimate_s: Callable[[int], float] | None = None) -> int | None:
        """The next count to run, or None (then `stopped` says why). estimate_s(n): the seconds count n is
        expected to take; a count that would end past the budget is not started (the first always is)."""
        if self.stopped:
            return None
        n, why = self.candidate()
        if n is None:
            self.stopped = why
            return None
        if self.budget_s is not None and self.tried:
            need = float(estimate_s(n)) if estimate_s is not None else 0.0
            left = self.budget_s - self.elapsed_s
            if need > left:
                self.stopped = (f"budget: {max(left, 0):.0f} s of {self.budget_s:g} s left, N={n} is expected to "
                                f"take {need:.0f} s")
                return None
        return n

    def to_dict(self) -> dict:
        """The record: start, grow, max_sessions, budget_s, the counts in the order tried with their outcomes,
        the bracket, why it stopped (None: not stopped yet), elapsed seconds."""
        return {"start": self.start, "grow": self.grow, "max_sessions": self.max_sessions, "budget_s": self.budget_s,
                "tried": list(self.tried), "counts": [t["sessions"] for t in self.tried],
                "bracket": self.bracket().to_dict(), "stopped": self.stopped, "elapsed_s": self.elapsed_s}


class FixedCounts(SessionSearch):
    """A fixed list of counts instead of the search (comparison with older records): the counts in increasing
    order; once one missed or was refused, at most `after_miss` larger ones. Budget and bracket as the search's."""

    def __init__(self, counts: list[int], *, after_miss: int = 1, budget_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        counts = sorted(set(counts))
        if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
            raise ValueError(f"counts: expected ints >= 1, got {counts!r}")
        super().__init__(counts[0], max_sessions=counts[-1], budget_s=budget_s, clock=clock)
        self.counts, self.after_miss = counts, after_miss

    def candidate(self) -> tuple[int | None, str | None]:
        done = [t["sessions"] for t in self.tried]
        first_bad = self.bracket().hi
        if first_bad is not None and sum(n > first_bad for n in done) >= self.after_miss:
            return None, f"after a miss at N={first_bad}: {self.after_miss} larger count(s) at most (--after-miss)"
        left = [n for n in self.counts if n not in done]
        return (left[0], None) if left else (None, "every listed count ran")

    def to_dict(self) -> dict:
        return {**super().to_dict(), "list": list(self.counts), "after_miss": self.after_miss}
