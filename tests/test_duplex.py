"""The live duplex harness (issue 7): cadence scheduler, AR stages, suite.duplex on a reduced Moshi.

CPU tests drive the scheduler with an injectable clock (misses and lateness are exact), and run the real
Mimi adapter (reduced depth) on a tiny script of 2-frame units: two concurrent sessions give the bytes of
the same session run alone. GPU tests skip on the CPU with the reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import threading

import pytest
import torch

from duplexcadence import scheduler
from duplexcadence.scheduler import AdmissionError, CadenceScheduler, ScheduleError, Slot
from suite import ar_stage, duplex, duplex_session

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
    assert duplex.parse_sessions("4,1,2,2") == [1, 2, 4]
    with pytest.raises(ValueError, match="--sessions"):
        duplex.parse_sessions("1,x")
    with pytest.raises(ValueError, match="--sessions"):
        duplex.parse_sessions("0")


def test_max_zero_miss_stops_at_the_first_miss_or_refusal():
    runs = [{"sessions": n, "metrics": {"misses": m}} for n, m in ((1, 0), (2, 0), (4, 3), (8, 0))]
    assert duplex.max_zero_miss(runs) == 2
    assert duplex.max_zero_miss(runs[:2] + [{"sessions": 4, "refused": "x", "metrics": {}}]) == 2
    assert duplex.max_zero_miss([{"sessions": 1, "metrics": {"misses": 1}}]) is None


def test_bisection_finds_the_exact_largest_zero_miss_count():
    capacity = 11                                  # a device where 11 sessions fit and 12 miss
    runs = [{"sessions": n, "metrics": {"misses": int(n > capacity)}} for n in (1, 8, 16)]
    tried = []
    while (n := duplex.next_bisect(runs)) is not None:
        tried.append(n)
        runs.append({"sessions": n, "metrics": {"misses": int(n > capacity)}})
    assert tried == [12, 10, 11] and duplex.max_zero_miss(runs) == 11
    assert duplex.next_bisect([{"sessions": 1, "metrics": {"misses": 2}}]) is None


# --- the real Mimi adapter (reduced) on a tiny script -------------------------------------------------------
def _with_script(tmp_path, workload: str, rows: list[dict]):
    """The named workload with its session script replaced by `rows` (written as JSONL under tmp_path)."""
    import workloads
    path = tmp_path / f"tiny_{workload}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return dataclasses.replace(workloads.get(workload), script=path)


def _tiny_moshi(tmp_path, frames=1):
    """The moshi workload on a 3-unit script (SPEAK, SPEAK final, LISTEN) of `frames` frames per unit
    (reduced Mimi takes about a second per frame on a busy 2-core CPU)."""
    import random

    rng = random.Random(5)
    rows = []
    for i, (kind, turn, final) in enumerate((("SPEAK", 0, False), ("SPEAK", 0, True), ("LISTEN", None, False))):
        codes = [[rng.randrange(2048) for _ in range(frames)] for _ in range(8)]
        rows.append({"unit": i, "t_start_s": float(i), "kind": kind, "turn": turn, "final": final,
                     "codes": codes})
    return _with_script(tmp_path, "moshi", rows)


@pytest.fixture(scope="module")
def mimi_model():
    from duplexcadence import runtime
    adapter = runtime.adapter("mimi")
    return adapter, adapter.build_model({}, device="cpu", depth="reduced", seed=0)


def _run(wl, mimi_model, mode, n, variants, clock=None, budget=None, seconds=2, policy="edf"):
    adapter, model = mimi_model
    return duplex.run_sessions(wl, mode, n, model=model, adapter=adapter, spec={}, ar=ar_stage.NoAR(),
                               device="cpu", seconds=seconds, variants=variants, clock=clock, policy=policy,
                               budget_bytes=budget, progress=False)


@pytest.mark.parametrize("mode, policy", [("cadence", "edf"), ("stock", "edf"), ("cadence", "threads")])
def test_concurrent_sessions_give_the_bytes_of_each_session_alone(tmp_path, mimi_model, mode, policy):
    wl = _tiny_moshi(tmp_path)
    refs = {v: duplex.session_hashes(duplex._solo_variant(wl, mode, v, mimi_model[1], mimi_model[0], {},
                                                          ar_stage.NoAR(), "cpu", 2))[0] for v in range(2)}
    assert refs[0] != refs[1]                       # the variants really carry different data
    run = _run(wl, mimi_model, mode, 2, variants=2, clock=FakeClock() if policy == "edf" else None,
               policy=policy)
    assert duplex.check_against_reference(run, refs, 2) == []
    assert len(duplex.session_hashes(run)) == 2 and [a["phase_s"] for a in run["admission"]] == [0, 0.5]
    # negative control: a session whose bytes differ is reported, with the unit
    bad = json.loads(json.dumps(run))
    u = next(u for u in bad["units"] if u["session"] == 1 and u["index"] == 1)
    assert u["kind"] == "SPEAK"
    u["sha256_f32"] = "0" * 64
    assert duplex.check_against_reference(bad, refs, 2) == [
        f"{mode} N=2 session 1: unit 1 differs from the same session run alone"]


def test_run_records_speak_time_misses_and_admission(tmp_path, mimi_model):
    wl = _tiny_moshi(tmp_path)
    run = _run(wl, mimi_model, "cadence", 2, variants=1, seconds=3)
    m = run["metrics"]
    assert m["units_run"] == 6 and m["speak_units"] == 4
    for u in run["units"]:
        assert u["lateness_ms"] == pytest.approx(u["end_ms"] - u["deadline_ms"])
        assert u["miss"] == (u["end_ms"] > u["deadline_ms"])
        assert (u["speak_ms"] is None) == (u["kind"] != "SPEAK")
    assert m["speak_frac_mean"] == pytest.approx(m["speak_ms_mean"] / 1000)
    assert all(a["footprint_how"].startswith("arena_bytes_reserved") and a["footprint_bytes"] > 0
               for a in run["admission"])
    need = run["admission"][0]["footprint_bytes"]
    with pytest.raises(AdmissionError, match="session 1"):
        _run(wl, mimi_model, "cadence", 2, variants=1, budget=need + need // 2)


def test_cli_end_to_end_writes_json_and_plots(tmp_path, mimi_model, monkeypatch):
    wl = _tiny_moshi(tmp_path)
    import workloads
    monkeypatch.setattr(workloads, "get", lambda name: wl)
    monkeypatch.setattr(mimi_model[0], "build_model", lambda *a, **k: mimi_model[1])   # built once
    out = tmp_path / "out"
    rc = duplex.main(["--workload", "moshi", "--device", "cpu", "--depth", "reduced", "--ar", "busy:1ms",
                      "--sessions", "1", "--seconds", "2", "--out", str(out), "--quiet"])
    text = (out / "duplex.json").read_text()
    rec = json.loads(text)
    assert "\n" not in text                   # compact (one line): its rows per unit made an indented one 4.3 MB
    runs = rec["workloads"]["moshi"]["modes"]["cadence"]["runs"]
    assert isinstance(runs[0]["units"], dict) and rec["unit_hashes"]      # one table per run, hashes once
    rows = duplex.read_record(out / "duplex.json")["workloads"]["moshi"]["modes"]["cadence"]["runs"][0]["units"]
    speak = [u for u in rows if u["kind"] == "SPEAK" and u["start_ms"] is not None]
    assert speak and all(len(u["sha256_f32"]) == 64 and len(u["sha256_pcm16"]) == 64 for u in speak)
    assert rc == 1 and rec["verdict"] == "INVALID"           # 2 s < 60 s (and maybe a dirty tree)
    assert any("< 60 s" in r for r in rec["invalid_reasons"])
    w = rec["workloads"]["moshi"]
    assert w["cadence_equals_stock"] is True
    assert w["modes"]["stock"]["stock_sharing"] == "shared_instance"
    assert {p.name for p in out.iterdir()} >= {"duplex.json", "moshi_speak.png", "moshi_miss_rate.png"}
    assert rec["provenance"]["git_rev"] and rec["parameters"]["ar"] == "busy:1ms"
    # Moshi sessions cannot warm themselves up: a throwaway session ran first, per mode
    assert {m: v["units"] for m, v in w["process_warm_up"].items()} == {"stock": 3, "cadence": 3}
    assert rec["parameters"]["policy"] == {"stock": "edf", "cadence": "edf"}


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
    assert len(err) == 1 and err[0].startswith("python -m suite.duplex: error: --device")
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: one stream per session, graph replay")
@pytest.mark.parametrize("policy", ["edf", "threads"])
def test_cuda_sessions_on_streams_give_the_bytes_of_each_session_alone(tmp_path, policy):
    from duplexcadence import runtime
    adapter = runtime.adapter("mimi")
    model = adapter.build_model({}, device="cuda", depth="reduced", seed=0)
    wl = _tiny_moshi(tmp_path, frames=12)
    refs = {v: duplex.session_hashes(duplex._solo_variant(wl, "cadence", v, model, adapter, {}, ar_stage.NoAR(),
                                                          "cuda", 3))[0] for v in range(2)}
    run = duplex.run_sessions(wl, "cadence", 4, model=model, adapter=adapter, spec={},
                              ar=ar_stage.make_ar("busy:5ms", "moshi", "cuda"), device="cuda", seconds=3,
                              policy=policy, variants=2, progress=False)
    assert duplex.check_against_reference(run, refs, 2) == []
    assert all(u["device_ms"] is not None for u in run["units"] if u["start_ms"] is not None)


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
    # minicpmo45's script opens with 3 LISTEN units: a window without a SPEAK unit measured nothing and then
    # crashed (KeyError: 0, looking for the one-session reference) after building and running the model
    with pytest.raises(SystemExit, match="--seconds") as exc:
        duplex.main(["--workload", "minicpmo45", "--seconds", seconds, "--sessions", "1", "--depth", "reduced",
                     "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seconds" in err[0] and "SPEAK" in err[0]
    assert not (tmp_path / "out").exists()


# --- Step-Audio 2: sessions that draw from the process's default generators --------------------------------
def _tiny_stepaudio2(tmp_path):
    """The stepaudio2_mini workload on a 3-unit script (SPEAK 16 tokens, SPEAK 16, SPEAK final empty)."""
    import random

    rng = random.Random(7)
    rows = [{"unit": i, "t_start_s": float(i), "kind": "SPEAK", "turn": 0, "final": i == 2,
             "tokens": [] if i == 2 else [rng.randrange(6561) for _ in range(16)]} for i in range(3)]
    return _with_script(tmp_path, "stepaudio2_mini", rows)


@pytest.fixture(scope="module")
def sa2_model():
    import workloads
    from duplexcadence import runtime
    from suite.runner import make_spec
    wl = workloads.get("stepaudio2_mini")
    adapter = runtime.adapter(wl.architecture)
    spec = make_spec(wl, steps=2)          # 2 Euler steps: the generator draws are the HiFT's either way
    return adapter, adapter.build_model(spec, device="cpu", depth="reduced", seed=0), spec


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_sessions_drawing_the_default_generator_each_give_their_bytes_alone(tmp_path, sa2_model, mode,
                                                                             monkeypatch):
    """Step-Audio 2's HiFT draws noise from the process's default generators: two sessions in one process
    give the bytes of each alone only because each Driver keeps its own generator state; without it
    (negative control) the second session's noise stream continues the first's and its bytes differ."""
    adapter, model, spec = sa2_model
    wl = _tiny_stepaudio2(tmp_path)
    refs = {v: duplex.session_hashes(duplex._solo_variant(wl, mode, v, model, adapter, spec, ar_stage.NoAR(),
                                                          "cpu", 3))[0] for v in range(2)}
    assert refs[0] != refs[1]
    run = duplex.run_sessions(wl, mode, 2, model=model, adapter=adapter, spec=spec, ar=ar_stage.NoAR(),
                              device="cpu", seconds=3, variants=2, clock=FakeClock(), progress=False)
    assert all(a["footprint_bytes"] >= 0 for a in run["admission"])
    # DuplexCadence sessions rehearsed their script's turns before the cadence (and restored their state)
    assert [bool(a["rehearsed"] and a["rehearsed"]["turns"] == [[16, 16, 0]]) for a in run["admission"]] == \
        [mode == "cadence"] * 2
    assert duplex.check_against_reference(run, refs, 2) == []
    monkeypatch.setattr(duplex_session.Driver, "_own_generators", lambda self: contextlib.nullcontext())
    shared = duplex.run_sessions(wl, mode, 2, model=model, adapter=adapter, spec=spec, ar=ar_stage.NoAR(),
                                 device="cpu", seconds=3, variants=2, clock=FakeClock(), progress=False)
    assert duplex.check_against_reference(shared, refs, 2) != []


def test_threads_policy_is_refused_for_sessions_drawing_the_default_generator(tmp_path, sa2_model, monkeypatch):
    adapter, model, spec = sa2_model
    released = []
    monkeypatch.setattr(duplex, "release", lambda session: released.append(session))
    with pytest.raises(ValueError, match="policy: 'threads' needs sessions that draw no noise"):
        duplex.run_sessions(_tiny_stepaudio2(tmp_path), "stock", 1, model=model, adapter=adapter, spec=spec,
                            ar=ar_stage.NoAR(), device="cpu", seconds=3, policy="threads", progress=False)
    assert len(released) == 1 and getattr(released[0], "draws_default_generator", False)   # the session built


def test_a_warm_up_that_raises_releases_the_session_it_built(tmp_path, sa2_model, monkeypatch):
    """A warm-up (rehearsal) that fails, e.g. out of memory or a ClockError, gives back the session it was
    warming: run_sessions has not pooled it yet, and `_solo_variant` releases however its run ends."""
    adapter, model, spec = sa2_model
    released = []
    monkeypatch.setattr(duplex, "release", lambda session: released.append(session))

    def boom(self, units, body=duplex_session.WARMUP_TURN_UNITS):
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(duplex_session.Driver, "warm_up", boom)
    wl = _tiny_stepaudio2(tmp_path)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        duplex.run_sessions(wl, "cadence", 1, model=model, adapter=adapter, spec=spec, ar=ar_stage.NoAR(),
                            device="cpu", seconds=3, progress=False)
    assert len(released) == 1
    with pytest.raises(RuntimeError, match="warm-up failed"):
        duplex._solo_variant(wl, "cadence", 0, model, adapter, spec, ar_stage.NoAR(), "cpu", 3)
    assert len(released) == 2 and released[0] is not released[1]


def test_every_session_class_declares_what_a_turn_does_to_its_state():
    """The harness warms a session by what its class declares (`turn_state`), not by its module's name:
    each adapter's stock and DuplexCadence sessions declare the same, and a session declaring nothing is
    refused (TypeError) rather than warmed the wrong way."""
    from duplexcadence.adapters import (code2wav, flow_hift, flow_hift_cadence, mimi, mimi_cadence, stepaudio2,
                                        stepaudio2_cadence)
    declared = {(m.__name__.rsplit(".", 1)[1], c.turn_state) for m, c in (
        (code2wav, code2wav.StockSession), (code2wav, code2wav.CadenceSession),
        (flow_hift, flow_hift.StockSession), (flow_hift_cadence, flow_hift_cadence.CadenceSession),
        (mimi, mimi.StockSession), (mimi_cadence, mimi_cadence.CadenceSession),
        (stepaudio2, stepaudio2.StockSession), (stepaudio2_cadence, stepaudio2_cadence.CadenceSession))}
    assert declared == {("code2wav", "reset"), ("flow_hift", "reset"), ("flow_hift_cadence", "reset"),
                        ("mimi", "stream"), ("mimi_cadence", "stream"), ("stepaudio2", "carried"),
                        ("stepaudio2_cadence", "carried")}

    class Undeclared:
        pass

    with pytest.raises(TypeError, match="turn_state"):
        duplex_session.turn_state(Undeclared())
    assert duplex_session._caches_carry_over(stepaudio2_cadence.CadenceSession.__new__(
        stepaudio2_cadence.CadenceSession))
    assert not duplex_session._turn_based(mimi.StockSession.__new__(mimi.StockSession))
