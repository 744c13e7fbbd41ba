"""suite.measure.duplex on the fake adapter of tests/fakes.py (session protocol): sessions with their own real
scripts joining during the run give the bytes of each alone; the slack captures what units met and what the
clocks predict, never inside a timed unit and never from a unit not yet run (the oracle does, labelled);
admission refuses a count that does not fit before building it; the search over a fake device's capacity; the
tail lock; warm-up on synthetic payloads; rejected units; the CLI. GPU tests skip on the CPU with the reason."""
from __future__ import annotations

import json

import pytest
import torch

import fakes
import workloads
from duplexcadence.clocks import signature
from duplexcadence.errors import InputError
from suite import records
from suite.measure import ar_stage, duplex, duplex_run, duplex_session, scheduler, slack
from suite.measure.duplex_run import Traffic
from suite.measure.scheduler import AdmissionError
from suite.report import figures
from test_duplex import FakeClock

SHORT = Traffic(seconds=6.0, seed=4, join_within_s=1.0)   # sessions 0-2 of seed 4 speak in their first seconds


@pytest.fixture
def fake(monkeypatch):
    return fakes.register(monkeypatch)


def _model(fake, **spec):
    return fake.build_model(spec, device="cpu", depth="reduced", seed=0)


def _run(wl, fake, mode, n, *, model=None, traffic=SHORT, policy="edf", clock=None, budget=None, prepare="voice",
         slack="idle"):
    model = model or _model(fake, **wl.spec)
    plans = duplex_run.plans(wl, n, traffic)
    run = duplex_run.run_sessions(wl, mode, plans, model=model, adapter=fake, spec=wl.spec, ar=ar_stage.NoAR(),
                                  device="cpu", clock=clock, policy=policy, budget_bytes=budget, progress=False,
                                  prepare=prepare, slack=slack)
    return run, plans, model


def _refs(wl, fake, mode, plans, model, prepare="voice"):
    return {p.key: duplex_run.reference(wl, mode, p, model, fake, wl.spec, ar_stage.NoAR(), "cpu", prepare)
            for p in plans}


# --- traffic: every session its own script ------------------------------------------------------------------
def test_each_session_gets_its_own_window_and_joins_at_its_own_time(tmp_path):
    wl = fakes.workload()
    plans = duplex_run.plans(wl, 5, Traffic(seconds=60.0, seed=2, join_within_s=20.0))
    assert len({p.source["window"] for p in plans}) == 5 and plans[0].phase_s == 0.0
    assert all(p.phase_s == p.source["join_s"] and 0 <= p.phase_s < 20 for p in plans)
    assert len({round(p.phase_s % 1, 6) for p in plans[1:]}) == 4        # each at its own offset into the period
    assert all(len(p.units) == 60 for p in plans) and [p.key for p in plans] == list(range(5))
    assert duplex_run.plans(wl, 3, Traffic(seconds=60.0, seed=2, join_within_s=20.0)) == plans[:3]   # a prefix
    short = duplex_run.plans(wl, 2, Traffic(seconds=7.0, seed=2, join_within_s=20.0))
    assert [u.index for u in short[1].units] == list(range(7)) and short[1].units == plans[1].units[:7]
    committed = duplex_run.plans(fakes.file_workload(tmp_path), 3, Traffic("committed", 4.0, variants=2))
    assert [p.key for p in committed] == [0, 1, 0] and [p.phase_s for p in committed] == pytest.approx([0, 1 / 3, 2 / 3])


@pytest.mark.parametrize("mode, policy", [("cadence", "edf"), ("stock", "edf"), ("cadence", "threads")])
def test_concurrent_sessions_give_the_bytes_of_each_session_alone(fake, mode, policy):
    wl = fakes.workload()
    run, plans, model = _run(wl, fake, mode, 3, policy=policy, clock=FakeClock() if policy == "edf" else None,
                             traffic=SHORT if policy == "edf" else Traffic(seconds=3.0, seed=4, join_within_s=0.5))
    refs = _refs(wl, fake, mode, plans, model)
    assert len({json.dumps(r) for r in refs.values()}) == 3          # the sessions really carry different data
    keys = [p.key for p in plans]
    assert duplex_session.check_bytes(run, refs, keys) == {"checked": 3, "unchecked": [], "mismatches": []}
    assert [a["window"] for a in run["admission"]] == [p.source["window"] for p in plans]
    bad = json.loads(json.dumps(run))               # negative control: a session whose bytes differ
    u = next(u for u in bad["units"] if u["session"] == 1 and u.get("sha256_f32"))
    u["sha256_f32"] = "0" * 64
    assert duplex_session.check_bytes(bad, refs, keys)["mismatches"] == [
        f"{mode} N=3 session 1: unit {u['index']} differs from the same session run alone"]
    assert duplex_session.check_bytes(run, {0: refs[0]}, keys)["unchecked"] == [1, 2]
    assert model["open"] == []                      # every session closed


def test_the_slack_captures_what_units_met_and_the_clocks_predict_never_inside_a_unit(fake):
    """The fake's clocks give one signature per unit; prepare(None) holds only full non-final units (VOICE). A
    unit that meets another signature runs eagerly (counted), its signature is captured in the slack after it,
    and its next occurrence replays. No capture happens inside a unit; every slack job ends before the
    session's next unit starts."""
    wl = fakes.workload()
    run, plans, _ = _run(wl, fake, "cadence", 3, clock=FakeClock())
    assert run["captures_inside_timed_units"] == 0 and run["slack_overlapping_timed_units"] == 0
    assert run["captures_during_cadence"] > 0 and run["eager_fallbacks_during_cadence"] > 0
    for s, cap in enumerate(run["capture"]):
        assert cap["captures_inside_timed_units"] == 0 and cap["graphs_end"] == len(fakes.VOICE) + cap[
            "captures_during_cadence"]
        assert cap["eager_fallbacks"] == run["cadence_counters"][s]["eager_fallbacks"]
    ran = [u for u in run["units"] if u["start_ms"] is not None]
    assert sum(u["eager_fallbacks"] for u in ran) == run["eager_fallbacks_during_cadence"]
    assert all(u["captures_in_unit"] == 0 for u in ran)
    jobs = [u for u in ran if "slack_ms" in u]
    assert jobs and all(u["slack_where"] == "idle" and u["slack_start_ms"] >= u["end_ms"] for u in jobs)
    assert run["slack"] == "idle" and run["graph_bytes_end_total"] == 1024 * run["graphs_end_total"]
    assert run["graph_bytes_per_model"] == {"shared": run["graph_bytes_end_total"]}
    assert run["slack_jobs_overrun"] == 0 and run["slack_signatures_deferred"] == 0    # fake time: jobs take none
    assert all(u["slack_deferred"] == 0 for u in jobs)
    after = _run(wl, fake, "cadence", 3, clock=FakeClock(), slack="after")[0]
    assert {u["slack_where"] for u in after["units"] if "slack_where" in u} == {"after_unit"}


def _allowed_sigs(events):
    """Walk one fake session's events in order; yield (prepared signatures, what a server could know then): the
    signatures of units already spoken, and the next full unit's from the clocks (computed here, not by the
    harness: history min(pos, 2) in the turn, a new turn after a final unit)."""
    spoken, pos, turn_open = set(), 0, False
    for kind, what in events:
        if kind == "start":
            pos, turn_open = 0, True
        elif kind == "speak":
            spoken.add(what)
            pos += 1
            turn_open = not what.get("last")
        elif what is not None:            # a prepare of signatures (None: the voice, before the cadence)
            nxt = signature("step", fakes.MAX_TOKENS, {"history": min(pos, 2) if turn_open else 0}, last=False)
            yield what, spoken | {nxt}


@pytest.mark.parametrize("prepare, foreknowledge", [("voice", False), ("oracle", True)])
def test_nothing_the_slack_captures_comes_from_a_unit_not_yet_run(fake, monkeypatch, prepare, foreknowledge):
    """Every signature the harness asks a cadence session to capture is one its units already met or the next
    full unit the clocks predict. The oracle (labelled) asks for the script's future before the first unit: the
    same check catches it."""
    log: dict = {}
    real_start, real_speak, real_prepare = (fakes.FakeSession.start_turn, fakes.FakeSession.speak,
                                            fakes.FakeSession.prepare)

    def start_turn(self):
        log.setdefault(id(self), []).append(("start", None))
        return real_start(self)

    def speak(self, tokens, *, final=False):
        sig = self.clock.copy().unit(len(tokens), final)[0]
        out = real_speak(self, tokens, final=final)
        log.setdefault(id(self), []).append(("speak", sig))
        return out

    def prep(self, signatures=None):
        log.setdefault(id(self), []).append(("prepare", None if signatures is None else list(signatures)))
        return real_prepare(self, signatures)

    monkeypatch.setattr(fakes.FakeSession, "start_turn", start_turn)
    monkeypatch.setattr(fakes.FakeSession, "speak", speak)
    monkeypatch.setattr(fakes.FakeSession, "prepare", prep)
    run = _run(fakes.workload(), fake, "cadence", 3, clock=FakeClock(), prepare=prepare)[0]
    assert run["prepare"] == prepare
    early = [s for events in log.values() for sigs, known in _allowed_sigs(events) for s in sigs if s not in known]
    assert bool(early) == foreknowledge
    assert sum(kind == "prepare" and what is not None for events in log.values() for kind, what in events) > 3


def test_a_capture_inside_a_timed_unit_makes_the_record_invalid(fake, tmp_path, monkeypatch):
    """A session that captures inside speak (inline) is caught by its counters: the run and the record say so,
    with the code capture_in_timed_unit."""
    wl = fakes.workload(inline=True)
    run = _run(wl, fake, "cadence", 2, clock=FakeClock())[0]
    assert run["captures_inside_timed_units"] > 0
    assert run["captures_inside_timed_units"] == sum(u.get("captures_in_unit", 0) for u in run["units"])
    out = duplex.measure_workload(wl, device="cpu", ar_spec="none", modes=("cadence",), traffic=SHORT, counts={
        "cadence": [2]}, progress=False, clock=FakeClock)
    (reason,) = out["invalid_reasons"]
    assert reason.startswith("cadence N=2: ") and records.invalid_codes([reason]) == ["capture_in_timed_unit"]


def test_run_records_footprints_admission_and_the_stock_figures(fake):
    run = _run(fakes.workload(), fake, "cadence", 2, clock=FakeClock())[0]
    a = run["admission"][0]
    assert a["footprint_how"].startswith("arena_bytes_reserved 4096 + graph_bytes 3072 + other session tensors")
    assert a["prepared"]["voice"]["captures"] == len(fakes.VOICE) and a["prepared"]["oracle"] is None
    assert a["join_s"] == 0.0 and a["window"].startswith("voxconverse:") and a["build_s"] >= 0
    cap = run["capture"][0]
    assert cap["footprint_end_bytes"] == 4096 + cap["graph_bytes_end"] and cap["arena_bytes_reserved"] == 4096
    m = run["metrics"]
    for u in (u for u in run["units"] if u["start_ms"] is not None):
        assert u["lateness_ms"] == pytest.approx(u["end_ms"] - u["deadline_ms"])
    assert m["speak_frac_mean"] == pytest.approx(m["speak_ms_mean"] / 1000) and m["rejected_units"] == 0
    with pytest.raises(AdmissionError, match="session 1"):
        _run(fakes.workload(), fake, "cadence", 2, clock=FakeClock(), budget=a["footprint_bytes"] * 3 // 2)
    stock = _run(fakes.workload(), fake, "stock", 2, clock=FakeClock())[0]
    assert stock["prepare"] is None and stock["slack_jobs"] == 0 and stock["captures_during_cadence"] == 0


def test_a_unit_the_session_refuses_is_recorded_and_the_session_goes_on(fake, monkeypatch):
    real = fakes.FakeSession.speak

    def picky(self, tokens, *, final=False):
        if final and len(tokens) == 0:
            raise InputError("tokens: an empty final unit")
        return real(self, tokens, final=final)
    monkeypatch.setattr(fakes.FakeSession, "speak", picky)
    run, plans, model = _run(fakes.workload(), fake, "cadence", 3, clock=FakeClock())
    rejected = [u for u in run["units"] if u.get("rejected")]
    assert rejected and all(u["rejected"] == "InputError: tokens: an empty final unit" for u in rejected)
    assert run["metrics"]["rejected_units"] == len(rejected) and all(u["speak_ms"] is None for u in rejected)
    refs = _refs(fakes.workload(), fake, "cadence", plans, model)
    assert duplex_session.check_bytes(run, refs, [p.key for p in plans])["mismatches"] == []


def test_sessions_that_are_not_concurrent_hold_the_model_lock_under_threads(fake):
    quick = Traffic(seconds=2.0, seed=4, join_within_s=0.2)
    run = _run(fakes.workload(session="carried"), fake, "cadence", 2, traffic=quick, policy="threads")[0]
    assert [a["tail_lock"] for a in run["admission"]] == [True, True] and run["slack"] == "thread"
    run = _run(fakes.workload(), fake, "cadence", 2, traffic=quick, policy="threads")[0]
    assert [a["tail_lock"] for a in run["admission"]] == [False, False]


def test_a_session_refused_on_a_shared_instance_gets_its_own_copy(fake):
    wl = fakes.workload(exclusive=True)
    run = _run(wl, fake, "stock", 2, clock=FakeClock())[0]
    hows = [a["footprint_how"] for a in run["admission"]]
    assert hows == ["session tensors (shared model excluded)", "model instance + session tensors"]
    assert list(run["graph_bytes_per_model"]) == ["shared", "own instance of session 1"]


def test_warm_up_speaks_synthetic_payloads_by_what_a_turn_does_to_the_state(fake, monkeypatch):
    """A "reset" session gets a warm-up turn of full synthetic units (its next start_turn undoes it), a "carried"
    one none: a unit would change what it carries. No warm-up payload comes from the session's script."""
    spoken = []
    real = fakes.FakeSession.speak
    monkeypatch.setattr(fakes.FakeSession, "speak", lambda self, t, *, final=False: (
        spoken.append(tuple(t)), real(self, t, final=final))[1])
    for kind, warm_turns in (("reset", 1), ("carried", 0)):
        spoken.clear()
        run, plans, _ = _run(fakes.workload(session=kind), fake, "cadence", 1, clock=FakeClock())
        script = {tuple(u.payload) for u in plans[0].units if u.payload is not None}
        turns = len({u.turn for u in plans[0].units if u.kind == "SPEAK"})
        assert run["session_stats"][0]["detail"]["turns"] == warm_turns + turns, kind
        warm = spoken[:duplex_session.WARMUP_TURN_UNITS * warm_turns]
        assert all(len(t) == fakes.MAX_TOKENS and t not in script for t in warm), kind


def test_a_warm_up_that_raises_closes_the_session_it_built(fake, monkeypatch):
    model = _model(fake)

    def boom(self, fmt, body=None):
        raise RuntimeError("warm-up failed")
    monkeypatch.setattr(duplex_session.Driver, "warm_up", boom)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        _run(fakes.workload(), fake, "cadence", 1, model=model)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        duplex_run.reference(fakes.workload(), "cadence", duplex_run.plans(fakes.workload(), 1, SHORT)[0], model, fake,
                             {}, ar_stage.NoAR(), "cpu")
    assert model["open"] == []


# --- the search over a fake device ---------------------------------------------------------------------------
def _capacity(monkeypatch, capacity):
    """A fake device that keeps up with `capacity` open sessions of a model: with more, every unit takes 1.5 s
    of the run's (fake) clock, a miss."""
    clocks = []
    real = fakes.FakeSession.speak

    def slow(self, tokens, *, final=False):
        if len(self.model["open"]) > capacity and clocks:
            clocks[-1].t += 1.5
        return real(self, tokens, final=final)
    monkeypatch.setattr(fakes.FakeSession, "speak", slow)

    def new_clock():
        clocks.append(FakeClock())
        return clocks[-1]
    return new_clock


def test_the_search_finds_a_fake_devices_capacity_and_records_the_bracket(fake, monkeypatch):
    out = duplex.measure_workload(fakes.workload(), device="cpu", ar_spec="none", modes=("cadence",),
                                  traffic=SHORT, start=1, progress=False, clock=_capacity(monkeypatch, 5),
                                  reference_sessions=2)
    m = out["modes"]["cadence"]
    assert m["search"]["counts"] == [1, 2, 4, 8, 6, 5] and m["search"]["stopped"] == "bracketed"
    assert m["search"]["bracket"] == {"lo": 5, "hi": 6, "exact": True} and m["max_zero_miss_sessions"] == 5
    assert [r["metrics"]["misses"] > 0 for r in m["runs"]] == [False, False, False, True, True, False]
    assert m["references"]["sessions"] == 2 and len(m["references"]["first_session_units"]) > 0
    assert all(r["bytes"]["checked"] == min(2, r["sessions"]) for r in m["runs"])
    assert out["invalid_reasons"] == [] and any("not compared with themselves alone" in n for n in out["notes"])


def test_references_run_after_the_count_and_a_checkpoint_keeps_the_count_before_they_do(fake, monkeypatch):
    """No unit of a session's script runs in the process before it arrives on the cadence: each session alone (its
    reference) runs after the count. The count is checkpointed once its cadence has run, its bytes pending, so a
    count whose references are cut still leaves its cadence in the record; then the bytes are compared."""
    order, snapshots = [], []
    real_run, real_ref = duplex.run_sessions, duplex.reference
    monkeypatch.setattr(duplex, "run_sessions", lambda *a, **k: (order.append("count"), real_run(*a, **k))[1])
    monkeypatch.setattr(duplex, "reference", lambda *a, **k: (order.append("alone"), real_ref(*a, **k))[1])

    def on_run(record):
        snapshots.append((list(order), [dict(r.get("bytes") or {}) for r in record["modes"]["cadence"]["runs"]]))
    duplex.measure_workload(fakes.workload(), device="cpu", ar_spec="none", modes=("cadence",), traffic=SHORT,
                            counts={"cadence": [2]}, progress=False, clock=FakeClock, on_run=on_run)
    assert order == ["count", "alone", "alone"]
    (seen_first, bytes_first), (seen_last, bytes_last) = snapshots[0], snapshots[-1]
    assert seen_first == ["count"] and list(bytes_first[0]) == ["pending"]
    assert seen_last == order and bytes_last[0]["checked"] == 2 and bytes_last[0]["mismatches"] == []


def test_a_count_that_does_not_fit_is_refused_before_it_is_built_and_bounds_the_search(fake, monkeypatch):
    """Fake sessions hold 4096 arena bytes and 1 KiB per graph: 7 KiB at open, up to 9 KiB after the slack
    captured what their scripts met. With 36 KiB for sessions, 4 fit; then 9 KiB each is the measured size and
    5, 6 and 8 sessions are refused from it, before any of their sessions is built."""
    built = []
    real = fake.new_session
    monkeypatch.setattr(fake, "new_session", lambda model, mode, spec: (built.append(mode), real(model, mode, spec))[1])
    out = duplex.measure_workload(fakes.workload(), device="cpu", ar_spec="none", modes=("cadence",), traffic=SHORT,
                                  start=2, progress=False, clock=FakeClock, budget_mib=36 * 1024 / 2 ** 20,
                                  reference_sessions=0)
    m = out["modes"]["cadence"]
    assert [(t["sessions"], t["outcome"]) for t in m["search"]["tried"]] == [
        (2, "clean"), (4, "clean"), (8, "refused"), (6, "refused"), (5, "refused")]
    per = m["admission"]["per_session_bytes_max"]
    assert per == 9216 and m["admission"]["budget_bytes"] == 36 * 1024
    assert m["runs"][-1]["refused"] == (f"admission: 5 sessions x 9216 bytes (the most one session held at the end of "
                                        f"a run: arena + graphs + its other tensors) = 46080 bytes > the 36864 bytes "
                                        f"left for sessions beside the model (0 bytes)")
    assert m["search"]["bracket"] == {"lo": 4, "hi": 5, "exact": True} and m["max_zero_miss_sessions"] == 4
    assert len(built) == 1 + 2 + 4               # the warm-up session, N=2, N=4; nothing for a refused count


# --- the CLI ---------------------------------------------------------------------------------------------------
def test_cli_end_to_end_writes_a_compact_record(tmp_path, fake, monkeypatch, capsys):
    wl = fakes.workload()
    monkeypatch.setattr(workloads, "get", lambda name: wl)
    monkeypatch.setattr(workloads, "names", lambda: ["fake"])
    monkeypatch.setattr(scheduler, "MonotonicClock", FakeClock)      # the cadence on a clock that never waits
    out = tmp_path / "out"
    rc = duplex.main(["--workload", "fake", "--device", "cpu", "--ar", "busy:1ms", "--start", "1", "--max-sessions",
                      "2", "--seconds", "4", "--seed", "4", "--join-within-s", "1", "--out", str(out)])
    text = (out / "duplex.json").read_text()
    rec = json.loads(text)
    assert "\n" not in text and rec["schema"] == records.DUPLEX_SCHEMA == "duplexcadence.duplex/3"
    w = rec["workloads"]["fake"]
    for mode in ("stock", "cadence"):
        m = w["modes"][mode]
        assert m["search"]["counts"] == [1, 2] and m["search"]["stopped"].startswith("max_sessions")
        assert isinstance(m["runs"][0]["units"], dict) and rec["unit_hashes"]      # one table per run, hashes once
    rows = records.read_duplex(out / "duplex.json")["workloads"]["fake"]["modes"]["cadence"]["runs"][1]["units"]
    speak = [u for u in rows if u["kind"] == "SPEAK" and u["start_ms"] is not None]
    assert speak and all(len(u["sha256_f32"]) == 64 and len(u["sha256_pcm16"]) == 64 for u in speak)
    assert rc == duplex.EXIT_INVALID and rec["verdict"] == "INVALID"      # 4 s < 60 s (and maybe a dirty tree)
    assert any("< 60 s" in r for r in rec["invalid_reasons"])
    assert {m: v["units"] for m, v in w["process_warm_up"].items()} == {"stock": 3, "cadence": 3}
    p = rec["parameters"]
    assert p["traffic"] == "voxconverse" and p["seed"] == 4 and p["search"]["start"] == {"stock": 1, "cadence": 1}
    assert sorted(x.name for x in out.iterdir()) == ["duplex.json"]       # plots are the report's
    entry = {"state": {"status": "done"}, "duplex": {"record": records.read_duplex(out / "duplex.json"), "file": "d"}}
    assert figures.duplex_figures({"duplex_cadence": entry}, "fake")["modes"]["cadence"]["unseen"] is True
    printed = capsys.readouterr().out
    assert "fake cadence: max sessions with zero misses = 2 (bracket 2..None, not exact)" in printed


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
    assert len(err) == 1 and err[0].startswith("python -m suite.measure.duplex: error: --device: expected a "
                                               "CUDA device this machine has (0 here), got 'cuda'")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags,match", [
    (["--seconds", "nan"], "--seconds"), (["--workload", "nosuch"], "--workload"), (["--steps", "0"], "--steps"),
    (["--device", "tpu"], "--device"), (["--budget-mib", "-1"], "--budget-mib"), (["--after-miss", "-1"], "--after-miss"),
    (["--stock-sessions", "x"], "--stock-sessions"), (["--sessions", "0"], "--sessions"), (["--modes", "bogus"], "--modes"),
    (["--modes", "stock,stock"], "--modes"), (["--stock-policy", "bogus"], "--stock-policy"),
    (["--policy", "bogus"], "--policy"), (["--prepare", "script"], "--prepare"), (["--seconds", "abc"], "--seconds"),
    (["--traffic", "random"], "--traffic"), (["--start", "0"], "--start"), (["--grow", "1"], "--grow"),
    (["--budget-s", "0"], "--budget-s"), (["--start", "8", "--max-sessions", "4"], "--max-sessions"),
    (["--slack", "later"], "--slack"), (["--reference-sessions", "-1"], "--reference-sessions"),
    (["--join-within-s", "-2"], "--join-within-s"),
])
def test_cli_bad_flag_exits_2_naming_the_flag_before_any_work(tmp_path, capsys, flags, match):
    with pytest.raises(SystemExit, match=match) as exc:
        duplex.main([*flags, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("seconds", ["1", "3"])
def test_cli_committed_seconds_before_the_first_speak_unit_exits_2_before_any_work(tmp_path, capsys, seconds):
    # minicpmo45's committed script opens with 3 LISTEN units: a window without a SPEAK unit would measure nothing
    with pytest.raises(SystemExit, match="--seconds") as exc:
        duplex.main(["--workload", "minicpmo45", "--traffic", "committed", "--seconds", seconds, "--sessions", "1",
                     "--depth", "reduced", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seconds" in err[0] and "SPEAK" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: one stream per session, device timing")
@pytest.mark.parametrize("policy", ["edf", "threads"])
def test_cuda_sessions_on_streams_give_the_bytes_of_each_session_alone(fake, policy):
    wl = fakes.workload()
    model = fake.build_model({}, device="cuda", depth="reduced", seed=0)
    plans = duplex_run.plans(wl, 4, Traffic(seconds=4.0, seed=4, join_within_s=1.0))
    refs = {p.key: duplex_run.reference(wl, "cadence", p, model, fake, {}, ar_stage.NoAR(), "cuda") for p in plans}
    run = duplex_run.run_sessions(wl, "cadence", plans, model=model, adapter=fake, spec={},
                                  ar=ar_stage.make_ar("busy:5ms", "fake", "cuda"), device="cuda", policy=policy,
                                  progress=False)
    assert duplex_session.check_bytes(run, refs, [p.key for p in plans])["mismatches"] == []
    assert all(u["device_ms"] is not None for u in run["units"] if u["start_ms"] is not None)


def test_prepare_turns_captures_the_clocks_turn_family_at_open_whatever_the_script(fake, monkeypatch):
    """--prepare turns: before the cadence each session asks for slack.turn_family of its fresh clocks, the same
    set for sessions that play different scripts (nothing of a script is read), beside prepare(None)."""
    asked: dict = {}
    real_prepare = fakes.FakeSession.prepare

    def prep(self, signatures=None):
        if signatures is not None and id(self) not in asked:
            asked[id(self)] = list(signatures)
        return real_prepare(self, signatures)

    monkeypatch.setattr(fakes.FakeSession, "prepare", prep)
    run, plans, model = _run(fakes.workload(), fake, "cadence", 3, clock=FakeClock(), prepare="turns")
    family = slack.turn_family(fake.new_session(model, "cadence", {}).clocks(), fakes.FakeSession.capabilities)
    assert len({p.source["window"] for p in plans}) == 3 and len(asked) == 3
    assert all(sigs == family for sigs in asked.values()) and len(family) > len(fakes.VOICE)
    assert all(a["prepared"]["turns"]["captures"] > 0 and a["prepared"]["oracle"] is None for a in run["admission"])
    assert run["prepare"] == "turns" and run["captures_inside_timed_units"] == 0


# --- prepare learned:K ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("how, k", [("voice", None), ("turns", None), ("oracle", None), ("learned:12", 12),
                                    ("learned:1", 1)])
def test_learned_graphs_reads_k_from_the_prepare_option(how, k):
    assert duplex_session.learned_graphs(how) == k


@pytest.mark.parametrize("how", ["learned:0", "learned:", "learned:x", "learned", "rehearse", "learned:-2"])
def test_a_bad_prepare_option_is_refused_naming_it(how):
    with pytest.raises(ValueError, match=f"prepare: expected one of .* got {how!r}"):
        duplex_session.learned_graphs(how)


def test_learned_signatures_rank_what_most_learn_scripts_meet_and_read_no_serve_recording(fake, monkeypatch):
    wl = fakes.workload()
    read = []
    real = duplex_run.traffic_mod.session_script
    monkeypatch.setattr(duplex_run.traffic_mod, "session_script",
                        lambda arch, w, seed: read.append(w.recording) or real(arch, w, seed))
    session = fake.new_session(_model(fake, **wl.spec), "cadence", wl.spec)
    duplex_run._LEARNED.clear()
    sigs = duplex_run.learned_signatures(wl, session, 3)
    learn, serve = workloads.traffic.split()
    assert read and set(read) <= set(learn) and not set(read) & set(serve)
    assert len(sigs) == 3 and len(set(sigs)) == 3
    walked = [duplex_session.oracle_signatures(session, duplex_session.traffic_units(real("flow_hift", w, 0), 60.0))
              for w in workloads.traffic.windows(60) if w.recording in learn]
    counts = sorted((sum(s in w for w in walked) for s in {s for w in walked for s in w}), reverse=True)
    assert [sum(s in w for w in walked) for s in sigs] == counts[:3]          # the three most common, in order
    assert duplex_run.learned_signatures(wl, session, 3) == sigs and len(read) == len(walked)   # cached


def fake_cli(tmp_path, monkeypatch, *flags) -> dict:
    """The CLI on the fake workload (CPU, no AR, the fake clock), `flags` after the common ones; its record."""
    wl = fakes.workload()
    monkeypatch.setattr(workloads, "get", lambda name: wl)
    monkeypatch.setattr(workloads, "names", lambda: ["fake"])
    monkeypatch.setattr(scheduler, "MonotonicClock", FakeClock)
    out = tmp_path / "out"
    duplex.main(["--workload", "fake", "--device", "cpu", "--ar", "none", *flags, "--out", str(out)])
    return json.loads((out / "duplex.json").read_text())


def test_cli_learned_prepare_runs_sessions_on_the_serve_recordings_with_the_learned_graphs(tmp_path, fake, monkeypatch):
    rec = fake_cli(tmp_path, monkeypatch, "--modes", "cadence", "--sessions", "3", "--seconds", "4", "--prepare",
                   "learned:2")
    assert rec["parameters"]["prepare"] == "learned:2" and rec["parameters"]["recordings"] == "serve"
    run = rec["workloads"]["fake"]["modes"]["cadence"]["runs"][0]
    serve = workloads.traffic.split()[1]
    assert all(a["window"].split(":", 1)[1].split("/")[0] in serve for a in run["admission"])
    assert all(a["prepared"]["learned"] is not None for a in run["admission"])
    refs = rec["workloads"]["fake"]["modes"]["cadence"]["references"]
    assert refs["sessions"] == 3 and refs["prepare"] == "voice"       # graphs change no byte: prepare(None) only


def test_cli_open_at_join_opens_each_session_at_its_join_on_its_thread_and_keeps_its_bytes(tmp_path, fake, monkeypatch):
    """--open-at join: each session is built and prepared at its join time (after the first joins at 0), its
    admission row says when, its captures at open are not counted as captures during the cadence, and every
    session's bytes equal the same session alone."""
    rec = fake_cli(tmp_path, monkeypatch, "--modes", "cadence", "--sessions", "3", "--seconds", "4", "--policy",
                   "threads", "--open-at", "join")
    assert rec["parameters"]["open_at"] == "join" and not any("differ" in r for r in rec["invalid_reasons"])
    run = rec["workloads"]["fake"]["modes"]["cadence"]["runs"][0]
    rows = run["admission"]
    assert [r["session"] for r in rows] == [0, 1, 2]
    assert all(r["opened_at_s"] is not None and r["opened_at_s"] >= r["phase_s"] - 1e-6 for r in rows)
    assert all(r["prepared"]["voice"]["captures"] > 0 for r in rows)
    cols = run["units"]["columns"]
    slack = sum(r[cols.index("slack_captures")] or 0 for r in run["units"]["rows"])
    assert run["captures_during_cadence"] == slack and run["bytes"]["mismatches"] == []   # none of the open's
    assert run["bytes"]["checked"] == 3


def test_cli_recordings_serve_runs_stock_on_the_serve_half_without_graphs(tmp_path, fake, monkeypatch):
    """--recordings serve: stock sessions play the recordings a learned cadence run plays, none of the learn half."""
    rec = fake_cli(tmp_path, monkeypatch, "--modes", "stock", "--sessions", "3", "--seconds", "4", "--recordings",
                   "serve")
    assert rec["parameters"]["recordings"] == "serve" and rec["parameters"]["prepare"] == "voice"
    run = rec["workloads"]["fake"]["modes"]["stock"]["runs"][0]
    learn, serve = workloads.traffic.split()
    names = [a["window"].split(":", 1)[1].split("/")[0] for a in run["admission"]]
    assert len(names) == 3 and all(n in serve and n not in learn for n in names)


@pytest.mark.parametrize("flags, message", [
    (["--prepare", "learned:0"], "--prepare"),
    (["--prepare", "learned:4", "--traffic", "committed", "--sessions", "1"], "--prepare learned:4: learns from"),
    (["--prepare", "learned:4", "--recordings", "all"], "--recordings all: --prepare learned:4"),
    (["--recordings", "serve", "--traffic", "committed", "--sessions", "1"], "--recordings serve: chooses"),
    (["--recordings", "half"], "--recordings"),
    (["--open-at", "join", "--policy", "edf"], "--open-at join: opens each session"),
    (["--open-at", "join", "--policy", "threads", "--traffic", "committed", "--sessions", "1"], "--open-at join"),
    (["--open-at", "later"], "--open-at"),
    (["--prepare", "learned:\u00b2"], "--prepare: expected one of"),
    (["--workload", "minicpmo45,minicpmo45"], "--workload: expected each workload once"),
    (["--device", "cpu:7"], "--device: expected cpu, cuda or cuda:N, got 'cpu:7'"),
    (["--out", ""], "--out: expected a folder (new or existing), got an empty path"),
])
def test_cli_refuses_a_learned_prepare_it_cannot_run(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        duplex.main(["--workload", "minicpmo45", "--device", "cpu", "--out", str(tmp_path / "o"), *flags])
    assert exc.value.code == 2 and message in capsys.readouterr().err


class SlowClock(FakeClock):
    """Every reading of the clock costs 0.3 s: units and slack jobs end past their next release."""

    def now(self) -> float:
        self.t += 0.3
        return self.t


def test_deferred_signatures_and_slack_jobs_past_their_release_reach_the_record(fake):
    """With time running out in every slack, the record carries what the jobs left and ran over: the sum of
    the sessions' deferred signatures, and the jobs whose end came after their next release, per unit too."""
    run = _run(fakes.workload(), fake, "cadence", 2, clock=SlowClock(), slack="after")[0]
    per_session = sum(c["signatures_deferred"] for c in run["capture"])
    jobs = [u for u in run["units"] if u.get("slack_where")]
    assert per_session > 0 and run["slack_signatures_deferred"] == per_session
    assert sum(u["slack_deferred"] for u in jobs) == per_session
    assert run["slack_jobs_overrun"] > 0
    assert run["slack_jobs_overrun"] == sum(1 for u in jobs if u["slack_overrun_ms"] > 0)
