"""suite.stages / suite.claims / suite.stage_run: the staged, resumable reproduction.

Scheduling (resume, failure, budget) runs on stub executors and a fake clock, so every decision is
checked exactly; the merged report runs real stages inline on the fake adapter (tests/test_suite_runner);
the one-process-per-mode memory stage runs the real Moshi workload (reduced depth, 1 unit) in a child
process, one per mode.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from suite import claims, duplex, report, reproduce, stage_run, stages
from test_duplex_merge import WL as MERGE_WL, part
from test_suite_runner import clean_tree, fake_adapter, workload  # noqa: F401

OPTIONS = {"device": "cpu", "steps": None, "seconds": None, "max_speak_units": None, "depth": "released",
           "seed": None, "notes": []}


def three(budget: float = 100.0) -> list[stages.Stage]:
    return [stages.Stage("w", h, budget) for h in ("verify", "memory_stock", "memory_cadence")]


class Stub:
    """An executor that records calls, advances a fake clock and fails the stages it is told to.
    record=False: a done stage leaves no run.json (for runs whose report is rendered, which reads records)."""

    def __init__(self, seconds: float = 10.0, fail: tuple = (), record: bool = True):
        self.now, self.seconds, self.fail, self.calls, self.record = 0.0, seconds, set(fail), [], record
        self.gpu = {}                       # stage name -> the gpu it was given

    def clock(self) -> float:
        return self.now

    def __call__(self, stage, out_dir, timeout_s, options, *, gpu=None):
        self.calls.append((stage.name, timeout_s))
        self.gpu[stage.name] = gpu
        self.now += self.seconds
        out_dir.mkdir(parents=True, exist_ok=True)
        if stage.name in self.fail:
            return stages.Outcome("failed", 1, "exit status 1: boom", ["stub"], ["boom"])
        if self.record:
            (out_dir / "run.json").write_text(json.dumps({"verdict": "VALID", "invalid_codes": []}))
        return stages.Outcome("done", 0, "", ["stub"])


def run(tmp_path, plan, stub, *, resume=False, budget_s=None):
    state = stages.State.open(tmp_path, OPTIONS, resume=resume)
    sitting = stages.run_plan(plan, state, OPTIONS, budget_s=budget_s, execute=stub, clock=stub.clock,
                              provenance={"git_rev": "abc", "impl_tree": "def"}, log=lambda *_: None)
    return state, sitting


def on_disk(tmp_path) -> dict:
    return json.loads((tmp_path / "stages.json").read_text())["stages"]


# --- resumability ------------------------------------------------------------------------------------
def test_done_stages_are_kept_on_resume(tmp_path):
    stub = Stub()
    run(tmp_path, three(), stub)
    assert [c[0] for c in stub.calls] == ["w.verify", "w.memory_stock", "w.memory_cadence"]
    assert {k: v["status"] for k, v in on_disk(tmp_path).items()} == dict.fromkeys(
        ["w.verify", "w.memory_stock", "w.memory_cadence"], "done")
    assert on_disk(tmp_path)["w.verify"]["verdict"] == "VALID"
    assert on_disk(tmp_path)["w.verify"]["seconds"] == 10.0

    again = Stub()
    _, sitting = run(tmp_path, three(), again, resume=True)
    assert again.calls == [] and sitting["kept"] == ["w.verify", "w.memory_stock", "w.memory_cadence"]
    assert all(v["attempts"] == 1 for v in on_disk(tmp_path).values())


def test_failed_stage_is_recorded_then_rerun(tmp_path):
    run(tmp_path, three(), Stub(fail={"w.memory_stock"}))
    st = on_disk(tmp_path)["w.memory_stock"]
    assert (st["status"], st["returncode"], st["reason"], st["log_tail"]) == ("failed", 1, "exit status 1: boom",
                                                                             ["boom"])
    assert on_disk(tmp_path)["w.memory_cadence"]["status"] == "done"      # a failure does not stop the rest

    again = Stub()
    run(tmp_path, three(), again, resume=True)
    assert [c[0] for c in again.calls] == ["w.memory_stock"]
    st = on_disk(tmp_path)["w.memory_stock"]
    assert (st["status"], st["attempts"], st["reason"]) == ("done", 2, "")
    sittings = json.loads((tmp_path / "stages.json").read_text())["sittings"]
    assert [s["ran"] for s in sittings] == [["w.verify", "w.memory_stock", "w.memory_cadence"], ["w.memory_stock"]]


def test_a_stage_interrupted_by_a_killed_sitting_is_rerun(tmp_path):
    class Killed(Exception):
        pass

    class KilledStub(Stub):
        def __call__(self, stage, out_dir, timeout_s, options, *, gpu=None):
            if stage.harness == "memory_stock":
                raise Killed                            # the 10-minute command ends mid-stage
            return super().__call__(stage, out_dir, timeout_s, options, gpu=gpu)

    with pytest.raises(Killed):
        run(tmp_path, three(), KilledStub())
    assert on_disk(tmp_path)["w.memory_stock"]["status"] == "running"      # saved before it started
    again = Stub()
    state, _ = run(tmp_path, three(), again, resume=True)
    assert [c[0] for c in again.calls] == ["w.memory_stock", "w.memory_cadence"]
    assert state.stages["w.memory_stock"].attempts == 2


def test_budget_exhaustion_stops_cleanly_with_state_saved(tmp_path):
    stub = Stub(seconds=90.0)
    state, sitting = run(tmp_path, three(budget=100.0), stub, budget_s=250.0)
    # 250 s: verify (90), memory_stock (left 160 >= 100: runs, 90), memory_cadence (left 70 < 100): stop
    assert stub.calls == [("w.verify", 100.0), ("w.memory_stock", 100.0)]
    assert "70 s of --budget-s 250 left before w.memory_cadence, which is expected to need 100 s" in sitting["stopped"]
    disk = on_disk(tmp_path)
    assert disk["w.memory_cadence"]["status"] == "pending" and disk["w.memory_cadence"]["attempts"] == 0
    assert disk["w.memory_cadence"]["reason"].startswith("not run yet: budget")

    # the next sitting: the first stage always starts, its timeout cut to the sitting's budget
    nxt = Stub(seconds=5.0)
    run(tmp_path, three(budget=100.0), nxt, resume=True, budget_s=40.0)
    assert nxt.calls == [("w.memory_cadence", 40.0)]
    assert on_disk(tmp_path)["w.memory_cadence"]["status"] == "done"


def test_budget_uses_what_done_stages_of_the_family_took(tmp_path):
    plan = [stages.Stage(w, "verify", 100.0) for w in ("a", "b", "c")]
    stub = Stub(seconds=20.0)
    _, sitting = run(tmp_path, plan, stub, budget_s=65.0)
    # a: 20 s; b expected 1.5 x 20 = 30 <= 45 left: runs, timeout cut to 45; c: 25 left < 30: stop
    assert stub.calls == [("a.verify", 65.0), ("b.verify", 45.0)]
    assert "expected to need 30 s" in sitting["stopped"]


def test_stage_killed_by_the_sitting_budget_says_so(tmp_path):
    def slow(stage, out_dir, timeout_s, options, *, gpu=None):
        return stages.Outcome("failed", None, f"timed out after {timeout_s:.0f} s (killed)")

    state = stages.State.open(tmp_path, OPTIONS, resume=False)
    stages.run_plan(three(), state, OPTIONS, budget_s=30.0, execute=slow, log=lambda *_: None)
    assert state.stages["w.verify"].reason.startswith("the sitting's --budget-s ran out during the stage "
                                                      "(timeout cut to 30 s of its 100 s budget)")


def test_budget_of_nothing_left_runs_nothing_after_the_first(tmp_path):
    stub = Stub(seconds=500.0)
    _, sitting = run(tmp_path, three(budget=100.0), stub, budget_s=300.0)
    assert [c[0] for c in stub.calls] == ["w.verify"] and sitting["stopped"]


def test_skipped_stage_is_recorded_and_checked_again(tmp_path):
    plan = [stages.Stage("w", "verify", 100.0), stages.Stage("w", "duplex_cadence", 100.0, skip="harness not here")]
    stub = Stub()
    run(tmp_path, plan, stub)
    assert on_disk(tmp_path)["w.duplex_cadence"] == {**on_disk(tmp_path)["w.duplex_cadence"], "status": "skipped",
                                                     "reason": "harness not here", "attempts": 0}
    later = Stub()                                  # the harness has arrived
    run(tmp_path, [plan[0], stages.Stage("w", "duplex_cadence", 100.0)], later, resume=True)
    assert [c[0] for c in later.calls] == ["w.duplex_cadence"]
    assert on_disk(tmp_path)["w.duplex_cadence"]["status"] == "done"


def test_state_open_rules(tmp_path):
    stages.State.open(tmp_path, OPTIONS, resume=True).save()        # --resume on a new folder starts it
    with pytest.raises(stages.StateError, match="pass --resume"):
        stages.State.open(tmp_path, OPTIONS, resume=False)
    with pytest.raises(stages.StateError, match=r"other options .*'max_speak_units': \(None, 4\)"):
        stages.State.open(tmp_path, {**OPTIONS, "max_speak_units": 4}, resume=True)


def test_timeout_kills_the_stage_process(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "stage_argv", lambda *a: ["timeit", "-n", "1", "import time; time.sleep(60)"])
    out = stages.subprocess_executor(stages.Stage("w", "verify", 1.0), tmp_path / "w.verify", 1.0, OPTIONS)
    assert out.status == "failed" and out.reason.startswith("timed out after 1 s (killed)")


@pytest.mark.parametrize("patterns, want", [
    pytest.param(["memory"], ["a.memory_stock", "a.memory_cadence", "b.memory_stock", "b.memory_cadence"],
                 id="family"),
    pytest.param(["b.*"], ["b.verify", "b.memory_stock", "b.memory_cadence", "b.duplex_stock", "b.duplex_cadence"],
                 id="glob"),
    pytest.param(["a", "duplex"], ["a.verify", "a.memory_stock", "a.memory_cadence", "a.duplex_stock",
                                   "a.duplex_cadence", "b.duplex_stock", "b.duplex_cadence"], id="workload+family"),
    pytest.param(["*.duplex_cadence"], ["a.duplex_cadence", "b.duplex_cadence"], id="one-mode"),
])
def test_select(patterns, want):
    plan = [stages.Stage(w, h, 1.0) for w in "ab" for h in stages.HARNESSES]
    assert [s.name for s in stages.select(plan, patterns)] == want
    with pytest.raises(ValueError, match=r"\['c\.\*'\]: no stage matches"):
        stages.select(plan, ["a", "c.*"])


def test_plan_of_the_registry_skips_what_cannot_run(monkeypatch):
    import workloads

    monkeypatch.setattr(stages, "harness_present", lambda module: False)
    plan = {s.name: s for s in stages.plan(workloads.names(), list(stages.HARNESSES), "cuda")}
    assert len(plan) == len(stages.HARNESSES) * len(workloads.names())
    assert "suite.duplex is not importable here" in plan["minicpmo45.duplex_stock"].skip
    assert "suite.duplex is not importable here" in plan["minicpmo45.duplex_cadence"].skip
    assert plan["minicpmo45.verify"].skip is None and plan["moshi.memory_cadence"].skip is None
    assert plan["minicpmo45.verify"].budget_s == stages.BUDGET_S["cuda"]["verify"]
    adapter = sys.modules["duplexcadence.adapters.flow_hift"]
    if "stepaudio2" not in getattr(adapter, "VARIANTS", ()):
        assert all("'stepaudio2' variant" in (plan[f"stepaudio2_mini.{h}"].skip or "") for h in stages.HARNESSES)
    with pytest.raises(ValueError, match="harness"):
        stages.plan(["moshi"], ["speed"], "cuda")


@pytest.mark.parametrize("workload_name, mode, sessions, policy", [
    pytest.param("minicpmo45", "cadence", "1,24,25", "threads", id="minicpmo45-cadence"),
    pytest.param("minicpmo45", "stock", "1,2,3,4", "edf", id="minicpmo45-stock"),
    pytest.param("minicpmo45_5step", "stock", "1,2,3,4,6", "edf", id="5step-stock"),
    pytest.param("minicpmo45_5step", "cadence", "1,32,40", "threads", id="5step-cadence"),
    pytest.param("moshi", "cadence", "1,32,36,40", None, id="moshi-cadence"),
    pytest.param("moshi", "stock", "1,4,5,6,7", None, id="moshi-stock"),
    pytest.param("stepaudio2_mini", "cadence", "1,8,16", None, id="stepaudio2-cadence"),
    pytest.param("stepaudio2_mini", "stock", "1,2,3", None, id="stepaudio2-stock"),
    pytest.param("qwen3_omni", "stock", "1,8,16,32", None, id="qwen3-stock"),
    pytest.param("qwen3_omni", "cadence", "1,32,64,96", None, id="qwen3-cadence"),
])
def test_duplex_stage_runs_one_mode_with_its_counts(workload_name, mode, sessions, policy):
    argv = stages.stage_argv(stages.Stage(workload_name, f"duplex_{mode}", 560.0), Path("out"),
                             {**OPTIONS, "device": "cuda"})
    assert argv[0] == "suite.duplex" and argv[argv.index("--modes") + 1] == mode
    assert argv[argv.index("--sessions") + 1] == sessions and "--stock-sessions" not in argv
    assert (argv[argv.index("--policy") + 1] if "--policy" in argv else None) == policy
    from suite import duplex
    args = duplex.build_parser().parse_args(argv[1:])          # the harness accepts what the stage passes
    assert args.modes == [mode] and args.seconds == 60 and args.after_miss == 0


def test_duplex_counts_fit_the_stage_budget():
    """The H200 timings of stages.DUPLEX_SESSIONS' comment (results/2026-11-30-h200-duplex-60s*,
    -reproduce-8, 2026-12-01-h200-reproduce-9*): model ~20 s, 60 s per count; MiniCPM-o DuplexCadence 3.6-6.3
    s warm-up per pooled session (max count built; 7 allowed), Moshi and Qwen3-Omni DuplexCadence ~1 s per
    session built per run, Step-Audio 2 DuplexCadence ~8.8 s (it rehearses its script's turns, twice; 10
    allowed), stock ~2 s per session per run. With a 10% margin."""
    budget = stages.BUDGET_S["cuda"]["duplex_cadence"]
    assert budget == stages.BUDGET_S["cuda"]["duplex_stock"] == 560 < 600     # one sitting: a 600 s command
    for mode, per_workload in stages.DUPLEX_SESSIONS.items():
        for name, argv in per_workload.items():
            counts = [int(n) for n in argv[argv.index("--sessions") + 1].split(",")]
            if mode == "cadence" and name.startswith("minicpmo45"):
                build = 7.0 * max(counts)
            elif mode == "cadence" and name in ("default", "stepaudio2_mini"):   # rehearses its script per session
                build = 10.0 * sum(counts)
            else:
                build = (1.0 if mode == "cadence" else 2.0) * sum(counts)
            assert 20 + 60 * len(counts) + build <= 0.9 * budget, (mode, name, counts)


# --- several GPUs of one host (--gpus) ---------------------------------------------------------------
FAKE_STAGE = """import json, os, sys, time
t0 = time.time()
time.sleep(float(sys.argv[2]))
with open(os.path.join(sys.argv[1], "seen.json"), "w") as fh:
    json.dump({"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": t0, "end": time.time()}, fh)
"""


@pytest.fixture
def fake_stage_process(tmp_path, monkeypatch):
    """subprocess_executor runs `python -m fake_stage <out dir> <sleep s>`: it writes what it saw to seen.json."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fake_stage.py").write_text(FAKE_STAGE)
    monkeypatch.setenv("PYTHONPATH", str(mods))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(stages, "stage_argv", lambda stage, out_dir, options: ["fake_stage", str(out_dir), "1.0"])

    def seen(run_dir: Path, name: str) -> dict:
        return json.loads((run_dir / name / "seen.json").read_text())
    return seen


def test_two_stages_run_at_once_each_on_its_gpu(tmp_path, fake_stage_process):
    """Real child processes: a and b overlap, each sees only its GPU; c waits for the first free one.
    (Memory stages: the timed ones run alone, test_timed_stages_run_alone_memory_stages_side_by_side.)"""
    run_dir = tmp_path / "run"
    state = stages.State.open(run_dir, OPTIONS, resume=False)
    plan = [stages.Stage(w, "memory_stock", 60.0) for w in "abc"]
    sitting = stages.run_plan(plan, state, OPTIONS, gpus=[0, 1], log=lambda *_: None)
    a, b, c = (fake_stage_process(run_dir, f"{w}.memory_stock") for w in "abc")
    assert max(a["start"], b["start"]) < min(a["end"], b["end"])            # at the same time
    assert c["start"] >= min(a["end"], b["end"])                            # two GPUs: two at a time
    disk = on_disk(run_dir)
    assert (a["cvd"], b["cvd"]) == ("0", "1")
    assert (disk["a.memory_stock"]["gpu"], disk["b.memory_stock"]["gpu"]) == (0, 1)
    assert c["cvd"] == str(disk["c.memory_stock"]["gpu"]) and all(v["status"] == "done" for v in disk.values())
    assert (run_dir / "b.memory_stock" / "log.txt").read_text().splitlines()[0] == \
        "# stage b.memory_stock on GPU 1 (CUDA_VISIBLE_DEVICES=1)"
    assert sitting["gpus"] == [0, 1] and sorted(sitting["ran"]) == [f"{w}.memory_stock" for w in "abc"]

    seq = tmp_path / "seq"                                                  # no --gpus: as before, unpinned
    stages.run_plan(plan[:1], stages.State.open(seq, OPTIONS, resume=False), OPTIONS, log=lambda *_: None)
    assert fake_stage_process(seq, "a.memory_stock")["cvd"] is None and on_disk(seq)["a.memory_stock"]["gpu"] is None
    assert not (seq / "a.memory_stock" / "log.txt").read_text().startswith("# stage")


def test_visible_device_maps_through_our_own_cuda_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert stages.visible_device(1) == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")                       # this process sees physical 3 and 5
    assert stages.visible_device(1) == "5"
    with pytest.raises(ValueError, match="shows 2 GPU"):
        stages.visible_device(2)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_budget_stop_with_a_stage_in_flight(tmp_path):
    """a holds GPU 0 until the sitting has stopped; b takes 90 s on GPU 1; c then finds 60 s of 150 left,
    less than the 100 s it needs: c and d stay pending, a still ends and is recorded."""
    clock, release, calls, at_stop = FakeClock(), threading.Event(), [], {}

    def execute(stage, out_dir, timeout_s, options, *, gpu=None):
        calls.append((stage.name, timeout_s, gpu))
        if stage.workload == "a":
            assert release.wait(10), "the sitting never stopped while a ran"
            clock.now += 5.0
        else:
            clock.now += 90.0
        return stages.Outcome("done", 0, "", ["stub"])

    def log(message: str) -> None:
        if message.startswith("stop:"):
            at_stop.update(on_disk(tmp_path))
            release.set()

    state = stages.State.open(tmp_path, OPTIONS, resume=False)
    plan = [stages.Stage(w, "memory_stock", 100.0) for w in "abcd"]
    sitting = stages.run_plan(plan, state, OPTIONS, budget_s=150.0, execute=execute, clock=clock, log=log,
                              gpus=[0, 1])
    assert sorted(calls) == [("a.memory_stock", 100.0, 0), ("b.memory_stock", 100.0, 1)]
    assert (at_stop["a.memory_stock"]["status"], at_stop["b.memory_stock"]["status"]) == ("running", "done")
    assert sitting["stopped"].startswith("budget: 60 s of --budget-s 150 left before c.memory_stock, which is "
                                         "expected to need 100 s")
    disk = on_disk(tmp_path)
    assert [disk[f"{w}.memory_stock"]["status"] for w in "abcd"] == ["done", "done", "pending", "pending"]
    assert disk["a.memory_stock"]["seconds"] == 95.0 and sitting["ran"] == ["b.memory_stock", "a.memory_stock"]
    assert "ended_utc" in sitting


def test_a_killed_parallel_sitting_is_resumed(tmp_path):
    """The command is killed with two stages in flight: both stay `running` on disk, become failed
    (interrupted) when the run folder is opened again, and rerun, here on another set of GPUs."""
    class Killed(Exception):
        pass

    go = threading.Event()

    def execute(stage, out_dir, timeout_s, options, *, gpu=None):
        go.wait(5)
        return stages.Outcome("done", 0, "", ["stub"])

    def log(message: str) -> None:
        if message.startswith("stage b.memory_stock: start"):
            go.set()
            raise Killed

    plan = [stages.Stage(w, "memory_stock", 100.0) for w in "abc"]
    with pytest.raises(Killed):
        stages.run_plan(plan, stages.State.open(tmp_path, OPTIONS, resume=False), OPTIONS, execute=execute,
                        log=log, gpus=[0, 1])
    disk = on_disk(tmp_path)
    assert {k: (v["status"], v["gpu"]) for k, v in disk.items()} == {"a.memory_stock": ("running", 0),
                                                                     "b.memory_stock": ("running", 1)}
    opened = stages.State.open(tmp_path, OPTIONS, resume=True)
    assert all((opened.stages[f"{w}.memory_stock"].status, opened.stages[f"{w}.memory_stock"].reason) ==
               ("failed", "interrupted: the sitting ended while this stage ran") for w in "ab")
    again = Stub()
    state, _ = run(tmp_path, plan, again, resume=True)          # run() has no gpus: a sitting on one GPU
    assert [c[0] for c in again.calls] == ["a.memory_stock", "b.memory_stock", "c.memory_stock"]
    assert [state.stages[f"{w}.memory_stock"].attempts for w in "abc"] == [2, 2, 1]
    assert all(state.stages[f"{w}.memory_stock"].gpu is None for w in "abc")
    disk = on_disk(tmp_path)
    assert all(v["status"] == "done" for v in disk.values())


def test_state_saves_one_at_a_time(tmp_path, monkeypatch):
    """Saves from several threads never overlap (each writes the one .tmp file, then renames it)."""
    inside, peak, real = [0], [0], os.replace

    def slow_replace(src, dst):
        inside[0] += 1
        peak[0] = max(peak[0], inside[0])
        time.sleep(0.02)
        inside[0] -= 1
        real(src, dst)

    monkeypatch.setattr(stages.os, "replace", slow_replace)
    state = stages.State.open(tmp_path, OPTIONS, resume=False)
    threads = [threading.Thread(target=state.save) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1 and json.loads((tmp_path / "stages.json").read_text())["schema"] == stages.SCHEMA


class Neighbours:
    """An executor for gpus=[0, 1] that records, as each stage starts, the stages running then (`beside`).
    A memory stage waits (up to 5 s) until two memory stages run, so that two side by side are certain
    where allowed; a timed stage runs 0.2 s, long enough for a stage started beside it to be seen."""

    def __init__(self):
        self.cond, self.running, self.started, self.beside = threading.Condition(), set(), [], {}

    def __call__(self, stage, out_dir, timeout_s, options, *, gpu=None):
        with self.cond:
            self.started.append(stage.name)
            self.beside[stage.name] = set(self.running)
            self.running.add(stage.name)
            self.cond.notify_all()
            if stage.harness not in stages.TIMED_HARNESSES:
                self.cond.wait_for(lambda: sum(".memory_" in n for n in self.running) >= 2, timeout=5)
        time.sleep(0.2 if stage.harness in stages.TIMED_HARNESSES else 0.05)
        with self.cond:
            self.running.discard(stage.name)
        return stages.Outcome("done", 0, "", ["stub"])


def test_timed_stages_run_alone_memory_stages_side_by_side(tmp_path):
    """--gpus 0,1: a verify or duplex stage starts when nothing runs and nothing starts beside it; the memory
    stages before and after run two at a time; stages start in plan order (a.verify waits for a's memory
    stages, b's memory stages wait behind a.duplex_stock); `overlapped` records who ran beside whom."""
    plan = [stages.Stage("a", h, 100.0) for h in ("memory_stock", "memory_cadence", "verify", "duplex_stock")]
    plan += [stages.Stage("b", h, 100.0) for h in ("memory_stock", "memory_cadence", "verify")]
    ex = Neighbours()
    state = stages.State.open(tmp_path, OPTIONS, resume=False)
    stages.run_plan(plan, state, OPTIONS, execute=ex, log=lambda *_: None, gpus=[0, 1])
    names = [s.name for s in plan]
    assert ex.started == names                                        # plan order, nothing reordered
    timed = [s.name for s in plan if s.harness in stages.TIMED_HARNESSES]
    assert timed == ["a.verify", "a.duplex_stock", "b.verify"]
    assert all(ex.beside[n] == set() for n in timed)                  # started with nothing running
    assert not [(n, t) for n in names for t in timed if t in ex.beside[n]]   # nothing started beside it
    assert ex.beside["a.memory_cadence"] == {"a.memory_stock"} and ex.beside["b.memory_cadence"] == {"b.memory_stock"}
    disk = on_disk(tmp_path)
    assert {n: disk[n]["overlapped"] for n in names} == {
        "a.memory_stock": ["a.memory_cadence"], "a.memory_cadence": ["a.memory_stock"], "a.verify": [],
        "a.duplex_stock": [], "b.memory_stock": ["b.memory_cadence"], "b.memory_cadence": ["b.memory_stock"],
        "b.verify": []}
    assert {disk["a.memory_stock"]["gpu"], disk["a.memory_cadence"]["gpu"]} == {0, 1}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", disk["a.verify"]["ended_utc"])


def test_overlap_is_derived_from_the_recorded_times():
    """`overlapping` on stages.json entries: whole seconds (older files) or milliseconds; touching is not
    overlapping; a running stage is open-ended unless its end is given; a cut-off attempt is left out."""
    def st(start, end, status="done"):
        return {"status": status, "started_utc": f"2026-11-30T10:{start}+00:00",
                "ended_utc": end and f"2026-11-30T10:{end}+00:00"}
    recorded = {"v": st("15:14", "16:17"), "m1": st("15:14", "15:54"), "m2": st("15:55", "16:34"),
                "next": st("16:17", "16:40"),            # started in the second v ended (whole seconds)
                "late": st("16:17.250", "16:50.125"),    # milliseconds
                "run": st("16:45", None, "running"),
                "after": st("20:00", "21:00"),            # beside run only while run is open-ended
                "cut": st("16:00", "12:00", "failed"),   # ended_utc left by an earlier attempt
                "never": {"status": "pending", "started_utc": None, "ended_utc": None}}
    assert stages.overlapping("v", recorded) == ["m1", "m2"]
    assert stages.overlapping("next", recorded) == ["m2", "late"]
    assert stages.overlapping("run", recorded) == ["late", "after"]
    assert stages.overlapping("after", recorded) == ["run"]
    assert stages.overlapping("after", recorded, ended={"run": "2026-11-30T10:16:50.500+00:00"}) == []
    assert stages.overlapping("cut", recorded) == [] and stages.overlapping("never", recorded) == []
    assert "cut" not in stages.overlapping("m2", recorded)


@pytest.fixture
def two_gpus(monkeypatch):
    """suite.reproduce believes it is on a host with 2 CUDA GPUs (no CUDA is touched: stub executors)."""
    monkeypatch.setattr(reproduce.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(reproduce.torch.cuda, "device_count", lambda: 2)


def test_gpus_is_not_a_recorded_option(fake_registry, clean_tree, two_gpus, tmp_path):  # noqa: F811
    """A run started on two GPUs resumes on none (and the reverse would too): --gpus is the sitting's."""
    run_dir = tmp_path / "run"
    args = ["--device", "cuda", "--workload", "fake", "--stages", "verify,memory", "--run-dir", str(run_dir)]
    first = Stub(fail={"fake.memory_cadence"}, record=False)
    assert reproduce.main([*args, "--gpus", "0,1"], execute=first) == 1
    data = json.loads((run_dir / "stages.json").read_text())
    assert "gpus" not in data["options"] and data["options"]["device"] == "cuda"
    assert data["sittings"][0]["gpus"] == [0, 1]
    gpus = {k: v["gpu"] for k, v in data["stages"].items()}
    assert set(gpus.values()) <= {0, 1} and first.gpu == gpus                 # what each executor call was given
    assert ", GPUs 0,1, git" in _section((run_dir / "REPORT.md").read_text(), "Provenance")
    again = Stub(record=False)
    assert reproduce.main([*args, "--resume"], execute=again) == 0
    assert [c[0] for c in again.calls] == ["fake.memory_cadence"]
    data = json.loads((run_dir / "stages.json").read_text())
    assert data["stages"]["fake.memory_cadence"]["gpu"] is None and data["sittings"][1]["gpus"] is None


@pytest.mark.parametrize("args, message", [
    pytest.param(["--gpus", "a"], "--gpus 'a': expected comma-separated GPU indices", id="not-int"),
    pytest.param(["--gpus=-1"], "--gpus '-1': expected comma-separated GPU indices", id="negative"),
    pytest.param(["--gpus", "0,,1"], "--gpus '0,,1': expected comma-separated GPU indices", id="empty-item"),
    pytest.param(["--gpus", "1.5"], "--gpus '1.5': expected comma-separated GPU indices", id="float"),
    pytest.param(["--gpus", "0,1,0"], "--gpus '0,1,0': expected each GPU once", id="repeat"),
    pytest.param(["--gpus", "0,2"], "--gpus 0,2: GPU 2 is not there; this process sees 2 GPU(s)", id="absent"),
    pytest.param(["--gpus", "0", "--device", "cuda:1"], "--gpus 0 with --device cuda:1", id="cuda-index"),
])
def test_bad_gpus_is_a_one_line_error(two_gpus, args, message, capsys):
    assert reproduce.main(["--device", "cuda", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_gpus_on_cpu_is_an_error(capsys):
    assert reproduce.main(["--device", "cpu", "--gpus", "0"]) == 2
    assert capsys.readouterr().err == ("error: --gpus 0: the device is cpu; --gpus pins stages to CUDA GPUs "
                                       "(--device cuda)\n")


def test_device_facts_of_a_pinned_stage_are_its_gpus(monkeypatch):
    """Under CUDA_VISIBLE_DEVICES the process's cuda:0 is not nvidia-smi's GPU 0: facts are asked by UUID."""
    from suite import env

    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=2**37,
                                  multi_processor_count=132, uuid="1234-abcd")
    asked = []
    monkeypatch.setattr(env.torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(env.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(env, "nvidia_smi", lambda index: asked.append(index) or {"driver": "x"})
    info = env.device_info("cuda")
    assert asked == ["GPU-1234-abcd"] and info["gpu_uuid"] == "GPU-1234-abcd" and info["driver"] == "x"


# --- merged report ---------------------------------------------------------------------------------------
@pytest.fixture
def fake_registry(monkeypatch, fake_adapter):  # noqa: F811
    registry = {"fake": workload(turns=3, speak_per_turn=12)}
    mod = types.ModuleType("workloads")
    mod.get, mod.names, mod.DEFAULT = registry.__getitem__, lambda: list(registry), "fake"
    monkeypatch.setitem(sys.modules, "workloads", mod)
    return registry


#: One-session mean and p99 SPEAK time / period, miss rate, max zero-miss sessions, per mode.
DUPLEX_FIGURES = {"stock": (1.132, 1.30, 0.61, 3), "cadence": (0.585, 0.80, 0.0, 25)}


def duplex_part(workload_name: str, mode: str, hashes=("u0", "u1", "u2")) -> dict:
    """A suite.duplex record of one mode (test_duplex_merge.part) carrying DUPLEX_FIGURES: its second run
    is at the best count, so the runs give that count as the claims derive it (`max_zero_miss`)."""
    rec = part(mode, hashes)
    w = rec["workloads"].pop(MERGE_WL)
    frac, p99, misses, best = DUPLEX_FIGURES[mode]
    w["modes"][mode]["runs"][0]["metrics"].update(speak_frac_mean=frac, speak_frac_p99=p99, miss_rate=misses)
    w["modes"][mode]["runs"][1]["sessions"] = best
    w["modes"][mode]["max_zero_miss_sessions"] = best
    rec["workloads"][workload_name] = {**w, "workload": workload_name}
    return rec


def _duplex_executor(stage, out_dir, timeout_s, options, *, gpu=None):
    """Stands in for `suite.duplex --modes <the stage's mode>`: writes that mode's record."""
    if stages.family(stage.harness) != "duplex":
        return stages.inline_executor(stage, out_dir, timeout_s, options, gpu=gpu)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "duplex.json").write_text(json.dumps(duplex_part(stage.workload, stage.mode)))
    return stages.Outcome("done", 0, "", ["duplex stub"])


def _as_minicpmo(run_dir: Path) -> None:
    """Label the fake records with the architecture the published figures belong to."""
    for path in run_dir.glob("*/run.json"):
        rec = json.loads(path.read_text())
        rec["workload"]["architecture"] = claims.FLOW_HIFT
        path.write_text(json.dumps(rec))


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


def test_stage_outputs_merge_into_one_report(fake_registry, clean_tree, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    state = stages.State.open(run_dir, OPTIONS, resume=False)
    plan = [stages.Stage("fake", h, 100.0) for h in stages.HARNESSES]
    stages.run_plan(plan, state, OPTIONS, execute=_duplex_executor, log=lambda *_: None)
    assert state.counts() == {"done": 5, "failed": 0, "skipped": 0, "pending": 0, "running": 0}
    _as_minicpmo(run_dir)
    text = claims.write(run_dir).read_text()
    assert text.count("# DuplexCadence reproduction") == 1 and "**Complete**" in text
    for title, paper in [("Speedup", "2.85x"), ("Peak memory", "-38.8%"),
                         ("SPEAK time against the 1 s cadence", "+14% -> -2%"), ("Per-session increment", "1/2"),
                         ("Sessions per GPU", ">= 24"), ("Bitwise equality", "every unit")]:
        table = _section(text, title)
        assert paper in table, title
        assert len([line for line in table.splitlines() if line.startswith("| fake")]) == 1, title
    # ours beside the stock baseline: the speedup row carries both modes' p50 and the ratio
    rec = json.loads((run_dir / "fake.verify" / "run.json").read_text())
    sp = claims.speedup(rec)
    row = next(line for line in _section(text, "Speedup").splitlines() if line.startswith("| fake"))
    assert f"{sp['stock'][1]:.1f} [" in row and f"{sp['x']:.2f}x [" in row
    # memory comes from the one-process-per-mode stages, not from verify
    assert "one process per mode; RSS" in _section(text, "Peak memory")
    stock_mem = json.loads((run_dir / "fake.memory_stock" / "run.json").read_text())["modes"]["stock"]["memory"]
    assert report._f(stock_mem["peak_over_idle_rss_mib"]) in _section(text, "Peak memory")
    speak = _section(text, "SPEAK time against the 1 s cadence")
    # the two per-mode stages' records joined into one row (suite.duplex_merge.merge)
    assert "+13.2%" in speak and "-41.5%" in speak and "+30.0% / -20.0%" in speak
    assert "duplex (fake.duplex_stock/duplex.json, fake.duplex_cadence/duplex.json)" in speak
    assert "one session alone, cadence == stock: yes" in speak
    assert "| 3 " in _section(text, "Sessions per GPU") and ">= 25 vs >= 3" in _section(text, "Sessions per GPU")
    assert "| 36 " in _section(text, "Bitwise equality")          # 3 turns x 12 SPEAK units, all compared
    assert (run_dir / "speedup.png").stat().st_size > 0 and "![memory.png](memory.png)" in text
    prov = _section(text, "Provenance")
    assert "commit (per stage record)" in prov and "impl/ tree" in prov and "seeds" in prov
    assert text.rstrip().split("\n## ")[-1].startswith("Parameters used")
    assert report.rebuild(run_dir) == run_dir / "REPORT.md"        # make report on a staged folder


def test_report_marks_figures_timed_beside_another_stage(fake_registry, clean_tree, tmp_path):  # noqa: F811
    """The speed and duplex rows say which stages ran at the same time: from the recorded `overlapped`, or,
    in a stages.json without it (an older version's), from the recorded times; memory is not marked."""
    run_dir = tmp_path / "run"
    plan = [stages.Stage("fake", h, 100.0) for h in ("verify", "memory_stock", "duplex_stock", "duplex_cadence")]
    stages.run_plan(plan, stages.State.open(run_dir, OPTIONS, resume=False), OPTIONS, execute=_duplex_executor,
                    log=lambda *_: None)
    text = claims.write(run_dir).read_text()                       # one at a time: each recorded alone
    assert "timed beside" not in text and claims.TIMED_NOTE not in text
    assert re.search(r"\| alone +\|$", next(line for line in _section(text, "Speedup").splitlines()
                                            if line.startswith("| fake")))

    data = json.loads((run_dir / "stages.json").read_text())       # as the first H200 sitting of --gpus 0,1
    for name, gpu, start, end in [("verify", 0, "00:00", "01:00"), ("memory_stock", 1, "00:30", "01:30"),
                                  ("duplex_stock", 0, "02:00", "03:00"), ("duplex_cadence", 0, "03:00", "04:00")]:
        st = data["stages"][f"fake.{name}"]
        del st["overlapped"]                                       # written before the field
        st.update(gpu=gpu, started_utc=f"2026-11-30T10:{start}+00:00", ended_utc=f"2026-11-30T10:{end}+00:00")
    (run_dir / "stages.json").write_text(json.dumps(data))
    assert stages.State.open(run_dir, OPTIONS, resume=True).stages["fake.verify"].overlapped is None
    text = claims.write(run_dir).read_text()
    speed = next(line for line in _section(text, "Speedup").splitlines() if line.startswith("| fake"))
    assert "| timed beside fake.memory_stock on another GPU " in speed and claims.TIMED_NOTE in text
    for title in ("SPEAK time against the 1 s cadence", "Sessions per GPU", "Peak memory", "Bitwise equality"):
        assert "timed beside" not in _section(text, title), title
    assert re.search(r"\| fake\.memory_stock .*\| fake\.verify +\|", _section(text, "Stages"))

    data["stages"]["fake.duplex_cadence"]["overlapped"] = ["fake.memory_stock"]   # recorded: it wins
    (run_dir / "stages.json").write_text(json.dumps(data))
    text = claims.write(run_dir).read_text()
    for title in ("SPEAK time against the 1 s cadence", "Sessions per GPU"):
        row = next(line for line in _section(text, title).splitlines() if line.startswith("| fake"))
        assert "; duplex_cadence timed beside fake.memory_stock on another GPU" in row, title
        assert "duplex_stock timed" not in row, title


def test_unfinished_run_report_says_what_is_missing(fake_registry, clean_tree, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    state = stages.State.open(run_dir, OPTIONS, resume=False)
    plan = [stages.Stage("fake", "verify", 100.0)] + [
        stages.Stage("fake", h, 100.0, skip="harness suite.duplex is not importable here")
        for h in ("duplex_stock", "duplex_cadence")]
    stages.run_plan(plan, state, OPTIONS, execute=stages.inline_executor, log=lambda *_: None)
    text = claims.write(run_dir).read_text()
    assert ("not measured (duplex: skipped: harness suite.duplex is not importable here)"
            in _section(text, "Sessions per GPU"))
    assert "tail only, p50, no AR stage (verify)" in _section(text, "SPEAK time against the 1 s cadence")
    assert "one process, both modes (verify)" in _section(text, "Peak memory")


def test_compare_states_whether_ratios_are_within_noise(fake_registry, clean_tree, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    state = stages.State.open(run_dir, OPTIONS, resume=False)
    stages.run_plan([stages.Stage("fake", "verify", 100.0)], state, OPTIONS, execute=stages.inline_executor,
                    log=lambda *_: None)
    ref = tmp_path / "ref"
    ref.mkdir()
    rec = json.loads((run_dir / "fake.verify" / "run.json").read_text())
    for mode, ms in (("stock", 10.0), ("cadence", 5.0)):   # fixed times: the fake's own timings move with
        for u in rec["modes"][mode]["units"]:                # the machine's load (a wide band hid the miss)
            if u["tail_ms"] is not None:
                u["tail_ms"] = ms + 0.01 * u.get("index", 0)
    (run_dir / "fake.verify" / "run.json").write_text(json.dumps(rec))
    (ref / "run.json").write_text(json.dumps(rec))
    assert "within the reference's noise" in claims.write(run_dir, [str(ref)]).read_text()
    for u in rec["modes"]["stock"]["units"]:          # a reference 10x faster in stock: ratio far outside
        if u["tail_ms"] is not None:
            u["tail_ms"] /= 10.0
    (ref / "run.json").write_text(json.dumps(rec))
    text = claims.write(run_dir, [str(ref)]).read_text()
    assert "OUTSIDE the reference's noise" in _section(text, "Against the reference run")


def test_timing_rounds_give_the_speedup_and_its_band(fake_registry, clean_tree, tmp_path):  # noqa: F811
    """A record with timing rounds: the speedup is their median and the band their min-max (not the much
    wider unit band), in the table, with the host probe; --compare judges against the reference's rounds."""
    run_dir = tmp_path / "run"
    state = stages.State.open(run_dir, OPTIONS, resume=False)
    stages.run_plan([stages.Stage("fake", "verify", 100.0)], state, OPTIONS, execute=stages.inline_executor,
                    log=lambda *_: None)
    path = run_dir / "fake.verify" / "run.json"
    rec = json.loads(path.read_text())

    def with_rounds(xs, host=(5.0, 6.0)):
        r = json.loads(json.dumps(rec))
        r["comparison"]["rounds"] = [{"round": i + 1, "order": ["stock", "cadence"], "stock_tail_ms_p50": 10 * x,
                                      "cadence_tail_ms_p50": 10.0, "speedup_x": x, "units_compared": 3,
                                      "mismatched_units": [], "host_us_per_op": {"before": host[0], "after": host[1]}}
                                     for i, x in enumerate(xs)]
        return r
    for mode, ms in (("stock", 10.0), ("cadence", 5.0)):       # a unit band of about [1.9, 2.1]
        for u in rec["modes"][mode]["units"]:
            if u["tail_ms"] is not None:
                u["tail_ms"] = ms * (1 + 0.05 * ((u.get("index", 0) % 3) - 1))
    ours = with_rounds([2.0, 2.2, 2.1])
    sp = claims.speedup(ours)
    assert (sp["x"], sp["lo"], sp["hi"], sp["band"], sp["host"]) == (2.1, 2.0, 2.2, "3 rounds", (5.0, 6.0))
    old = with_rounds([2.0, 2.2, 2.1])                             # rounds 2+ after round 1's profiled units
    next(u for u in old["modes"]["stock"]["units"] if u["tail_ms"] is not None)["kernels"] = {"kernels": 1}
    assert claims.speedup(old)["band"] == "3 rounds; rounds 2+ timed after the profiler"
    old["comparison"]["profile_pass"] = {"units_compared": 3, "mismatched_units": [], "profiled_units": {}}
    assert claims.speedup(old)["band"] == "3 rounds"
    one = claims.speedup(with_rounds([2.0]))                       # one round: the unit band, as before
    assert one["band"] == "units" and one["lo"] < 1.95 and one["hi"] > 2.05
    path.write_text(json.dumps(ours))
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "run.json").write_text(json.dumps(with_rounds([2.05, 2.15, 2.3])))
    text = claims.write(run_dir, [str(ref)]).read_text()
    row = next(line for line in _section(text, "Speedup").splitlines() if line.startswith("| fake"))
    assert "2.10x [2.00-2.20] (3 rounds)" in row and "5.0-6.0" in row
    assert "us launch" in row and "MHz SM" not in row          # the CPU record's per-unit samples, no GPU clock
    bad = json.loads(json.dumps(ours))                         # a malformed per-unit sample: an error, no file rewritten
    next(u for u in bad["modes"]["stock"]["units"] if u["measured"])["host"] = [8.5, 125.0, None]
    path.write_text(json.dumps(bad))
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.suffix in (".png", ".md")}
    with pytest.raises(ValueError, match=r"fake.verify/run.json: stock unit \d+: host: expected an object"):
        claims.write(run_dir, [str(ref)])
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.suffix in (".png", ".md")} == before
    path.write_text(json.dumps(ours))
    host = _section(text, "Host state per unit (verify, round 1)")
    assert "| fake" in host and "rho(SM MHz, tail)" in host
    ms = {"host_op_us_p50": 10.46, "sm_mhz_p50": 1980.0}
    assert claims.unit_host_cell(ms, {"host_op_us_p50": 7.27}) == "10.5 / 7.3 us launch, 1980 / — MHz SM"
    assert claims.unit_host_cell({}, {}) == "—"
    assert "within the reference's noise" in _section(text, "Against the reference run")
    # the reference's rounds are tight around 1.95: its unit band would hold 2.10, its rounds do not
    (ref / "run.json").write_text(json.dumps(with_rounds([1.94, 1.95, 1.96])))
    assert claims.speedup(json.loads((ref / "run.json").read_text()))["hi"] == 1.96
    text = claims.write(run_dir, [str(ref)]).read_text()
    assert "OUTSIDE the reference's noise" in _section(text, "Against the reference run")


def _rounds_record(xs, tree="t1", stock=None, profiled=False):
    """A verify-style record with timing rounds of speedups xs (cadence 10 ms, stock 10 * x ms)."""
    rec = {"provenance": {"impl_tree": tree}, "run_id": "w.verify",
           "comparison": {"rounds": [{"round": i + 1, "speedup_x": x, "cadence_tail_ms_p50": 10.0,
                                      "stock_tail_ms_p50": 10.0 * x if stock is None else stock[i]}
                                     for i, x in enumerate(xs)]},
           "modes": {"stock": {"units": [{"index": 0, "kernels": {"kernels": 1}} if profiled else {"index": 0}]}}}
    return rec


def _w_row(table: str) -> list[str]:
    """The cells of workload "w"'s row of a rendered table."""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "w":
            return cells
    raise AssertionError(f"no row for w in:\n{table}")


def test_between_runs_pools_the_references_rounds_of_the_same_impl_tree():
    data = {"workloads": {"w": {"verify": {"record": _rounds_record([2.5, 2.6, 2.7])}}}}
    refs = {"w": [("run-a", _rounds_record([2.0, 2.1, 2.2])), ("run-b", _rounds_record([2.9, 3.0, 3.4]))]}
    cells = _w_row(claims.between_runs_table(data, refs))
    # two references; ours (2.6) lies between them, outside each one's own band but inside the pooled one
    assert cells[1:6] == ["2", "2.10x, 3.00x", "2.60x", "[2.00-3.40] (6 rounds)", "yes"]
    assert cells[6].startswith("stock x1.70 (20.0-34.0 ms), cadence x1.00")
    refs["w"][1] = ("run-b", _rounds_record([2.9, 3.0, 3.4], tree="t0"))     # another impl tree: counted out
    cells = _w_row(claims.between_runs_table(data, refs))
    assert cells[1:6] == ["1", "2.10x", "2.60x", "[2.00-2.20] (3 rounds)", "NO"]
    assert "other impl/ trees counted out: run-b" in cells[6]
    # a reference whose rounds 2+ ran after the profiler gives round 1 only
    refs["w"][1] = ("run-c", _rounds_record([2.4, 5.0, 5.0], profiled=True))
    cells = _w_row(claims.between_runs_table(data, refs))
    assert cells[4] == "[2.00-2.40] (4 rounds)" and "round 1 only (rounds 2+ timed after the profiler): run-c" in cells[6]
    assert claims.between_runs_table(data, {}) == "No reference run with timing rounds for a workload of this run."
    only_other = {"w": [("run-b", _rounds_record([2.9], tree="t0"))]}
    assert "no reference of this impl/ tree (other trees: run-b)" in claims.between_runs_table(data, only_other)


def test_between_runs_cuts_ours_as_the_references_and_never_pools_unknown_trees_or_nan():
    # ours ran its rounds 2+ after the profiler: round 1 only, as for a reference
    ours = _rounds_record([2.5, 5.0, 5.0], profiled=True)
    cells = _w_row(claims.between_runs_table({"workloads": {"w": {"verify": {"record": ours}}}},
                                             {"w": [("run-a", _rounds_record([2.4, 2.5, 2.6]))]}))
    assert cells[3:6] == ["2.50x", "[2.40-2.60] (3 rounds)", "yes"] and "profiler): ours" in cells[6]
    # neither record says its impl/ tree: not "the same tree"
    data = {"workloads": {"w": {"verify": {"record": {**_rounds_record([2.5]), "provenance": {}}}}}}
    refs = {"w": [("run-a", {**_rounds_record([2.0, 3.0]), "provenance": {}})]}
    assert "no reference of this impl/ tree" in claims.between_runs_table(data, refs)
    # a NaN round is left out wherever it stands (min/max over NaN depend on its position)
    data = {"workloads": {"w": {"verify": {"record": _rounds_record([2.5, 2.6, 2.7])}}}}
    for xs in ([float("nan"), 2.0, 3.0], [2.0, float("nan"), 3.0]):
        cells = _w_row(claims.between_runs_table(data, {"w": [("run-a", _rounds_record(xs))]}))
        assert cells[4:6] == ["[2.00-3.00] (2 rounds)", "yes"]


def test_compare_keeps_a_row_per_reference_run(fake_registry, clean_tree, tmp_path):  # noqa: F811
    """Several --compare folders: one row each (a later folder used to replace an earlier one's record)."""
    run_dir = tmp_path / "run"
    state = stages.State.open(run_dir, OPTIONS, resume=False)
    stages.run_plan([stages.Stage("fake", "verify", 100.0)], state, OPTIONS, execute=stages.inline_executor,
                    log=lambda *_: None)
    rec = json.loads((run_dir / "fake.verify" / "run.json").read_text())
    for name in ("ref-a", "ref-b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps(rec))
    text = claims.write(run_dir, [str(tmp_path / "ref-a"), str(tmp_path / "ref-b")]).read_text()
    rows = [line for line in _section(text, "Against the reference run").splitlines() if line.startswith("| fake")]
    assert [r.split("|")[2].strip() for r in rows] == ["ref-a", "ref-b"]
    assert "## Between runs" in text
    # a folder named twice counts once; two folders of one name are labelled by their paths
    text = claims.write(run_dir, [str(tmp_path / "ref-a"), str(tmp_path / "ref-a")]).read_text()
    rows = [line for line in _section(text, "Against the reference run").splitlines() if line.startswith("| fake")]
    assert len(rows) == 1
    (tmp_path / "x" / "ref-a").mkdir(parents=True)
    (tmp_path / "x" / "ref-a" / "run.json").write_text(json.dumps(rec))
    text = claims.write(run_dir, [str(tmp_path / "ref-a"), str(tmp_path / "x" / "ref-a")]).read_text()
    rows = [line for line in _section(text, "Against the reference run").splitlines() if line.startswith("| fake")]
    assert [r.split("|")[2].strip() for r in rows] == [str(tmp_path / "ref-a"), str(tmp_path / "x" / "ref-a")]


def _staged_with_reference(tmp_path):
    """A CPU staged run folder (fake verify done) and a single-run reference folder beside it."""
    run_dir = tmp_path / "results" / "run"
    state = stages.State.open(run_dir, OPTIONS, resume=False)
    stages.run_plan([stages.Stage("fake", "verify", 100.0)], state, OPTIONS, execute=stages.inline_executor,
                    log=lambda *_: None)
    ref = tmp_path / "results" / "ref"
    ref.mkdir()
    (ref / "run.json").write_text((run_dir / "fake.verify" / "run.json").read_text())
    return run_dir, ref


def _disk(*folders: Path) -> dict:
    return {p: p.read_bytes() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


def test_make_report_compare_records_the_reference_and_keeps_it(fake_registry, clean_tree, tmp_path, capsys):  # noqa: F811
    """`python -m suite.report RUN --compare REF`: the second run of a tree judged against the first after
    both came back (reproduce-9-second against reproduce-9); the reference is recorded in stages.json, so a
    plain rebuild keeps it. A missing reference, or --compare on a single run's folder, is an error that
    changes nothing."""
    run_dir, ref = _staged_with_reference(tmp_path)
    before = (run_dir / "stages.json").read_text()
    assert report.main([str(run_dir), "--compare", str(tmp_path / "missing")]) == 1
    assert "missing" in capsys.readouterr().err and (run_dir / "stages.json").read_text() == before
    assert report.main([str(ref), "--compare", str(run_dir)]) == 1
    assert "only for a staged reproduction" in capsys.readouterr().err and not (ref / "REPORT.md").exists()
    assert not (run_dir / "REPORT.md").exists()                  # neither error wrote a report
    assert report.main([str(run_dir), "--compare", str(ref)]) == 0
    assert json.loads((run_dir / "stages.json").read_text())["compare"] == [str(ref)]
    assert report.main([str(run_dir)]) == 0                      # kept by a plain rebuild
    rows = [line for line in _section((run_dir / "REPORT.md").read_text(), "Against the reference run").splitlines()
            if line.startswith("| fake")]
    assert len(rows) == 1 and "| ref " in rows[0]


@pytest.mark.parametrize("spoil, args, match", [
    # a reference whose record renders wrong: found before stages.json is written
    (lambda run, ref: (ref / "run.json").write_text(json.dumps({"workload": {"name": "fake"}, "modes": []})),
     lambda run, ref: [str(run), "--compare", str(ref)], "reference run"),
    (lambda run, ref: (ref / "run.json").write_text("[]"), lambda run, ref: [str(run), "--compare", str(ref)],
     "expected a run record"),
    (lambda run, ref: (ref / "run.json").write_text("{"), lambda run, ref: [str(run), "--compare", str(ref)],
     "not JSON"),
    # the run itself as its reference
    (lambda run, ref: None, lambda run, ref: [str(run), "--compare", str(run)], "it is the run itself"),
    # several folders: the second fails, so the first is not rebuilt either
    (lambda run, ref: None, lambda run, ref: [str(run), str(ref.parent / "nope"), "--compare", str(ref)],
     "neither stages.json nor run.json"),
])
def test_report_compare_that_fails_changes_nothing(fake_registry, clean_tree, tmp_path, capsys,  # noqa: F811
                                                     spoil, args, match):
    run_dir, ref = _staged_with_reference(tmp_path)
    spoil(run_dir, ref)
    before = _disk(run_dir, ref)
    assert report.main(args(run_dir, ref)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and "nothing was rebuilt" in err
    assert _disk(run_dir, ref) == before


def test_report_compare_leaves_a_running_stage_alone_and_finds_a_moved_reference(
        fake_registry, clean_tree, tmp_path, monkeypatch):  # noqa: F811
    """Recording a reference only sets `compare` (suite.stages.State.open would mark a stage of a live
    sitting interrupted); a relative reference that is not there from the working directory is looked up
    beside the run folder (a report rebuilt from elsewhere)."""
    run_dir, ref = _staged_with_reference(tmp_path)
    data = json.loads((run_dir / "stages.json").read_text())
    data["stages"]["fake.verify"]["status"] = "running"
    (run_dir / "stages.json").write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    assert report.main([str(run_dir), "--compare", "results/ref"]) == 0
    after = json.loads((run_dir / "stages.json").read_text())
    assert after["stages"] == data["stages"] and after["compare"] == ["results/ref"]
    monkeypatch.chdir(run_dir)                                   # results/ref is not there from here
    assert report.main([str(run_dir)]) == 0
    assert "| ref " in _section((run_dir / "REPORT.md").read_text(), "Against the reference run")


def test_a_stages_json_without_the_run_s_device_is_refused(tmp_path):
    """Without options.device a CUDA run could not be judged against its plan (it read "Complete")."""
    for options in (None, [], {"steps": None}):
        data = {"schema": stages.SCHEMA, "sittings": [], "stages": {}, **({} if options is None else
                                                                          {"options": options})}
        with pytest.raises(stages.StateError, match="'options': expected an object with the run's 'device'"):
            stages.check_data(data, "x/stages.json")
    with pytest.raises(stages.StateError, match="schema"):
        stages.check_data({"schema": "other/9", "options": OPTIONS}, "x/stages.json")
    assert stages.device_type("cudagraph-cpu") == "cpu" and stages.device_type("cuda:1") == "cuda"


def test_host_state_table_correlates_each_sample_with_the_tail():
    def unit(i, tail, op, sm):
        return {"index": i, "kind": "SPEAK", "measured": True, "tail_ms": tail,
                "host": {"op_us": op, "cpu_loop_us": 50.0 + (i % 2), "sm_mhz": sm}}
    ops = [7.2, 10.5, 7.4, 10.8, 7.3, 10.4]
    stock = [unit(i, 20.0 * op, op, 1980) for i, op in enumerate(ops)]              # the tail follows the launch cost
    stock.append({"index": 9, "kind": "SPEAK", "measured": False, "tail_ms": 1.0, "host": {"op_us": 99.0}})
    rec = {"modes": {"stock": {"units": stock}, "cadence": {"units": [{"index": 0, "kind": "SPEAK", "measured": True,
                                                                        "tail_ms": 5.0, "host": None}]}}}
    row = claims.host_state_rows(rec, "stock")
    assert row[0] == "6"                                       # measured units with samples only
    assert row[1].startswith("8.90 [") and row[2] == "+1.00"    # p50 of the launch cost; rho +1
    assert row[5] == "1980 [1980-1980]" and row[6] == "—"       # a constant clock: no correlation
    assert claims.host_state_rows(rec, "cadence") is None and claims.host_state_rows(None, "stock") is None
    assert claims.rank_corr([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert claims.rank_corr([1, 2], [1, 2]) is None
    assert claims.rank_corr([1, 2, 3], [float("nan"), 2, 3]) is None              # 2 finite pairs left
    assert claims.rank_corr([1, 2, 3, 4, 5], [float("nan"), 2, 3, 5, 4]) == pytest.approx(0.8)
    with pytest.raises(ValueError, match=r"x, y: expected two 1-d sequences of one length"):
        claims.rank_corr([1, 2, 3], [1, 2])
    data = {"workloads": {"w": {"verify": {"record": rec}}}}
    table = claims.host_state_table(data)
    assert table.count("| w ") == 1 and "rho(launch us, tail)" in table
    lines = claims.host_state_section(data)
    assert lines[0].startswith("## Host state per unit")
    stock[0]["host"]["op_us"] = float("nan")                   # a NaN sample (json reads NaN) is left out, not "nan"
    stock[1]["host"]["sm_mhz"] = "1980"                        # text is not a number either
    row = claims.host_state_rows(rec, "stock")
    assert "nan" not in " ".join(row) and row[2] == "+1.00" and row[5] == "1980 [1980-1980]"
    stock[2]["host"] = [8.5, 125.0, None]                      # malformed: a clear error naming the unit and field
    with pytest.raises(ValueError, match=r"^w.verify/run.json: stock unit 2: host: expected an object"):
        claims.host_state_table(data)
    stock[2]["host"] = {"op_us": 7.4, "cpu_loop_us": 50.0, "sm_mhz": 1980}
    for u in stock:                                            # a record made before the samples: no section
        u["host"] = None
    assert claims.host_state_table(data) is None and claims.host_state_section(data) == []


def test_verify_stage_passes_the_device_s_timing_rounds(tmp_path):
    st = stages.Stage("minicpmo45", "verify", 100.0)
    for device, rounds in (("cuda", stages.VERIFY_ROUNDS["cuda"]), ("cpu", stages.VERIFY_ROUNDS["cpu"])):
        argv = stages.stage_argv(st, tmp_path, {**OPTIONS, "device": device})
        assert argv[argv.index("--rounds") + 1] == str(rounds)
    mem = stages.stage_argv(stages.Stage("minicpmo45", "memory_stock", 100.0), tmp_path, OPTIONS)
    assert "--rounds" not in mem
    assert stages.VERIFY_ROUNDS["cuda"] >= 2                       # the report's band needs two rounds


def test_join_takes_the_stages_other_copies_ran(fake_registry, clean_tree, tmp_path):  # noqa: F811
    """Two sittings that each started from a fresh copy (a lent machine): each folder holds its own stages;
    --join puts them into one run folder and one report; a stage done in both, other options or no
    stages.json are refused before anything is written."""
    a, b, joined = tmp_path / "a", tmp_path / "b", tmp_path / "joined"
    for folder, harnesses in ((a, ("verify",)), (b, ("memory_stock", "memory_cadence"))):
        stages.run_plan([stages.Stage("fake", h, 100.0) for h in harnesses],
                        stages.State.open(folder, OPTIONS, resume=False), OPTIONS,
                        execute=stages.inline_executor, log=lambda *_: None)
    assert reproduce.main(["--join", str(a)]) == 2                          # no --run-dir
    assert reproduce.main(["--run-dir", str(joined), "--join", str(a), "--join", str(b)]) == 0
    data = json.loads((joined / "stages.json").read_text())
    assert sorted(data["stages"]) == ["fake.memory_cadence", "fake.memory_stock", "fake.verify"]
    assert all(st["status"] == "done" for st in data["stages"].values())
    assert [s["joined_from"] for s in data["sittings"]] == [str(a), str(b)]
    for name in data["stages"]:
        assert (joined / name / "run.json").read_bytes() == ((a if name == "fake.verify" else b) / name /
                                                             "run.json").read_bytes()
    text = (joined / "REPORT.md").read_text()
    assert "3 done" in text and "one process per mode" in _section(text, "Peak memory")
    before = (joined / "stages.json").read_bytes()
    with pytest.raises(stages.StateError, match="'fake.verify' is done in both"):
        stages.join(joined, [a])
    other = tmp_path / "other"
    stages.run_plan([stages.Stage("fake", "memory_stock", 100.0)],
                    stages.State.open(other, {**OPTIONS, "seed": 7}, resume=False), {**OPTIONS, "seed": 7},
                    execute=stages.inline_executor, log=lambda *_: None)
    with pytest.raises(stages.StateError, match="other options"):
        stages.join(tmp_path / "new", [a, other])
    assert not (tmp_path / "new").exists()
    with pytest.raises(stages.StateError, match="no stages.json"):
        stages.join(joined, [tmp_path / "nowhere"])
    with pytest.raises(stages.StateError, match="is the run folder itself"):
        stages.join(joined, [joined])
    assert (joined / "stages.json").read_bytes() == before


def test_gpu_coverage_names_the_impl_tree_and_head(tmp_path):
    from suite import env

    head = env._git("rev-parse", "HEAD:impl")
    old = {"device": "cuda", "comparison": {"units": []}, "run_id": "old-gpu", "workload": {"name": "w"},
           "provenance": {"date_utc": "2026-11-01", "impl_tree": "0" * 40, "git_rev": "1" * 40}}
    new = {**old, "run_id": "new-gpu", "provenance": {**old["provenance"], "date_utc": "2026-11-30",
                                                        "impl_tree": head or "NA"}}
    for rec in (old, new):
        (tmp_path / rec["run_id"]).mkdir()
        (tmp_path / rec["run_id"] / "run.json").write_text(json.dumps(rec))
    data = {"workloads": {}, "state": {}}
    line = claims.gpu_coverage(data, tmp_path)
    assert "`new-gpu`" in line
    if head:
        assert "it is HEAD's impl/ tree" in line
        (tmp_path / "new-gpu" / "run.json").unlink()
        assert "it is NOT HEAD's impl/ tree" in claims.gpu_coverage(data, tmp_path)


# --- one process per mode, for real ----------------------------------------------------------------------
def test_memory_stages_run_one_subprocess_per_mode(tmp_path):
    """Moshi (reduced depth, the first unit: LISTEN, decoded as moshi's server does), one child process per
    mode. Each child builds its own model: nothing an earlier session left is in its figures."""
    options = {**OPTIONS, "depth": "reduced", "seconds": 1.0}
    state = stages.State.open(tmp_path, options, resume=False)
    plan = [stages.Stage("moshi", f"memory_{m}", 240.0) for m in ("stock", "cadence")]
    stages.run_plan(plan, state, options, log=lambda *_: None)
    pids = set()
    for mode in ("stock", "cadence"):
        st = state.stages[f"moshi.memory_{mode}"]
        assert st.status == "done", (st.reason, st.log_tail)
        assert st.command[1:4] == ["-m", "suite.stage_run", "mode"] and f"--mode {mode}" in " ".join(st.command)
        rec = json.loads((tmp_path / f"moshi.memory_{mode}" / "run.json").read_text())
        assert list(rec["modes"]) == [mode]
        mem = rec["modes"][mode]["memory"]
        assert mem["leftover_rss_mib"] == 0.0                  # the only session of its process
        assert mem["session_rss_mib"] > 0 and mem["peak_over_idle_rss_mib"] > mem["session_rss_mib"]
        (pid,) = [int(m.group(1)) for n in rec["notes"] for m in [re.search(r"pid (\d+)", n)] if m]
        pids.add(pid)
        assert (tmp_path / f"moshi.memory_{mode}" / "log.txt").is_file()
    assert len(pids) == 2 and os.getpid() not in pids


def test_stage_run_bad_input():
    assert stage_run.main(["mode", "--workload", "moshi", "--device", "cpu", "--out", "x"]) == 2   # no --mode
    assert stage_run.main(["verify", "--workload", "nosuch", "--device", "cpu", "--out", "x"]) == 2
    assert stage_run.main(["verify", "--workload", "moshi", "--device", "cpu", "--out", "x", "--rounds", "0"]) == 2
    assert stage_run.main(["mode", "--mode", "stock", "--workload", "moshi", "--device", "cpu", "--out", "x",
                           "--rounds", "2"]) == 2


def _done_duplex_stages(run_dir: Path, records: dict) -> dict:
    """stages.json with done stages `w.<harness>` whose folders hold the given duplex.json records;
    returns workload w's claims entries (claims.load)."""
    data = {"schema": stages.SCHEMA, "options": OPTIONS, "sittings": [], "stages": {}}
    for harness, rec in records.items():
        (run_dir / f"w.{harness}").mkdir(parents=True)
        (run_dir / f"w.{harness}" / "duplex.json").write_text(json.dumps(rec))
        data["stages"][f"w.{harness}"] = {"workload": "w", "harness": harness, "status": "done"}
    (run_dir / "stages.json").write_text(json.dumps(data))
    return claims.load(run_dir)["workloads"]["w"]


def test_duplex_json_of_the_harness_gives_the_claim_figures(tmp_path):
    """suite.duplex writes duplex.json (schema duplexcadence.duplex/2; /1 before); the claims read the one-session
    run's mean / p99 SPEAK time as % over the cadence, its miss rate, and the zero-miss session count.
    Here from a legacy both-mode `duplex` stage, which an older run folder may hold."""
    runs = lambda frac, p99, misses, best: {"max_zero_miss_sessions": best, "runs": [  # noqa: E731
        {"sessions": 1, "metrics": {"speak_frac_mean": frac, "speak_frac_p99": p99, "miss_rate": misses,
                                    "misses": 0 if best else 24}},
        {"sessions": 12, "metrics": {"speak_frac_mean": 2.0, "speak_frac_p99": 3.0, "miss_rate": 0.5,
                                     "misses": 0 if best == 12 else 360}}]}
    legacy = {"schema": "duplexcadence.duplex/1", "parameters": {"seconds": 60},
              "workloads": {"w": {"ar": {"kind": "none"}, "modes": {"stock": runs(1.14, 1.3, 0.4, None),
                                                                    "cadence": runs(0.1, 0.2, 0.0, 12)}}}}
    d = claims.duplex_figures(_done_duplex_stages(tmp_path, {"duplex": legacy}), "w")
    assert d["modes"]["stock"]["speak_vs_period_pct_mean"] == pytest.approx(14.0)
    assert d["modes"]["cadence"]["speak_vs_period_pct_p99"] == pytest.approx(-80.0)
    assert d["modes"]["stock"]["miss_rate"] == 0.4 and d["modes"]["cadence"]["max_sessions_zero_miss"] == 12
    assert d["files"] == ["w.duplex/duplex.json"]


def test_the_claims_read_a_unit_table_as_they_read_rows(tmp_path):
    """suite.duplex writes each run's units as one table (suite.duplex.pack_units); the report's figures
    and the stock == cadence check through suite.duplex_merge are the same as from rows of objects."""
    rows = claims.duplex_figures(_done_duplex_stages(tmp_path / "rows", {
        "duplex_stock": duplex_part("w", "stock"), "duplex_cadence": duplex_part("w", "cadence")}), "w")
    table = claims.duplex_figures(_done_duplex_stages(tmp_path / "table", {
        "duplex_stock": duplex.pack_units(duplex_part("w", "stock")),
        "duplex_cadence": duplex.pack_units(duplex_part("w", "cadence", ("u0", "X", "u2")))}), "w")
    assert table["cadence_equals_stock"] is False                # the hashes were resolved, and compared
    table = claims.duplex_figures(_done_duplex_stages(tmp_path / "same", {
        "duplex_stock": duplex.pack_units(duplex_part("w", "stock")),
        "duplex_cadence": duplex.pack_units(duplex_part("w", "cadence"))}), "w")
    assert table == {**rows, "files": table["files"]} and table["cadence_equals_stock"] is True


def _mode_runs(best: int | None, counts_misses: list[tuple[int, int | str]]) -> dict:
    """A mode's duplex record: one run per (sessions, misses or "refused"), 60 units per session, and its
    best count."""
    return {"max_zero_miss_sessions": best, "runs": [
        {"sessions": n, "refused": True} if k == "refused" else
        {"sessions": n, "metrics": {"speak_frac_mean": 0.1, "speak_frac_p99": 0.2, "misses": k,
                                    "miss_rate": k / (60 * n), "units_run": 60 * n}} for n, k in counts_misses]}


@pytest.mark.parametrize("stock, cadence, cells, ratio", [
    # stock exact (2 clean, 3 missed); cadence skipped counts: 1 clean, 26 missed -> limit in 1-25
    pytest.param((2, [(1, 0), (2, 0), (3, 6)]), (1, [(1, 0), (26, 46)]),
                 ("2 (3 missed 6/180)", "1 (26 missed 46/1560: limit 1-25)"), "0.5-12.5x", id="cadence-bracket"),
    # both exact
    pytest.param((2, [(1, 0), (2, 0), (3, 6)]), (26, [(1, 0), (26, 0), (27, 1)]),
                 ("2 (3 missed 6/180)", "26 (27 missed 1/1620)"), "13.0x", id="both-exact"),
    # cadence never missed: a lower bound on the ratio
    pytest.param((2, [(1, 0), (2, 0), (4, 26)]), (8, [(1, 0), (8, 0)]),
                 ("2 (4 missed 26/240: limit 2-3)", "8 (largest tried)"), ">= 2.6x", id="cadence-lower-bound"),
    # a range rounded outwards: 32/7 = 4.57 -> 4.5, 47/4 = 11.75 -> 11.8
    pytest.param((4, [(1, 0), (4, 0), (8, 453)]), (32, [(1, 0), (32, 0), (48, 2617)]),
                 ("4 (8 missed 453/480: limit 4-7)", "32 (48 missed 2617/2880: limit 32-47)"), "4.5-11.8x",
                 id="range-rounded-outwards"),
    # neither missed
    pytest.param((4, [(1, 0), (4, 0)]), (32, [(1, 0), (32, 0)]),
                 ("4 (largest tried)", "32 (largest tried)"), "— (both limits above the counts tried: >= 32 vs >= 4)",
                 id="two-lower-bounds"),
    # one session alone missed: a limit of 0, shown, not a dash; a refused count bounds the limit as a miss does
    pytest.param((None, [(1, 3)]), (4, [(1, 0), (4, 0), (8, "refused")]),
                 ("0 (1 missed 3/60)", "4 (8 refused (memory): limit 4-7)"), claims.DASH, id="zero-and-refused"),
])
def test_sessions_per_gpu_shows_the_bracket_the_counts_tried_put_on_each_limit(tmp_path, stock, cadence, cells,
                                                                             ratio):
    """The sessions row names the first count that missed and the ratio comes from the two brackets: a
    cadence run whose counts jumped 1 -> 26 and missed at 26 is not '0.5x' but a limit somewhere in 1-25
    (reproduce-9's MiniCPM-o), and a count that never missed is marked a lower bound."""
    recs = {}
    for mode, (best, runs) in (("stock", stock), ("cadence", cadence)):
        rec = {"schema": "duplexcadence.duplex/1", "parameters": {"seconds": 60}, "verdict": "VALID",
               "workloads": {"w": {"ar": {"kind": "none"}, "modes": {mode: _mode_runs(best, runs)}}}}
        recs[mode] = rec
    d = claims.duplex_figures(_done_duplex_stages(tmp_path, {"duplex": {
        **recs["stock"], "workloads": {"w": {"ar": {"kind": "none"}, "modes": {
            "stock": recs["stock"]["workloads"]["w"]["modes"]["stock"],
            "cadence": recs["cadence"]["workloads"]["w"]["modes"]["cadence"]}}}}}), "w")
    fs, fc = d["modes"]["stock"], d["modes"]["cadence"]
    assert (claims._limit_cell(fs), claims._limit_cell(fc)) == cells
    assert claims.session_ratio(fs, fc) == ratio
    assert claims.session_ratio(None, fc) == claims.DASH and claims._limit_cell(None) == claims.DASH


def test_a_run_folder_missing_default_plan_stages_reads_incomplete(tmp_path, monkeypatch):
    """A stage enters stages.json only when a sitting selects it: a CUDA folder whose sittings never named
    two stages read 'Complete' before (reproduce-9 without its Moshi and 5-step duplex_stock stages)."""
    cuda = {**OPTIONS, "device": "cuda"}
    have = {f"w.{h}": {"workload": "w", "harness": h, "status": "done"} for h in stages.HARNESSES
            if h != "duplex_stock"}
    assert stages.unselected({"options": cuda, "stages": have}) == ["w.duplex_stock"]
    assert stages.unselected({"options": cuda, "stages": have}, ["v", "w"]) == [
        *(f"v.{h}" for h in stages.HARNESSES), "w.duplex_stock"]
    assert stages.unselected({"options": OPTIONS, "stages": {}}, ["w"]) == []     # a CPU folder: a check
    legacy = {"w.duplex": {"workload": "w", "harness": "duplex", "status": "done"}}
    assert stages.unselected({"options": cuda, "stages": legacy}) == []           # legacy entries name no plan
    monkeypatch.setattr(claims, "_registered", lambda: ["w"])    # a CUDA run's plan: every registered workload
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    skipped = {name: {**st, "status": "skipped", "reason": "not here"} for name, st in have.items()}
    data = {"schema": stages.SCHEMA, "options": cuda, "sittings": [], "stages": skipped}
    (run_dir / "stages.json").write_text(json.dumps(data))
    head = claims.write(run_dir).read_text().split("\n## ")[0]
    assert "**Incomplete**" in head and "never selected in a sitting: w.duplex_stock" in head
    data["stages"]["w.duplex_stock"] = {"workload": "w", "harness": "duplex_stock", "status": "skipped",
                                        "reason": "not here"}
    (run_dir / "stages.json").write_text(json.dumps(data))
    head = claims.write(run_dir).read_text().split("\n## ")[0]
    assert "**Complete**" in head and "never selected" not in head


def test_per_mode_duplex_records_are_joined_by_duplex_merge(tmp_path):
    """Both per-mode stages done: one set of figures, stock == cadence recomputed by suite.duplex_merge;
    a differing unit of the one-session runs shows as NO."""
    d = claims.duplex_figures(_done_duplex_stages(tmp_path / "same", {
        "duplex_stock": duplex_part("w", "stock"), "duplex_cadence": duplex_part("w", "cadence")}), "w")
    assert set(d["modes"]) == {"stock", "cadence"} and d["cadence_equals_stock"] is True
    assert d["modes"]["cadence"]["max_sessions_zero_miss"] == 25 and d["verdict"] == "VALID"
    d = claims.duplex_figures(_done_duplex_stages(tmp_path / "differ", {
        "duplex_stock": duplex_part("w", "stock"), "duplex_cadence": duplex_part("w", "cadence", ("u0", "X", "u2"))}),
        "w")
    assert d["cadence_equals_stock"] is False and d["verdict"] == "INVALID"


def test_one_duplex_mode_done_is_shown_and_the_other_said_pending(tmp_path):
    """The sitting's budget ends after duplex_stock: the report has stock's figures, and says cadence is pending."""
    class DuplexStub(Stub):
        def __call__(self, stage, out_dir, timeout_s, options, *, gpu=None):
            self.calls.append((stage.name, timeout_s))
            self.now += self.seconds
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "duplex.json").write_text(json.dumps(duplex_part(stage.workload, stage.mode)))
            return stages.Outcome("done", 0, "", ["duplex stub"])

    stub = DuplexStub(seconds=500.0)
    plan = [stages.Stage("w", h, 560.0) for h in ("duplex_stock", "duplex_cadence")]
    state, sitting = run(tmp_path, plan, stub, budget_s=580.0)
    assert [c[0] for c in stub.calls] == ["w.duplex_stock"] and sitting["stopped"]
    text = claims.write(tmp_path).read_text()
    speak, sessions = _section(text, "SPEAK time against the 1 s cadence"), _section(text, "Sessions per GPU")
    row = next(line for line in speak.splitlines() if line.startswith("| w "))
    assert "+13.2%" in row and "duplex (w.duplex_stock/duplex.json); cadence: pending: not run yet: budget" in row
    row = next(line for line in sessions.splitlines() if line.startswith("| w "))
    assert "| 3 " in row and "cadence: pending" in row and "cadence == stock" not in row


def test_a_legacy_duplex_entry_is_left_alone_and_listed(fake_registry, clean_tree, tmp_path, capsys):  # noqa: F811
    """A stages.json of the single `duplex` harness (before the per-mode split): resume neither crashes
    nor runs or rewrites it; --list and the report name it; it is not counted."""
    run_dir = tmp_path / "run"
    args = ["--device", "cpu", "--workload", "fake", "--run-dir", str(run_dir), "--stages", "verify"]
    stub = Stub(record=False)
    assert reproduce.main(args, execute=stub) == 0
    data = json.loads((run_dir / "stages.json").read_text())
    old = {"workload": "fake", "harness": "duplex", "status": "running", "reason": "", "attempts": 1}
    data["stages"]["fake.duplex"] = old                        # as a sitting killed in an old version left it
    (run_dir / "stages.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert reproduce.main([*args, "--resume", "--list"], execute=stub) == 0
    assert re.search(r"fake\.duplex +\S+ +legacy: harness 'duplex' is not run by this version", capsys.readouterr().out)
    assert reproduce.main([*args, "--resume"], execute=stub) == 0
    assert [c[0] for c in stub.calls] == ["fake.verify"]        # kept on resume; the legacy entry never runs
    disk = on_disk(run_dir)["fake.duplex"]
    assert {k: disk[k] for k in ("harness", "attempts")} == {"harness": "duplex", "attempts": 1}
    state = stages.State.open(run_dir, json.loads((run_dir / "stages.json").read_text())["options"], resume=True)
    assert list(state.legacy()) == ["fake.duplex"] and state.counts()["failed"] == 0
    text = (run_dir / "REPORT.md").read_text()
    assert "**Complete**" in text and "1 legacy entries" in text
    assert "legacy (a harness this version does not run" in _section(text, "Stages")


# --- a duplex stage's verdict ------------------------------------------------------------------------------
SEGFAULT = "exit status -11: Fatal Python error: Segmentation fault"
TIMEOUT = "timed out after 560 s (killed); rerun with --resume and a larger --stage-budget-s"


def duplex_record(workload_name: str, mode: str, verdict: str = "VALID", reasons=()) -> dict:
    """duplex_part as suite.duplex writes it: INVALID with `reasons` at the top level and the byte
    mismatches among the workload's reasons; PARTIAL: a checkpoint (top level: run not finished)."""
    rec = duplex_part(workload_name, mode)
    w = rec["workloads"][workload_name]
    w["invalid_reasons"] = [r for r in reasons if "differs" in r]
    rec["verdict"] = verdict
    rec["invalid_reasons"] = [duplex.NOT_FINISHED] if verdict == "PARTIAL" else list(reasons)
    if verdict == "PARTIAL":
        w["modes"][mode]["partial"] = True
    return rec


class DuplexStages(Stub):
    """Stands in for `suite.duplex --modes <mode>` run by subprocess_executor: per harness the duplex.json it
    leaves (None: none) and how its process ended (exit status, or "timeout"); default a VALID record, exit 0."""

    def __init__(self, records: dict | None = None, ends: dict | None = None):
        super().__init__(seconds=100.0)
        self.records, self.ends = records or {}, ends or {}

    def __call__(self, stage, out_dir, timeout_s, options, *, gpu=None):
        self.calls.append((stage.name, timeout_s))
        self.now += self.seconds
        out_dir.mkdir(parents=True, exist_ok=True)
        rec = self.records.get(stage.harness, duplex_record(stage.workload, stage.mode))
        if rec is not None:
            (out_dir / "duplex.json").write_text(json.dumps(rec))
        end = self.ends.get(stage.harness, 0)
        if end == "timeout":
            return stages.Outcome("failed", None, TIMEOUT, ["duplex stub"])
        if end == 0:
            return stages.Outcome("done", 0, "", ["duplex stub"])
        tail = {1: "exit status 1: verdict INVALID", -11: SEGFAULT}.get(end, f"exit status {end}")
        return stages.Outcome("failed", end, tail, ["duplex stub"], [tail])


DUPLEX_PLAN = [stages.Stage("w", h, 560.0) for h in ("duplex_stock", "duplex_cadence")]


def test_a_duplex_stages_verdict_is_read_from_its_duplex_json(tmp_path):
    state, _ = run(tmp_path, DUPLEX_PLAN, DuplexStages())
    disk = on_disk(tmp_path)
    for name in ("w.duplex_stock", "w.duplex_cadence"):
        assert {k: disk[name][k] for k in ("status", "verdict", "invalid_codes", "mismatched_units")} == {
            "status": "done", "verdict": "VALID", "invalid_codes": [], "mismatched_units": []}, name
    text = claims.write(tmp_path).read_text()
    assert "Stage verdicts: 2 VALID, 0 INVALID." in text
    assert re.search(r"\| w\.duplex_cadence +\| done .*\| VALID +\|", _section(text, "Stages"))


MISMATCH = "cadence N=2 session 1: unit 1 differs from the same session run alone"


@pytest.mark.parametrize("reasons, codes, message", [
    pytest.param([MISMATCH], ["mismatch"], f"1 session(s) differ from the same session alone: ['{MISMATCH}']",
                 id="session-differs-from-itself-alone"),
    pytest.param([duplex.DIRTY_TREE], ["dirty_tree"], "verdict INVALID: ['dirty_tree']", id="dirty-tree"),
    pytest.param([f"30 s < 60 s: {duplex.SHORT_RUN}"], ["short_run"], "verdict INVALID: ['short_run']",
                 id="short-run"),
])
@pytest.mark.parametrize("limited", [False, True], ids=["full", "limited"])
def test_an_invalid_duplex_record_is_done_and_fails_reproduce_like_verify(
        fake_registry, clean_tree, tmp_path, capsys, reasons, codes, message, limited):  # noqa: F811
    """suite.duplex ran to the end and exits EXIT_INVALID: the stage is done with verdict INVALID (not failed:
    resume does not rerun it), and reproduce exits 1 as for a verify stage's INVALID run.json. No duplex code
    is tolerated, not even in a run cut short with --max-speak-units (a duplex stage runs its 60 s anyway)."""
    run_dir = tmp_path / "run"
    stub = DuplexStages({"duplex_cadence": duplex_record("fake", "cadence", "INVALID", reasons)},
                        {"duplex_cadence": duplex.EXIT_INVALID})
    args = ["--device", "cpu", "--workload", "fake", "--stages", "duplex", "--run-dir", str(run_dir),
            *(["--max-speak-units", "4"] if limited else [])]
    assert reproduce.main(args, execute=stub) == 1
    st = on_disk(run_dir)["fake.duplex_cadence"]
    assert (st["status"], st["reason"], st["verdict"]) == ("done", "", "INVALID")
    assert st["invalid_codes"] == codes and st["invalid_reasons"] == reasons
    assert st["mismatched_units"] == ([MISMATCH] if codes == ["mismatch"] else [])
    assert on_disk(run_dir)["fake.duplex_stock"]["verdict"] == "VALID"
    assert f"FAIL: fake.duplex_cadence: {message}" in capsys.readouterr().err
    text = (run_dir / "REPORT.md").read_text()
    assert "**Complete**" in text and f"1 INVALID; fake.duplex_cadence: {codes[0]}." in text
    assert f"cadence: INVALID ({codes[0]})" in _section(text, "Sessions per GPU")
    again = DuplexStages()
    assert reproduce.main([*args, "--resume"], execute=again) == 1 and again.calls == []   # done: kept


def test_tolerated_needs_a_code():
    assert reproduce.tolerated(["few_units"], True) and not reproduce.tolerated(["few_units"], False)
    assert not reproduce.tolerated([], True)               # INVALID without a code: not a short run
    assert not any(reproduce.tolerated([c], True) for c in ("mismatch", "dirty_tree", "short_run"))


@pytest.mark.parametrize("record, end", [
    pytest.param("PARTIAL", 1, id="exception-after-a-checkpoint"),
    pytest.param(None, 1, id="exception-before-any-run"),
    pytest.param("VALID", 1, id="exception-after-a-valid-record"),
    pytest.param("INVALID", -11, id="signal"),
    pytest.param("INVALID", "timeout", id="timeout"),
    pytest.param("PARTIAL", 2, id="other-status"),
])
def test_a_duplex_crash_is_failed_not_done(tmp_path, record, end):
    """Only suite.duplex's own EXIT_INVALID beside a complete INVALID record is the harness's end; a Python
    exception (exit 1 too) leaves a checkpoint or nothing, a timeout or signal has no such status."""
    rec = None if record is None else duplex_record("w", "cadence", record, [duplex.DIRTY_TREE])
    state, _ = run(tmp_path, DUPLEX_PLAN, DuplexStages({"duplex_cadence": rec}, {"duplex_cadence": end}))
    st = state.stages["w.duplex_cadence"]
    assert st.status == "failed" and st.reason and st.verdict == record
    assert state.stages["w.duplex_stock"].status == "done"


@pytest.mark.parametrize("end, reason", [(-11, SEGFAULT), ("timeout", TIMEOUT)], ids=["segfault", "timeout"])
def test_a_failed_duplex_stage_still_reports_the_runs_it_measured(tmp_path, end, reason):
    """As on the H200: a segfault at 32 sessions after the 1- and 24-session runs were checkpointed, or the time
    limit cutting the last count. The stage stays failed (resume reruns it); the report shows its runs, PARTIAL,
    with the counts it holds and the failure reason."""
    stub = DuplexStages({"duplex_cadence": duplex_record("w", "cadence", "PARTIAL")}, {"duplex_cadence": end})
    state, _ = run(tmp_path, DUPLEX_PLAN, stub)
    st = state.stages["w.duplex_cadence"]
    assert (st.status, st.reason, st.verdict, st.invalid_codes) == ("failed", reason, "PARTIAL", ["partial"])
    text = claims.write(tmp_path).read_text()
    mark = f"cadence: PARTIAL, N=1,25 measured (failed: {reason})"
    speak = next(line for line in _section(text, "SPEAK time against the 1 s cadence").splitlines()
                 if line.startswith("| w "))
    assert "-41.5%" in speak and mark in speak                       # cadence's one-session run, measured
    assert "duplex (w.duplex_stock/duplex.json, w.duplex_cadence/duplex.json)" in speak
    sessions = next(line for line in _section(text, "Sessions per GPU").splitlines() if line.startswith("| w "))
    assert "| 3 (largest tried) | 25 (largest tried) (PARTIAL) | — (both limits above the counts tried: >= 25 vs >= 3) |" in re.sub(r" +\|", " |", sessions) and mark in sessions
    assert "**Incomplete**" in text and "1 PARTIAL (failed after measuring some runs): w.duplex_cadence" in text
    again = DuplexStages()
    run(tmp_path, DUPLEX_PLAN, again, resume=True)
    assert [c[0] for c in again.calls] == ["w.duplex_cadence"]
    text = claims.write(tmp_path).read_text()
    assert "PARTIAL" not in _section(text, "Sessions per GPU") and "Stage verdicts: 2 VALID" in text


BAD_STAGES_JSON = {
    "not JSON": "{not json",
    "a JSON list": "[1, 2]",
    "a JSON string": '"str"',
    "stages a list": {"stages": [1]},
    "stages null": {"stages": None},
    "a stage a list": {"stages": {"w.verify": [1]}},
    "a stage without harness": {"stages": {"w.verify": {"workload": "w", "status": "done"}}},
    "a stage with an unknown key": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "newkey": 1}}},
    "a stage with an unknown status": {"stages": {"w.verify": {"workload": "w", "harness": "verify",
                                                               "status": "bogus"}}},
    "sittings not a list": {"sittings": {}},
}


def _write_bad_state(run_dir: Path, bad) -> str:
    run_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(bad, dict):
        bad = json.dumps({"schema": stages.SCHEMA, "created_utc": "x", "options": OPTIONS, "sittings": [],
                          "stages": {}, "compare": [], **bad})
    (run_dir / "stages.json").write_text(bad)
    return bad


@pytest.mark.parametrize("what", list(BAD_STAGES_JSON))
def test_a_corrupt_stages_json_is_a_one_line_error_naming_it_and_left_as_it_was(tmp_path, capsys, what):
    # a JSON list / string or mis-shaped entries ended in a traceback (AttributeError, TypeError)
    run_dir = tmp_path / "run"
    text = _write_bad_state(run_dir, BAD_STAGES_JSON[what])
    with pytest.raises(stages.StateError, match="stages.json"):
        stages.State.open(run_dir, OPTIONS, resume=True)
    stub = Stub()
    for extra in ([], ["--list"]):
        argv = ["--device", "cpu", "--run-dir", str(run_dir), "--resume", *extra]
        assert reproduce.main(argv, execute=stub) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and "stages.json" in err[0]
    assert stub.calls == [] and (run_dir / "stages.json").read_text() == text
    assert sorted(p.name for p in run_dir.iterdir()) == ["stages.json"]
    assert report.main([str(run_dir)]) == 1                   # make report: one line too
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "stages.json" in err[0]


def test_an_empty_workload_list_is_an_error_not_an_empty_run(tmp_path, capsys):
    # `--workload ,` planned nothing, wrote a run folder with an empty report and exited 0
    stub = Stub()
    assert reproduce.main(["--device", "cpu", "--workload", ",", "--out", str(tmp_path)], execute=stub) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--workload" in err[0]
    assert stub.calls == [] and list(tmp_path.iterdir()) == []


def _memory_record(modes: dict, arch: str = claims.FLOW_HIFT) -> dict:
    """A harness record with {mode: (peak MiB, session MiB)} driver-level memory (suite.memory's keys)."""
    return {"workload": {"architecture": arch}, "modes": {
        m: {"memory": {"peak_over_idle_driver_mib": p, "session_driver_mib": s, "driver_source": "nvml"}}
        for m, (p, s) in modes.items()}}


def test_memory_claims_never_pair_one_memory_stage_with_the_other_modes_verify_figure():
    verify = _memory_record({"stock": (5000.0, 3616.0), "cadence": (3000.0, 2230.0)})
    stock_stage = _memory_record({"stock": (4800.0, 3616.0)})
    # as reproduce-9: memory_stock done, memory_cadence not run: both figures from verify, not 3616 vs 2230 mixed
    # with a one-process-per-mode stock
    half = {"verify": {"record": verify}, "memory_stock": {"record": stock_stage}}
    m = claims.memory_figures(half)
    assert {x["how"] for x in m.values()} == {"one process, both modes (verify); driver (nvml)"}
    assert (m["stock"]["peak"], m["cadence"]["peak"]) == (5000.0, 3000.0)
    row = claims.session_table({"workloads": {"w": half}})
    assert "0.62 of stock (not judged: needs both memory stages)" in row and "(met)" not in row
    assert "(missed)" not in row

    both = dict(half, memory_cadence={"record": _memory_record({"cadence": (2000.0, 1200.0)})})
    m = claims.memory_figures(both)
    assert {x["how"] for x in m.values()} == {"one process per mode; driver (nvml)"}
    assert (m["stock"]["peak"], m["cadence"]["peak"]) == (4800.0, 2000.0)
    assert "0.33 of stock (met)" in claims.session_table({"workloads": {"w": both}})


def test_a_workload_with_no_record_in_the_run_keeps_its_published_figure():
    # the architecture comes from the registry then: a third run without MiniCPM-o's verify read
    # "— (published for MiniCPM-o only)" on MiniCPM-o's own row (2026-12-01-h200-reproduce-9-third)
    table = claims.speedup_table({"workloads": {"minicpmo45": {}, "moshi": {}, "not_registered": {}}})
    rows = {r.split("|")[1].strip(): r.split("|")[3].strip() for r in table.splitlines()[2:]}
    assert rows["minicpmo45"] == f"{claims.PUBLISHED['speedup_x']:.2f}x"
    assert rows["moshi"] == rows["not_registered"] == f"{claims.DASH} (published for MiniCPM-o only)"


def _folder_digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("edit, match", [
    pytest.param(lambda d: d["stages"]["fake.verify"].update(dir="../victim"), "'dir': expected the stage's own",
                 id="dir-escapes"),
    pytest.param(lambda d: d["stages"]["fake.verify"].update(dir="/tmp/x"), "'dir': expected the stage's own",
                 id="dir-absolute"),
    pytest.param(lambda d: d["stages"]["fake.verify"].update(dir="."), "'dir': expected the stage's own",
                 id="dir-the-run-folder"),
    pytest.param(lambda d: d["stages"]["fake.verify"].update(dir=5), "'dir': expected the stage's own",
                 id="dir-a-number"),
    pytest.param(lambda d: d["stages"]["fake.verify"].update(dir="fake.memory_stock"),   # another stage's folder
                 "'dir': expected the stage's own", id="dir-of-another-stage"),
    pytest.param(lambda d: d["stages"]["fake.verify"].update(seconds="abc"), "'seconds': expected a number",
                 id="seconds-a-string"),
    pytest.param(lambda d: d.update(sittings=[1, 2]), "'sittings': expected a list of objects",
                 id="sittings-of-ints"),
    pytest.param("remove the folder", "its folder .* is not there", id="done-without-its-folder"),
])
def test_a_join_of_a_crafted_folder_is_refused_and_deletes_nothing(fake_registry, clean_tree, tmp_path,  # noqa: F811
                                                                  capsys, edit, match):
    """A helper's attack (2026-12-01): a stage 'dir' of '../victim' made join rmtree a folder outside the
    run, '.' replaced the run folder, and sittings of ints failed after a stage folder was copied."""
    ours, theirs, victim = tmp_path / "ours", tmp_path / "theirs", tmp_path / "victim"
    for folder, harness in ((ours, "memory_stock"), (theirs, "verify")):
        stages.run_plan([stages.Stage("fake", harness, 100.0)], stages.State.open(folder, OPTIONS, resume=False),
                        OPTIONS, execute=stages.inline_executor, log=lambda *_: None)
    (victim / "keep").mkdir(parents=True)
    data = json.loads((theirs / "stages.json").read_text())
    if callable(edit):
        edit(data)
    else:
        import shutil
        shutil.rmtree(theirs / "fake.verify")
    (theirs / "stages.json").write_text(json.dumps(data))
    before, kept = _folder_digest(ours), _folder_digest(tmp_path)
    with pytest.raises(stages.StateError, match=match):
        stages.join(ours, [theirs])
    assert reproduce.main(["--run-dir", str(ours), "--join", str(theirs)]) == 2
    assert "error: " in capsys.readouterr().err
    assert _folder_digest(ours) == before and _folder_digest(tmp_path) == kept


def test_a_join_that_cannot_render_the_report_says_so_in_one_line(fake_registry, clean_tree, tmp_path,  # noqa: F811
                                                                  capsys):
    a, b, joined = tmp_path / "a", tmp_path / "b", tmp_path / "joined"
    for folder, harness in ((a, "verify"), (b, "memory_stock")):
        stages.run_plan([stages.Stage("fake", harness, 100.0)], stages.State.open(folder, OPTIONS, resume=False),
                        OPTIONS, execute=stages.inline_executor, log=lambda *_: None)
    data = json.loads((a / "stages.json").read_text())
    data["compare"] = ["results/no-such-reference"]          # recorded relative to a root not here
    (a / "stages.json").write_text(json.dumps(data))
    assert reproduce.main(["--run-dir", str(joined), "--join", str(a), "--join", str(b)]) == 1
    err = capsys.readouterr().err
    assert "REPORT.md not rewritten" in err and "no-such-reference" in err and "Traceback" not in err
    assert sorted(json.loads((joined / "stages.json").read_text())["stages"]) == ["fake.memory_stock", "fake.verify"]
    for bad in (a / "stages.json", tmp_path / "nowhere-file"):                 # a file, not a folder
        bad.touch()
        with pytest.raises(stages.StateError):
            stages.join(tmp_path / "new", [bad])


SLEEPER = """import os, sys, time
open(os.path.join(sys.argv[1], "pid"), "w").write(str(os.getpid()))
time.sleep(60)
"""
SITTING = """import signal, sys
from pathlib import Path
from suite import reproduce, stages
stages.stage_argv = lambda stage, out_dir, options: ["sleeper", str(out_dir)]
signal.signal(signal.SIGTERM, reproduce._stop_on_sigterm)
options = {"device": "cuda"}          # --gpus 0: the stage runs from a worker thread, which no signal reaches
state = stages.State.open(Path(sys.argv[1]), options, resume=False)
stages.run_plan([stages.Stage("w", "memory_stock", 60.0)], state, options, gpus=[0], log=lambda *_: None)
"""


def test_a_sitting_stopped_by_sigterm_takes_its_stage_process_with_it(tmp_path):
    """A stage runs in a session of its own (so its timeout kills its whole group): a `timeout` that
    stopped the sitting left it running for up to its budget (a helper's finding, 2026-12-01)."""
    import os
    import signal
    import subprocess
    import time
    from suite import env
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "sitting.py").write_text(SITTING)
    run_dir = tmp_path / "run"
    out = run_dir / "w.memory_stock"
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(env.REPO_ROOT / "impl"), str(env.REPO_ROOT),
                                                           str(tmp_path)])}
    sitting = subprocess.Popen([sys.executable, str(tmp_path / "sitting.py"), str(run_dir)], env=environ)
    stage_pid = None
    try:
        deadline = time.monotonic() + 60
        while not (out / "pid").exists() or not (out / "pid").read_text():
            assert time.monotonic() < deadline and sitting.poll() is None, "the stage process never started"
            time.sleep(0.1)
        stage_pid = int((out / "pid").read_text())
        sitting.send_signal(signal.SIGTERM)
        assert sitting.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while True:
            try:
                os.kill(stage_pid, 0)
            except ProcessLookupError:
                break                                                 # gone
            assert time.monotonic() < deadline, "the stage process outlived the sitting"
            time.sleep(0.1)
    finally:
        sitting.kill()
        if stage_pid is not None:
            try:
                os.kill(stage_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("fail_at", ["copy", "swap", "save"])
def test_a_join_that_fails_midway_puts_the_run_folder_back(fake_registry, clean_tree, tmp_path, monkeypatch,  # noqa: F811
                                                           fail_at):
    """The folders are copied beside ours, swapped in by renames and ours removed only once stages.json is
    saved: a failure at any step (here made to happen) leaves the run folder as it was, no .join-* left."""
    import shutil
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for folder, harnesses in ((ours, ("memory_stock",)), (theirs, ("verify", "memory_cadence"))):
        stages.run_plan([stages.Stage("fake", h, 100.0) for h in harnesses],
                        stages.State.open(folder, OPTIONS, resume=False), OPTIONS,
                        execute=stages.inline_executor, log=lambda *_: None)
    data = json.loads((ours / "stages.json").read_text())       # ours has a failed verify attempt to replace
    data["stages"]["fake.verify"] = {"workload": "fake", "harness": "verify", "status": "failed",
                                     "dir": "fake.verify"}
    (ours / "stages.json").write_text(json.dumps(data))
    (ours / "fake.verify").mkdir()
    (ours / "fake.verify" / "log.txt").write_text("our failed attempt")
    before = _folder_digest(ours)
    calls = {"n": 0}

    def boom(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:                                      # the second copy / rename / save fails
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)
    if fail_at == "copy":
        real = shutil.copytree
        monkeypatch.setattr(shutil, "copytree", boom)
    elif fail_at == "swap":
        real = Path.rename
        monkeypatch.setattr(Path, "rename", lambda self, target: boom(self, target))
    else:
        real = stages.State.save
        calls["n"] = 1
        monkeypatch.setattr(stages.State, "save", lambda self: boom(self))
    with pytest.raises(stages.StateError, match="nothing joined"):
        stages.join(ours, [theirs])
    monkeypatch.undo()
    assert _folder_digest(ours) == before and not list(ours.glob(".join-*"))
    state = stages.join(ours, [theirs])                          # and it works once nothing fails
    assert sorted(state.stages) == ["fake.memory_cadence", "fake.memory_stock", "fake.verify"]
    assert (ours / "fake.verify" / "run.json").exists() and not (ours / "fake.verify" / "log.txt").exists()
    assert not list(ours.glob(".join-*"))


def test_the_session_limit_is_derived_from_the_runs_not_read_from_the_record(tmp_path):
    # an edited record says 8 sessions were clean where its own runs say 4 missed
    rec = {"schema": "duplexcadence.duplex/1", "parameters": {"seconds": 60}, "verdict": "VALID",
           "workloads": {"w": {"ar": {"kind": "none"},
                               "modes": {"cadence": _mode_runs(8, [(1, 0), (2, 0), (4, 3), (8, 0)])}}}}
    fc = claims.duplex_figures(_done_duplex_stages(tmp_path, {"duplex": rec}), "w")["modes"]["cadence"]
    assert fc["max_sessions_zero_miss"] == 2
    assert claims._limit_cell(fc) == "2 (4 missed 3/240: limit 2-3)"
