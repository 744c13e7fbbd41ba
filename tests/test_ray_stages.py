"""suite.stages.on_ray: the plan's stages as Ray tasks on a local Ray instance (2 CPUs, no GPU), each a real
stage process (tests/fake_stage.py: suite.measure.stage on the fake adapter) on a fresh worker. Results come
back into the one run folder; a failing stage is run once more and then recorded failed while the rest go on;
timed stages never overlap another stage on their node (from the recorded instants); a sitting stopped by its
budget is resumed. Skipped where Ray is not installed (`make test` installs the ray extra)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="needs Ray: pip install -e '.[ray]' (make test installs it)")

from suite import records  # noqa: E402
from suite.report import document  # noqa: E402
from suite.stages import on_ray, plan as plans  # noqa: E402
from suite.stages.plan import Stage  # noqa: E402
from suite.stages.state import State  # noqa: E402

OPTIONS = {"device": "cpu", "steps": None, "seconds": None, "max_speak_units": None, "depth": "released",
           "seed": None, "notes": []}
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (2 CPUs, the host resource declared). Its workers inherit this
    environment: tests/ on PYTHONPATH (fake_stage), stages that last long enough to be seen side by side, and
    no OMP_NUM_THREADS (Ray then sets it to 1 in its workers; a stage process must not inherit that)."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "FAKE_STAGE_SLEEP_S", "OMP_NUM_THREADS")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), saved["PYTHONPATH"]) if p)
    os.environ["FAKE_STAGE_SLEEP_S"] = "3"
    os.environ.pop("OMP_NUM_THREADS", None)
    ray.init(num_cpus=2, resources={on_ray.HOST_RESOURCE: on_ray.HOST_UNITS}, include_dashboard=False,
             log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def fake_stages(monkeypatch, local_ray):
    """Every verify / memory stage runs `python -m fake_stage <its suite.measure.stage arguments>`."""
    monkeypatch.setattr(on_ray, "stage_argv", lambda stage, out_dir, options: [
        "fake_stage", *plans.stage_argv(stage, out_dir, options)[1:]])


def sit(run_dir, plan, *, resume=False, budget_s=None, after=None):
    state = State.open(run_dir, OPTIONS, resume=resume)
    lines = []
    sitting = on_ray.run_plan_ray(plan, state, OPTIONS, address="local", budget_s=budget_s, log=lines.append,
                                  provenance={"git_rev": "abc", "impl_tree": "def"}, after=after)
    return state, sitting, lines


def spans(stages: dict) -> dict:
    return {n: (records.instant(st["started_utc"]), records.instant(st["ended_utc"]), st["node"])
            for n, st in stages.items() if st.get("started_utc") and st.get("ended_utc")}


def test_a_plan_runs_through_ray_timed_stages_alone_and_a_failed_one_twice(tmp_path, fake_stages):
    run_dir = tmp_path / "run"
    plan = [Stage("w", "memory_stock", 120.0), Stage("w", "memory_cadence", 120.0), Stage("w", "verify", 120.0),
            Stage("fail", "verify", 120.0), Stage("v", "verify", 120.0)]
    written = []
    state, sitting, lines = sit(run_dir, plan, after=written.append)
    st = {n: vars(x) for n, x in state.stages.items()}
    assert {n: s["status"] for n, s in st.items()} == {"w.memory_stock": "done", "w.memory_cadence": "done",
                                                      "w.verify": "done", "fail.verify": "failed", "v.verify": "done"}
    assert st["fail.verify"]["attempts"] == 2 and st["fail.verify"]["reason"] == "exit status 1: fail: boom"
    assert sitting["ray"] == "local" and written.count("fail.verify") == 2 and len(written) == 6
    for name in ("w.memory_stock", "w.memory_cadence", "w.verify", "v.verify"):    # the files came back
        rec = json.loads((run_dir / name / "run.json").read_text())
        assert rec["verdict"] in ("VALID", "INVALID") and (run_dir / name / "log.txt").stat().st_size > 0
        assert st[name]["node"] and st[name]["gpu"] is None and st[name]["gpu_name"] == "cpu"
    assert (run_dir / "w.verify" / "audio_stock.wav").is_file()
    for name in ("w.verify", "v.verify"):    # the driver's host threads, not the 1 Ray gives a 1-CPU worker
        rec = json.loads((run_dir / name / "run.json").read_text())
        assert "OMP_NUM_THREADS" not in rec["provenance"]["env"], name
    assert st["w.verify"]["units_compared"] == 8 and st["w.verify"]["mismatched_units"] == []
    pids = {int(n.split()[3]) for name in ("w.verify", "v.verify")
            for n in json.loads((run_dir / name / "run.json").read_text())["notes"] if n.startswith("stage process pid")}
    assert len(pids) == 2 and os.getpid() not in pids                     # a process of its own each
    # timed stages alone on their node, from the instants the stage processes recorded
    s = spans(st)
    for timed in ("w.verify", "fail.verify", "v.verify"):
        a0, a1, node = s[timed]
        assert not [n for n, (b0, b1, other) in s.items() if n != timed and other == node and b0 < a1 and a0 < b1], timed
        assert st[timed]["overlapped"] == []
    assert st["w.memory_stock"]["overlapped"] == ["w.memory_cadence"]     # memory stages may share the host
    assert lines[0] == ("plan: 5 stage(s) to run, at most 10 min of stage time (their budgets: no stage of their "
                        "kind has run yet); on Ray (local)")
    assert any(line.startswith("stage 4 of 5 fail.verify: start again") for line in lines)
    text = document.write(run_dir).read_text()
    assert re.search(r"^- `v\.verify`: done in [\d.]+ s \(budget \d+ s, 1 attempt\(s\), [^,()]+, cpu\)", text, re.M)  # node, device
    assert "on Ray (local)" in text


def test_a_sitting_stopped_by_its_budget_is_resumed(tmp_path, fake_stages):
    run_dir = tmp_path / "run"
    plan = [Stage("w", "verify", 100.0), Stage("w", "memory_stock", 100.0), Stage("w", "memory_cadence", 100.0)]
    state, sitting, _ = sit(run_dir, plan, budget_s=60.0)       # the first always starts; the next need 100 s
    assert [state.stages[s.name].status for s in plan] == ["done", "pending", "pending"] and sitting["stopped"]
    state, sitting, _ = sit(run_dir, plan, resume=True)
    assert sitting["kept"] == ["w.verify"] and sorted(sitting["ran"]) == ["w.memory_cadence", "w.memory_stock"]
    assert all(state.stages[s.name].status == "done" for s in plan) and state.stages["w.verify"].attempts == 1


def test_task_resources_make_timed_stages_exclusive_on_their_host():
    timed = on_ray.task_options(Stage("w", "verify", 1.0), "cuda")
    memory = on_ray.task_options(Stage("w", "memory_stock", 1.0), "cpu")
    assert timed == {"num_gpus": 1, "num_cpus": 1, "max_retries": 0,
                     "resources": {on_ray.HOST_RESOURCE: on_ray.HOST_UNITS}}
    assert memory["num_gpus"] == 0 and memory["resources"] == {on_ray.HOST_RESOURCE: 1}
    assert on_ray.task_options(Stage("w", "duplex_oracle", 1.0), "cpu")["resources"][on_ray.HOST_RESOURCE] == \
        on_ray.HOST_UNITS


def test_a_cluster_without_the_host_resource_is_refused(local_ray):
    with pytest.raises(records.StateError, match=r"no node with a GPU declares the resource 'duplexcadence_host'"):
        on_ray.capacity("cuda")                                   # the local instance has no GPU
    assert on_ray.capacity("cpu") == 2



def test_a_cluster_that_does_not_answer_is_a_state_error_naming_the_address(monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to.")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", unreachable)
    with pytest.raises(records.StateError, match=r"^--ray 1\.2\.3\.4:1: no Ray cluster could be joined there "
                                                 r"\(Could not find any running Ray instance"):
        on_ray.connect("1.2.3.4:1")
