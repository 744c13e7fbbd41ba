"""Paired measurement: two sessions of one model instance walk one session script, unit by unit, in
A B B A blocks, and the speedup is the median of the per-pair ratios over several processes.

A run of stock (A) against DuplexCadence (B), or of stock against a second stock session (an A/A run, the
noise floor), is `run_pairs` once per fresh process; `summarise` pools the processes. Why pairs: the stock
tails are host-bound and a lent host changes speed in blocks of seconds (docs/measurement.md), so timing
all of A and then all of B lets the host's states fall on one arm more than the other. Alternating short
blocks (A B, B A, A B, ...) puts both arms of a pair in the same few hundred milliseconds, and a pair's
ratio a_ms / b_ms carries little of the host's state; what is left shows up between processes, so the
interval comes from a bootstrap over processes and then over pairs within each.

Pure host code (numpy only): sessions, the timer and the host probe are passed in, so the measure layer
gives CUDA-event timing and tests give fake clocks.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np

MIN_PROCESSES = 3          # a run is at least three fresh processes (as pyperf runs its benchmarks)
CONFIDENCE = 0.95          # the bootstrap interval's coverage
STATES = ("fast", "slow")  # host states, by the probe: "fast" = the cluster of lower readings
MIN_STATE_FRACTION = 0.1   # each of two host states has at least this weight in the probe readings' mixture
MIN_SEPARATION = 2.0       # Ashman's D between the two components (D > 2: two modes cleanly apart)
MIN_BIC_GAIN = 10.0        # two normals must beat one by this much BIC ("very strong", Kass & Raftery 1995)
MIN_STATE_PAIRS = 10       # a state with fewer pairs in a run is not judged by `reproduces`
BOOT_CHUNK = 250           # bootstrap resamples drawn per batch (bounds memory, not the result)


@dataclass(frozen=True)
class Pair:
    """One unit of the script, run by both sessions.

    index: the script unit's index; kind: "SPEAK", or "LISTEN" for a listening unit that carries a payload
    (decoded as the runner does, never measured); a_ms / b_ms: each session's time for the unit from
    `timer` (ms); order: "ab" (A spoke it first) or "ba"; block: the number of the block pair (A B or B A)
    the unit was in; equal: A's and B's float32 and int16 bytes equal (UnitOutput.sha256); sha256_a /
    sha256_b: those hashes; measured: counted by `summarise` (a SPEAK unit after the warm-up);
    probe_before / probe_between / probe_after: the host probe read before the first session's block,
    between the two blocks and after the second (None without a probe)."""
    index: int
    kind: str
    a_ms: float
    b_ms: float
    order: str
    block: int
    equal: bool
    sha256_a: tuple
    sha256_b: tuple
    measured: bool
    probe_before: float | None = None
    probe_between: float | None = None
    probe_after: float | None = None

    @property
    def ratio(self) -> float:
        """a_ms / b_ms: how many times longer A took than B for this unit."""
        return self.a_ms / self.b_ms

    @property
    def probes(self) -> list[float]:
        return [p for p in (self.probe_before, self.probe_between, self.probe_after) if p is not None]


# --- running ------------------------------------------------------------------------------------------
def _count(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")
    return int(value)


def _finite(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.floating)) and math.isfinite(value)


class _Walker:
    """One session's walk over the script, as the runner walks it: `start_turn()` before the first SPEAK
    unit of a turn, `speak(payload, final=unit.final)` for a SPEAK unit, `speak(payload, final=False)` for a
    LISTEN unit that carries a payload (Moshi decodes every frame), nothing for a LISTEN unit without one."""

    def __init__(self, name: str, session, timer: Callable):
        self.name, self.session, self.timer = name, session, timer
        self.open_turn = None

    def walk(self, segment: list) -> list[tuple]:
        """[(unit, UnitOutput, ms)] for the units of `segment` that ran."""
        done = []
        for unit in segment:
            speak = unit.kind == "SPEAK"
            if not speak and unit.payload is None:
                continue
            if speak and unit.turn != self.open_turn:
                self.session.start_turn()
                self.open_turn = unit.turn
            final = bool(speak and unit.final)
            timed = self.timer(self.session.speak, unit.payload, final=final)
            out, ms = timed[0], timed[1]
            if not (_finite(ms) and ms > 0):
                raise ValueError(f"timer: expected a positive finite time in ms for unit {unit.index} of "
                                 f"session {self.name}, got {ms!r}")
            if final:
                self.open_turn = None
            done.append((unit, out, float(ms)))
        return done


def _segments(units: list, block: int) -> list[list]:
    """The script cut into consecutive segments of `block` SPEAK units each (a segment ends right after its
    block-th SPEAK unit; LISTEN units go with the SPEAK unit after them; what trails the last one is a last
    segment of its own)."""
    out, cur, n = [], [], 0
    for unit in units:
        cur.append(unit)
        n += unit.kind == "SPEAK"
        if n == block:
            out.append(cur)
            cur, n = [], 0
    if cur:
        out.append(cur)
    return out


def _read(probe) -> float | None:
    if probe is None:
        return None
    value = probe()
    if not _finite(value):
        raise ValueError(f"probe: expected a finite number, got {value!r}")
    return float(value)


def run_pairs(a, b, units: Iterable, *, timer: Callable, probe: Callable | None = None, block: int = 1,
              warmup: int = 0) -> list[Pair]:
    """Walk the script `units` (workloads.common.Unit: index, kind "LISTEN" | "SPEAK", turn, final, payload)
    with sessions `a` and `b` (duplexcadence.session.Session; two sessions of one model instance: stock and
    DuplexCadence, or two stock sessions for an A/A run), alternating blocks of `block` SPEAK units:
    A B, B A, A B, ... (blocks A B B A A B B A ...). Within a block one session runs its units in order;
    then the other runs the same units with the same payload objects. Every unit of both is hashed.

    timer(fn, *args, **kwargs): calls fn once and returns a tuple whose first two items are fn's result and
    its time in ms (more items are ignored, e.g. a wall time): CUDA events in the measure layer, a fake
    clock in tests. probe(): a number describing the host's speed now, higher = slower (e.g. microseconds
    per tiny kernel launch), read before, between and after each block pair. warmup: the first `warmup`
    SPEAK units are run and hashed but not measured. Returns one Pair per unit that ran, in script order.

    Raises ValueError for `a is b`, a block or warmup that is not an int >= 1 / >= 0, a unit kind other
    than LISTEN / SPEAK, a timer time that is not a positive finite number, or a probe value that is not
    finite; what the sessions raise (duplexcadence.errors.InputError) propagates."""
    if a is b:
        raise ValueError("a and b: expected two sessions (an A/A run opens a second stock session), got one "
                         "object twice")
    block, warmup = _count("block", block, 1), _count("warmup", warmup, 0)
    units = list(units)
    for unit in units:
        if unit.kind not in ("LISTEN", "SPEAK"):
            raise ValueError(f"unit {unit.index}: kind {unit.kind!r}, expected 'LISTEN' or 'SPEAK'")
    walkers = {"a": _Walker("a", a, timer), "b": _Walker("b", b, timer)}
    pairs, n_speak = [], 0
    for g, segment in enumerate(_segments(units, block)):
        order = "ab" if g % 2 == 0 else "ba"
        before = _read(probe)
        first = walkers[order[0]].walk(segment)
        between = _read(probe)
        second = walkers[order[1]].walk(segment)
        after = _read(probe)
        runs = {order[0]: first, order[1]: second}
        for (unit, out_a, ms_a), (_, out_b, ms_b) in zip(runs["a"], runs["b"]):
            speak = unit.kind == "SPEAK"
            ha, hb = tuple(out_a.sha256()), tuple(out_b.sha256())
            pairs.append(Pair(index=int(unit.index), kind=unit.kind, a_ms=ms_a, b_ms=ms_b, order=order,
                              block=g, equal=ha == hb, sha256_a=ha, sha256_b=hb,
                              measured=speak and n_speak >= warmup, probe_before=before,
                              probe_between=between, probe_after=after))
            n_speak += speak
    return pairs


# --- host states ----------------------------------------------------------------------------------
def _mixture(x: np.ndarray, cut: int, iterations: int = 200):
    """A two-component normal mixture fitted to sorted readings x by EM, started from the split x[:cut] |
    x[cut:]: (weights, means, variances, log-likelihood), the lower mean first; None when a component
    empties."""
    floor = (1e-6 * (x[-1] - x[0])) ** 2 + 1e-30          # keeps a component of equal readings finite
    parts = (x[:cut], x[cut:])
    w = np.array([p.size / x.size for p in parts])
    mu = np.array([p.mean() for p in parts])
    var = np.array([p.var() for p in parts]) + floor
    last = ll = -np.inf
    for _ in range(iterations):
        logp = np.log(w) - 0.5 * np.log(2 * np.pi * var) - (x[:, None] - mu) ** 2 / (2 * var)
        top = logp.max(axis=1, keepdims=True)
        total = top[:, 0] + np.log(np.exp(logp - top).sum(axis=1))
        r = np.exp(logp - total[:, None])                  # responsibilities [readings, 2]
        nk = r.sum(axis=0)
        if nk.min() < 1e-9 * x.size:
            return None
        ll = float(total.sum())                            # of the parameters this E step used
        if ll - last < 1e-9 * abs(ll) + 1e-12:
            break
        last = ll
        w, mu = nk / x.size, (r * x[:, None]).sum(axis=0) / nk
        var = (r * (x[:, None] - mu) ** 2).sum(axis=0) / nk + floor
    order = np.argsort(mu)
    return w[order], mu[order], var[order], ll


def split_states(values: Iterable[float], *, min_fraction: float = MIN_STATE_FRACTION,
                 min_separation: float = MIN_SEPARATION) -> float | None:
    """The threshold between two host states in probe readings, or None for one state.

    Rule: fit a mixture of two normals to the readings (EM, started from the least-squares split of the
    sorted readings into a lower and an upper cluster). Two states only if all three hold: the mixture
    beats one normal by more than MIN_BIC_GAIN in BIC (2 x the log-likelihood gain minus 3 ln n for its
    three extra parameters), each component holds at least `min_fraction` of the readings, and the
    components are clearly apart: Ashman's D = sqrt(2) |m2 - m1| / sqrt(s1^2 + s2^2) >= `min_separation`
    (D > 2 is the usual bound for two normals to separate cleanly; a skewed single mode fits as two
    overlapping components, D well under 2). The threshold is where the two weighted components are
    equally likely, between the two means. Fewer than 4 finite readings, or all equal: None."""
    x = np.sort(np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64))
    n = x.size
    if n < 4 or x[0] == x[-1]:
        return None
    c, c2 = np.cumsum(x), np.cumsum(x * x)
    k = np.arange(1, n)                                   # left cluster x[:k], right x[k:]
    sse = (c2[k - 1] - c[k - 1] ** 2 / k) + ((c2[-1] - c2[k - 1]) - (c[-1] - c[k - 1]) ** 2 / (n - k))
    fit = _mixture(x, int(k[np.argmin(sse)]))
    if fit is None:
        return None
    w, mu, var, ll2 = fit
    var1 = x.var() + (1e-6 * (x[-1] - x[0])) ** 2 + 1e-30
    ll1 = -0.5 * n * (math.log(2 * math.pi * var1) + 1.0)            # one normal at its maximum likelihood
    if 2.0 * (ll2 - ll1) - 3.0 * math.log(n) <= MIN_BIC_GAIN:
        return None
    if w.min() < min_fraction or math.sqrt(2) * (mu[1] - mu[0]) / math.sqrt(var.sum()) < min_separation:
        return None
    grid = np.linspace(mu[0], mu[1], 2001)
    logp = np.log(w) - 0.5 * np.log(var) - (grid[:, None] - mu) ** 2 / (2 * var)
    upper = np.flatnonzero(logp[:, 1] >= logp[:, 0])
    return float(grid[upper[0]]) if upper.size else float((mu[0] + mu[1]) / 2)


def pair_state(pair: Pair, threshold: float | None) -> str | None:
    """"fast" if every probe reading of the pair is under the threshold, "slow" if every one is at or over
    it, "mixed" if they disagree (the host switched during the pair); None without a threshold or readings."""
    readings = pair.probes
    if threshold is None or not readings:
        return None
    slow = [r >= threshold for r in readings]
    return "slow" if all(slow) else "fast" if not any(slow) else "mixed"


# --- summaries ------------------------------------------------------------------------------------
@dataclass
class StateSummary:
    """The figures of the pairs in one host state: median ratio, its interval, pairs and processes, the
    state's median probe reading."""
    state: str
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    pairs: int
    processes: int
    probe_median: float | None


@dataclass
class Summary:
    """A paired run over several processes.

    speedup: median over every measured pair of a_ms / b_ms; ci_low / ci_high: its 95% interval from the
    hierarchical bootstrap (processes, then pairs within each); a_ms_median / b_ms_median: the arms' median
    unit times; processes / pairs: counts (processes with measured pairs); process_medians: each process's
    median ratio (None for one without measured pairs); mismatched: pairs (any unit, measured or not)
    whose bytes differ, listed in mismatches as (process, unit index); states: per host state ("fast",
    "slow") when the probe shows two (`split_states`), else empty; mixed_pairs: pairs whose readings fall
    in both states (in no state's figures); probe_split: the threshold; flags: what makes the run fall
    short of the protocol (fewer than MIN_PROCESSES processes, no measured pairs, mismatched bytes)."""
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    a_ms_median: float | None
    b_ms_median: float | None
    processes: int
    pairs: int
    process_medians: list
    mismatched: int
    mismatches: list
    states: dict = field(default_factory=dict)
    mixed_pairs: int = 0
    probe_split: float | None = None
    flags: list = field(default_factory=list)
    seed: int = 0
    n_boot: int = 2000

    def to_dict(self) -> dict:
        return asdict(self)

    def interval(self) -> str:
        if self.speedup is None:
            return "no measured pairs"
        return f"{self.speedup:.2f}x [{self.ci_low:.2f}-{self.ci_high:.2f}]"


def bootstrap_median(groups: list[np.ndarray], *, rng: np.random.Generator, n_boot: int) -> tuple[float, float]:
    """The CONFIDENCE percentile interval of the pooled median under the hierarchical bootstrap: each
    resample draws len(groups) groups with replacement, then within each drawn group as many values as it
    holds, with replacement, and takes the median of all drawn values. Empty groups are left out.
    Raises ValueError when every group is empty."""
    groups = [np.asarray(g, dtype=np.float64) for g in groups if len(g)]
    if not groups:
        raise ValueError("groups: expected at least one value")
    sizes = np.array([g.size for g in groups])
    n_groups, width = len(groups), int(sizes.max())
    table = np.full((n_groups, width), np.nan)
    for i, g in enumerate(groups):
        table[i, :g.size] = g
    medians = []
    for start in range(0, n_boot, BOOT_CHUNK):
        m = min(BOOT_CHUNK, n_boot - start)
        pick = rng.integers(0, n_groups, size=(m, n_groups))                 # groups drawn
        n = sizes[pick][..., None]                                            # [m, groups, 1]
        idx = np.minimum((rng.random((m, n_groups, width)) * n).astype(np.int64), n - 1)
        drawn = np.where(np.arange(width) < n, table[pick[..., None], idx], np.inf).reshape(m, -1)
        drawn.sort(axis=1)                                                    # the draws first, inf after
        count, rows = n.reshape(m, -1).sum(axis=1), np.arange(m)
        medians.append((drawn[rows, (count - 1) // 2] + drawn[rows, count // 2]) / 2)
    tail = (1.0 - CONFIDENCE) / 2 * 100.0
    lo, hi = np.percentile(np.concatenate(medians), [tail, 100.0 - tail])
    return float(lo), float(hi)


def _ratios(pairs: list[Pair]) -> np.ndarray:
    return np.array([p.ratio for p in pairs], dtype=np.float64)


def _median(x) -> float | None:
    return float(np.median(x)) if len(x) else None


def summarise(processes: list[list[Pair]], *, seed: int = 0, n_boot: int = 2000) -> Summary:
    """Pool the pairs of several processes (one `run_pairs` result each) into a Summary (its docstring
    lists the fields). Host states: the probe readings of every measured pair of every process are split
    by `split_states`; each pair is then "fast", "slow" or "mixed" (`pair_state`). seed: the bootstrap's
    generator; n_boot: its resamples. Raises ValueError for no processes or n_boot < 100."""
    if not processes:
        raise ValueError("processes: expected the pairs of at least one process, got none")
    n_boot = _count("n_boot", n_boot, 100)
    rng = np.random.default_rng(seed)
    measured = [[p for p in proc if p.measured] for proc in processes]
    ratios = [_ratios(m) for m in measured]
    pooled = np.concatenate(ratios) if ratios else np.zeros(0)
    mismatches = [(i, p.index) for i, proc in enumerate(processes) for p in proc if not p.equal]
    used = sum(1 for r in ratios if r.size)
    flags = []
    if used < MIN_PROCESSES:
        flags.append(f"{used} processes with measured pairs < {MIN_PROCESSES}")
    if mismatches:
        flags.append(f"{len(mismatches)} pairs whose bytes differ")
    if pooled.size == 0:
        flags.append("no measured pairs")
        lo = hi = None
    else:
        lo, hi = bootstrap_median(ratios, rng=rng, n_boot=n_boot)
    all_pairs = [p for m in measured for p in m]
    threshold = split_states([r for p in all_pairs for r in p.probes])
    states, mixed = {}, 0
    if threshold is not None:
        by_state = [[pair_state(p, threshold) for p in m] for m in measured]
        mixed = sum(s == "mixed" for row in by_state for s in row)
        for name in STATES:
            groups = [_ratios([p for p, s in zip(m, row) if s == name]) for m, row in zip(measured, by_state)]
            chosen = [p for m, row in zip(measured, by_state) for p, s in zip(m, row) if s == name]
            if not chosen:
                continue
            slo, shi = bootstrap_median(groups, rng=rng, n_boot=n_boot)
            states[name] = StateSummary(name, _median(np.concatenate(groups)), slo, shi, len(chosen),
                                        sum(1 for g in groups if g.size),
                                        _median([r for p in chosen for r in p.probes]))
    return Summary(speedup=_median(pooled), ci_low=lo, ci_high=hi,
                   a_ms_median=_median([p.a_ms for p in all_pairs]),
                   b_ms_median=_median([p.b_ms for p in all_pairs]),
                   processes=used, pairs=int(pooled.size), process_medians=[_median(r) for r in ratios],
                   mismatched=len(mismatches), mismatches=mismatches, states=states, mixed_pairs=mixed,
                   probe_split=threshold, flags=flags, seed=seed, n_boot=n_boot)


# --- the floor and the reproducibility bar ------------------------------------------------------------
def noise_floor(aa_processes: list[list[Pair]], *, seed: int = 0, n_boot: int = 2000) -> Summary:
    """The Summary of an A/A run (two stock sessions, the same protocol): its interval around 1.0 is the
    noise floor a speedup must clear. Flagged when the interval excludes 1.0 (the two arms, or the order
    within a pair, differ systematically). Raises as `summarise`."""
    floor = summarise(aa_processes, seed=seed, n_boot=n_boot)
    if floor.ci_low is not None and not floor.ci_low <= 1.0 <= floor.ci_high:
        floor.flags.append(f"A/A interval [{floor.ci_low:.3f}-{floor.ci_high:.3f}] excludes 1.0")
    return floor


def clears_floor(summary: Summary, floor: Summary) -> bool:
    """True when the speedup's whole interval lies outside the A/A floor's interval (above or below it);
    False when it overlaps, or either has no interval."""
    if None in (summary.ci_low, summary.ci_high, floor.ci_low, floor.ci_high):
        return False
    return summary.ci_low > floor.ci_high or summary.ci_high < floor.ci_low


@dataclass
class Verdict:
    """The reproducibility bar's answer: ok, one line per check (reasons) and the failed ones (failures)."""
    ok: bool
    reasons: list
    failures: list


def _inside(name: str, first: Summary | StateSummary, second: Summary | StateSummary) -> tuple[bool, str]:
    if second.speedup is None or first.ci_low is None:
        return False, f"{name}: no measured pairs in {'the second' if second.speedup is None else 'the first'} run"
    ok = first.ci_low <= second.speedup <= first.ci_high
    return ok, (f"{name}: second run {second.speedup:.2f}x {'inside' if ok else 'outside'} the first's "
                f"[{first.ci_low:.2f}-{first.ci_high:.2f}]")


def reproduces(first: Mapping[str, Summary], second: Mapping[str, Summary]) -> Verdict:
    """The reproducibility bar: per workload (the mappings' keys), the second run's median paired ratio
    lies inside the first run's interval. Where both runs saw the same host state with at least
    MIN_STATE_PAIRS pairs, the bar is judged per such state instead of on the pooled figure (the pooled
    median moves with the share of time the host spent in each state; the per-state medians do not), and
    every such state must pass. A workload in one run only, or a run flagged by `summarise` (fewer than
    MIN_PROCESSES processes, mismatched bytes, no pairs), fails. Raises TypeError unless both are mappings."""
    for name, value in (("first", first), ("second", second)):
        if not isinstance(value, Mapping):
            raise TypeError(f"{name}: expected a mapping of workload name -> Summary, got {type(value).__name__}")
    reasons, failures = [], []

    def check(ok: bool, line: str) -> None:
        reasons.append(line)
        if not ok:
            failures.append(line)

    for w in sorted(set(first) | set(second)):
        if w not in second or w not in first:
            check(False, f"{w}: not in the {'second' if w not in second else 'first'} run")
            continue
        s1, s2 = first[w], second[w]
        for which, s in (("first", s1), ("second", s2)):
            for flag in s.flags:
                check(False, f"{w}: {which} run: {flag}")
        common = [st for st in STATES if st in s1.states and st in s2.states
                  and min(s1.states[st].pairs, s2.states[st].pairs) >= MIN_STATE_PAIRS]
        if common:
            for st in common:
                check(*_inside(f"{w} ({st} host)", s1.states[st], s2.states[st]))
            _, line = _inside(f"{w} (all pairs)", s1, s2)
            reasons.append(line + " (not judged: judged per host state)")
        else:
            check(*_inside(w, s1, s2))
    return Verdict(ok=not failures and bool(reasons), reasons=reasons, failures=failures)
