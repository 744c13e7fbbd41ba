"""The paired verify's statistics: what a speedup, its interval, its host states, the A/A noise floor and
the reproducibility bar are, computed from the pairs a verify record holds (numpy only, no torch).

A paired run (suite.measure.paired.run_pairs, once per fresh process) walks one session script with two
sessions of one model instance, unit by unit, in A B B A blocks: stock (A) against DuplexCadence (B), or
stock against a second stock session (an A/A run, the noise floor). Each unit both ran is a `Pair`;
`summarise` pools the processes: the speedup is the median of the per-pair ratios a_ms / b_ms, its 95%
interval a hierarchical bootstrap over processes and then pairs within each (processes differ by a few
percent on a lent host, pairs within one process much less), per host state where the probe readings
show two, and at a reference host speed (suite.records.host_speed). `reproduces` is the bar a second run
must meet, `reproduces_at_reference` the same bar on the ratio at the reference host speed; both read
summaries only, so the report judges two runs from their records alone.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Iterable, Mapping

import numpy as np

from suite.records.bootstrap import hierarchical_draws, padded_table, percentile_interval
from suite.records.host_speed import PROBE_REFERENCE_US, check_processes, fit_host_speed

MIN_PROCESSES = 3          # a run is at least three fresh processes (as pyperf runs its benchmarks)
CONFIDENCE = 0.95          # the bootstrap interval's coverage
STATES = ("fast", "slow")  # host states, by the probe: "fast" = the cluster of lower readings
MIN_STATE_FRACTION = 0.1   # each of two host states has at least this weight in the probe readings' mixture
MIN_SEPARATION = 2.0       # Ashman's D between the two components (D > 2: two modes cleanly apart)
MIN_BIC_GAIN = 10.0        # two normals must beat one by this much BIC ("very strong", Kass & Raftery 1995)
MIN_STATE_PAIRS = 10       # a state with fewer pairs in a run is not judged by `reproduces`
BOOT_CHUNK = 250           # bootstrap resamples drawn per batch (suite.records.bootstrap.hierarchical_draws)


@dataclass(frozen=True)
class Pair:
    """One unit of the script, run by both sessions.

    index: the script unit's index; kind: "SPEAK", or "LISTEN" for a listening unit that carries a payload
    (decoded as the runner does, never measured); a_ms / b_ms: each session's time for the unit (ms: the
    timer's, or the wall time under the profiler for a profiled unit); order: "ab" (A spoke it first) or
    "ba"; block: the number of the block pair (A B or B A) the unit was in; equal: A's and B's float32 and
    int16 bytes equal (UnitOutput.sha256); sha256_a / sha256_b: those hashes; measured: counted by
    `summarise` (a SPEAK unit after the warm-up, not profiled); probe_before / probe_between / probe_after:
    the host probe read before the first session's block, between the two blocks and after the second (None
    without a probe). walk: which pass over the script (0 first); samples: A's audio samples @ 24 kHz.
    Graph counters of each session, from its `stats()` around the unit: a_eager / b_eager: steps that ran
    eagerly inside the timed call because their signature had no graph (first occurrences); a_captures /
    b_captures: graphs captured inside the timed call (never allowed); a_captured / b_captured: graphs
    captured right after it, outside the timer (`prepare` of the unit's signatures). profiled: run under
    the CUDA profiler instead of timed; a_kernels / b_kernels: its kernel records (suite.measure.kernels)."""
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
    walk: int = 0
    samples: int = 0
    a_eager: int = 0
    b_eager: int = 0
    a_captures: int = 0
    b_captures: int = 0
    a_captured: int = 0
    b_captured: int = 0
    profiled: bool = False
    a_kernels: dict | None = None
    b_kernels: dict | None = None

    @property
    def ratio(self) -> float:
        """a_ms / b_ms: how many times longer A took than B for this unit."""
        return self.a_ms / self.b_ms

    @property
    def probes(self) -> list[float]:
        return [p for p in (self.probe_before, self.probe_between, self.probe_after) if p is not None]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Pair":
        """A Pair from `to_dict()`'s output (or a record's row of it): hashes back to tuples, unknown keys
        left out. Raises KeyError for a missing field without a default."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        for key in ("sha256_a", "sha256_b"):
            kw[key] = tuple(kw[key])
        return cls(**kw)


@dataclass(frozen=True)
class Protocol:
    """How a paired verify ran (its record's `paired.protocol`; suite.measure.verify_process says what each
    part does). processes: fresh processes, each building the model once; passes: walks of the script in
    the A/B run; warmup_pairs: with one pass, its first SPEAK pairs, run and hashed but not measured (with
    two or more passes the whole first pass is the warm-up: `warmup_for`); aa_speak_units: the
    SPEAK units of the A/A run (0: none), aa_warmup_pairs its first unmeasured ones; prime_speak_units: SPEAK
    units a throwaway stock session speaks at set-up (untimed); profiled_speak_units: the A/B walk's last
    SPEAK units under the CUDA profiler in the last process (not measured); block: SPEAK units per block.
    Raises ValueError for a count that is not an int in range."""
    processes: int = MIN_PROCESSES
    passes: int = 1
    warmup_pairs: int = 4
    aa_speak_units: int = 10
    aa_warmup_pairs: int = 3
    prime_speak_units: int = 2
    profiled_speak_units: int = 5
    block: int = 1

    def __post_init__(self):
        for f in fields(self):
            least = 1 if f.name in ("processes", "passes", "block") else 0
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{f.name}: expected an int >= {least}, got {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def warmup_for(self, speak_units: int) -> int:
        """The A/B run's unmeasured SPEAK pairs for a script of `speak_units` SPEAK units."""
        return self.warmup_pairs if self.passes == 1 else speak_units


#: The columns of a pairs table holding a (float32, int16) sha256 pair, stored as positions in its `hashes`.
HASH_COLUMNS = ("sha256_a", "sha256_b")


def pack_pairs(rows: list[dict]) -> dict:
    """Rows of pairs (Pair.to_dict() plus keys such as process and run) as one table: {"columns", "rows",
    "hashes"}, keys once, each distinct sha256 once (HASH_COLUMNS hold [f32 position, int16 position])."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    where: dict[str, int] = {}

    def pos(h: str) -> int:
        return where.setdefault(h, len(where))
    table = [[[pos(h) for h in r[c]] if c in HASH_COLUMNS and r.get(c) is not None else r.get(c) for c in cols]
             for r in rows]
    return {"columns": cols, "rows": table, "hashes": list(where)}


def unpack_pairs(table: dict) -> list[dict]:
    """`pack_pairs`' table back to rows. Raises ValueError for a table not shaped so."""
    try:
        cols, rows, hashes = table["columns"], table["rows"], table["hashes"]
        out = []
        for r in rows:
            row = dict(zip(cols, r, strict=True))
            for c in HASH_COLUMNS:
                if row.get(c) is not None:
                    row[c] = tuple(hashes[i] for i in row[c])
            out.append(row)
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"pairs: expected a table {{'columns', 'rows', 'hashes'}} as pack_pairs writes it "
                         f"({type(exc).__name__}: {exc})") from None
    return out


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
    equally likely, between the two means. Fewer than 4 finite readings, all equal, or readings whose squares
    exceed a float: None."""
    x = np.sort(np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64))
    n = x.size
    if n < 4 or x[0] == x[-1] or np.abs(x).max() > 1e150:     # their squares would exceed a float: no fit
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
    short of the protocol (fewer than MIN_PROCESSES processes, no measured pairs, mismatched bytes);
    host_speed: suite.records.host_speed.HostSpeedFit's dict, the ratio at the reference host speed (None in
    records made before it)."""
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
    host_speed: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Summary":
        """A Summary from `to_dict()`'s output (a verify record's `paired.speedup` or `paired.floor`), its
        states as StateSummary. Raises TypeError / KeyError for a dict not shaped so."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw["states"] = {name: StateSummary(**st) for name, st in (data.get("states") or {}).items()}
        return cls(**kw)

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
    table, medians = padded_table(groups, np.nan), []
    for pick, idx, drawn in hierarchical_draws(sizes, rng=rng, n_boot=n_boot, chunk=BOOT_CHUNK):
        m = pick.shape[0]
        values = np.where(drawn, table[pick[..., None], idx], np.inf).reshape(m, -1)
        values.sort(axis=1)                                                   # the draws first, inf after
        count, rows = drawn.reshape(m, -1).sum(axis=1), np.arange(m)
        medians.append((values[rows, (count - 1) // 2] + values[rows, count // 2]) / 2)
    return percentile_interval(np.concatenate(medians), CONFIDENCE)


def _ratios(pairs: list[Pair]) -> np.ndarray:
    return np.array([p.ratio for p in pairs], dtype=np.float64)


def _median(x) -> float | None:
    return float(np.median(x)) if len(x) else None


def summarise(processes: list[list[Pair]], *, seed: int = 0, n_boot: int = 2000) -> Summary:
    """Pool the pairs of several processes (one `run_pairs` result each) into a Summary (its docstring
    lists the fields). Host states: the probe readings of every measured pair of every process are split
    by `split_states`; each pair is then "fast", "slow" or "mixed" (`pair_state`). seed: the bootstrap's
    generator; n_boot: its resamples. Raises ValueError naming the place for no processes, a pair with a time
    or probe reading that is not finite (suite.records.host_speed.check_processes), a seed that is not an int
    >= 0 or n_boot < 100."""
    check_processes(processes)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 100:
        raise ValueError(f"n_boot: expected an int >= 100, got {n_boot!r}")
    n_boot = int(n_boot)
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
                   probe_split=threshold, flags=flags, seed=seed, n_boot=n_boot,
                   host_speed=fit_host_speed(processes, seed=seed, n_boot=n_boot, min_processes=MIN_PROCESSES,
                                             confidence=CONFIDENCE).to_dict())


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


def reproduces_at_reference(first: Mapping[str, Summary], second: Mapping[str, Summary]) -> Verdict:
    """The reproducibility bar at the reference host speed: per workload, the second run's speedup at the
    reference (its `host_speed`, suite.records.host_speed) lies inside the first run's interval there. A
    workload in one run only, without a fit or an interval in either run, or in a run flagged by `summarise`
    or by the fit (fewer processes or steady pairs, the reference outside the probe range), fails. Raises
    TypeError unless both are mappings."""
    for name, value in (("first", first), ("second", second)):
        if not isinstance(value, Mapping):
            raise TypeError(f"{name}: expected a mapping of workload name -> Summary, got {type(value).__name__}")
    reasons, failures = [], []
    for w in sorted(set(first) | set(second)):
        if w not in second or w not in first:
            bad = [f"{w}: not in the {'second' if w not in second else 'first'} run"]
        else:
            (h1, h2), bad = (first[w].host_speed or {}, second[w].host_speed or {}), []
            for which, s, h in (("first", first[w], h1), ("second", second[w], h2)):
                bad += [f"{w}: {which} run: {f}" for f in [*s.flags, *h.get("flags", ["no host-speed fit"])]]
            if h1 and h2 and h1.get("reference_us") != h2.get("reference_us"):
                bad.append(f"{w}: the runs' reference host speeds differ ({h1.get('reference_us')} and "
                           f"{h2.get('reference_us')} us)")
            if None not in (h1.get("ci_low"), h1.get("ci_high"), h2.get("speedup")):
                inside = h1["ci_low"] <= h2["speedup"] <= h1["ci_high"]
                reasons.append(f"{w}: at {h1['reference_us']:.1f} us per launch, second run {h2['speedup']:.2f}x "
                               f"{'inside' if inside else 'outside'} the first's "
                               f"[{h1['ci_low']:.2f}-{h1['ci_high']:.2f}]")
                bad = bad if inside else [reasons.pop(), *bad]
        reasons += bad
        failures += bad
    return Verdict(ok=not failures and bool(reasons), reasons=reasons, failures=failures)
