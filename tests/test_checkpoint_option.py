"""`--checkpoint [WORKLOAD=]PATH`: from `suite.reproduce`'s options through the stage process's environment
(suite.measure.env.CHECKPOINT_ENV) to the spec the adapter builds from (`session.make_spec`, which the duplex
harness calls too), and the `weights` provenance of the records. The sha256 expected here is computed in the test
from the files, independently of env.checkpoint_sha256. Stages run in this process on the fake adapter.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import fakes
import workloads
from suite import reproduce
from suite.measure import duplex, env, session, stage as stage_process
from suite.stages import plan as plans
from suite.stages.process import Outcome


@pytest.fixture(autouse=True)
def no_checkpoints(monkeypatch):
    monkeypatch.setenv(env.CHECKPOINT_ENV, "{}")       # restored (unset) after each test, whatever it wrote
    env.checkpoint_sha256.cache_clear()


@pytest.fixture
def ckpt(tmp_path) -> Path:
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "flow.pt").write_bytes(b"flow weights")
    (folder / "sub" / "hift.pt").write_bytes(b"hift weights")
    return folder


def expected_sha256(folder: Path) -> str:
    lines = "".join(f"{p} {hashlib.sha256((folder / p).read_bytes()).hexdigest()}\n" for p in ("flow.pt", "sub/hift.pt"))
    return hashlib.sha256(lines.encode()).hexdigest()


def test_checkpoint_values_parse_and_bad_ones_are_named(ckpt, tmp_path):
    assert env.parse_checkpoints(None, ["a", "b"]) == {}
    assert env.parse_checkpoints([f"b={ckpt}"], ["a", "b"]) == {"b": str(ckpt.resolve())}
    assert env.parse_checkpoints([str(ckpt)], ["a"]) == {"a": str(ckpt.resolve())}
    for values, names, what in (([str(ckpt)], ["a", "b"], "say which workload"),
                                ([f"c={ckpt}"], ["a", "b"], "'c' is not in this run"),
                                ([f"a={ckpt}", f"a={ckpt}"], ["a"], "named twice"),
                                ([f"a={tmp_path / 'absent'}"], ["a"], "does not exist")):
        with pytest.raises(ValueError, match=what):
            env.parse_checkpoints(values, names)


def test_make_spec_takes_the_workload_s_checkpoint_from_the_environment(monkeypatch, ckpt):
    wl = workloads.get("moshi")
    assert "checkpoint" not in session.make_spec(wl)
    monkeypatch.setenv(env.CHECKPOINT_ENV, json.dumps({"moshi": str(ckpt), "qwen3_omni": "/elsewhere"}))
    assert session.make_spec(wl)["checkpoint"] == str(ckpt)
    assert "checkpoint" not in session.make_spec(workloads.get("minicpmo45"))
    assert duplex.make_spec is session.make_spec              # the duplex harness builds from the same spec
    monkeypatch.setenv(env.CHECKPOINT_ENV, "moshi=/x")
    with pytest.raises(ValueError, match=env.CHECKPOINT_ENV):
        session.make_spec(wl)


def test_weights_say_seeded_random_or_the_checkpoint_and_its_sha256(monkeypatch, ckpt):
    assert env.weights("moshi", 3) == "seeded random (seed 3)"
    assert env.provenance()["weights"] == "seeded random (the workload's seed)"
    monkeypatch.setenv(env.CHECKPOINT_ENV, json.dumps({"moshi": str(ckpt)}))
    assert env.weights("moshi", 3) == f"checkpoint {ckpt} sha256 {expected_sha256(ckpt)}"
    assert env.provenance()["weights"] == {"moshi": env.weights("moshi", None)}
    single = ckpt / "flow.pt"
    assert env.checkpoint_sha256(str(single)) == hashlib.sha256(b"flow weights").hexdigest()


def inline(stage, out_dir, timeout_s, options):
    """A stage in this process, as its own process would run it (the environment is this process's)."""
    argv = plans.stage_argv(stage, str(out_dir), options)
    rc = stage_process.main([*argv[1:], "--quiet"])
    return Outcome("done" if rc == 0 else "failed", rc, "", argv)


def test_reproduce_checkpoint_reaches_the_spec_and_the_record(monkeypatch, ckpt, tmp_path):
    adapter = fakes.register(monkeypatch)
    registry = {"fake": fakes.workload(turns=2, speak_per_turn=2)}
    monkeypatch.setattr(workloads, "get", registry.__getitem__)
    monkeypatch.setattr(workloads, "names", lambda: list(registry))
    monkeypatch.setattr(workloads, "DEFAULT", "fake")
    real = env.provenance                                      # a clean tree: the verdict is about the run
    monkeypatch.setattr(env, "provenance", lambda command=None, *, device="cpu": {
        **real(command, device=device), "git_dirty": False, "git_status": []})
    run_dir = tmp_path / "run"
    args = ["--device", "cpu", "--workload", "fake", "--stages", "verify", "--run-dir", str(run_dir)]
    assert reproduce.main([*args, "--checkpoint", f"fake={ckpt}"], execute=inline) == 0
    assert [b["spec"].get("checkpoint") for b in adapter.builds] == [str(ckpt.resolve())]
    record = json.loads((run_dir / "fake.verify" / "run.json").read_text())
    assert record["parameters"]["spec"]["checkpoint"] == str(ckpt.resolve())
    assert record["provenance"]["weights"] == f"checkpoint {ckpt.resolve()} sha256 {expected_sha256(ckpt)}"
    assert json.loads((run_dir / "stages.json").read_text())["options"]["checkpoint"] == {"fake": str(ckpt.resolve())}
    # a resume without the checkpoint is another run: refused
    assert reproduce.main([*args, "--resume"], execute=inline) == 2
    # without --checkpoint: seeded random, said so
    other = tmp_path / "other"
    assert reproduce.main(["--device", "cpu", "--workload", "fake", "--stages", "verify", "--run-dir", str(other)],
                          execute=inline) == 0
    record = json.loads((other / "fake.verify" / "run.json").read_text())
    assert "checkpoint" not in record["parameters"]["spec"] and record["provenance"]["weights"].startswith(
        "seeded random (seed ")
    assert "checkpoint" not in json.loads((other / "stages.json").read_text())["options"]


def test_duplex_checkpoint_reaches_the_build_and_the_record_and_a_bad_one_is_one_line(monkeypatch, ckpt, tmp_path,
                                                                                     capsys):
    adapter = fakes.register(monkeypatch)
    registry = {"fake": fakes.workload(turns=2, speak_per_turn=2)}
    monkeypatch.setattr(workloads, "get", registry.__getitem__)
    monkeypatch.setattr(workloads, "names", lambda: list(registry))
    out = tmp_path / "out"
    base = ["--workload", "fake", "--device", "cpu", "--modes", "cadence", "--sessions", "1", "--seconds", "4",
            "--reference-sessions", "0", "--quiet"]
    duplex.main([*base, "--checkpoint", str(ckpt), "--out", str(out)])
    assert adapter.builds and {b["spec"].get("checkpoint") for b in adapter.builds} == {str(ckpt.resolve())}
    record = json.loads((out / "duplex.json").read_text())
    assert record["provenance"]["weights"] == {"fake": f"checkpoint {ckpt.resolve()} sha256 {expected_sha256(ckpt)}"}
    n = len(adapter.builds)
    for value, what in ((f"other={ckpt}", "'other' is not in this run"), (str(tmp_path / "absent"), "does not exist")):
        with pytest.raises(SystemExit) as exc:
            duplex.main([*base, "--checkpoint", value, "--out", str(tmp_path / "refused")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--checkpoint" in err and what in err
    assert len(adapter.builds) == n and not (tmp_path / "refused").exists()     # refused before any build
