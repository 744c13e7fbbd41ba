"""suite.stages (plan, state, run) and suite.report's merged report: the staged, resumable reproduction.

Scheduling (resume, failure, budget, retries) runs on stub executors and a fake clock, so every decision is
checked exactly; the merged report runs real verify and memory stages in this process on the fake adapter
of tests/fakes.py (`inline`), and stage processes (`fake_stage`) where a process boundary is the point.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

import fakes
import workloads
from suite import records, reproduce
from suite.measure import duplex as duplex_harness
from suite.measure import stage as stage_process
from suite.report import claims, cli as report, document, figures, runs
from suite.records import StageState, StateError
from suite.stages import plan as plans, run as runner
from suite.stages.plan import Stage
from suite.stages.process import Outcome, run_process
from suite.stages.state import State
from test_duplex import WL as PART_WL, part

OPTIONS = {"device": "cpu", "steps": None, "seconds": None, "max_speak_units": None, "depth": "released",
           "seed": None, "notes": []}
TESTS = Path(__file__).resolve().parent


def three(budget: float = 100.0) -> list[Stage]:
    return [Stage("w", h, budget) for h in ("verify", "memory_stock", "memory_cadence")]


class Stub:
    """An executor that records calls, advances a fake clock and fails the stages it is told to (`fail`; a
    name in `once` fails its first attempt only). record=False: a done stage leaves no run.json."""

    def __init__(self, seconds: float = 10.0, fail: tuple = (), record: bool = True, once: tuple = ()):
        self.now, self.seconds, self.fail, self.calls, self.record = 0.0, seconds, set(fail), [], record
        self.once = set(once)

    def clock(self) -> float:
        return self.now

    def __call__(self, stage, out_dir, timeout_s, options):
        self.calls.append((stage.name, timeout_s))
        self.now += self.seconds
        out_dir.mkdir(parents=True, exist_ok=True)
        if stage.name in self.fail or stage.name in self.once:
            self.once.discard(stage.name)
            return Outcome("failed", 1, "exit status 1: boom", ["stub"], ["boom"])
        if self.record:
            (out_dir / "run.json").write_text(json.dumps({"verdict": "VALID", "invalid_codes": []}))
        return Outcome("done", 0, "", ["stub"])


def run(tmp_path, plan, stub, *, resume=False, budget_s=None, retries=0, log=None):
    state = State.open(tmp_path, OPTIONS, resume=resume)
    sitting = runner.run_plan(plan, state, OPTIONS, budget_s=budget_s, execute=stub, clock=stub.clock,
                              provenance={"git_rev": "abc", "impl_tree": "def"}, log=log or (lambda *_: None),
                              retries=retries)
    return state, sitting


def on_disk(run_dir) -> dict:
    return json.loads((run_dir / "stages.json").read_text())["stages"]


def inline(stage, out_dir, timeout_s, options):
    """A verify or memory stage run in this process (the fake adapter registered here is seen); a duplex
    stage writes a record of its mode (`duplex_part`)."""
    if records.family(stage.harness) == "duplex":
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "duplex.json").write_text(json.dumps(duplex_part(stage.workload, stage.mode)))
        return Outcome("done", 0, "", ["duplex stub"])
    argv = plans.stage_argv(stage, str(out_dir), options)
    rc = stage_process.main([*argv[1:], "--quiet"])
    return Outcome("done" if rc == 0 else "failed", rc, "" if rc == 0 else f"exit status {rc}", argv)


@pytest.fixture
def fake_registry(monkeypatch):
    fakes.register(monkeypatch)
    registry = {"fake": fakes.workload(turns=3, speak_per_turn=12)}
    monkeypatch.setattr(workloads, "get", registry.__getitem__)
    monkeypatch.setattr(workloads, "names", lambda: list(registry))
    monkeypatch.setattr(workloads, "DEFAULT", "fake")
    return registry


def section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


def row_of(text: str, title: str, name: str = "fake") -> str:
    part = section(text, title) if title else text
    return next(line for line in part.splitlines() if line.startswith(f"| {name} "))


# --- resumability, budget, retries --------------------------------------------------------------------------
def test_done_stages_are_kept_on_resume(tmp_path):
    stub = Stub()
    run(tmp_path, three(), stub)
    assert [c[0] for c in stub.calls] == ["w.verify", "w.memory_stock", "w.memory_cadence"]
    disk = on_disk(tmp_path)
    assert {k: v["status"] for k, v in disk.items()} == dict.fromkeys(disk, "done")
    assert disk["w.verify"]["verdict"] == "VALID" and disk["w.verify"]["seconds"] == 10.0
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


def test_retries_run_a_failed_stage_once_more_then_record_it(tmp_path):
    stub = Stub(once={"w.memory_stock"}, fail={"w.memory_cadence"})
    state, _ = run(tmp_path, three(), stub, retries=1)
    assert [c[0] for c in stub.calls] == ["w.verify", "w.memory_stock", "w.memory_stock", "w.memory_cadence",
                                          "w.memory_cadence"]
    assert (state.stages["w.memory_stock"].status, state.stages["w.memory_stock"].attempts) == ("done", 2)
    st = state.stages["w.memory_cadence"]
    assert (st.status, st.attempts, st.reason) == ("failed", 2, "exit status 1: boom")


def test_a_stage_interrupted_by_a_killed_sitting_is_rerun(tmp_path):
    class Killed(Exception):
        pass

    class KilledStub(Stub):
        def __call__(self, stage, out_dir, timeout_s, options):
            if stage.harness == "memory_stock":
                raise Killed                            # the 10-minute command ends mid-stage
            return super().__call__(stage, out_dir, timeout_s, options)

    with pytest.raises(Killed):
        run(tmp_path, three(), KilledStub())
    assert on_disk(tmp_path)["w.memory_stock"]["status"] == "running"      # saved before it started
    again = Stub()
    state, _ = run(tmp_path, three(), again, resume=True)
    assert [c[0] for c in again.calls] == ["w.memory_stock", "w.memory_cadence"]
    assert state.stages["w.memory_stock"].attempts == 2


def test_budget_exhaustion_stops_cleanly_with_state_saved(tmp_path):
    stub = Stub(seconds=90.0)
    _, sitting = run(tmp_path, three(budget=100.0), stub, budget_s=250.0)
    # 250 s: verify (90), memory_stock (left 160 >= 100: runs, 90), memory_cadence (left 70 < 100): stop
    assert stub.calls == [("w.verify", 100.0), ("w.memory_stock", 100.0)]
    assert "70 s of --budget-s 250 left before w.memory_cadence, which is expected to need 100 s" in sitting["stopped"]
    disk = on_disk(tmp_path)
    assert disk["w.memory_cadence"]["status"] == "pending" and disk["w.memory_cadence"]["attempts"] == 0
    assert disk["w.memory_cadence"]["reason"].startswith("not run yet: budget")
    nxt = Stub(seconds=5.0)          # the next sitting: the first stage always starts, its timeout cut to the budget
    run(tmp_path, three(budget=100.0), nxt, resume=True, budget_s=40.0)
    assert nxt.calls == [("w.memory_cadence", 40.0)] and on_disk(tmp_path)["w.memory_cadence"]["status"] == "done"


def test_the_plan_line_says_which_part_of_its_time_is_only_budgets(tmp_path):
    lines = []
    run(tmp_path, [Stage("w", "verify", 100.0, expected_s=20.0), Stage("w", "memory_stock", 100.0)], Stub(),
        log=lines.append)
    assert lines[0] == ("plan: 2 stage(s) to run, about 2 min of stage time (100 s of it the budgets of stages of a "
                        "kind not run yet)")                                 # 1.1 x 20 s + a 100 s budget
    assert "stage 1 of 2 w.verify: start (expected about 22 s, budget 100 s, timeout 100 s)" in lines


def test_budget_uses_what_done_stages_of_the_family_took(tmp_path):
    stub = Stub(seconds=20.0)
    _, sitting = run(tmp_path, [Stage(w, "verify", 100.0) for w in ("a", "b", "c")], stub, budget_s=65.0)
    # a: 20 s; b expected 1.5 x 20 = 30 <= 45 left: runs, timeout cut to 45; c: 25 left < 30: stop
    assert stub.calls == [("a.verify", 65.0), ("b.verify", 45.0)] and "expected to need 30 s" in sitting["stopped"]


def test_stage_killed_by_the_sitting_budget_says_so(tmp_path):
    def slow(stage, out_dir, timeout_s, options):
        return Outcome("failed", None, f"timed out after {timeout_s:.0f} s (killed)")
    state = State.open(tmp_path, OPTIONS, resume=False)
    runner.run_plan(three(), state, OPTIONS, budget_s=30.0, execute=slow, log=lambda *_: None)
    assert state.stages["w.verify"].reason.startswith("the sitting's --budget-s ran out during the stage "
                                                      "(timeout cut to 30 s of its 100 s budget)")


def test_budget_of_nothing_left_runs_nothing_after_the_first(tmp_path):
    stub = Stub(seconds=500.0)
    _, sitting = run(tmp_path, three(budget=100.0), stub, budget_s=300.0)
    assert [c[0] for c in stub.calls] == ["w.verify"] and sitting["stopped"]


def test_skipped_stage_is_recorded_and_checked_again(tmp_path):
    plan = [Stage("w", "verify", 100.0), Stage("w", "duplex_cadence", 100.0, skip="no cadence mode")]
    run(tmp_path, plan, Stub())
    assert {k: on_disk(tmp_path)["w.duplex_cadence"][k] for k in ("status", "reason", "attempts")} == {
        "status": "skipped", "reason": "no cadence mode", "attempts": 0}
    later = Stub()
    run(tmp_path, [plan[0], Stage("w", "duplex_cadence", 100.0)], later, resume=True)
    assert [c[0] for c in later.calls] == ["w.duplex_cadence"] and on_disk(tmp_path)["w.duplex_cadence"]["status"] == "done"


def test_the_console_counts_the_stages_and_gives_the_estimates(tmp_path):
    lines = []
    run(tmp_path, three(), Stub(fail={"w.memory_cadence"}), log=lines.append)
    assert lines[0] == ("plan: 3 stage(s) to run, at most 5 min of stage time (their budgets: no stage of "
                        "their kind has run yet)")
    starts = [line for line in lines if ": start" in line]
    assert starts[0] == "stage 1 of 3 w.verify: start (no estimate yet, budget 100 s, timeout 100 s)"
    assert starts[1].startswith("stage 2 of 3 w.memory_stock: start (no estimate yet")
    assert "stage 1 of 3 w.verify: done in 10.0 s; record verdict VALID" in lines
    assert any(line.startswith("stage 3 of 3 w.memory_cadence: failed in 10.0 s: exit status 1: boom") for line in lines)
    assert "  | boom" in lines                                    # a failed stage's own output
    lines.clear()
    run(tmp_path, three(), Stub(), resume=True, log=lines.append)
    assert lines[0] == "plan: 1 stage(s) to run, about 15 s of stage time; 2 done (kept)"   # 1.5 x the memory stage done


def test_state_open_rules(tmp_path):
    State.open(tmp_path, OPTIONS, resume=True).save()        # --resume on a new folder starts it
    with pytest.raises(StateError, match="pass --resume"):
        State.open(tmp_path, OPTIONS, resume=False)
    with pytest.raises(StateError, match=r"other options .*'max_speak_units': \(None, 4\)"):
        State.open(tmp_path, {**OPTIONS, "max_speak_units": 4}, resume=True)


def test_state_saves_one_at_a_time(tmp_path, monkeypatch):
    inside, peak, real = [0], [0], os.replace

    def slow_replace(src, dst):
        inside[0] += 1
        peak[0] = max(peak[0], inside[0])
        time.sleep(0.02)
        inside[0] -= 1
        real(src, dst)
    from suite.stages import state as state_module
    monkeypatch.setattr(state_module.os, "replace", slow_replace)
    state = State.open(tmp_path, OPTIONS, resume=False)
    threads = [threading.Thread(target=state.save) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1 and json.loads((tmp_path / "stages.json").read_text())["schema"] == records.STAGES_SCHEMA


# --- stage processes -------------------------------------------------------------------------------------------
def test_timeout_kills_the_stage_process(tmp_path):
    out = run_process(["timeit", "-n", "1", "import time; time.sleep(60)"], tmp_path / "w.verify", 1.0, relay=None)
    assert out.status == "failed" and out.reason.startswith("timed out after 1 s (killed)")


def test_a_running_stage_s_last_log_line_is_relayed(tmp_path, monkeypatch):
    from suite.stages import process
    monkeypatch.setattr(process, "RELAY_S", 0.3)
    relayed = []
    code = "import time; print('unit 3 of 40', flush=True); time.sleep(1.5)"
    out = run_process(["timeit", "-n", "1", code], tmp_path / "s", 30.0, label="w.duplex_cadence: ",
                      relay=relayed.append)
    assert out.status == "done" and relayed[0] == "  | w.duplex_cadence: unit 3 of 40"
    assert relayed.count(relayed[0]) == 1 and len(relayed) >= 2        # a line once, then that the stage runs
    assert all(r.startswith("  | w.duplex_cadence: (running ") and r.endswith(" s, no new line)") for r in relayed[1:])
    assert records.instant(out.started_utc) < records.instant(out.ended_utc)


def test_stage_processes_run_one_per_mode(tmp_path, monkeypatch):
    """Real stage processes (fake_stage: suite.measure.stage on the fake adapter), one per mode: each builds
    its own model; their log holds what they printed; a failing one is recorded failed with its output."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setattr(runner, "stage_argv", lambda stage, out_dir, options: [
        "fake_stage", *plans.stage_argv(stage, out_dir, options)[1:]])
    state = State.open(tmp_path, OPTIONS, resume=False)
    plan = [Stage("w", f"memory_{m}", 240.0) for m in ("stock", "cadence")] + [Stage("fail", "verify", 240.0)]
    runner.run_plan(plan, state, OPTIONS, log=lambda *_: None)
    pids = set()
    for mode in ("stock", "cadence"):
        st = state.stages[f"w.memory_{mode}"]
        assert st.status == "done", (st.reason, st.log_tail)
        assert st.command[1:4] == ["-m", "fake_stage", "mode"] and f"--mode {mode}" in " ".join(st.command)
        rec = json.loads((tmp_path / f"w.memory_{mode}" / "run.json").read_text())
        assert list(rec["modes"]) == [mode] and rec["modes"][mode]["memory"]["leftover_rss_mib"] == 0.0
        (pid,) = [int(m.group(1)) for n in rec["notes"] for m in [re.search(r"pid (\d+)", n)] if m]
        pids.add(pid)
        log = (tmp_path / f"w.memory_{mode}" / "log.txt").read_text()
        assert f"w {mode}: unit 2 SPEAK" in log and "bytes:" not in log.splitlines()[-2]
        assert st.gpu_name == "cpu" and st.node is None
    assert len(pids) == 2 and os.getpid() not in pids
    failed = state.stages["fail.verify"]
    assert (failed.status, failed.reason) == ("failed", "exit status 1: fail: boom")


def test_stage_process_bad_input():
    assert stage_process.main(["mode", "--workload", "moshi", "--device", "cpu", "--out", "x"]) == 2   # no --mode
    assert stage_process.main(["verify", "--workload", "nosuch", "--device", "cpu", "--out", "x"]) == 2
    assert stage_process.main(["verify", "--workload", "moshi", "--device", "cpu", "--out", "x", "--rounds", "0"]) == 2
    assert stage_process.main(["mode", "--mode", "stock", "--workload", "moshi", "--device", "cpu", "--out", "x",
                               "--rounds", "2"]) == 2


SLEEPER = """import os, sys, time
open(os.path.join(sys.argv[1], "pid"), "w").write(str(os.getpid()))
time.sleep(60)
"""
SITTING = """import signal, sys
from pathlib import Path
from suite import reproduce
from suite.stages import run as runner
from suite.stages.plan import Stage
from suite.stages.state import State
runner.stage_argv = lambda stage, out_dir, options: ["sleeper", str(out_dir)]
signal.signal(signal.SIGTERM, reproduce.stop_on_sigterm)
options = {"device": "cpu"}
state = State.open(Path(sys.argv[1]), options, resume=False)
runner.run_plan([Stage("w", "memory_stock", 60.0)], state, options, log=lambda *_: None)
"""


def test_a_sitting_stopped_by_sigterm_takes_its_stage_process_with_it(tmp_path):
    """A stage runs in a session of its own (its timeout kills its whole group): a `timeout` that stopped the
    sitting must stop the stage too."""
    import signal
    import subprocess
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "sitting.py").write_text(SITTING)
    run_dir = tmp_path / "run"
    out = run_dir / "w.memory_stock"
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(records.REPO_ROOT / "impl"), str(records.REPO_ROOT),
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
                break
            assert time.monotonic() < deadline, "the stage process outlived the sitting"
            time.sleep(0.1)
    finally:
        sitting.kill()
        if stage_pid is not None:
            try:
                os.kill(stage_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- the plan -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("patterns, want", [
    pytest.param(["memory"], ["a.memory_stock", "a.memory_cadence", "b.memory_stock", "b.memory_cadence"], id="family"),
    pytest.param(["b.*"], ["b.verify", "b.memory_stock", "b.memory_cadence", "b.duplex_stock", "b.duplex_cadence"],
                 id="glob"),
    pytest.param(["a", "duplex"], ["a.verify", "a.memory_stock", "a.memory_cadence", "a.duplex_stock",
                                   "a.duplex_cadence", "b.duplex_stock", "b.duplex_cadence"], id="workload+family"),
    pytest.param(["*.duplex_cadence"], ["a.duplex_cadence", "b.duplex_cadence"], id="one-mode"),
    pytest.param(["duplex_oracle"], ["a.duplex_oracle", "b.duplex_oracle"], id="oracle-by-name"),
    pytest.param(["*.duplex_*"], ["a.duplex_stock", "a.duplex_cadence", "b.duplex_stock", "b.duplex_cadence"],
                 id="oracle-not-by-glob"),
])
def test_select(patterns, want):
    plan = [Stage(w, h, 1.0) for w in "ab" for h in records.HARNESSES]
    assert [s.name for s in plans.select(plan, patterns)] == want
    with pytest.raises(ValueError, match=r"\['c\.\*'\]: no stage matches"):
        plans.select(plan, ["a", "c.*"])


def test_plan_of_the_registry_skips_what_cannot_run(monkeypatch):
    mod = fakes.register(monkeypatch, modes=("stock",))
    monkeypatch.setattr(workloads, "get", lambda name: fakes.workload(name=name))
    plan = {s.name: s for s in plans.plan(["fake"], list(records.HARNESSES), "cuda")}
    assert len(plan) == len(records.HARNESSES)
    assert plan["fake.verify"].skip.startswith(f"adapter {mod.__name__} has no cadence mode")
    assert plan["fake.memory_stock"].skip is None and plan["fake.duplex_stock"].skip is None
    assert plan["fake.memory_stock"].budget_s == plans.BUDGET_S["cuda"]["memory_stock"]
    assert plan["fake.duplex_oracle"].mode == "cadence" and plan["fake.duplex_oracle"].timed
    with pytest.raises(ValueError, match="harness"):
        plans.plan(["fake"], ["speed"], "cuda")


@pytest.mark.parametrize("workload_name, harness, start, policy, prepare, recordings", [
    pytest.param("minicpmo45", "duplex_cadence", 24, "threads", "learned:64", None, id="minicpmo45-cadence"),
    pytest.param("minicpmo45", "duplex_stock", 2, "edf", "voice", "serve", id="minicpmo45-stock"),
    pytest.param("minicpmo45", "duplex_oracle", 24, "threads", "oracle", None, id="minicpmo45-oracle"),
    pytest.param("stepaudio2_mini", "duplex_cadence", 8, None, "learned:64", None, id="stepaudio2-cadence"),
    pytest.param("stepaudio2_mini", "duplex_stock", 2, None, "voice", "serve", id="stepaudio2-stock"),
    pytest.param("moshi", "duplex_cadence", 32, None, "voice", None, id="moshi-cadence"),
    pytest.param("qwen3_omni", "duplex_stock", 8, None, "voice", None, id="qwen3-stock"),
    pytest.param("nosuch", "duplex_cadence", 1, None, "voice", None, id="default"),
])
def test_duplex_stage_runs_one_mode_by_the_search_within_its_budget(workload_name, harness, start, policy, prepare,
                                                                    recordings):
    """The flow-matching cadence stages capture a learned graph set and their stock stages play the same
    (serve) recordings; the oracle stage's --prepare oracle comes last, so it wins over the learned set."""
    argv = plans.stage_argv(Stage(workload_name, harness, 560.0), "out", {**OPTIONS, "device": "cuda"})
    mode = "stock" if harness == "duplex_stock" else "cadence"
    assert argv[0] == "suite.measure.duplex" and argv[argv.index("--modes") + 1] == mode
    assert "--sessions" not in argv and "--quiet" not in argv     # the search, not a list; its log holds its lines
    assert (argv[argv.index("--policy") + 1] if "--policy" in argv else None) == policy
    args = duplex_harness.build_parser().parse_args(argv[1:])          # the harness accepts what the stage passes
    assert args.modes == [mode] and args.seconds == 60 and args.start == start and args.sessions is None
    assert args.budget_s == 560.0 - plans.DUPLEX_MARGIN_S and args.traffic == "voxconverse"
    assert args.prepare == prepare and args.recordings == recordings
    small = duplex_harness.build_parser().parse_args(plans.stage_argv(Stage(workload_name, harness, 120.0), "out",
                                                                      {**OPTIONS, "device": "cuda"})[1:])
    assert small.budget_s == 60.0                                      # a small stage budget: half of it


def test_duplex_starts_are_starting_points_at_the_targets_and_the_search_fits_the_stage():
    """suite/stages/duplex_sessions.json: where each search starts, said to be a starting point; cadence at issue
    23's targets, stock below cadence; the search's budget and the margin make the stage's budget, one 600 s
    command."""
    targets = {"minicpmo45": 24, "minicpmo45_5step": 32, "stepaudio2_mini": 8, "moshi": 32, "qwen3_omni": 32}
    budget = plans.BUDGET_S["cuda"]["duplex_cadence"]
    assert budget == plans.BUDGET_S["cuda"]["duplex_stock"] == 560 < 600 and plans.DUPLEX_MARGIN_S < budget / 2
    starts = {}
    for mode in ("stock", "cadence"):
        for name, entry in plans.DUPLEX_SESSIONS[mode].items():
            assert entry["provenance"].startswith("starting point"), (mode, name)
            args = duplex_harness.build_parser().parse_args([*entry["args"], "--out", "x"])
            starts[mode, name] = args.start
    assert {n: starts["cadence", n] for n in targets} == targets
    assert all(starts["stock", n] < starts["cadence", n] for n in targets)
    assert "not measurements" in json.dumps(plans.DUPLEX_SESSIONS["about"])


def test_verify_stage_passes_the_device_s_protocol():
    st = Stage("minicpmo45", "verify", 100.0)
    cuda = plans.stage_argv(st, "x", {**OPTIONS, "device": "cuda"})
    assert cuda[:2] == ["suite.measure.stage", "verify"]
    flags = {k: cuda[cuda.index(k) + 1] for k in ("--processes", "--passes", "--warmup-pairs", "--aa-units",
                                                   "--prime-units")}
    assert flags == {"--processes": "3", "--passes": "1", "--warmup-pairs": "4", "--aa-units": "10",
                     "--prime-units": "2"}
    cpu = plans.stage_argv(st, "x", {**OPTIONS, "device": "cpu"})
    assert [cpu[cpu.index(k) + 1] for k in ("--processes", "--aa-units", "--prime-units")] == ["1", "0", "0"]
    more = plans.stage_argv(st, "x", {**OPTIONS, "device": "cuda", "processes": 5, "passes": 2})
    assert [more[more.index(k) + 1] for k in ("--processes", "--passes")] == ["5", "2"]
    assert "--processes" not in plans.stage_argv(Stage("minicpmo45", "memory_stock", 100.0), "x", OPTIONS)


def test_a_verify_stage_is_expected_to_take_what_its_protocol_costs():
    """The H200 estimate: the set-ups at once, then each process's A/A and A/B runs; more processes or passes
    cost more, a CPU run and a workload without costs have none; the sum of the five fits 400 s +- 5%."""
    wl = workloads.get("minicpmo45")
    base = plans.verify_estimate_s(wl, "cuda", {})
    five = plans.verify_estimate_s(wl, "cuda", {"processes": 5})
    two = plans.verify_estimate_s(wl, "cuda", {"passes": 2})
    cost = plans.VERIFY_COST_S["minicpmo45"]
    per_pass = 39 * (cost["stock"] + cost["cadence"])              # the script's 39 SPEAK units, no LISTEN payload
    assert two - base == pytest.approx(3 * per_pass)
    assert five - base == pytest.approx(2 * (2 * cost["stock"] * 10 + per_pass))
    assert plans.verify_estimate_s(wl, "cpu", {}) is None
    total = sum(plans.verify_estimate_s(workloads.get(n), "cuda", {}) for n in plans.VERIFY_COST_S)
    assert 300 < total < 420, total
    st = plans.plan(["minicpmo45"], ["verify", "memory_stock"], "cuda")
    assert st[0].expected_s == pytest.approx(base) and st[1].expected_s is None
    assert plans.estimate_s(st[0], {}) == pytest.approx(plans.VERIFY_MARGIN * base)


# --- overlap: from the recorded times, per node ------------------------------------------------------------------
def test_overlap_is_derived_from_the_recorded_times():
    """Whole seconds (older files) or milliseconds; touching is not overlapping; a running stage is
    open-ended unless its end is given; a cut-off attempt is left out; stages on other nodes never overlap."""
    def st(start, end, status="done", node=None):
        return {"status": status, "started_utc": f"2026-11-30T10:{start}+00:00",
                "ended_utc": end and f"2026-11-30T10:{end}+00:00", "node": node}
    recorded = {"v": st("15:14", "16:17"), "m1": st("15:14", "15:54"), "m2": st("15:55", "16:34"),
                "next": st("16:17", "16:40"), "late": st("16:17.250", "16:50.125"), "run": st("16:45", None, "running"),
                "after": st("20:00", "21:00"), "cut": st("16:00", "12:00", "failed"),
                "elsewhere": st("15:00", "22:00", node="host-b"),
                "never": {"status": "pending", "started_utc": None, "ended_utc": None}}
    assert records.overlapping("v", recorded) == ["m1", "m2"]
    assert records.overlapping("next", recorded) == ["m2", "late"]
    assert records.overlapping("run", recorded) == ["late", "after"]
    assert records.overlapping("after", recorded, ended={"run": "2026-11-30T10:16:50.500+00:00"}) == []
    assert records.overlapping("cut", recorded) == [] and records.overlapping("never", recorded) == []
    assert records.overlapping("elsewhere", recorded) == []


# --- stages.json -------------------------------------------------------------------------------------------------
BAD_STAGES_JSON = {
    "not JSON": "{not json",
    "a JSON list": "[1, 2]",
    "stages a list": {"stages": [1]},
    "a stage without harness": {"stages": {"w.verify": {"workload": "w", "status": "done"}}},
    "a stage with an unknown key": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "newkey": 1}}},
    "a stage with an unknown status": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "status": "x"}}},
    "a dir outside the run": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "dir": "../victim"}}},
    "seconds a string": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "seconds": "abc"}}},
    "seconds NaN": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "seconds": float("nan")}}},
    "seconds negative": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "seconds": -5.0}}},
    "overlapped a number": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "overlapped": 5}}},
    "overlapped not names": {"stages": {"w.verify": {"workload": "w", "harness": "verify", "overlapped": [1]}}},
    "mismatched_units a string": {"stages": {"w.verify": {"workload": "w", "harness": "verify",
                                                          "mismatched_units": "3"}}},
    "compare null": {"compare": None},
    "compare a number": {"compare": 5},
    "compare holding null": {"compare": [None]},
    "sittings not a list": {"sittings": {}},
    "no device": {"options": {"steps": None}},
}


@pytest.mark.parametrize("what", list(BAD_STAGES_JSON))
def test_a_corrupt_stages_json_is_a_one_line_error_naming_it_and_left_as_it_was(tmp_path, capsys, what):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    bad = BAD_STAGES_JSON[what]
    if isinstance(bad, dict):
        bad = json.dumps({"schema": records.STAGES_SCHEMA, "created_utc": "x", "options": OPTIONS, "sittings": [],
                          "stages": {}, "compare": [], **bad})
    (run_dir / "stages.json").write_text(bad)
    with pytest.raises(StateError, match="stages.json"):
        State.open(run_dir, OPTIONS, resume=True)
    stub = Stub()
    for extra in ([], ["--list"]):
        assert reproduce.main(["--device", "cpu", "--run-dir", str(run_dir), "--resume", *extra], execute=stub) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and "stages.json" in err[0]
    assert stub.calls == [] and (run_dir / "stages.json").read_text() == bad
    assert sorted(p.name for p in run_dir.iterdir()) == ["stages.json"]
    assert report.main([str(run_dir)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "stages.json" in err[0]


def test_an_empty_workload_list_is_an_error_not_an_empty_run(tmp_path, capsys):
    stub = Stub()
    assert reproduce.main(["--device", "cpu", "--workload", ",", "--out", str(tmp_path)], execute=stub) == 2
    assert "--workload" in capsys.readouterr().err and stub.calls == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, says", [
    (["--seconds", "nan"], "--seconds: expected a finite positive float, got 'nan'"),
    (["--budget-s", "inf"], "--budget-s: expected a finite positive float, got 'inf'"),
    (["--stage-budget-s", "nan"], "--stage-budget-s: expected a finite positive float, got 'nan'"),
    (["--seed", str(2 ** 64)], f"--seed: expected an int in [0, 2**63), got '{2 ** 64}'"),
    (["--stages", ","], "--stages: expected comma-separated stage globs or names, got ','"),
    (["--seconds", "0.001"], "seconds: the first 0.001 s of minicpmo45's script hold no SPEAK unit"),
    (["--checkpoint", "minicpmo45="], "--checkpoint 'minicpmo45=': no path given"),
])
def test_options_that_would_run_nothing_or_run_unbounded_are_refused_before_a_stage(args, says, tmp_path, capsys):
    stub = Stub()
    assert reproduce.main(["--device", "cpu", "--out", str(tmp_path), *args], execute=stub) == 2
    assert says in capsys.readouterr().err and stub.calls == [] and list(tmp_path.iterdir()) == []


def test_a_run_folder_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    for args in (["--run-dir", str(tmp_path / "f")], ["--run-dir", str(tmp_path / "f" / "sub")],
                 ["--out", str(tmp_path / "f")]):
        stub = Stub()
        assert reproduce.main(["--device", "cpu", *args], execute=stub) == 2
        assert f"{tmp_path / 'f'} is a file" in capsys.readouterr().err and stub.calls == []


def test_a_legacy_duplex_entry_is_left_alone_and_listed(fake_registry, clean_tree, tmp_path, capsys):
    """A stages.json of the single `duplex` harness an older version ran: resume neither runs nor rewrites it;
    --list and the report name it; it is not counted."""
    run_dir = tmp_path / "run"
    args = ["--device", "cpu", "--workload", "fake", "--run-dir", str(run_dir), "--stages", "verify"]
    stub = Stub(record=False)
    assert reproduce.main(args, execute=stub) == 0
    data = json.loads((run_dir / "stages.json").read_text())
    data["stages"]["fake.duplex"] = {"workload": "fake", "harness": "duplex", "status": "running", "reason": "",
                                     "attempts": 1}
    (run_dir / "stages.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert reproduce.main([*args, "--resume", "--list"], execute=stub) == 0
    assert re.search(r"fake\.duplex +\S+ +legacy: harness 'duplex' is not run by this version", capsys.readouterr().out)
    assert reproduce.main([*args, "--resume"], execute=stub) == 0
    assert [c[0] for c in stub.calls] == ["fake.verify"]
    assert on_disk(run_dir)["fake.duplex"]["attempts"] == 1
    state = State.open(run_dir, json.loads((run_dir / "stages.json").read_text())["options"], resume=True)
    assert list(state.legacy()) == ["fake.duplex"] and state.counts()["failed"] == 0
    text = (run_dir / "REPORT.md").read_text()
    assert "**Complete**" in text and "1 legacy entries" in text
    assert "legacy: a harness this version does not run" in section(text, "Stages")


def test_a_reference_run_missing_here_does_not_stop_the_stages(fake_registry, clean_tree, tmp_path, capsys):
    """A resumed sitting on a machine without the reference run its stages.json names (a lent GPU carries the
    run folder only): every stage still runs and is saved done; the report's failure is said on stderr."""
    run_dir, ref = tmp_path / "run", tmp_path / "reference"
    ref.mkdir()
    args = ["--device", "cpu", "--workload", "fake", "--run-dir", str(run_dir), "--stages", "verify"]
    assert reproduce.main(args, execute=Stub(record=False)) == 0
    data = json.loads((run_dir / "stages.json").read_text())
    data["stages"]["fake.verify"].update(status="running")          # the earlier sitting was cut in this stage
    (run_dir / "stages.json").write_text(json.dumps({**data, "compare": [str(ref)]}))
    capsys.readouterr()
    stub = Stub(record=False)
    assert reproduce.main([*args, "--resume"], execute=stub) == 0
    assert [c[0] for c in stub.calls] == ["fake.verify"]
    assert on_disk(run_dir)["fake.verify"]["status"] == "done"
    err = capsys.readouterr().err
    assert "REPORT.md not rewritten after fake.verify" in err and str(ref) in err


# --- the merged report ----------------------------------------------------------------------------------------
#: One-session mean and p99 SPEAK time / period, miss rate, max zero-miss sessions, per mode.
DUPLEX_FIGURES = {"stock": (1.132, 1.30, 0.61, 3), "cadence": (0.585, 0.80, 0.0, 25)}


def duplex_part(workload_name: str, mode: str, hashes=("u0", "u1", "u2"), gpu=None) -> dict:
    """A duplex record of one mode (test_duplex.part) carrying DUPLEX_FIGURES: its second run at the best count."""
    rec = part(mode, hashes)
    w = rec["workloads"].pop(PART_WL)
    frac, p99, misses, best = DUPLEX_FIGURES[mode]
    w["modes"][mode]["runs"][0]["metrics"].update(speak_frac_mean=frac, speak_frac_p99=p99, miss_rate=misses)
    w["modes"][mode]["runs"][1]["sessions"] = best
    w["modes"][mode]["max_zero_miss_sessions"] = best
    rec["workloads"][workload_name] = {**w, "workload": workload_name}
    if gpu:
        rec["provenance"] = {"device": {"gpu_name": gpu}}
    return rec


def as_minicpmo(run_dir: Path) -> None:
    """Label the fake records with the model the published figures belong to (10 Euler steps already)."""
    for path in run_dir.glob("*/run.json"):
        rec = json.loads(path.read_text())
        rec["workload"]["model"] = records.PUBLISHED_MODEL
        path.write_text(json.dumps(rec))


def test_stage_outputs_merge_into_one_report(fake_registry, clean_tree, tmp_path):
    run_dir = tmp_path / "run"
    state = State.open(run_dir, OPTIONS, resume=False)
    runner.run_plan([Stage("fake", h, 100.0) for h in records.HARNESSES[:5]], state, OPTIONS, execute=inline,
                    log=lambda *_: None)
    assert state.counts() == {"done": 5, "failed": 0, "skipped": 0, "pending": 0, "running": 0}
    as_minicpmo(run_dir)
    text = document.write(run_dir).read_text()
    assert text.count("# DuplexCadence reproduction") == 1 and "**Complete**" in text
    verdicts = section(text, "Verdicts")
    for claim, paper in [("speed", "2.85x"), ("tail / kernel-busy", "—"), ("peak memory", "-38.8%"),
                         ("memory per session", "—"), ("mean SPEAK vs 1 s", "+14% -> -2%"),
                         ("sessions per GPU", "—"), ("bytes equal", "—")]:
        rows = [line for line in verdicts.splitlines() if line.startswith(f"| {claim} | fake | {paper} |")]
        assert len(rows) == 1, claim
    rec = json.loads((run_dir / "fake.verify" / "run.json").read_text())
    sp = figures.speedup(rec)
    assert sp["protocol"] == "paired" and f"| {sp['x']:.2f}x [{sp['lo']:.2f}-{sp['hi']:.2f}] |" in verdicts
    assert "one process per mode; RSS" in section(text, "Memory")
    sessions = row_of(text, "Sessions per GPU")
    assert "| >= 3 | >= 25 |" in sessions and "| one shared script |" in sessions and "| +13.2 / -41.5 |" in sessions
    assert "fake.duplex_stock/duplex.json, fake.duplex_cadence/duplex.json" in sessions
    assert "| bytes equal | fake | — | 36/36 units stock vs cadence; duplex: every session equal to itself alone |" in text
    assert "| sessions per GPU | fake | — | — | >= 3 | — |" in verdicts          # no target for a fake workload
    for png, title in (("speed.png", "Speed"), ("memory.png", "Memory"), ("sessions.png", "Sessions per GPU"),
                       ("speak_limit.png", "Sessions per GPU")):
        assert (run_dir / png).stat().st_size > 0 and f"]({png})" in section(text, title)
    assert re.search(r"- `fake\.verify`: done in [0-9.]+ s \(budget 100 s, 1 attempt\(s\), cpu\)", section(text, "Stages"))
    assert text.rstrip().split("\n## ")[-1].startswith("Provenance") and "\nParameters: device \"cpu\"" in text
    claims_file = json.loads((run_dir / "claims.json").read_text())
    assert [(r["claim"], r["verdict"]) for r in claims_file["claims"]][0] == ("speed", "open")
    assert {r["run"] for r in claims_file["claims"]} == {"run"} and claims_file["complete"] is True
    assert report.rebuild(run_dir) == run_dir / "REPORT.md"


def test_report_marks_figures_timed_beside_another_stage(fake_registry, clean_tree, tmp_path):
    run_dir = tmp_path / "run"
    plan = [Stage("fake", h, 100.0) for h in ("verify", "memory_stock", "duplex_stock", "duplex_cadence")]
    runner.run_plan(plan, State.open(run_dir, OPTIONS, resume=False), OPTIONS, execute=inline, log=lambda *_: None)
    text = document.write(run_dir).read_text()                     # one at a time: each recorded alone
    assert "timed beside" not in text and document.TIMED_NOTE not in text
    assert row_of(text, "Speed").endswith("| alone |")
    data = json.loads((run_dir / "stages.json").read_text())       # as a sitting of an older version on 2 GPUs
    for name, gpu, start, end in [("verify", 0, "00:00", "01:00"), ("memory_stock", 1, "00:30", "01:30"),
                                  ("duplex_stock", 0, "02:00", "03:00"), ("duplex_cadence", 0, "03:00", "04:00")]:
        st = data["stages"][f"fake.{name}"]
        del st["overlapped"]
        st.update(gpu=gpu, started_utc=f"2026-11-30T10:{start}+00:00", ended_utc=f"2026-11-30T10:{end}+00:00")
    (run_dir / "stages.json").write_text(json.dumps(data))
    text = document.write(run_dir).read_text()
    assert "| timed beside fake.memory_stock on another GPU " in row_of(text, "Speed") and document.TIMED_NOTE in text
    for title in ("Sessions per GPU", "Memory", "Bytes"):
        assert "timed beside" not in section(text, title), title
    data["stages"]["fake.duplex_cadence"]["overlapped"] = ["fake.memory_stock"]   # recorded: it wins
    (run_dir / "stages.json").write_text(json.dumps(data))
    text = document.write(run_dir).read_text()
    assert "; duplex_cadence timed beside fake.memory_stock on another GPU" in row_of(text, "Sessions per GPU")


def test_unfinished_run_report_says_what_is_missing(fake_registry, clean_tree, tmp_path):
    run_dir = tmp_path / "run"
    plan = [Stage("fake", "verify", 100.0)] + [Stage("fake", h, 100.0, skip="no cadence here")
                                               for h in ("duplex_stock", "duplex_cadence")]
    runner.run_plan(plan, State.open(run_dir, OPTIONS, resume=False), OPTIONS, execute=inline, log=lambda *_: None)
    verdicts = section(document.write(run_dir).read_text(), "Verdicts")
    assert "**open** (not measured: skipped: no cadence here)" in row_of(verdicts, "", "sessions per GPU")
    assert "**open** (not measured: not in this run)" in row_of(verdicts, "", "peak memory")


def test_a_run_folder_missing_default_plan_stages_reads_incomplete(tmp_path, monkeypatch):
    cuda = {**OPTIONS, "device": "cuda"}
    have = {f"w.{h}": {"workload": "w", "harness": h, "status": "done"} for h in records.DEFAULT_HARNESSES["cuda"]
            if h != "duplex_stock"}
    assert records.unselected({"options": cuda, "stages": have}) == ["w.duplex_stock"]
    assert records.unselected({"options": OPTIONS, "stages": {}}, ["w"]) == []     # a CPU folder: a check
    monkeypatch.setattr(workloads, "names", lambda: ["w"])       # a CUDA run's plan: every registered workload
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    data = {"schema": records.STAGES_SCHEMA, "options": cuda, "sittings": [],
            "stages": {n: {**st, "status": "skipped", "reason": "not here"} for n, st in have.items()}}
    (run_dir / "stages.json").write_text(json.dumps(data))
    head = document.write(run_dir).read_text().split("\n## ")[0]
    assert "**Incomplete**" in head and "never selected in a sitting: w.duplex_stock" in head
    data["stages"]["w.duplex_stock"] = {"workload": "w", "harness": "duplex_stock", "status": "skipped", "reason": "x"}
    (run_dir / "stages.json").write_text(json.dumps(data))
    assert "**Complete**" in document.write(run_dir).read_text().split("\n## ")[0]


def done_duplex_stages(run_dir: Path, recs: dict) -> dict:
    """stages.json with done stages `w.<harness>` holding the given duplex.json records; returns w's entries."""
    data = {"schema": records.STAGES_SCHEMA, "options": OPTIONS, "sittings": [], "stages": {}}
    for harness, rec in recs.items():
        (run_dir / f"w.{harness}").mkdir(parents=True)
        (run_dir / f"w.{harness}" / "duplex.json").write_text(json.dumps(rec))
        data["stages"][f"w.{harness}"] = {"workload": "w", "harness": harness, "status": "done"}
    (run_dir / "stages.json").write_text(json.dumps(data))
    return figures.load(run_dir)["workloads"]["w"]


def test_per_mode_duplex_records_are_joined(tmp_path):
    d = figures.duplex_figures(done_duplex_stages(tmp_path / "same", {
        "duplex_stock": duplex_part("w", "stock"), "duplex_cadence": duplex_part("w", "cadence")}), "w")
    assert set(d["modes"]) == {"stock", "cadence"} and d["cadence_equals_stock"] is True
    assert d["modes"]["cadence"]["max_sessions_zero_miss"] == 25
    d = figures.duplex_figures(done_duplex_stages(tmp_path / "differ", {
        "duplex_stock": duplex_part("w", "stock"), "duplex_cadence": duplex_part("w", "cadence", ("u0", "X", "u2"))}),
        "w")
    assert d["cadence_equals_stock"] is False
    other = duplex_part("w", "cadence")
    other["parameters"]["period_s"] = 0.5
    d = figures.duplex_figures(done_duplex_stages(tmp_path / "period", {
        "duplex_stock": duplex_part("w", "stock"), "duplex_cadence": other}), "w")
    assert d["modes"] == {} and "cannot be joined: parameters.period_s" in d["error"]


def test_the_claims_read_a_unit_table_as_they_read_rows(tmp_path):
    rows = figures.duplex_figures(done_duplex_stages(tmp_path / "rows", {
        "duplex_stock": duplex_part("w", "stock"), "duplex_cadence": duplex_part("w", "cadence")}), "w")
    table = figures.duplex_figures(done_duplex_stages(tmp_path / "table", {
        "duplex_stock": records.pack_units(duplex_part("w", "stock")),
        "duplex_cadence": records.pack_units(duplex_part("w", "cadence", ("u0", "X", "u2")))}), "w")
    assert table["cadence_equals_stock"] is False                # the hashes were resolved, and compared
    table = figures.duplex_figures(done_duplex_stages(tmp_path / "same", {
        "duplex_stock": records.pack_units(duplex_part("w", "stock")),
        "duplex_cadence": records.pack_units(duplex_part("w", "cadence"))}), "w")
    assert table == {**rows, "files": table["files"]} and table["cadence_equals_stock"] is True


def test_figures_from_two_gpu_types_are_never_paired(tmp_path):
    """Stock's and cadence's duplex stages on different GPU types (a heterogeneous Ray cluster): no ratio."""
    def stock(gpu):
        rec = duplex_part("w", "stock", gpu=gpu)           # 3 clean, then 4 missed: the stock limit is 3
        rec["workloads"]["w"]["modes"]["stock"]["runs"].append(
            {"sessions": 4, "metrics": {"misses": 3, "miss_rate": 0.01, "units_run": 240}})
        return rec
    entries = done_duplex_stages(tmp_path, {"duplex_stock": stock("NVIDIA H200"),
                                            "duplex_cadence": duplex_part("w", "cadence", gpu="NVIDIA A100")})
    d = figures.duplex_figures(entries, "w")
    assert claims.ratio_bounds(d["modes"]["stock"], d["modes"]["cadence"]) == (None, None)
    same = done_duplex_stages(tmp_path / "same", {"duplex_stock": stock("NVIDIA H200"),
                                                  "duplex_cadence": duplex_part("w", "cadence", gpu="NVIDIA H200")})
    d = figures.duplex_figures(same, "w")
    assert claims.ratio_bounds(d["modes"]["stock"], d["modes"]["cadence"]) == (8.3, None)   # 25 clean / stock 3 clean


def test_an_oracle_figure_is_labelled_and_shown_beside_the_real_one(tmp_path):
    """A cadence record whose graphs came from the sessions' own script (the harness's --prepare oracle, or a
    record of a harness that rehearsed the script) is never the headline; the oracle stage's figure sits
    beside the real one."""
    rehearsed = duplex_part("w", "cadence")
    rehearsed["workloads"]["w"]["modes"]["cadence"]["runs"][0]["admission"] = [{"session": 0, "rehearsed": {"x": 1}}]
    e = done_duplex_stages(tmp_path / "old", {"duplex_stock": duplex_part("w", "stock"), "duplex_cadence": rehearsed})
    row = claims.sessions("w", e)
    assert (row.ours, row.verdict, row.oracle) == (None, "open", ">= 25 (oracle: graphs from the sessions' own script)")
    oracle = duplex_part("w", "cadence")
    oracle["workloads"]["w"]["modes"]["cadence"]["prepare"] = "oracle"
    oracle["workloads"]["w"]["modes"]["cadence"]["runs"][1]["sessions"] = 30
    unseen = duplex_part("w", "cadence")
    unseen["parameters"]["traffic"] = records.UNSEEN_TRAFFIC
    e = done_duplex_stages(tmp_path / "new", {"duplex_stock": duplex_part("w", "stock"), "duplex_cadence": unseen,
                                              "duplex_oracle": oracle})
    row = claims.sessions("w", e)
    assert (row.ours, row.ours_text, row.oracle) == (25, ">= 25", ">= 30 (oracle graphs)")
    data = {"workloads": {"w": e}, "state": {}}
    line = row_of("\n".join(document.sessions_section(data, [], "")), "", "w")
    assert "| >= 3 | >= 25 | — | unseen scripts | >= 30 |" in line


def test_a_search_without_a_clean_count_is_an_upper_bound_and_below_the_target_not_met(tmp_path):
    cadence = duplex_part("minicpmo45", "cadence")
    cadence["parameters"]["traffic"] = records.UNSEEN_TRAFFIC
    m = cadence["workloads"]["minicpmo45"]["modes"]["cadence"]
    m["runs"], m["max_zero_miss_sessions"] = [{"sessions": 24, "metrics": {"misses": 641, "units_run": 812}}], None
    row = claims.sessions("minicpmo45", done_duplex_stages(tmp_path, {"duplex_cadence": cadence}))
    assert (row.ours, row.ours_text, row.verdict) == (None, "<= 23 (24 missed 641/812)", "not met")
    m["runs"][0]["sessions"] = 30                    # at most 29: the target (24) is inside the bracket
    row = claims.sessions("minicpmo45", done_duplex_stages(tmp_path / "b", {"duplex_cadence": cadence}))
    assert (row.ours_text, row.verdict) == ("<= 29 (30 missed 641/812)", "open")
    m["runs"][0].update(graph_bytes_per_session_max=70 * 2 ** 20, captures_during_cadence=398,
                        captures_inside_timed_units=0, eager_fallbacks_during_cadence=307)
    m["prepare"] = "learned:128"                     # learned from the other half of the recordings: not an oracle
    e = done_duplex_stages(tmp_path / "c", {"duplex_cadence": cadence})
    assert claims.sessions("minicpmo45", e).verdict == "open"
    lines = document.sessions_section({"workloads": {"minicpmo45": e}, "state": {}}, [], "")
    line = row_of("\n".join(lines), "", "minicpmo45")
    assert "| unseen scripts, learned:128 graphs learned from the other recordings | — | N=30: 70 MiB, 398 captures " \
           "(0 in a timed unit), 307 eager steps |" in line
    m["prepare"] = "turns"                           # every turn's graphs from the clocks: not an oracle either
    e = done_duplex_stages(tmp_path / "d", {"duplex_cadence": cadence})
    assert claims.sessions("minicpmo45", e).verdict == "open"
    line = row_of("\n".join(document.sessions_section({"workloads": {"minicpmo45": e}, "state": {}}, [], "")), "",
                  "minicpmo45")
    assert "| unseen scripts, every turn's graphs from the clocks | — | N=30: 70 MiB" in line
    assert "SPEAK/s" not in line                     # no units and no verify record: no kernel demand
    # releases 0-2 s, a cadence of 3 s; two SPEAK units made audio (a third none): 2/3 per s; with the verify's
    # 84.6 ms of kernels per unit, 0.0564 s of kernels per s
    m["runs"][0]["units"] = [{"kind": "SPEAK", "release_ms": 0.0, "service_ms": 90.0, "samples": 24000},
                             {"kind": "SPEAK", "release_ms": 1000.0, "service_ms": 90.0, "samples": 24000},
                             {"kind": "SPEAK", "release_ms": 1000.0, "service_ms": 1.0, "samples": 0},
                             {"kind": "LISTEN", "release_ms": 2000.0, "service_ms": None, "samples": None}]
    e = done_duplex_stages(tmp_path / "e", {"duplex_cadence": cadence})
    e["verify"] = {"record": {"modes": {"cadence": {"metrics": {"kernel_busy_ms_per_unit_p50": 84.6}}}}}
    text = "\n".join(document.sessions_section({"workloads": {"minicpmo45": e}, "state": {}}, [], ""))
    assert "307 eager steps; 0.7 SPEAK/s x 84.6 ms = 0.06 s of kernels per s |" in row_of(text, "", "minicpmo45")
    assert "Kernels per s: " in text and "Kernels per s: " not in "\n".join(lines)


def _mode_runs(best, counts_misses) -> dict:
    return {"max_zero_miss_sessions": best, "runs": [
        {"sessions": n, "refused": True} if k == "refused" else
        {"sessions": n, "metrics": {"speak_frac_mean": 0.1, "speak_frac_p99": 0.2, "misses": k,
                                    "miss_rate": k / (60 * n), "units_run": 60 * n}} for n, k in counts_misses]}


@pytest.mark.parametrize("stock, cadence, cells, ratio", [
    pytest.param((2, [(1, 0), (2, 0), (3, 6)]), (1, [(1, 0), (26, 46)]),
                 ("2 (3 missed 6/180)", "1-25 (26 missed 46/1560)"), "0.5-12.5x", id="cadence-bracket"),
    pytest.param((2, [(1, 0), (2, 0), (3, 6)]), (26, [(1, 0), (26, 0), (27, 1)]),
                 ("2 (3 missed 6/180)", "26 (27 missed 1/1620)"), "13x", id="both-exact"),
    pytest.param((2, [(1, 0), (2, 0), (4, 26)]), (8, [(1, 0), (8, 0)]),
                 ("2-3 (4 missed 26/240)", ">= 8"), ">= 2.6x", id="cadence-lower-bound"),
    pytest.param((4, [(1, 0), (4, 0), (8, 453)]), (32, [(1, 0), (32, 0), (48, 2617)]),
                 ("4-7 (8 missed 453/480)", "32-47 (48 missed 2617/2880)"), "4.5-11.8x", id="range-rounded-outwards"),
    pytest.param((4, [(1, 0), (4, 0)]), (32, [(1, 0), (32, 0)]), (">= 4", ">= 32"), "—", id="two-lower-bounds"),
    pytest.param((None, [(1, 3)]), (4, [(1, 0), (4, 0), (8, "refused")]),
                 ("0 (1 missed 3/60)", "4-7 (8 refused)"), "—", id="zero-and-refused"),
    pytest.param((2, [(1, 0), (2, 0), (3, 6)]), (None, [(24, 641)]),
                 ("2 (3 missed 6/180)", "<= 23 (24 missed 641/1440)"), "<= 11.5x", id="no-clean-count"),
])
def test_sessions_per_gpu_shows_the_bracket_the_counts_tried_put_on_each_limit(tmp_path, stock, cadence, cells, ratio):
    legacy = {"schema": "duplexcadence.duplex/1", "parameters": {"seconds": 60}, "verdict": "VALID",
              "workloads": {"w": {"ar": {"kind": "none"}, "modes": {"stock": _mode_runs(*stock),
                                                                    "cadence": _mode_runs(*cadence)}}}}
    d = figures.duplex_figures(done_duplex_stages(tmp_path, {"duplex": legacy}), "w")
    fs, fc = d["modes"]["stock"], d["modes"]["cadence"]
    assert (claims.limit_text(fs), claims.limit_text(fc)) == cells
    assert claims.ratio_text(*claims.ratio_bounds(fs, fc)) == ratio
    assert claims.ratio_bounds(None, fc) == (None, None) and claims.limit_text(None) == "—"


def test_the_session_limit_is_derived_from_the_runs_not_read_from_the_record(tmp_path):
    rec = {"schema": "duplexcadence.duplex/1", "parameters": {"seconds": 60}, "verdict": "VALID",
           "workloads": {"w": {"ar": {"kind": "none"}, "modes": {"cadence": _mode_runs(8, [(1, 0), (2, 0), (4, 3),
                                                                                           (8, 0)])}}}}
    fc = figures.duplex_figures(done_duplex_stages(tmp_path, {"duplex": rec}), "w")["modes"]["cadence"]
    assert fc["max_sessions_zero_miss"] == 2 and claims.limit_text(fc) == "2-3 (4 missed 3/240)"


# --- a duplex stage's verdict --------------------------------------------------------------------------------
SEGFAULT = "exit status -11: Fatal Python error: Segmentation fault"
TIMEOUT = "timed out after 560 s (killed); rerun with --resume and a larger --stage-budget-s"
MISMATCH = "cadence N=2 session 1: unit 1 differs from the same session run alone"
DUPLEX_PLAN = [Stage("w", h, 560.0) for h in ("duplex_stock", "duplex_cadence")]


def duplex_record(workload_name: str, mode: str, verdict: str = "VALID", reasons=()) -> dict:
    rec = duplex_part(workload_name, mode)
    w = rec["workloads"][workload_name]
    w["invalid_reasons"] = [r for r in reasons if "differs" in r]
    rec["verdict"] = verdict
    rec["invalid_reasons"] = [records.NOT_FINISHED] if verdict == "PARTIAL" else list(reasons)
    return rec


class DuplexStages(Stub):
    """Stands in for a duplex stage's process: per harness the duplex.json it leaves (None: none) and how it
    ended (exit status, or "timeout"); default a VALID record, exit 0."""

    def __init__(self, recs: dict | None = None, ends: dict | None = None):
        super().__init__(seconds=100.0)
        self.recs, self.ends = recs or {}, ends or {}

    def __call__(self, stage, out_dir, timeout_s, options):
        self.calls.append((stage.name, timeout_s))
        self.now += self.seconds
        out_dir.mkdir(parents=True, exist_ok=True)
        rec = self.recs.get(stage.harness, duplex_record(stage.workload, stage.mode))
        if rec is not None:
            (out_dir / "duplex.json").write_text(json.dumps(rec))
        end = self.ends.get(stage.harness, 0)
        if end == "timeout":
            return Outcome("failed", None, TIMEOUT, ["duplex stub"])
        if end == 0:
            return Outcome("done", 0, "", ["duplex stub"])
        tail = {1: "exit status 1: verdict INVALID", -11: SEGFAULT}.get(end, f"exit status {end}")
        return Outcome("failed", end, tail, ["duplex stub"], [tail])


def test_a_duplex_stages_verdict_is_read_from_its_duplex_json(tmp_path):
    run(tmp_path, DUPLEX_PLAN, DuplexStages())
    disk = on_disk(tmp_path)
    for name in ("w.duplex_stock", "w.duplex_cadence"):
        assert {k: disk[name][k] for k in ("status", "verdict", "invalid_codes", "mismatched_units")} == {
            "status": "done", "verdict": "VALID", "invalid_codes": [], "mismatched_units": []}, name
    text = document.write(tmp_path).read_text()
    assert "Stage verdicts: 2 VALID, 0 INVALID." in text


@pytest.mark.parametrize("reasons, codes, message", [
    pytest.param([MISMATCH], ["mismatch"], f"1 session(s) differ from the same session alone: ['{MISMATCH}']",
                 id="session-differs-from-itself-alone"),
    pytest.param([records.DIRTY_TREE], ["dirty_tree"], "verdict INVALID: ['dirty_tree']", id="dirty-tree"),
    pytest.param([f"30 s < 60 s: {records.SHORT_RUN}"], ["short_run"], "verdict INVALID: ['short_run']",
                 id="short-run"),
])
def test_an_invalid_duplex_record_is_done_and_fails_reproduce_like_verify(fake_registry, clean_tree, tmp_path, capsys,
                                                                       reasons, codes, message):
    run_dir = tmp_path / "run"
    stub = DuplexStages({"duplex_cadence": duplex_record("fake", "cadence", "INVALID", reasons)},
                        {"duplex_cadence": records.EXIT_INVALID})
    args = ["--device", "cpu", "--workload", "fake", "--stages", "duplex", "--run-dir", str(run_dir),
            "--max-speak-units", "4"]                 # cut short on purpose: still no duplex code is tolerated
    assert reproduce.main(args, execute=stub) == 1
    st = on_disk(run_dir)["fake.duplex_cadence"]
    assert (st["status"], st["reason"], st["verdict"]) == ("done", "", "INVALID")
    assert st["invalid_codes"] == codes and st["mismatched_units"] == ([MISMATCH] if codes == ["mismatch"] else [])
    err = capsys.readouterr().err
    assert f"FAIL: fake.duplex_cadence: {message}" in err
    text = (run_dir / "REPORT.md").read_text()
    assert "**Complete**" in text and f"1 INVALID; fake.duplex_cadence: {codes[0]}." in text
    again = DuplexStages()
    assert reproduce.main([*args, "--resume"], execute=again) == 1 and again.calls == []


def test_tolerated_needs_a_code():
    assert reproduce.tolerated(["few_units"], True) and not reproduce.tolerated(["few_units"], False)
    assert not reproduce.tolerated([], True)
    assert not any(reproduce.tolerated([c], True) for c in ("mismatch", "dirty_tree", "short_run"))


@pytest.mark.parametrize("record, end", [
    pytest.param("PARTIAL", 1, id="exception-after-a-checkpoint"),
    pytest.param(None, 1, id="exception-before-any-run"),
    pytest.param("VALID", 1, id="exception-after-a-valid-record"),
    pytest.param("INVALID", -11, id="signal"),
    pytest.param("INVALID", "timeout", id="timeout"),
])
def test_a_duplex_crash_is_failed_not_done(tmp_path, record, end):
    rec = None if record is None else duplex_record("w", "cadence", record, [records.DIRTY_TREE])
    state, _ = run(tmp_path, DUPLEX_PLAN, DuplexStages({"duplex_cadence": rec}, {"duplex_cadence": end}))
    st = state.stages["w.duplex_cadence"]
    assert st.status == "failed" and st.reason and st.verdict == record
    assert state.stages["w.duplex_stock"].status == "done"


@pytest.mark.parametrize("end, reason", [(-11, SEGFAULT), ("timeout", TIMEOUT)], ids=["segfault", "timeout"])
def test_a_failed_duplex_stage_still_reports_the_runs_it_measured(tmp_path, end, reason):
    stub = DuplexStages({"duplex_cadence": duplex_record("w", "cadence", "PARTIAL")}, {"duplex_cadence": end})
    state, _ = run(tmp_path, DUPLEX_PLAN, stub)
    st = state.stages["w.duplex_cadence"]
    assert (st.status, st.reason, st.verdict, st.invalid_codes) == ("failed", reason, "PARTIAL", ["partial"])
    text = document.write(tmp_path).read_text()
    mark = f"cadence: PARTIAL, N=1,25 measured (failed: {reason})"
    sessions = row_of(text, "Sessions per GPU", "w")
    assert "| >= 3 | >= 25 |" in sessions and "| +13.2 / -41.5 |" in sessions and mark in sessions
    assert "**Incomplete**" in text and "1 PARTIAL (failed after measuring some runs): w.duplex_cadence" in text
    again = DuplexStages()
    run(tmp_path, DUPLEX_PLAN, again, resume=True)
    assert [c[0] for c in again.calls] == ["w.duplex_cadence"]
    assert "PARTIAL" not in section(document.write(tmp_path).read_text(), "Sessions per GPU")


def test_one_duplex_mode_done_is_shown_and_the_other_said_pending(tmp_path):
    stub = DuplexStages()
    stub.seconds = 500.0
    _, sitting = run(tmp_path, DUPLEX_PLAN, stub, budget_s=580.0)
    assert [c[0] for c in stub.calls] == ["w.duplex_stock"] and sitting["stopped"]
    text = document.write(tmp_path).read_text()
    row = row_of(text, "Sessions per GPU", "w")
    assert "| >= 3 | — |" in row and "| +13.2 / — |" in row
    assert "w.duplex_stock/duplex.json; cadence: pending: not run yet: budget" in row


def paired_record(x, lo, hi, *, gpu="NVIDIA H200", states=None, processes=3) -> dict:
    """A paired verify record carrying only what the report reads: its speedup summary (suite.records.paired)."""
    sp = {"speedup": x, "ci_low": lo, "ci_high": hi, "a_ms_median": 10.0 * x, "b_ms_median": 10.0,
          "processes": processes, "pairs": 30 * processes, "process_medians": [x] * processes, "mismatched": 0,
          "mismatches": [], "mixed_pairs": 0, "probe_split": None, "seed": 0, "n_boot": 2000,
          "flags": [] if processes >= 3 else [f"{processes} processes with measured pairs < 3"],
          "states": {k: {"state": k, "speedup": v[0], "ci_low": v[1], "ci_high": v[2], "pairs": v[3],
                         "processes": 3, "probe_median": 7.0} for k, v in (states or {}).items()}}
    return {"schema": records.VERIFY_SCHEMA, "workload": {"name": "w", "model": "M"}, "parameters": {},
            "provenance": {"device": {"gpu_name": gpu}, "impl_tree": "t", "date_utc": "2026-12-01"},
            "device": "cuda", "verdict": "VALID",
            "modes": {m: {"metrics": {}, "units": [], "memory": {}} for m in ("stock", "cadence")},
            "comparison": {"protocol": "paired", "units_compared": 90, "mismatched_units": []},
            "paired": {"speedup": sp, "floor": None, "clears_floor": None}}


def test_the_reproducibility_bar_judges_a_second_run_against_the_first(tmp_path):
    first = paired_record(2.50, 2.45, 2.60)
    verdict, reasons = runs.bar(paired_record(2.55, 2.50, 2.62), first, "w")
    assert (verdict, reasons[0]) == ("met", "w: second run 2.55x inside the first's [2.45-2.60]")
    assert reasons[1].startswith("median per unit, the reference's -> ours: stock ") and len(reasons) == 2
    verdict, reasons = runs.bar(paired_record(2.70, 2.65, 2.75), first, "w")
    assert verdict == "not met" and "outside the first's" in reasons[0]
    two = {"fast": (2.3, 2.25, 2.35, 40), "slow": (3.0, 2.9, 3.1, 40)}
    moved = {"fast": (2.32, 2.3, 2.4, 40), "slow": (3.05, 3.0, 3.1, 60)}
    verdict, reasons = runs.bar(paired_record(2.8, 2.7, 2.9, states=moved), paired_record(2.5, 2.4, 2.6, states=two), "w")
    assert verdict == "met" and any("(slow host)" in r and "inside" in r for r in reasons)   # judged per state
    verdict, reasons = runs.bar(paired_record(2.55, 2.5, 2.6, processes=2), first, "w")
    assert verdict == "not met" and any("2 processes with measured pairs < 3" in r for r in reasons)
    older = {**first, "schema": records.RUN_SCHEMA, "comparison": {"rounds": [{"speedup_x": 2.0}, {"speedup_x": 2.2}]}}
    verdict, reasons = runs.bar(first, older, "w")
    assert verdict == "open" and "the reference of the older protocol" in reasons[0]
    verdict, reasons = runs.bar(first, paired_record(2.5, 2.4, 2.6, gpu="NVIDIA A100"), "w")
    assert verdict == "open" and "not comparable: ours on NVIDIA H200, the reference on NVIDIA A100" in reasons[0]
    assert runs.bar(None, first, "w")[0] == "open"


def test_compare_puts_the_bar_in_the_report(tmp_path):
    run_dir, ref = tmp_path / "run", tmp_path / "ref"
    for folder, rec in ((run_dir / "w.verify", paired_record(2.55, 2.5, 2.6)), (ref, paired_record(2.5, 2.45, 2.6))):
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps(rec))
    (run_dir / "stages.json").write_text(json.dumps({"schema": records.STAGES_SCHEMA, "options": OPTIONS, "sittings": [],
                                                     "stages": {"w.verify": {"workload": "w", "harness": "verify",
                                                                             "status": "done"}}}))
    text = section(document.write(run_dir, [str(ref)]).read_text(), "Against the reference run")
    assert "Against `ref`: the judged bar **met** (1 of 1 workloads met)" in text and "- w: **met**: w: second run 2.55x inside the first's [2.45-2.60]" in text
    (ref / "run.json").write_text(json.dumps(paired_record(2.2, 2.1, 2.3)))
    assert "Against `ref`: the judged bar **not met**" in section(document.write(run_dir, [str(ref)]).read_text(),
                                                  "Against the reference run")


def test_timing_rounds_give_the_speedup_and_its_band(tmp_path):
    """Older verify records: the median of their timing rounds with the rounds' min-max; one round: the units' band."""
    rec = {"modes": {m: {"metrics": {}, "units": [{"index": i, "measured": True, "tail_ms": ms * (1 + 0.05 * ((i % 3) - 1))}
                                                  for i in range(9)]} for m, ms in (("stock", 10.0), ("cadence", 5.0))}}

    def with_rounds(xs):
        r = json.loads(json.dumps(rec))
        r["comparison"] = {"rounds": [{"round": i + 1, "speedup_x": x, "stock_tail_ms_p50": 10 * x,
                                       "cadence_tail_ms_p50": 10.0} for i, x in enumerate(xs)]}
        return r
    sp = figures.speedup(with_rounds([2.0, 2.2, 2.1]))
    assert (sp["x"], sp["lo"], sp["hi"], sp["protocol"], sp["floor"]) == (2.1, 2.0, 2.2, "rounds", None)
    assert sp["band"] == "min-max of 3 rounds in one process"
    old = with_rounds([2.0, 2.2, 2.1])
    old["modes"]["stock"]["units"][0]["kernels"] = {"kernels": 1}
    assert figures.speedup(old)["band"].endswith("; rounds 2+ timed after the profiler")
    one = figures.speedup(with_rounds([2.0]))
    assert one["protocol"] == "units" and one["lo"] < 1.95 and one["hi"] > 2.05
    row = claims.speed("moshi", {"verify": {"record": with_rounds([6.9, 7.1, 7.0]), "state": {}}})
    assert row.verdict == "open" and row.ours_text == "7.00x [6.90-7.10] (older protocol)" and "no A/A floor" in row.note


def test_make_report_compare_records_the_reference_and_keeps_it(fake_registry, clean_tree, tmp_path, capsys):
    run_dir = tmp_path / "results" / "run"
    runner.run_plan([Stage("fake", "verify", 100.0)], State.open(run_dir, OPTIONS, resume=False), OPTIONS,
                    execute=inline, log=lambda *_: None)
    ref = tmp_path / "results" / "ref"
    ref.mkdir()
    (ref / "run.json").write_text((run_dir / "fake.verify" / "run.json").read_text())
    before = (run_dir / "stages.json").read_text()
    assert report.main([str(run_dir), "--compare", str(tmp_path / "missing")]) == 1
    assert "missing" in capsys.readouterr().err and (run_dir / "stages.json").read_text() == before
    assert report.main([str(ref), "--compare", str(run_dir)]) == 1
    assert "only for a staged reproduction" in capsys.readouterr().err and not (ref / "REPORT.md").exists()
    assert report.main([str(run_dir), "--compare", str(ref)]) == 0
    assert json.loads((run_dir / "stages.json").read_text())["compare"] == [str(ref)]
    assert report.main([str(run_dir)]) == 0                      # kept by a plain rebuild
    assert "Against `ref`: " in section((run_dir / "REPORT.md").read_text(), "Against the reference run")
    assert report.main([str(run_dir), "--compare", str(run_dir)]) == 1
    assert "it is the run itself" in capsys.readouterr().err


def test_memory_claims_never_pair_one_memory_stage_with_the_other_modes_verify_figure():
    def mem(modes):
        return {"workload": {"model": records.PUBLISHED_MODEL}, "parameters": {"euler_steps": 10}, "modes": {
            m: {"memory": {"peak_over_idle_driver_mib": p, "session_driver_mib": s, "driver_source": "nvml"}}
            for m, (p, s) in modes.items()}}
    half = {"verify": {"record": mem({"stock": (5000.0, 3616.0), "cadence": (3000.0, 2230.0)})},
            "memory_stock": {"record": mem({"stock": (4800.0, 3616.0)})}}
    m = figures.memory_figures(half)
    assert {x["how"] for x in m.values()} == {"one process, both modes (verify); driver (nvml)"}
    assert claims.per_session("w", half).verdict == "open"
    peak = claims.memory("w", half)
    assert (peak.verdict, peak.ours_text) == ("open", "-40.0% (3000 MiB)") and "one process for both modes" in peak.note
    both = dict(half, memory_cadence={"record": mem({"cadence": (2000.0, 1200.0)})})
    assert (figures.memory_figures(both)["cadence"]["peak"], figures.memory_figures(both)["stock"]["peak"]) == (2000.0, 4800.0)
    row = claims.per_session("w", both)
    assert (row.verdict, row.ours_text, row.stock) == ("met", "0.33 of stock (1200 MiB)", 3616.0)
    peak = claims.memory("w", both)                    # the published configuration: its -38.8% is the bar
    assert (peak.verdict, peak.published, peak.target) == ("met", -38.8, "<= -38.8% (published)")


def test_the_published_figures_stand_beside_minicpmo_at_ten_steps_only():
    """No published figure or published target beside Step-Audio 2, the 5-step workload or any other."""
    assert claims.speed("minicpmo45", {}).published_text == "2.85x"
    assert claims.speed("minicpmo45", {}).target == ">= 2.85x (published)"
    for name in ("minicpmo45_5step", "stepaudio2_mini", "moshi", "qwen3_omni", "not_registered"):
        for fn in (claims.speed, claims.memory):
            row = fn(name, {})
            assert (row.published, row.published_text) == (None, "—") and "published" not in row.target, (name, fn)
    assert claims.speed("stepaudio2_mini", {}).target == ">= 3x"
    assert claims.speed("moshi", {}).target == "faster than stock, clear of the A/A floor"
    assert claims.memory("minicpmo45", {}).published == -38.8
    five = {"verify": {"state": {"status": "done"},
                       "record": {"workload": {"model": records.PUBLISHED_MODEL}, "parameters": {"euler_steps": 5}}}}
    assert claims.speed("minicpmo45", five).published is None                  # the published model at 5 steps
    names = ["minicpmo45", "minicpmo45_5step", "stepaudio2_mini", "moshi", "qwen3_omni"]
    rows = claims.claim_rows({"workloads": {n: {} for n in reversed(names)}})
    assert [r.workload for r in rows if r.claim == "mean SPEAK vs 1 s"] == ["minicpmo45"]
    assert [r.workload for r in rows if r.claim == "speed"] == names            # the registry's order
    assert all(r.verdict == "open" and r.note.startswith("not ") for r in rows)


def test_gpu_coverage_names_the_impl_tree_and_head(tmp_path):
    head = records.git("rev-parse", "HEAD:impl")
    old = {"device": "cuda", "comparison": {"units": []}, "run_id": "old-gpu", "workload": {"name": "w"},
           "provenance": {"date_utc": "2026-11-01", "impl_tree": "0" * 40, "git_rev": "1" * 40}}
    new = {**old, "run_id": "new-gpu", "provenance": {**old["provenance"], "date_utc": "2026-11-30",
                                                        "impl_tree": head or "NA"}}
    for rec in (old, new):
        (tmp_path / rec["run_id"]).mkdir()
        (tmp_path / rec["run_id"] / "run.json").write_text(json.dumps(rec))
    line = runs.gpu_coverage({"workloads": {}, "state": {}}, tmp_path)
    assert "`new-gpu`" in line
    if head:
        assert "it is HEAD's impl/ tree" in line
        (tmp_path / "new-gpu" / "run.json").unlink()
        assert "it is NOT HEAD's impl/ tree" in runs.gpu_coverage({"workloads": {}, "state": {}}, tmp_path)


def test_stages_say_where_they_ran():
    st = StageState("w", "verify", status="done", node="host-a", gpu=1, gpu_name="NVIDIA H200")
    from dataclasses import asdict
    assert runs.ran_on("w.verify", asdict(st), {"workloads": {}}) == "host-a, GPU 1, NVIDIA H200"
    old = {"workload": "w", "harness": "verify", "status": "done"}      # an older stages.json: from its record
    data = {"workloads": {"w": {"verify": {"record": {"provenance": {"device": {"gpu_name": "NVIDIA H200"}}}}}}}
    assert runs.ran_on("w.verify", old, data) == "NVIDIA H200" and runs.ran_on("w.verify", old, {"workloads": {}}) == "—"


def test_the_bytes_against_a_reference_are_compared_unit_by_unit():
    def rec(hashes, threads=16, omp=None):
        units = [{"index": i, "sha256_f32": h, "sha256_pcm16": h + "p"} for i, h in enumerate(hashes)]
        return {"modes": {"stock": {"units": units}, "cadence": {"units": units}},
                "provenance": {"device": {"torch_threads": threads}, "env": {} if omp is None else {"OMP_NUM_THREADS": omp}}}
    first = rec(["a", "b", "c"])
    assert runs.same_bytes(rec(["a", "b", "c"]), first) == "same bytes: stock 3/3, cadence 3/3 units equal"
    text = runs.same_bytes(rec(["a", "x", "c"], threads=1, omp="1"), first)
    assert text == ("**other bytes**: stock 2/3, cadence 2/3 units equal; host threads: ours torch threads 1, "
                    "OMP_NUM_THREADS 1, the reference's torch threads 16, OMP_NUM_THREADS unset")
    assert runs.same_bytes(rec(["a", "x"]), first).startswith("**other bytes**: stock 1/2, cadence 1/2 units equal")
    assert runs.same_bytes(None, first).startswith("not compared")


def test_a_run_of_duplex_stages_only_states_their_gpu_and_commit(tmp_path):
    rec = duplex_part("w", "cadence", gpu="NVIDIA H200")
    rec["provenance"].update(git_rev="6b815058e911aa", impl_tree="305010d4b496bb", date_utc="2026-12-02T02:05:55")
    done_duplex_stages(tmp_path, {"duplex_cadence": rec})
    lines = runs.provenance_list(figures.load(tmp_path))
    assert "- device: GPU: NVIDIA H200" in lines and "- commit: 6b815058e911" in lines and "- impl/ tree: 305010d4b496" in lines
    cpu = duplex_part("w", "cadence")
    cpu["provenance"] = {**rec["provenance"], "device": {"cpu_model": "Intel(R) Xeon(R) Processor"}}
    done_duplex_stages(tmp_path / "cpu", {"duplex_cadence": cpu})
    assert "- device: CPU only: Intel(R) Xeon(R) Processor" in runs.provenance_list(figures.load(tmp_path / "cpu"))
