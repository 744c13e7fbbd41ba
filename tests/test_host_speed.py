"""suite.records.host_speed: the paired ratio at a fixed host speed, on synthetic pairs whose truth the tests set.

The synthetic host: each pair's probe reading is drawn in a range the test names; stock's unit time is
200 ms * exp(0.11 * (probe - 9)) (launch-bound: it follows the host) and DuplexCadence's 50 ms whatever the
probe, each with log-normal noise. So by construction log(a / b) = log(4) + 0.11 * (probe - 9): the ratio at
9.0 us per launch is 4.0, the slope of log ratio 0.11 per us, stock's slope 0.11 and DuplexCadence's 0.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time

import numpy as np
import pytest

from suite import records
from suite.records import host_speed, paired
from suite.records.host_speed import PROBE_REFERENCE_US, fit_host_speed
from suite.records.paired import (Pair, Summary, pack_pairs, reproduces, reproduces_at_reference, split_states,
                                  summarise)
from suite.report import document, figures, runs

STOCK_MS, CADENCE_MS, SLOPE = 200.0, 50.0, 0.11
TRUE_RATIO = STOCK_MS / CADENCE_MS                      # 4.0 at the reference by construction
OPTIONS = {"device": "cpu", "steps": None, "seconds": None, "max_speak_units": None, "depth": "released",
           "seed": None, "notes": []}


def pair(i: int, probe: float | None, a_ms: float, b_ms: float, *, a_eager=0, b_eager=0, measured=True,
         samples=24_000) -> Pair:
    probes = (None, None, None) if probe is None else (probe - 0.1, probe, probe + 0.1)   # mean: probe
    return Pair(i, "SPEAK", a_ms, b_ms, "ab" if i % 2 == 0 else "ba", i, True, ("h", "h"), ("h", "h"), measured,
                *probes, a_eager=a_eager, b_eager=b_eager, samples=samples)


def process(seed: int, n: int, lo: float, hi: float, *, noise: float = 0.02, factor: float = 1.0) -> list[Pair]:
    """n steady pairs, probes uniform in [lo, hi]; factor: this process's own factor on stock's time."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = float(rng.uniform(lo, hi))
        a = factor * STOCK_MS * math.exp(SLOPE * (p - 9.0) + noise * rng.standard_normal())
        b = CADENCE_MS * math.exp(noise * rng.standard_normal())
        out.append(pair(i, p, a, b))
    return out


def run(lo: float, hi: float, *, n_proc: int = 3, n: int = 50, seed: int = 0, **kw) -> list[list[Pair]]:
    return [process(seed * 100 + k, n, lo, hi, **kw) for k in range(n_proc)]


# --- the fit ------------------------------------------------------------------------------------------
def test_exact_line_through_two_probe_readings():
    """Noise-free pairs at 8 and 10 us: log ratio log(4) -+ 0.11, so the line crosses 9 us at exactly 4.0."""
    procs = [[pair(0, 8.0, 4.0 * math.exp(-0.11) * 10, 10.0), pair(1, 10.0, 4.0 * math.exp(0.11) * 10, 10.0)]
             for _ in range(3)]
    fit = fit_host_speed(procs, n_boot=200)
    assert fit.speedup == pytest.approx(4.0, rel=1e-9) and fit.slope == pytest.approx(0.11, rel=1e-9)
    assert fit.stock_slope == pytest.approx(0.11, rel=1e-9) and fit.cadence_slope == pytest.approx(0.0, abs=1e-12)
    assert (fit.probe_min, fit.probe_max, fit.pairs, fit.processes) == (8.0, 10.0, 6, 3)


def test_slope_and_speedup_at_the_reference_are_recovered():
    fit = fit_host_speed(run(7.0, 12.0), n_boot=1000)
    assert fit.reference_us == PROBE_REFERENCE_US == 9.0
    assert fit.speedup == pytest.approx(TRUE_RATIO, rel=0.02)
    assert fit.ci_low <= TRUE_RATIO <= fit.ci_high and fit.ci_high - fit.ci_low < 0.15
    assert fit.slope == pytest.approx(SLOPE, abs=0.01)
    assert fit.stock_slope == pytest.approx(SLOPE, abs=0.01) and abs(fit.cadence_slope) < 0.01
    assert (fit.pairs, fit.processes, fit.first_occurrences, fit.no_probe, fit.flags) == (150, 3, 0, 0, [])


def test_a_slower_host_moves_the_median_ratio_but_not_the_ratio_at_the_reference():
    """Probes over 8.5-13 us: the median ratio is about 4 exp(0.11 x 1.75) = 4.85, the ratio at 9 us still 4."""
    slow = run(8.5, 13.0, seed=1)
    med = summarise(slow, n_boot=200).speedup
    assert med == pytest.approx(TRUE_RATIO * math.exp(SLOPE * 1.75), rel=0.05)
    assert fit_host_speed(slow, n_boot=200).speedup == pytest.approx(TRUE_RATIO, rel=0.03)


def test_first_occurrences_silent_units_unmeasured_pairs_and_pairs_without_probe_are_left_out():
    procs = run(7.0, 12.0)
    for k, proc in enumerate(procs):      # eager in both arms: a ratio of 1, which would pull the line down
        proc += [pair(100 + j, 9.0, 50.0, 50.0, a_eager=2, b_eager=2) for j in range(10)]
        proc += [pair(200, 9.0, 50.0, 50.0, b_eager=1), pair(201, 9.0, 50.0, 50.0, measured=False)]
        proc += [pair(300, None, 50.0, 50.0)]
        proc += [pair(400 + j, 12.0, 0.4, 0.4, samples=0) for j in range(4)]   # no audio: ratio 1 at a slow host
    fit = fit_host_speed(procs, n_boot=200)
    assert (fit.pairs, fit.first_occurrences, fit.no_probe, fit.silent) == (150, 33, 3, 12)
    assert fit.speedup == pytest.approx(TRUE_RATIO, rel=0.02)


def test_the_interval_carries_the_spread_between_processes():
    same = fit_host_speed(run(7.0, 12.0, seed=3), n_boot=1000)
    spread = fit_host_speed([process(300 + k, 50, 7.0, 12.0, factor=f) for k, f in enumerate((0.85, 1.0, 1.15))],
                            n_boot=1000)
    assert (spread.ci_high - spread.ci_low) > 3 * (same.ci_high - same.ci_low)


def test_the_same_seed_gives_the_same_interval():
    procs = run(7.0, 12.0, seed=4)
    a, b = fit_host_speed(procs, seed=5), fit_host_speed(procs, seed=5)
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)


def test_a_reference_outside_the_probe_range_is_flagged_an_extrapolation():
    far = fit_host_speed(run(10.0, 13.0), n_boot=200)
    assert any(f.startswith("extrapolated: the reference 9.0 us lies outside") for f in far.flags)
    assert far.speedup is not None
    assert not any("extrapolated" in f for f in fit_host_speed(run(8.0, 13.0), n_boot=200).flags)


def test_equal_probe_readings_give_no_fit():
    procs = [[pair(i, 9.5, 200.0 + i, 50.0) for i in range(20)] for _ in range(3)]
    fit = fit_host_speed(procs, n_boot=200)
    assert (fit.speedup, fit.ci_low, fit.ci_high, fit.slope, fit.stock_slope, fit.cadence_slope) == (None,) * 6
    assert fit.pairs == 60 and any(f.startswith("no fit: every probe reading") for f in fit.flags)
    assert fit.interval() == "no fit"


def test_a_line_extrapolated_beyond_a_float_gives_no_fit_instead_of_raising():
    """Probes 100.0 and 100.1 us, log ratio 0 then -1: the line reaches about +910 at 9 us, past exp's range
    (math.exp raised OverflowError there)."""
    procs = [[pair(0, 100.0, 10.0, 10.0), pair(1, 100.1, 10.0 * math.exp(-1.0), 10.0)] for _ in range(3)]
    fit = fit_host_speed(procs, n_boot=200)
    assert (fit.speedup, fit.ci_low, fit.ci_high, fit.slope) == (None,) * 4 and fit.interval() == "no fit"
    assert any(f.startswith("no fit: the log ratio at the reference, 910") for f in fit.flags), fit.flags


def test_bootstrap_bounds_beyond_a_float_give_no_interval_instead_of_raising():
    """One process spans 8-10 us; two hold probes 1e-4 us apart with ratios 4 and 6: resamples of only those
    two fit a slope of about 4,000 per us, whose intercept exp cannot hold. The point fit stays."""
    procs = [[pair(i, 8.0 + 2.0 * (i % 2), 40.0, 10.0) for i in range(10)]]
    procs += [[pair(i, 9.5 + 1e-4 * (i % 2), 40.0 * (1.5 if i % 2 else 1.0), 10.0) for i in range(10)]
              for _ in range(2)]
    fit = fit_host_speed(procs, n_boot=200)
    assert fit.speedup == pytest.approx(4.49, abs=0.01) and (fit.ci_low, fit.ci_high) == (None, None)
    assert any(f.startswith("no interval: its log bounds [-20") for f in fit.flags), fit.flags
    assert fit.interval().endswith("(no interval) at 9.0 us")


def test_few_processes_and_few_pairs_are_flagged():
    fit = fit_host_speed(run(7.0, 12.0, n_proc=2, n=4), n_boot=200)
    assert f"2 processes with steady pairs < {paired.MIN_PROCESSES}" in fit.flags
    assert f"8 steady pairs < {host_speed.MIN_FIT_PAIRS}" in fit.flags
    none = fit_host_speed([[pair(0, 9.0, 50.0, 50.0, a_eager=1)]], n_boot=200)
    assert none.speedup is None and any(f.startswith("no fit: no measured pair") for f in none.flags)


def test_the_defaults_are_the_paired_protocols():
    assert host_speed.DEFAULT_MIN_PROCESSES == paired.MIN_PROCESSES
    assert host_speed.DEFAULT_CONFIDENCE == paired.CONFIDENCE


@pytest.mark.parametrize("kwargs, name", [
    ({"processes": []}, "processes"),
    ({"processes": "pairs"}, "processes"),
    ({"processes": [[1, 2]]}, r"processes\[0\]"),
    ({"reference_us": -1.0}, "reference_us"),
    ({"reference_us": float("nan")}, "reference_us"),
    ({"reference_us": "9"}, "reference_us"),
    ({"n_boot": 10}, "n_boot"),
    ({"n_boot": 2000.0}, "n_boot"),
    ({"seed": -1}, "seed"),
    ({"confidence": 1.5}, "confidence"),
    ({"min_processes": 0}, "min_processes"),
])
def test_bad_arguments_are_named(kwargs, name):
    kw = {"processes": run(7.0, 12.0, n=5), **kwargs}
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        fit_host_speed(kw.pop("processes"), **kw)


def test_two_thousand_resamples_of_150_pairs_take_well_under_a_second():
    procs = run(7.0, 12.0)
    fit_host_speed(procs, n_boot=200)                  # warm
    t0 = time.perf_counter()
    fit_host_speed(procs, n_boot=2000)
    assert time.perf_counter() - t0 < 0.5


# --- the summary and the bar --------------------------------------------------------------------------
def test_summarise_fills_host_speed_and_old_summaries_still_load():
    s = summarise(run(7.0, 12.0), n_boot=200)
    assert s.host_speed["speedup"] == pytest.approx(TRUE_RATIO, rel=0.02) and s.host_speed["reference_us"] == 9.0
    again = Summary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again.host_speed == s.host_speed
    old = {k: v for k, v in s.to_dict().items() if k != "host_speed"}     # a record made before the fit
    loaded = Summary.from_dict(old)
    assert loaded.host_speed is None and loaded.speedup == s.speedup and loaded.states.keys() == s.states.keys()


def summary(x: float, lo: float, hi: float, flags=(), fit_flags=()) -> Summary:
    fit = {"reference_us": 9.0, "speedup": x, "ci_low": lo, "ci_high": hi, "flags": list(fit_flags)}
    return Summary(3.0, 2.9, 3.1, None, None, 3, 90, [3.0] * 3, 0, [], flags=list(flags), host_speed=fit)


def test_reproduces_at_reference_passes_and_fails():
    first = {"w": summary(4.0, 3.9, 4.1)}
    v = reproduces_at_reference(first, {"w": summary(4.05, 3.95, 4.15)})
    assert v.ok and v.reasons == ["w: at 9.0 us per launch, second run 4.05x inside the first's [3.90-4.10]"]
    v = reproduces_at_reference(first, {"w": summary(4.2, 4.1, 4.3)})
    assert not v.ok and v.failures == ["w: at 9.0 us per launch, second run 4.20x outside the first's [3.90-4.10]"]
    v = reproduces_at_reference(first, {"w": summary(4.0, 3.9, 4.1, fit_flags=["extrapolated: ..."])})
    assert not v.ok and v.failures == ["w: second run: extrapolated: ..."]
    v = reproduces_at_reference(first, {"w": summary(4.0, 3.9, 4.1, flags=["2 pairs whose bytes differ"])})
    assert not v.ok and v.failures == ["w: second run: 2 pairs whose bytes differ"]
    no_fit = summary(4.0, 3.9, 4.1)
    no_fit.host_speed = None
    v = reproduces_at_reference({"w": no_fit}, {"w": summary(4.0, 3.9, 4.1)})
    assert not v.ok and v.failures == ["w: first run: no host-speed fit"]
    v = reproduces_at_reference(first, {"v": summary(4.0, 3.9, 4.1)})
    assert not v.ok and set(v.failures) == {"v: not in the first run", "w: not in the second run"}
    with pytest.raises(TypeError, match="second"):
        reproduces_at_reference(first, [summary(4.0, 3.9, 4.1)])


def test_two_runs_on_hosts_of_other_speeds_fail_the_pooled_bar_and_meet_the_one_at_the_reference():
    """The second run on a slower host, with little noise so that its ratio at the reference is close to the
    true 4.0 (which the first run's interval covers): the pooled median moves to about 4.85 and fails."""
    first, second = summarise(run(7.0, 11.0, seed=6)), summarise(run(8.5, 13.0, seed=7, noise=0.002))
    assert first.host_speed["ci_low"] <= TRUE_RATIO <= first.host_speed["ci_high"]
    assert not reproduces({"w": first}, {"w": second}).ok
    assert reproduces_at_reference({"w": first}, {"w": second}).ok


# --- the report ---------------------------------------------------------------------------------------
def record(procs: list[list[Pair]], *, stored_fit: bool) -> dict:
    """A paired verify record with what the report reads; stored_fit False: as records made before the fit."""
    sp = summarise(procs, n_boot=500).to_dict()
    if not stored_fit:
        del sp["host_speed"]
    rows = [{"process": i, "run": "ab", **p.to_dict()} for i, proc in enumerate(procs, 1) for p in proc]
    rows += [{"process": 1, "run": "aa", **pair(0, 9.0, 50.0, 50.0).to_dict()}]
    return {"schema": records.VERIFY_SCHEMA, "workload": {"name": "w", "model": "M"}, "parameters": {},
            "provenance": {"device": {"gpu_name": "NVIDIA H200"}, "impl_tree": "t", "date_utc": "2026-12-01"},
            "device": "cuda", "verdict": "VALID",
            "modes": {m: {"metrics": {}, "units": [], "memory": {}} for m in ("stock", "cadence")},
            "comparison": {"protocol": "paired", "units_compared": 90, "mismatched_units": []},
            "paired": {"speedup": sp, "floor": None, "clears_floor": None, "pairs": pack_pairs(rows)}}


def test_a_record_without_the_fit_is_fitted_from_its_pairs():
    procs = run(7.0, 12.0, seed=8)
    old = figures.paired_summary(record(procs, stored_fit=False)).host_speed
    assert old["speedup"] == pytest.approx(TRUE_RATIO, rel=0.02) and old["pairs"] == 150    # the A/A row left out
    assert old == figures.paired_summary(record(procs, stored_fit=True)).host_speed


def test_the_report_shows_both_bars_and_the_ratio_at_the_reference(tmp_path):
    run_dir, ref = tmp_path / "run", tmp_path / "ref"
    for folder, rec in ((run_dir / "w.verify", record(run(8.5, 13.0, seed=7, noise=0.002), stored_fit=False)),
                        (ref, record(run(7.0, 11.0, seed=6), stored_fit=False))):
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps(rec))
    (run_dir / "stages.json").write_text(json.dumps({"schema": records.STAGES_SCHEMA, "options": OPTIONS, "sittings": [],
                                                     "stages": {"w.verify": {"workload": "w", "harness": "verify",
                                                                             "status": "done"}}}))
    text = document.write(run_dir, [str(ref)]).read_text()
    against = text.split("## Against the reference run")[1].split("\n## ")[0]
    assert ("Against `ref`: the judged bar **not met** (0 of 1 workloads met); at the reference host speed, not "
            "judged: met (1 of 1 workloads met)") in against
    assert "  - at the reference host speed: **met**: w: at 9.0 us per launch, second run 4.0" in against
    speed = text.split("## Speed")[1].split("\n## ")[0]
    assert "at 9.0 us per launch; slope per us, stock / cadence" in speed
    row = next(line for line in speed.splitlines() if line.startswith("| w "))
    cell = row.split(" | ")[4]                                 # the column after "per host state"
    assert cell.startswith("4.0") and "; +0.11" in cell
    verdict, reasons = runs.bar_at_reference(None, json.loads((ref / "run.json").read_text()), "w")
    assert verdict == "open" and reasons == ["w: not in this run"]


@pytest.mark.parametrize("field, value, says", [
    ("a_ms", 0.0, "a_ms: expected a finite time > 0 ms, got 0.0"),
    ("b_ms", -1.0, "b_ms: expected a finite time > 0 ms, got -1.0"),
    ("a_ms", float("nan"), "a_ms: expected a finite time > 0 ms, got nan"),
    ("probe_between", float("inf"), "probe_between: expected a finite reading (us) or None, got inf"),
])
def test_a_measured_pair_without_a_finite_time_or_reading_is_refused_naming_it(field, value, says):
    procs = run(7.0, 12.0, n=12)
    procs[1][5] = dataclasses.replace(procs[1][5], **{field: value})
    for fn in (fit_host_speed, summarise):
        with pytest.raises(ValueError, match=re.escape(f"processes[1][5] (unit 5): {says}")):
            fn(procs, n_boot=200)
    procs[1][5] = dataclasses.replace(procs[1][5], measured=False)      # an unmeasured pair is not read
    assert fit_host_speed(procs, n_boot=200).pairs == 35


def test_summarise_names_a_bad_seed_and_probe_readings_beyond_a_float_have_one_state():
    with pytest.raises(ValueError, match=r"^seed: expected an int >= 0, got -1"):
        summarise(run(7.0, 12.0, n=12), seed=-1, n_boot=200)
    assert split_states([1e200, 1e200, 1e308, 1e308, 1e308, 1e200]) is None
