"""The duplex harness's parts: the cadence scheduler (misses, lateness, slack work after a unit and never inside
one), AR stages, the search that brackets sessions per GPU, duplex records (their unit table, schemas, codes).
The harness on the fake adapter is tests/test_duplex_harness.py. GPU tests skip on the CPU with the reason."""
from __future__ import annotations

import dataclasses
import json
import threading

import pytest
import torch

from suite import records
from suite.measure import ar_stage, duplex_session, scheduler
from suite.measure import search as duplex_search
from suite.measure.scheduler import AdmissionError, CadenceScheduler, ScheduleError, Slot
from suite.records import max_zero_miss

PERIOD = 1.0


class FakeClock:
    """Time moves only when told: sleep_until jumps, work advances it by its cost."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep_until(self, t: float) -> None:
        self.t = max(self.t, t)


@dataclasses.dataclass
class U:
    index: int
    kind: str = "SPEAK"


def slot(name, costs, clock, log=None, phase=0.0, nbytes=0, kinds=None):
    """A session whose unit i takes costs[i] seconds of clock time (None: no work)."""
    units = [U(i, (kinds or {}).get(i, "SPEAK")) for i in range(len(costs))]

    def run(u):
        clock.t += costs[u.index]
        if log is not None:
            log.append((name, u.index, clock.t))
        return {"cost": costs[u.index]}

    return Slot(name, units, run, lambda u: costs[u.index] is not None, nbytes, phase)


# --- scheduler: misses and lateness -----------------------------------------------------------------------
def test_unit_longer_than_cadence_is_a_miss_with_its_lateness():
    clock = FakeClock()
    sched = CadenceScheduler(period_s=PERIOD, clock=clock)
    sched.admit(slot("a", [0.25, 1.3, 0.5, None], clock))
    rec = sched.run()
    assert [r.miss for r in rec] == [False, True, False, False]
    assert rec[0].lateness_s == pytest.approx(0.25 - 1.0)
    # unit 1 released at 1.0, ends at 2.3: 0.3 s past its deadline
    assert rec[1].start_s == pytest.approx(1.0) and rec[1].lateness_s == pytest.approx(0.3)
    # unit 2 released at 2.0 starts at 2.3 (unit 1 still running) and ends at 2.8, before its 3.0 deadline
    assert rec[2].start_s == pytest.approx(2.3) and rec[2].lateness_s == pytest.approx(-0.2)


def test_queueing_behind_a_late_unit_counts_against_the_next():
    clock = FakeClock()
    sched = CadenceScheduler(period_s=PERIOD, clock=clock)
    sched.admit(slot("a", [1.9, 0.2], clock))
    r0, r1 = sched.run()
    assert r0.miss and r0.lateness_s == pytest.approx(0.9)
    assert r1.start_s == pytest.approx(1.9) and r1.end_s == pytest.approx(2.1)
    assert r1.miss and r1.lateness_s == pytest.approx(0.1)
    assert r1.service_s == pytest.approx(0.2)


def test_unit_without_work_is_recorded_not_run():
    clock = FakeClock()
    sched = CadenceScheduler(period_s=PERIOD, clock=clock)
    sched.admit(slot("a", [None, 0.1], clock, kinds={0: "LISTEN"}))
    r0, r1 = sched.run()
    assert r0.start_s is None and r0.lateness_s is None and not r0.miss
    assert r1.start_s == pytest.approx(1.0)


def test_edf_runs_earliest_deadline_first_with_staggered_phases():
    clock, log = FakeClock(), []
    sched = CadenceScheduler(period_s=PERIOD, clock=clock)
    phases = scheduler.staggered_phases(2, PERIOD)
    assert phases == [0.0, 0.5]
    # a's unit 0 takes 0.7 s: b's unit 0 (released 0.5, due 1.5) waits; at 1.0 a's unit 1 is released
    # (due 2.0) but b's earlier deadline goes first.
    sched.admit(slot("a", [0.7, 0.1], clock, log, phase=phases[0]))
    sched.admit(slot("b", [0.1, 0.1], clock, log, phase=phases[1]))
    sched.run()
    assert [(n, i) for n, i, _ in log] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert log[1][2] == pytest.approx(0.8)


def test_threads_policy_runs_every_unit_in_order():
    seen, lock = [], threading.Lock()

    def mk(name):
        units = [U(i) for i in range(3)]

        def run(u):
            with lock:
                seen.append((name, u.index))
            return u.index
        return Slot(name, units, run, lambda u: True)

    sched = CadenceScheduler(period_s=0.01, policy="threads")
    for s, name in enumerate("abc"):
        sched.admit(dataclasses.replace(mk(name), phase_s=s * 0.003))
    rec = sched.run()
    assert all(r.end_s is not None for r in rec)
    for name in "abc":
        assert [i for n, i in seen if n == name] == [0, 1, 2]


def test_threads_policy_reraises_a_unit_error():
    def boom(u):
        raise RuntimeError("unit failed")
    sched = CadenceScheduler(period_s=0.01, policy="threads")
    sched.admit(Slot("x", [U(0)], boom, lambda u: True))
    with pytest.raises(RuntimeError, match="unit failed"):
        sched.run()


# --- scheduler: slack work after a unit, never inside one -----------------------------------------------------
def slack_slot(name, costs, clock, log, job_cost, phase=0.0):
    """A session whose unit i takes costs[i] s and whose slack job takes job_cost s of clock time."""
    base = slot(name, costs, clock, log, phase=phase)

    def after(u):
        def job(left):
            log.append((name, f"job{u.index}", clock.t, None if left is None else round(left(), 6)))
            clock.t += job_cost
            return {"after": u.index}
        return job
    return dataclasses.replace(base, after_unit=after)


def test_threads_slack_runs_after_each_unit_on_its_thread_never_after_the_last():
    clock, log = FakeClock(), []
    sched = CadenceScheduler(period_s=PERIOD, policy="threads", clock=clock)
    sched.admit(slack_slot("a", [0.2, 0.2, 0.2], clock, log, job_cost=0.3))
    rec = sched.run()
    assert [x[1] for x in log] == [0, "job0", 1, "job1", 2]       # no job after the last unit
    assert [x[3] for x in log if x[1] in ("job0", "job1")] == [0.8, 0.8]     # left: until the next release
    jobs = sched.slack_timings
    assert [(j.after, j.where) for j in jobs] == [(0, "thread"), (1, "thread")]
    assert jobs[0].start_s == pytest.approx(rec[0].end_s) and jobs[0].end_s == pytest.approx(0.5)
    assert jobs[0].next_release_s == 1.0 and jobs[0].overrun_s == 0.0 and jobs[0].output == {"after": 0}
    assert all(not (r.start_s < j.end_s and j.start_s < r.end_s) for r in rec for j in jobs)


def test_threads_slack_has_until_the_next_release_on_the_grid_not_the_next_unit_with_work():
    """Unit 1 carries no work: the job after unit 0 still has only until 1.0 s (0.8 s left), not until unit 2
    at 2.0 s; unit 3 runs 1.5 s, past its own next release at 4.0 s, so the job after it has -0.5 s."""
    clock, log = FakeClock(), []
    sched = CadenceScheduler(period_s=PERIOD, policy="threads", clock=clock)
    sched.admit(slack_slot("a", [0.2, None, 0.2, 1.5, 0.2], clock, log, job_cost=0.0))
    sched.run()
    assert [(x[1], x[3]) for x in log if str(x[1]).startswith("job")] == [("job0", 0.8), ("job2", 0.8),
                                                                           ("job3", -0.5)]


def test_threads_on_join_opens_at_the_phase_before_the_first_unit_and_units_released_meanwhile_start_late():
    """A session that joins at 0.5 s and takes 1.8 s to open (its on_join): its unit 0 (released at 0.5) and
    unit 1 (1.5) start once the open ends at 2.3; unit 2 (2.5) on time. The join is timed; edf refuses it."""
    clock, log = FakeClock(), []

    def open_():
        clock.t += 1.8
        log.append(("open", clock.t))

    sched = CadenceScheduler(period_s=PERIOD, policy="threads", clock=clock)
    sched.admit(dataclasses.replace(slot("a", [0.1, 0.1, 0.1], clock, log, phase=0.5), on_join=open_))
    rec = sched.run()
    assert log[0] == ("open", pytest.approx(2.3)) and sched.join_timings == [(0, 0.5, pytest.approx(2.3))]
    assert [r.start_s for r in rec] == [pytest.approx(2.3), pytest.approx(2.4), pytest.approx(2.5)]
    assert [r.miss for r in rec] == [True, False, False]          # unit 0's deadline was 1.5
    edf = CadenceScheduler(period_s=PERIOD, clock=FakeClock())
    with pytest.raises(ScheduleError, match="on_join: expected a callable under policy 'threads'"):
        edf.admit(dataclasses.replace(slot("b", [0.1], clock), on_join=open_))


def test_edf_slack_waits_for_idle_time_and_a_later_job_supersedes_a_queued_one():
    """b's unit 0 is released while a's job would run: the unit goes first. a's jobs queue until the scheduler is
    idle; the second replaces the first (dropped); an idle job that runs past the next release is an overrun."""
    clock, log = FakeClock(), []
    sched = CadenceScheduler(period_s=PERIOD, clock=clock)
    sched.admit(slack_slot("a", [0.5, 0.5, 0.1], clock, log, job_cost=0.6))
    sched.admit(slack_slot("b", [0.45, 0.45, 0.1], clock, log, job_cost=0.0, phase=0.5))
    rec = sched.run()
    order = [x[1] if x[0] == "a" else f"b{x[1]}" for x in log]
    # 0.0 a0 (to 0.5); 0.5 b0 released: b0 (to 0.95); idle: a's job0 (to 1.55, past a1's release at 1.0)
    assert order[:3] == [0, "b0", "job0"]
    assert log[2][3] == pytest.approx(0.05)                       # left: until a1's release at 1.0
    j0 = next(j for j in sched.slack_timings if j.session == 0 and j.after == 0)
    assert j0.where == "idle" and j0.start_s == pytest.approx(0.95) and j0.overrun_s == pytest.approx(0.55)
    a1 = next(r for r in rec if r.session == 0 and r.position == 1)
    assert a1.start_s == pytest.approx(1.55)                      # the overrun delayed a's next unit
    # from 1.55 units are always waiting: b's job0 is superseded by its job1, and a's job1 and b's job1 are
    # still queued when the last units end (stale): 3 dropped, only a's job0 ran
    assert len(sched.slack_timings) == 1 and sched.slack_dropped == 3


def test_edf_slack_after_runs_at_once_and_counts_against_the_next_unit():
    clock, log = FakeClock(), []
    sched = CadenceScheduler(period_s=PERIOD, clock=clock, slack="after")
    sched.admit(slack_slot("a", [0.5, 0.2], clock, log, job_cost=0.7))
    r0, r1 = sched.run()
    (j,) = sched.slack_timings
    assert j.where == "after_unit" and j.start_s == pytest.approx(0.5) and j.end_s == pytest.approx(1.2)
    assert [x[3] for x in log if x[1] == "job0"] == [0.5]
    assert r1.start_s == pytest.approx(1.2) and j.overrun_s == pytest.approx(0.2)
    with pytest.raises(ScheduleError, match="slack: expected one of"):
        CadenceScheduler(slack="never")


# --- admission and bad input ----------------------------------------------------------------------------
def test_admission_rejects_a_session_that_does_not_fit():
    clock = FakeClock()
    sched = CadenceScheduler(clock=clock, budget_bytes=3 * 2 ** 20)
    sched.admit(slot("a", [0.1], clock, nbytes=2 * 2 ** 20))
    with pytest.raises(AdmissionError, match=r"session 1 \('b'\) needs 1.5 MiB .* only 1.0 MiB of the 3.0 MiB"):
        sched.admit(slot("b", [0.1], clock, nbytes=3 * 2 ** 19))
    assert len(sched.slots) == 1 and sched.admitted_bytes == 2 * 2 ** 20
    sched.admit(slot("c", [0.1], clock, nbytes=2 ** 20))          # exactly what is left fits
    assert len(sched.slots) == 2


@pytest.mark.parametrize("kwargs, match", [
    pytest.param({"policy": "batched"}, "policy: expected one of", id="policy"),
    pytest.param({"period_s": 0}, "period_s: expected a positive", id="period"),
    pytest.param({"budget_bytes": -1}, "budget_bytes", id="budget"),
    pytest.param({"period_s": float("nan")}, "period_s: expected a positive", id="period-nan"),
    pytest.param({"period_s": float("inf")}, "period_s: expected a positive", id="period-inf"),
    pytest.param({"period_s": True}, "period_s: expected a positive", id="period-bool"),
    pytest.param({"budget_bytes": True}, "budget_bytes", id="budget-bool"),
])
def test_bad_scheduler_arguments(kwargs, match):
    with pytest.raises(ScheduleError, match=match):
        CadenceScheduler(**kwargs)


def test_bad_phase_and_session_count():
    clock = FakeClock()
    with pytest.raises(ScheduleError, match="phase_s: expected >= 0"):
        CadenceScheduler(clock=clock).admit(slot("a", [0.1], clock, phase=-0.5))
    with pytest.raises(ScheduleError, match="n: expected an int >= 1"):
        scheduler.staggered_phases(0)
    with pytest.raises(ScheduleError, match="period_s"):
        scheduler.staggered_phases(2, float("nan"))
    sched = CadenceScheduler(clock=clock)
    with pytest.raises(ScheduleError, match="phase_s: expected >= 0"):
        sched.admit(slot("a", [0.1], clock, phase=float("nan")))
    with pytest.raises(ScheduleError, match=r"units\[0\]: expected a unit with .kind"):
        sched.admit(Slot("b", [0], lambda u: None, lambda u: True))
    with pytest.raises(ScheduleError, match="run_unit: expected a callable"):
        sched.admit(Slot("c", [], None, lambda u: True))
    assert sched.slots == []                     # nothing admitted by a rejected slot


@pytest.mark.parametrize("spec, match", [
    pytest.param("fast", "--ar: expected 'none', 'busy:<ms>ms'", id="unknown"),
    pytest.param("busy:30", "busy:<number>ms", id="busy-no-unit"),
    pytest.param("busy:0ms", "must be > 0 ms", id="busy-zero"),
    pytest.param("standin:gpt2", "stand-in 'gpt2': expected one of", id="standin-unknown"),
])
def test_bad_ar_spec(spec, match):
    with pytest.raises(ar_stage.ARSpecError, match=match):
        ar_stage.parse_ar(spec)


def test_ar_specs_parse_and_standin_needs_a_default():
    assert ar_stage.parse_ar("none") == ("none", None)
    assert ar_stage.parse_ar("busy:30ms") == ("busy", 30.0)
    assert ar_stage.parse_ar("busy:0.05s") == ("busy", 50.0)
    assert ar_stage.parse_ar("standin") == ("standin", None)
    with pytest.raises(ar_stage.ARSpecError, match="workload 'moshi' has no default stand-in"):
        ar_stage.make_ar("standin", "moshi", "cpu")


def test_busy_ar_on_cpu_takes_its_time():
    import time
    ar = ar_stage.BusyAR(20, "cpu")
    t0 = time.perf_counter()
    ar.run()
    assert time.perf_counter() - t0 >= 0.02


def test_standin_generates_26_tokens_reduced():
    ar = ar_stage.make_ar("standin", "minicpmo45", "cpu", depth="reduced")
    toks = ar.run(seed=3)
    assert toks.shape == (26,) and toks.dtype == torch.int64
    assert torch.equal(toks, ar.run(seed=3))
    d = ar.describe()
    assert d["config"]["num_hidden_layers"] == 2 and "vllm-omni" in d["source"]


def test_parse_sessions():
    assert duplex_session.parse_sessions("4,1,2,2") == [1, 2, 4]
    with pytest.raises(ValueError, match="--sessions"):
        duplex_session.parse_sessions("1,x")
    with pytest.raises(ValueError, match="--sessions"):
        duplex_session.parse_sessions("0")


def test_max_zero_miss_stops_at_the_first_miss_or_refusal():
    runs = [{"sessions": n, "metrics": {"misses": m}} for n, m in ((1, 0), (2, 0), (4, 3), (8, 0))]
    assert max_zero_miss(runs) == 2
    assert max_zero_miss(runs[:2] + [{"sessions": 4, "refused": "x", "metrics": {}}]) == 2
    assert max_zero_miss([{"sessions": 1, "metrics": {"misses": 1}}]) is None


# --- the search: sessions per GPU, bracketed ---------------------------------------------------------------
def limit(capacity: int, refused_from: int | None = None):
    """A device where `capacity` sessions run clean and more miss; from `refused_from` on none fit."""
    return lambda n: ("refused" if refused_from is not None and n >= refused_from
                      else "clean" if n <= capacity else "missed")


def drive(search, outcome, cost_s=0.0, clock=None) -> list[int]:
    tried = []
    while (n := search.next(lambda n: 60.0)) is not None:
        tried.append(n)
        if clock is not None:
            clock.t += cost_s
        search.record(n, outcome(n), reason="did not fit" if outcome(n) == "refused" else None)
    return tried


@pytest.mark.parametrize("start, capacity, refused_from, tried, bracket", [
    pytest.param(1, 11, None, [1, 2, 4, 8, 16, 12, 10, 11], (11, 12), id="grow-then-bisect"),
    pytest.param(24, 9, None, [24, 12, 6, 9, 10], (9, 10), id="shrink-then-bisect"),
    pytest.param(8, 100, 20, [8, 16, 32, 24, 20, 18, 19], (19, 20), id="refused-is-the-upper-bound"),
    pytest.param(24, 24, None, [24, 48, 36, 30, 27, 25], (24, 25), id="at-the-start"),
])
def test_the_search_brackets_the_largest_zero_miss_count(start, capacity, refused_from, tried, bracket):
    search = duplex_search.SessionSearch(start)
    assert drive(search, limit(capacity, refused_from)) == tried
    b = search.bracket()
    assert (b.lo, b.hi) == bracket and b.exact and search.stopped == "bracketed"
    rec = search.to_dict()
    assert rec["counts"] == tried and rec["bracket"] == {"lo": bracket[0], "hi": bracket[1], "exact": True}
    if refused_from:
        assert {t["sessions"]: t["reason"] for t in rec["tried"] if t["outcome"] == "refused"} == {
            n: "did not fit" for n in tried if n >= refused_from}


def test_the_search_stops_where_one_session_misses_or_at_max_sessions():
    search = duplex_search.SessionSearch(4)
    assert drive(search, limit(0)) == [4, 2, 1]
    assert (search.bracket().lo, search.bracket().hi) == (0, 1) and search.stopped == "one session alone missed"
    capped = duplex_search.SessionSearch(3, max_sessions=10)
    assert drive(capped, limit(50)) == [3, 6, 10]
    b = capped.bracket()
    assert (b.lo, b.hi, b.exact) == (10, None, False) and capped.stopped.startswith("max_sessions")


def test_a_budget_stops_the_search_with_the_bracket_it_has():
    """Each count takes 100 s and is expected to take 60 s: with 250 s, the third would end past the budget."""
    clock = FakeClock()
    search = duplex_search.SessionSearch(16, budget_s=250.0, clock=clock.now)
    assert drive(search, limit(20), cost_s=100.0, clock=clock) == [16, 32]
    b = search.bracket()
    assert (b.lo, b.hi, b.exact) == (16, 32, False)
    assert search.stopped == "budget: 50 s of 250 s left, N=24 is expected to take 60 s"
    first = duplex_search.SessionSearch(2, budget_s=1.0, clock=clock.now)
    assert first.next(lambda n: 1e6) == 2                       # the first count always runs


def test_a_fixed_list_runs_in_order_and_stops_after_a_miss():
    fixed = duplex_search.FixedCounts([16, 1, 8], after_miss=0)
    assert drive(fixed, limit(11)) == [1, 8, 16] and fixed.stopped.startswith("after a miss at N=16")
    assert (fixed.bracket().lo, fixed.bracket().hi) == (8, 16)
    assert drive(duplex_search.FixedCounts([1, 2]), limit(11)) == [1, 2]


@pytest.mark.parametrize("kwargs, match", [
    ({"start": 0}, "start: expected an int >= 1"), ({"start": True}, "start"), ({"start": 2, "grow": 1}, "grow"),
    ({"start": 2, "grow": float("nan")}, "grow"), ({"start": 5, "max_sessions": 4}, "above max_sessions"),
    ({"start": 2, "budget_s": 0}, "budget_s"),
])
def test_bad_search_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        duplex_search.SessionSearch(**kwargs)
    with pytest.raises(ValueError, match="outcome"):
        duplex_search.SessionSearch(1).record(1, "fine")


# --- duplex records: the unit table -------------------------------------------------------------------------
WL = "wl_a"


def units(hashes: list[str], session: int = 0) -> list[dict]:
    return [{"session": session, "index": i, "kind": "SPEAK", "miss": False,
             "sha256_f32": f"{h}-f32", "sha256_pcm16": f"{h}-pcm16"} for i, h in enumerate(hashes)]


def part(mode: str, hashes=("u0", "u1", "u2"), *, period_s=1.0, verdict="VALID", reasons=(), wl_reasons=()):
    """A finished (or PARTIAL) duplex record of one mode: a one-session run and a two-session run."""
    solo = units(list(hashes))
    runs = [{"mode": mode, "sessions": 1, "metrics": {"misses": 0, "units_run": 3}, "units": solo},
            {"mode": mode, "sessions": 2, "metrics": {"misses": 0, "units_run": 6},
             "units": solo + units(list(hashes), session=1)}]
    return {"schema": records.DUPLEX_SCHEMA, "provenance": {"host": f"gpu-{mode}"},
            "parameters": {"period_s": period_s, "ar": "none", "seconds": 60.0, "modes": [mode],
                           "sessions": {mode: [1, 2]}, "policy": {mode: "edf" if mode == "stock" else "threads"}},
            "workloads": {WL: {"workload": WL, "architecture": "flow_hift",
                               "modes": {mode: {"runs": runs, "max_zero_miss_sessions": 2}},
                               "reference": {mode: {"0": len(hashes)}}, "invalid_reasons": list(wl_reasons)}},
            "verdict": verdict, "invalid_reasons": list(reasons)}


def test_unit_table_gives_the_rows_back_and_stores_each_hash_once():
    """Each run's units as one table: keys once per run, each distinct sha256 once per record (a session of a
    multi-session run repeats its one-session run's hashes). Unpacking gives the rows back; a key a row
    lacked reads null."""
    rec = part("cadence")
    rec["workloads"][WL]["modes"]["cadence"]["runs"][0]["units"].append(
        {"session": 0, "index": 3, "kind": "LISTEN", "miss": False})              # no hashes on a LISTEN unit
    packed = records.pack_units(rec)
    assert packed is not rec and rec["workloads"][WL]["modes"]["cadence"]["runs"][0]["units"][0]["sha256_f32"]
    assert sorted(packed["unit_hashes"]) == sorted({f"u{i}-{k}" for i in range(3) for k in ("f32", "pcm16")})
    table = packed["workloads"][WL]["modes"]["cadence"]["runs"][1]["units"]
    assert table["columns"][:2] == ["session", "index"] and set(table["interned"]) == set(records.INTERNED_COLUMNS)
    assert len(json.dumps(packed)) < len(json.dumps(rec))
    back = records.unpack_units(json.loads(json.dumps(packed)))
    assert "unit_hashes" not in back
    expect = json.loads(json.dumps(rec))
    expect["workloads"][WL]["modes"]["cadence"]["runs"][0]["units"][3].update(sha256_f32=None, sha256_pcm16=None)
    assert back == expect
    assert records.unpack_units(json.loads(json.dumps(rec))) == rec           # a list (older records) is kept
    assert records.pack_units(packed) == packed                               # a table is kept


def _set_hash(t: dict, value) -> None:
    t["rows"][0][t["columns"].index("sha256_f32")] = value


@pytest.mark.parametrize("mutate, match", [
    (lambda t: t["rows"][0].pop(), "one value per column"),
    (lambda t: t.update(rows={}), "one value per column"),
    (lambda t: _set_hash(t, 99), "position in unit_hashes"),
    (lambda t: _set_hash(t, "u0-f32"), "position in unit_hashes"),
    (lambda t: _set_hash(t, True), "position in unit_hashes"),           # a bool is no position
    (lambda t: t.pop("interned"), "'interned'"),
    (lambda t: t.update(interned="sha256_f32"), "'interned'"),
    (lambda t: t.update(interned=["index"]), "'interned'"),
    (lambda t: t["columns"].__setitem__(1, "session"), "distinct strings"),
    (lambda t: t.update(columns="session"), "distinct strings"),
])
def test_a_mis_shaped_unit_table_is_an_error_naming_the_run(mutate, match):
    packed = records.pack_units(part("stock"))
    mutate(packed["workloads"][WL]["modes"]["stock"]["runs"][1]["units"])
    with pytest.raises(ValueError, match=match) as exc:
        records.unpack_units(json.loads(json.dumps(packed)))
    assert "run N=2 stock" in str(exc.value)


@pytest.mark.parametrize("hashes", ["abc", {"0": "x"}, 3, [1, 2]])
def test_unit_hashes_that_are_not_a_list_of_strings_are_an_error(hashes):
    packed = {**records.pack_units(part("stock")), "unit_hashes": hashes}
    with pytest.raises(ValueError, match="'unit_hashes': expected a list of sha256 strings"):
        records.unpack_units(json.loads(json.dumps(packed)))




# --- records: schemas and codes ---------------------------------------------------------------------------
def test_older_duplex_schemas_stay_readable_and_capture_reasons_have_their_code():
    assert records.DUPLEX_SCHEMA == "duplexcadence.duplex/3"
    assert set(records.DUPLEX_READ_SCHEMAS) == {"duplexcadence.duplex/1", "duplexcadence.duplex/2", "duplexcadence.duplex/3"}
    old = {**part("cadence"), "schema": "duplexcadence.duplex/2"}
    assert records.unpack_units(json.loads(json.dumps(records.pack_units(old)))) == old
    reasons = [f"cadence N=4: 2 {records.CAPTURE_IN_UNIT}", "cadence N=4 session 1: unit 3 differs from the same "
               "session run alone", records.DIRTY_TREE]
    assert records.invalid_codes(reasons) == ["capture_in_timed_unit", "mismatch", "dirty_tree"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: per-session streams and busy kernels")
def test_busy_ar_on_cuda_occupies_the_stream():
    ar = ar_stage.BusyAR(20, "cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ar.run()
    start.record()
    ar.run()
    end.record()
    end.synchronize()
    assert 15 <= start.elapsed_time(end) <= 40
