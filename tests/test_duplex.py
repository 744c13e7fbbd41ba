"""The duplex harness: the cadence scheduler, AR stages, duplex records (their unit table), and
suite.measure.duplex on the fake adapter of tests/fakes.py (session protocol): concurrent sessions give the
bytes of each alone, admission, graphs prepared for the voice or (oracle) from the script, the tail lock for
sessions that are not concurrent, warm-up by turn_state, the CLI. GPU tests skip on the CPU with the reason."""
from __future__ import annotations

import dataclasses
import json
import threading

import pytest
import torch

import fakes
import workloads
from suite import records
from suite.measure import ar_stage, duplex, duplex_session, scheduler
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


def test_bisection_finds_the_exact_largest_zero_miss_count():
    capacity = 11                                  # a device where 11 sessions fit and 12 miss
    runs = [{"sessions": n, "metrics": {"misses": int(n > capacity)}} for n in (1, 8, 16)]
    tried = []
    while (n := duplex_session.next_bisect(runs)) is not None:
        tried.append(n)
        runs.append({"sessions": n, "metrics": {"misses": int(n > capacity)}})
    assert tried == [12, 10, 11] and max_zero_miss(runs) == 11
    assert duplex_session.next_bisect([{"sessions": 1, "metrics": {"misses": 2}}]) is None


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




# --- the harness on the fake adapter ------------------------------------------------------------------------
@pytest.fixture
def fake(monkeypatch):
    return fakes.register(monkeypatch)


def _model(fake, **spec):
    return fake.build_model(spec, device="cpu", depth="reduced", seed=0)


def _run(wl, fake, mode, n, *, model=None, variants=1, seconds=8, policy="edf", clock=None, budget=None,
         prepare="voice", pool=None):
    model = model or _model(fake, **wl.spec)
    return duplex.run_sessions(wl, mode, n, model=model, adapter=fake, spec=wl.spec, ar=ar_stage.NoAR(),
                               device="cpu", seconds=seconds, variants=variants, clock=clock, policy=policy,
                               budget_bytes=budget, progress=False, prepare=prepare, pool=pool)


@pytest.mark.parametrize("mode, policy", [("cadence", "edf"), ("stock", "edf"), ("cadence", "threads")])
def test_concurrent_sessions_give_the_bytes_of_each_session_alone(tmp_path, fake, mode, policy):
    wl = fakes.file_workload(tmp_path, turns=2, speak_per_turn=3, listen_per_turn=1)
    model, seconds = _model(fake), 8 if policy == "edf" else 3
    refs = {v: duplex.session_hashes(duplex.solo_variant(wl, mode, v, model, fake, {}, ar_stage.NoAR(), "cpu", seconds,
                                                         clock=FakeClock()))[0] for v in range(2)}
    assert refs[0] != refs[1]                       # the variants really carry different data
    run = _run(wl, fake, mode, 2, model=model, variants=2, clock=FakeClock() if policy == "edf" else None,
               policy=policy, seconds=seconds)
    assert duplex.check_against_reference(run, refs, 2) == []
    assert len(duplex.session_hashes(run)) == 2 and [a["phase_s"] for a in run["admission"]] == [0, 0.5]
    bad = json.loads(json.dumps(run))               # negative control: a session whose bytes differ
    u = next(u for u in bad["units"] if u["session"] == 1 and u["index"] == 1)
    assert u["kind"] == "SPEAK"
    u["sha256_f32"] = "0" * 64
    assert duplex.check_against_reference(bad, refs, 2) == [
        f"{mode} N=2 session 1: unit 1 differs from the same session run alone"]
    assert model["open"] == []                      # every session closed (pooled or not)


def test_run_records_speak_time_misses_admission_and_the_cadence_counters(tmp_path, fake):
    wl = fakes.file_workload(tmp_path, turns=2, speak_per_turn=3, listen_per_turn=1)
    run = _run(wl, fake, "cadence", 2, clock=FakeClock())
    m = run["metrics"]
    assert m["units_run"] == 12 and m["speak_units"] == 12 and m["misses"] == 0
    for u in (u for u in run["units"] if u["start_ms"] is not None):
        assert u["lateness_ms"] == pytest.approx(u["end_ms"] - u["deadline_ms"])
        assert (u["speak_ms"] is None) == (u["kind"] != "SPEAK")
    assert m["speak_frac_mean"] == pytest.approx(m["speak_ms_mean"] / 1000)
    a = run["admission"][0]
    assert a["footprint_how"].startswith("arena_bytes_reserved 4096 + graph_bytes 3072 + other session tensors")
    assert a["prepared"]["voice"]["captures"] == len(fakes.VOICE) and a["prepared"]["oracle"] is None
    # the cadence replays what the voice prepared; the turns' final 10-token units were not: eager, counted
    assert run["captures_during_cadence"] == 0 and run["eager_fallbacks_during_cadence"] == 4
    assert [c["replays"] for c in run["cadence_counters"]] == [4, 4]
    with pytest.raises(AdmissionError, match="session 1"):
        _run(wl, fake, "cadence", 2, clock=FakeClock(), budget=a["footprint_bytes"] * 3 // 2)


def test_oracle_graphs_come_from_the_sessions_own_script_and_are_labelled(tmp_path, fake):
    """With --prepare oracle a session's graphs also cover what its script will meet (a copy of its clocks
    walked over the units): nothing runs eagerly during the cadence. The record says so."""
    wl = fakes.file_workload(tmp_path, turns=2, speak_per_turn=3, listen_per_turn=1)
    run = _run(wl, fake, "cadence", 1, clock=FakeClock(), prepare="oracle")
    assert run["prepare"] == "oracle" and run["admission"][0]["prepared"]["oracle"]["captures"] > 0
    assert run["eager_fallbacks_during_cadence"] == 0 and run["captures_during_cadence"] == 0
    voice = _run(wl, fake, "cadence", 1, clock=FakeClock())
    assert voice["prepare"] == "voice" and voice["eager_fallbacks_during_cadence"] > 0
    assert duplex.session_hashes(voice) == duplex.session_hashes(run)     # the bytes do not depend on it
    stock = _run(wl, fake, "stock", 1, clock=FakeClock(), prepare="oracle")
    assert stock["prepare"] is None                # stock captures nothing: never labelled


def test_sessions_that_are_not_concurrent_hold_the_model_lock_under_threads(tmp_path, fake):
    wl = fakes.file_workload(tmp_path, turns=1, speak_per_turn=3, listen_per_turn=0, session="carried")
    run = _run(wl, fake, "cadence", 2, seconds=3, policy="threads")
    assert [a["tail_lock"] for a in run["admission"]] == [True, True]
    wl = fakes.file_workload(tmp_path, turns=1, speak_per_turn=3, listen_per_turn=0)
    run = _run(wl, fake, "cadence", 2, seconds=3, policy="threads")
    assert [a["tail_lock"] for a in run["admission"]] == [False, False]


def test_a_session_refused_on_a_shared_instance_gets_its_own_copy(tmp_path, fake):
    wl = fakes.file_workload(tmp_path, turns=1, speak_per_turn=3, listen_per_turn=0, exclusive=True)
    model = _model(fake, **wl.spec)
    run = _run(wl, fake, "stock", 2, model=model, seconds=3, clock=FakeClock())
    hows = [a["footprint_how"] for a in run["admission"]]
    assert hows == ["session tensors (shared model excluded)", "model instance + session tensors"]
    ref = duplex.session_hashes(run)
    assert ref[0] == ref[1]


def test_warm_up_follows_what_a_turn_does_to_the_state(tmp_path, fake):
    """A "reset" session gets a warm-up turn (its next start_turn undoes it); a "carried" one none: a unit
    would change what it carries."""
    for kind, warm_turns in (("reset", 1), ("carried", 0)):
        wl = fakes.file_workload(tmp_path, turns=2, speak_per_turn=3, listen_per_turn=0, session=kind)
        run = _run(wl, fake, "cadence", 1, seconds=6, clock=FakeClock())
        assert run["session_stats"][0]["detail"]["turns"] == warm_turns + 2, kind


def test_a_warm_up_that_raises_closes_the_session_it_built(tmp_path, fake, monkeypatch):
    wl = fakes.file_workload(tmp_path, turns=1, speak_per_turn=3, listen_per_turn=0)
    model = _model(fake)

    def boom(self, units, body=duplex_session.WARMUP_TURN_UNITS):
        raise RuntimeError("warm-up failed")
    monkeypatch.setattr(duplex_session.Driver, "warm_up", boom)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        _run(wl, fake, "cadence", 1, model=model, seconds=3)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        duplex.solo_variant(wl, "cadence", 0, model, fake, {}, ar_stage.NoAR(), "cpu", 3, clock=FakeClock())
    assert model["open"] == []


def test_progress_lines_count_the_units_done(tmp_path, fake, monkeypatch, capsys):
    monkeypatch.setattr(duplex_session, "PROGRESS_S", 0.0)
    wl = fakes.file_workload(tmp_path, turns=1, speak_per_turn=3, listen_per_turn=0)
    model = _model(fake)
    duplex.run_sessions(wl, "cadence", 1, model=model, adapter=fake, spec={}, ar=ar_stage.NoAR(), device="cpu",
                        seconds=3, clock=FakeClock(), progress=True)
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if "units done" in line]
    assert lines[-1] == "fake cadence N=1: 3/3 units done, 0 of 3 s, 0 missed"


def test_cli_end_to_end_writes_a_compact_record(tmp_path, fake, monkeypatch, capsys):
    wl = fakes.file_workload(tmp_path, turns=2, speak_per_turn=3, listen_per_turn=1)
    monkeypatch.setattr(workloads, "get", lambda name: wl)
    monkeypatch.setattr(workloads, "names", lambda: ["fake"])
    out = tmp_path / "out"
    rc = duplex.main(["--workload", "fake", "--device", "cpu", "--ar", "busy:1ms", "--sessions", "1,2",
                      "--seconds", "4", "--out", str(out)])
    text = (out / "duplex.json").read_text()
    rec = json.loads(text)
    assert "\n" not in text and rec["schema"] == records.DUPLEX_SCHEMA
    runs = rec["workloads"]["fake"]["modes"]["cadence"]["runs"]
    assert isinstance(runs[0]["units"], dict) and rec["unit_hashes"]       # one table per run, hashes once
    rows = records.read_duplex(out / "duplex.json")["workloads"]["fake"]["modes"]["cadence"]["runs"][0]["units"]
    speak = [u for u in rows if u["kind"] == "SPEAK" and u["start_ms"] is not None]
    assert speak and all(len(u["sha256_f32"]) == 64 and len(u["sha256_pcm16"]) == 64 for u in speak)
    assert rc == duplex.EXIT_INVALID and rec["verdict"] == "INVALID"      # 4 s < 60 s (and maybe a dirty tree)
    assert any("< 60 s" in r for r in rec["invalid_reasons"])
    w = rec["workloads"]["fake"]
    assert {m: v["units"] for m, v in w["process_warm_up"].items()} == {"stock": 3, "cadence": 3}
    assert rec["parameters"]["policy"] == {"stock": "edf", "cadence": "edf"} and rec["parameters"]["prepare"] == "voice"
    assert sorted(p.name for p in out.iterdir()) == ["duplex.json"]       # plots are the report's
    printed = capsys.readouterr().out
    assert "fake cadence: max sessions with zero misses = 2" in printed and "N=  2" in printed


def test_cli_bad_ar_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="--ar: a busy time is written"):
        duplex.main(["--ar", "busy:soon", "--out", str(tmp_path)])


def test_cli_out_that_is_a_file_exits_2_before_any_work(tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(SystemExit, match="--out") as exc:
        duplex.main(["--out", str(f)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and f.read_text() == "x"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cli_cuda_without_cuda_exits_2_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        duplex.main(["--device", "cuda", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m suite.measure.duplex: error: --device")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags,match", [
    (["--seconds", "nan"], "--seconds"),
    (["--workload", "nosuch"], "--workload"),
    (["--steps", "0"], "--steps"),
    (["--device", "tpu"], "--device"),
    (["--budget-mib", "-1"], "--budget-mib"),
    (["--after-miss", "-1"], "--after-miss"),
    (["--stock-sessions", "x"], "--stock-sessions"),
    (["--modes", "bogus"], "--modes"),
    (["--modes", "stock,stock"], "--modes"),
    (["--stock-policy", "bogus"], "--stock-policy"),
    (["--policy", "bogus"], "--policy"),
    (["--prepare", "script"], "--prepare"),
    (["--seconds", "abc"], "--seconds"),
])
def test_cli_bad_flag_exits_2_naming_the_flag_before_any_work(tmp_path, capsys, flags, match):
    with pytest.raises(SystemExit, match=match) as exc:
        duplex.main([*flags, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("seconds", ["1", "3"])
def test_cli_seconds_before_the_first_speak_unit_exits_2_before_any_work(tmp_path, capsys, seconds):
    # minicpmo45's script opens with 3 LISTEN units: a window without a SPEAK unit would measure nothing
    with pytest.raises(SystemExit, match="--seconds") as exc:
        duplex.main(["--workload", "minicpmo45", "--seconds", seconds, "--sessions", "1", "--depth", "reduced",
                     "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seconds" in err[0] and "SPEAK" in err[0]
    assert not (tmp_path / "out").exists()


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: one stream per session, device timing")
@pytest.mark.parametrize("policy", ["edf", "threads"])
def test_cuda_sessions_on_streams_give_the_bytes_of_each_session_alone(tmp_path, fake, policy):
    wl = fakes.file_workload(tmp_path, turns=2, speak_per_turn=3, listen_per_turn=1)
    model = fake.build_model({}, device="cuda", depth="reduced", seed=0)
    refs = {v: duplex.session_hashes(duplex.solo_variant(wl, "cadence", v, model, fake, {}, ar_stage.NoAR(), "cuda",
                                                         4, clock=FakeClock()))[0] for v in range(2)}
    run = duplex.run_sessions(wl, "cadence", 4, model=model, adapter=fake, spec={},
                              ar=ar_stage.make_ar("busy:5ms", "fake", "cuda"), device="cuda", seconds=4,
                              policy=policy, variants=2, progress=False)
    assert duplex.check_against_reference(run, refs, 2) == []
    assert all(u["device_ms"] is not None for u in run["units"] if u["start_ms"] is not None)
