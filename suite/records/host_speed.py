"""The paired ratio at one fixed host speed (numpy only, no torch).

Stock is launch-bound: per pair, its log time rises with the host probe's reading (microseconds per tiny
eager launch) while DuplexCadence's hardly moves, so the median ratio of a run carries the host speed that
run happened to see. `fit_host_speed` fits log(a_ms / b_ms) = alpha + beta * (probe - reference) by least
squares over the measured pairs in which neither arm ran a step eagerly (a first occurrence of a graph
signature runs eagerly in both arms, a ratio near 1 that is no part of the steady state) and that made audio (a
SPEAK unit of 0 samples runs no decoder step in either arm: a host-only call of well under a millisecond), with
probe the mean of the pair's readings. exp(alpha) is the speedup at the reference host speed; its interval is a
hierarchical bootstrap (suite.records.bootstrap: processes with replacement, then pairs within each).
The same fit of log a_ms and log b_ms alone shows which arm follows the host.

This module takes the pairs (suite.records.paired.Pair) as given and imports only suite.records.bootstrap.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from suite.records.bootstrap import hierarchical_draws, padded_table, percentile_interval

#: The reference host speed, microseconds per tiny eager launch. A convention, not a measurement of any run:
#: a speed inside the range of probe readings the lent H200 hosts show (about 7-12 us), fixed so that two
#: runs are compared at the same host speed.
PROBE_REFERENCE_US = 9.0
MIN_FIT_PAIRS = 10         # a fit over fewer steady pairs is flagged
DEFAULT_MIN_PROCESSES = 3  # as suite.records.paired.MIN_PROCESSES (summarise passes its own)
DEFAULT_CONFIDENCE = 0.95  # as suite.records.paired.CONFIDENCE
BOOT_CHUNK = 500           # bootstrap resamples drawn per batch (suite.records.bootstrap.hierarchical_draws)
MAX_LOG = math.log(np.finfo(np.float64).max)    # the largest log ratio whose exp is a float


@dataclass
class HostSpeedFit:
    """The fit of the paired ratio against the host probe (module docstring).

    reference_us: the probe reading the speedup is read at; speedup: exp(alpha), the ratio a_ms / b_ms there;
    ci_low / ci_high: its interval; slope: beta, the change of log(a_ms / b_ms) per microsecond of probe;
    stock_slope / cadence_slope: the same fit of log a_ms and of log b_ms alone; pairs: the pairs used;
    processes: processes with pairs used; first_occurrences: measured pairs left out because an arm ran a step
    eagerly (a_eager or b_eager > 0); silent: measured pairs left out for making no audio (samples == 0);
    no_probe: measured pairs left out for having no probe reading;
    probe_min / probe_max: the range of the used pairs' probes; flags: what makes the fit weak or absent.
    The fitted figures are None where there is no fit (no pairs used, or all their probes equal)."""
    reference_us: float
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    slope: float | None
    stock_slope: float | None
    cadence_slope: float | None
    pairs: int
    processes: int
    first_occurrences: int
    no_probe: int
    probe_min: float | None
    probe_max: float | None
    silent: int = 0
    flags: list = field(default_factory=list)
    seed: int = 0
    n_boot: int = 2000

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HostSpeedFit":
        """A HostSpeedFit from `to_dict()`'s output, unknown keys left out. Raises TypeError for a missing
        field without a default."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def interval(self) -> str:
        if self.speedup is None:
            return "no fit"
        if self.ci_low is None:
            return f"{self.speedup:.2f}x (no interval) at {self.reference_us:.1f} us"
        return f"{self.speedup:.2f}x [{self.ci_low:.2f}-{self.ci_high:.2f}] at {self.reference_us:.1f} us"


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line y = a + b x (x not all equal)."""
    xm, ym = x.mean(), y.mean()
    dx = x - xm
    b = float((dx * (y - ym)).sum() / (dx * dx).sum())
    return float(ym - b * xm), b


def _check_int(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")
    return int(value)


def bootstrap_intercept(groups: list[tuple[np.ndarray, np.ndarray]], *, rng: np.random.Generator, n_boot: int,
                        confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float] | None:
    """The `confidence` percentile interval of the least-squares intercept of y on x under the hierarchical
    bootstrap: each resample draws len(groups) groups (x, y) with replacement, then within each drawn group as
    many pairs as it holds, with replacement, and fits one line to all drawn pairs. Resamples whose x are all
    equal have no line and are left out; None when every resample is so. Empty groups are left out."""
    groups = [(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)) for x, y in groups if len(x)]
    if not groups:
        return None
    sizes = np.array([x.size for x, _ in groups])
    tx, ty = padded_table([x for x, _ in groups], 0.0), padded_table([y for _, y in groups], 0.0)
    out = []
    for pick, idx, drawn in hierarchical_draws(sizes, rng=rng, n_boot=n_boot, chunk=BOOT_CHUNK):
        w = drawn.astype(np.float64)                                          # 1 for a draw, 0 for padding
        x, y = tx[pick[..., None], idx] * w, ty[pick[..., None], idx] * w
        count = w.sum(axis=(1, 2))
        sx, sy = x.sum(axis=(1, 2)), y.sum(axis=(1, 2))
        sxx, sxy = (x * x).sum(axis=(1, 2)), (x * y).sum(axis=(1, 2))
        var = sxx - sx * sx / count                                           # count x the drawn x's variance
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(var > 1e-12 * np.maximum(sxx, 1e-300), (sxy - sx * sy / count) / var, np.nan)
        out.append((sy - slope * sx) / count)
    a = np.concatenate(out)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return None
    return percentile_interval(a, confidence)


def _finite(value, low_open: float | None) -> bool:
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) \
        and math.isfinite(value)
    return ok and (low_open is None or value > low_open)


def check_processes(processes) -> None:
    """Raises ValueError naming the first bad place unless `processes` is a non-empty list (one per process) of
    lists of Pair whose measured pairs hold finite times > 0 ms (a_ms, b_ms) and finite probe readings (or
    None): a time of 0 or NaN has no ratio and a NaN reading no host speed, and either would otherwise come out
    as a NaN figure with a finite interval."""
    if isinstance(processes, (str, bytes)) or not isinstance(processes, (list, tuple)) or not processes:
        raise ValueError(f"processes: expected a non-empty list of lists of Pair, got {processes!r:.80}")
    for i, proc in enumerate(processes):
        if not isinstance(proc, (list, tuple)) or not all(hasattr(p, "a_ms") and hasattr(p, "probes") for p in proc):
            raise ValueError(f"processes[{i}]: expected a list of Pair, got {proc!r:.80}")
        for j, p in enumerate(proc):
            if not p.measured:
                continue
            for key in ("a_ms", "b_ms"):
                if not _finite(getattr(p, key), 0.0):
                    raise ValueError(f"processes[{i}][{j}] (unit {p.index}): {key}: expected a finite time > 0 ms, "
                                     f"got {getattr(p, key)!r}")
            for key in ("probe_before", "probe_between", "probe_after"):
                v = getattr(p, key)
                if v is not None and not _finite(v, None):
                    raise ValueError(f"processes[{i}][{j}] (unit {p.index}): {key}: expected a finite reading (us) "
                                     f"or None, got {v!r}")


def fit_host_speed(processes, *, reference_us: float = PROBE_REFERENCE_US, seed: int = 0, n_boot: int = 2000,
                   min_processes: int = DEFAULT_MIN_PROCESSES, confidence: float = DEFAULT_CONFIDENCE) -> HostSpeedFit:
    """The HostSpeedFit of several processes' pairs (a list with one list of Pair per process). Uses the
    measured pairs with a_eager == b_eager == 0, samples > 0 and at least one probe reading. seed: the bootstrap's
    generator; n_boot: its resamples. Flags: fewer than `min_processes` processes or MIN_FIT_PAIRS pairs used,
    the reference outside the used pairs' probe range (an extrapolation), no fit. Raises ValueError naming
    the argument for no processes, a process that is not a list of pairs or a measured pair with a time or
    probe reading that is not finite (`check_processes`), a reference that is not a positive finite number,
    n_boot < 100 or a confidence outside (0, 1)."""
    check_processes(processes)
    if isinstance(reference_us, bool) or not isinstance(reference_us, (int, float, np.floating)) \
            or not math.isfinite(reference_us) or reference_us <= 0:
        raise ValueError(f"reference_us: expected a finite number > 0 (us per launch), got {reference_us!r}")
    n_boot = _check_int("n_boot", n_boot, 100)
    _check_int("seed", seed, 0)
    min_processes = _check_int("min_processes", min_processes, 1)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence: expected a number in (0, 1), got {confidence!r}")
    reference_us = float(reference_us)
    groups, first, silent, no_probe = [], 0, 0, 0
    for proc in processes:
        rows = []
        for p in proc:
            if not p.measured:
                continue
            if p.a_eager > 0 or p.b_eager > 0:
                first += 1
            elif p.samples == 0:
                silent += 1
            elif not p.probes:
                no_probe += 1
            else:
                rows.append((float(np.mean(p.probes)) - reference_us, math.log(p.a_ms), math.log(p.b_ms)))
        groups.append(np.array(rows, dtype=np.float64).reshape(-1, 3))
    used = [g for g in groups if len(g)]
    data = np.concatenate(used) if used else np.zeros((0, 3))
    fit = HostSpeedFit(reference_us, None, None, None, None, None, None, pairs=len(data), processes=len(used),
                       first_occurrences=first, no_probe=no_probe, silent=silent, probe_min=None, probe_max=None,
                       seed=seed, n_boot=n_boot)
    if len(used) < min_processes:
        fit.flags.append(f"{len(used)} processes with steady pairs < {min_processes}")
    if len(data) < MIN_FIT_PAIRS:
        fit.flags.append(f"{len(data)} steady pairs < {MIN_FIT_PAIRS}")
    if len(data) == 0:
        fit.flags.append("no fit: no measured pair without an eager step, with audio and with a probe reading")
        return fit
    x, log_a, log_b = data[:, 0], data[:, 1], data[:, 2]
    fit.probe_min, fit.probe_max = float(x.min() + reference_us), float(x.max() + reference_us)
    if x.min() == x.max():
        fit.flags.append(f"no fit: every probe reading of the pairs used is {fit.probe_min:g} us, the slope is "
                         f"undefined")
        return fit
    alpha, slope = _line(x, log_a - log_b)
    if abs(alpha) > MAX_LOG:
        fit.flags.append(f"no fit: the log ratio at the reference, {alpha:.4g}, is beyond a float's range (the "
                         f"line over probes {fit.probe_min:g}-{fit.probe_max:g} us is extrapolated too far)")
        return fit
    fit.slope, fit.speedup = slope, math.exp(alpha)
    fit.stock_slope, fit.cadence_slope = _line(x, log_a)[1], _line(x, log_b)[1]
    ci = bootstrap_intercept([(g[:, 0], g[:, 1] - g[:, 2]) for g in used], rng=np.random.default_rng(seed),
                             n_boot=n_boot, confidence=confidence)
    if ci is None:
        fit.flags.append("no interval: every bootstrap resample's probe readings were all equal")
    elif max(abs(ci[0]), abs(ci[1])) > MAX_LOG:
        fit.flags.append(f"no interval: its log bounds [{ci[0]:.4g}, {ci[1]:.4g}] are beyond a float's range "
                         f"(resamples of nearly equal probe readings extrapolate too far)")
    else:
        fit.ci_low, fit.ci_high = math.exp(ci[0]), math.exp(ci[1])
    if not fit.probe_min <= reference_us <= fit.probe_max:
        fit.flags.append(f"extrapolated: the reference {reference_us:.1f} us lies outside the pairs' probe range "
                         f"[{fit.probe_min:.2f}-{fit.probe_max:.2f}] us")
    return fit
