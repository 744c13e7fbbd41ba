"""MiniCPM-o 4.5 tail: the suite's per-unit hashes equal those of an independent reference process.

tests/reference/minicpmo_reference.py imports only torch, numpy and the stock package (stepaudio2 of
minicpmo-utils 1.0.7), builds Token2wav from the same synthetic reduced-depth checkpoint directory and
drives it as the MiniCPM-o duplex loop does, printing per-unit sha256 of the float32 waveform and int16 PCM.
This process runs the same units through flow_hift.build_model / new_session, "stock" and "cadence".
Both processes seed the global CPU RNG with SEED right before building, in the same construction order
(flow from flow.yaml, its weights, then the vocoder from config.yaml: flow_hift.build_token2wav), so the
construction-time tables (decoder.rand_noise, the vocoder's rand_ini / sine_waves) are the same.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import synthetic_checkpoint as sc  # noqa: E402  (tests/ is on sys.path under pytest)
from torch_threads import torch_threads  # noqa: E402
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.flow_hift import build, facts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "reference" / "minicpmo_reference.py"
VOICE = ROOT / "workloads" / "data" / "voice_prompts" / "ljspeech_LJ001-0001_24k.wav"
STEPS, SEED, THREADS = 2, 11, 2
# Tokens per unit (each call runs the released-size vocoder, seconds of CPU, so few units). Turn 0: the
# 28-token first call, then a final unit whose 8 tokens (3 carried + 5) make the smallest non-final call and
# leave 3 for the last_chunk flush. Turn 1 (caches restored): one unit, a 7-token last_chunk flush.
UNIT_TOKENS = [[25, 5], [4]]
EXPECTED_CALLS = [[[28], [8, 3]], [[7]]]


def script() -> list[list[list[int]]]:
    gen = torch.Generator().manual_seed(2024)
    return [[torch.randint(0, facts.VOCAB_SIZE, (n,), generator=gen).tolist() for n in turn] for turn in UNIT_TOKENS]


def run_session(session, turns) -> list[dict]:
    units = []
    with session:
        _run(session, turns, units)
    return units


def _run(session, turns, units) -> None:
    for turn in turns:
        session.start_turn()
        for i, tokens in enumerate(turn):
            out = session.speak(tokens, final=i == len(turn) - 1)
            f32, pcm = out.sha256()
            units.append({"calls": out.info["calls"], "samples": out.samples, "sha256_f32": f32,
                          "sha256_pcm16": pcm})


@pytest.fixture(scope="module", autouse=True)
def threads():
    with torch_threads(THREADS):      # this module's tests at THREADS threads; the count before is back after
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("reference")
    checkpoint = work / "ckpt"
    sc.write_checkpoint(checkpoint, seed=5)
    prompt = build.prepare_prompt(VOICE, seconds=2.0)
    torch.save({"tokens": prompt.tokens, "spk": prompt.spk, "mel": prompt.mel}, work / "prompt.pt")
    turns = script()
    (work / "script.json").write_text(json.dumps({"turns": turns}))
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1", OMP_NUM_THREADS=str(THREADS))
    # Sequential on purpose: two 2-thread processes on 2 cores oversubscribe and double the CPU time.
    proc = subprocess.run(
        [sys.executable, str(REFERENCE), "--checkpoint", str(checkpoint), "--prompt", str(work / "prompt.pt"),
         "--script", str(work / "script.json"), "--steps", str(STEPS), "--seed", str(SEED),
         "--threads", str(THREADS)],
        cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"reference script failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    reference = json.loads(proc.stdout.strip().splitlines()[-1])

    model = fh.build_model({"n_timesteps": STEPS, "voice_prompt": str(VOICE), "prompt_seconds": 2.0,
                            "checkpoint": str(checkpoint)}, device="cpu", depth="reduced", seed=SEED)
    stock = run_session(fh.new_session(model, "stock"), turns)
    cadence = run_session(fh.new_session(model, "cadence"), turns)
    return reference, stock, cadence


def test_reference_imports_only_upstream(runs):
    reference, _, _ = runs
    assert reference["project_modules"] == []


def test_reference_units_are_the_duplex_loop_calls(runs):
    reference, _, _ = runs
    assert [u["calls"] for u in reference["units"]] == [c for turn in EXPECTED_CALLS for c in turn]
    assert reference["units"][0]["samples"] == 24000                 # first unit: 3840 zeros + 42 frames
    hashes = [u["sha256_f32"] for u in reference["units"]]
    assert len(set(hashes)) == len(hashes), "distinct units must not hash alike (degenerate audio?)"


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_suite_hashes_equal_the_reference_process(runs, mode):
    reference, stock, cadence = runs
    ours = {"stock": stock, "cadence": cadence}[mode]
    theirs = [{k: u[k] for k in ("calls", "samples", "sha256_f32", "sha256_pcm16")} for u in reference["units"]]
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"{mode} unit {i} differs from the reference process: {a} != {b}"
