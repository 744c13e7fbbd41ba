"""suite.measure.dropin: each drop-in's stock loop against the same loop through the drop-in, one small process
per drop-in on CPU at reduced depth (a CPU run checks the loop, the pairing and the bytes; its times are no speed
figure); a perturbed output is caught; bad arguments are named; the records become report lines."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")     # as `make test`: stepaudio2's compiled encoder chunk

import workloads  # noqa: E402
from suite.measure import dropin as harness  # noqa: E402
from suite.measure import env  # noqa: E402
from suite.measure.session import select_units  # noqa: E402
from suite.records.paired import unpack_pairs  # noqa: E402
from suite.report import cli as report  # noqa: E402
from suite.report import document, figures  # noqa: E402
from torch_threads import torch_threads  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "2026-12-01-h200-reproduce-9"     # a staged run
OPTS = dict(depth="reduced", max_speak_units=5, aa_units=2)      # 2 turns; 2 A/A units, 1 measured
STEPS = {"token2wav": 2}                                          # the one drop-in with Euler steps


@pytest.fixture(scope="module", autouse=True)
def clean_one_thread():
    """One intra-op thread (a loaded 2-core machine) and the provenance of a clean checkout (conftest's
    clean_tree, for the module)."""
    real = env.provenance
    with torch_threads(1), pytest.MonkeyPatch.context() as mp:
        mp.setattr(env, "provenance", lambda command=None, *, device="cpu": {
            **real(command, device=device), "git_dirty": False, "git_status": []})
        yield


@pytest.fixture(scope="module")
def records():
    return {name: harness.measure(name, "cpu", processes=1, command=["test"], steps=STEPS.get(name), **OPTS)
            for name in ("mimi", "code2wav", "token2wav")}


def script_units(name: str) -> list:
    """The script's units that carry a payload, as the workload's own script cut gives them."""
    return [u for u in select_units(workloads.get(harness.WORKLOAD[name]), max_speak_units=5) if u.payload is not None]


@pytest.mark.parametrize("name", ["mimi", "code2wav", "token2wav"])
def test_one_process_pairs_every_unit_and_every_units_bytes_are_equal(records, name):
    rec = records[name]
    units = script_units(name)
    pairs = unpack_pairs(rec["paired"]["pairs"])
    ab, aa = [p for p in pairs if p["run"] == "ab"], [p for p in pairs if p["run"] == "aa"]
    assert [p["index"] for p in ab] == [u.index for u in units]             # every unit, in script order
    assert len(aa) == 2 and aa[0]["index"] == ab[0]["index"]
    assert all(p["equal"] and p["sha256_a"] == p["sha256_b"] and p["samples"] > 0 for p in ab + aa)
    assert rec["bytes"] == {"verdict": "VALID", "units_compared": len(units) + 2, "units_equal": len(units) + 2,
                            "mismatches": []}
    assert (rec["verdict"], rec["invalid_codes"]) == ("VALID", [])
    # every A/B pair measured (no warm-up by default), the ratio's median the median of a_ms / b_ms
    assert rec["paired"]["speedup"]["pairs"] == len(units)
    assert rec["paired"]["speedup"]["speedup"] == pytest.approx(np.median([p["a_ms"] / p["b_ms"] for p in ab]))
    assert rec["paired"]["floor"]["pairs"] == 1
    # CPU: graphs off, so every drop-in unit ran its steps eagerly
    assert rec["calls"]["dropin_units"] == {"eager": len(units)} and rec["calls"]["graph_counters"]["captures"] == 0
    assert rec["provenance"]["git_rev"] and rec["provenance"]["command"] == ["test"]


def test_a_perturbed_drop_in_output_makes_the_bytes_verdict_invalid(monkeypatch):
    real, seen = harness.LOOPS["code2wav"], []

    def perturbed(model, spec, dropin):
        arm = real(model, spec, dropin)
        step = arm.step

        def flip_second(payload, final):
            out = step(payload, final)
            seen.extend([out] if dropin else [])
            if dropin and len(seen) == 2:
                out.waveform[100] = np.nextafter(out.waveform[100], np.float32(2))    # one sample, one ulp
            return out
        arm.step = flip_second
        return arm
    monkeypatch.setitem(harness.LOOPS, "code2wav", perturbed)
    rec = harness.measure("code2wav", "cpu", processes=1, **{**OPTS, "aa_units": 0})
    second = script_units("code2wav")[1].index
    assert rec["bytes"]["verdict"] == "INVALID"
    assert rec["bytes"]["mismatches"] == [{"run": "A/B", "process": 1, "index": second}]
    assert rec["verdict"] == "INVALID" and "mismatch" in rec["invalid_codes"]
    assert rec["paired"]["speedup"]["mismatched"] == 1 and rec["paired"]["floor"] is None


def test_bad_arguments_are_named(capsys, tmp_path):
    with pytest.raises(ValueError, match="dropin: expected one of"):
        harness.measure("vocoder", "cpu")
    with pytest.raises(ValueError, match="processes: expected an int >= 1"):
        harness.measure("mimi", "cpu", processes=0)
    with pytest.raises(ValueError, match="steps: the mimi drop-in"):
        harness.measure("mimi", "cpu", processes=1, steps=3)
    for args, name in ((["--dropin", "vocoder"], "--dropin"), (["--dropin", "mimi", "--processes", "0"], "--processes"),
                       (["--dropin", "mimi", "--aa-units", "-1"], "--aa-units"),
                       (["--dropin", "mimi", "--device", "gpu"], "--device"),
                       (["--dropin", "code2wav", "--steps", "3"], "steps")):
        argv = ["--device", "cpu", "--out", str(tmp_path)] + args
        assert harness.main(argv) == 2
        assert name in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_records_become_drop_in_lines_of_a_report(records, tmp_path):
    for name, rec in records.items():
        (tmp_path / f"dropin_{name}.json").write_text(json.dumps(rec))
    assert report.main([str(tmp_path)]) == 0
    text = (tmp_path / "REPORT.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("- **")]
    assert [line.split("**")[1] for line in lines] == ["code2wav", "mimi", "token2wav"]
    for line in lines:
        assert "no speed figure" in line and "bytes VALID" in line and line.endswith("**VALID**")
    data = figures.load(REFERENCE)                          # a staged run's report gains the section
    assert data["dropins"] == [] and "## Drop-ins" not in document.render(data)
    data["dropins"] = [records["token2wav"]]
    assert "## Drop-ins" in document.render(data) and "- **token2wav**" in document.render(data)
