"""flow_hift.build.build_stepaudio2_token2wav: Step-Audio 2 mini's released token2wav/ folder (stepfun-ai/Step-Audio2
token2wav.py @ b1bb23c L37-48: flow.yaml + flow.pt into the flow, hift.pt into `HiFTGenerator()` with "generator."
removed from its keys), loaded from a small synthetic checkpoint written in that layout by
tests/synthetic_checkpoint.py (reduced-depth flow, the released HiFT's shapes), independently of the loader.
Expected values are the tensors written, compared key by key; every defect is one line naming the file and key.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import synthetic_checkpoint as sc  # noqa: E402
from torch_threads import torch_threads  # noqa: E402
from duplexcadence.adapters.flow_hift import build, facts  # noqa: E402
from duplexcadence.errors import InputError  # noqa: E402
from duplexcadence.runtime import compare_units, open_model  # noqa: E402

VOICE = Path(__file__).resolve().parents[1] / "workloads" / "data" / "voice_prompts" / "librispeech_8297-275156-0011_24k.wav"
FLOW_KEY = "decoder.estimator.blocks.1.attn.to_q.weight"
HIFT_KEY = "f0_predictor.classifier.weight"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("token2wav")
    return directory, sc.write_stepaudio2_checkpoint(directory, seed=5)


def assert_loaded(module: torch.nn.Module, written: dict, what: str) -> None:
    loaded = module.state_dict()
    assert set(loaded) == set(written), f"{what}: keys differ: {sorted(set(loaded) ^ set(written))[:5]}"
    for key, tensor in written.items():
        assert loaded[key].dtype == tensor.dtype and torch.equal(loaded[key], tensor), f"{what}: {key}"


@pytest.mark.parametrize("prefix", ["generator.", ""])
def test_every_written_tensor_is_loaded(checkpoint, tmp_path, prefix):
    directory, written = checkpoint if prefix else (tmp_path, sc.write_stepaudio2_checkpoint(tmp_path, seed=6,
                                                                                               hift_prefix=prefix))
    t2w = build.build_stepaudio2_token2wav(directory, n_timesteps=2)
    assert isinstance(t2w, build.StockToken2wav) and t2w.n_timesteps == 2
    assert_loaded(t2w.flow, written["flow.pt"], "flow.pt")
    assert_loaded(t2w.hift, {k.removeprefix(prefix): v for k, v in written["hift.pt"].items()}, "hift.pt")
    assert len(t2w.flow.decoder.estimator.blocks) == 2                 # the architecture is flow.yaml's


def test_opened_by_name_it_speaks_the_same_bytes_in_both_modes(checkpoint):
    model = open_model("stepaudio2_mini", depth="reduced", checkpoint=str(checkpoint[0]), voice_prompt=str(VOICE),
                       prompt_seconds=2.0, n_timesteps=2)
    assert_loaded(model.native.t2w.flow, checkpoint[1]["flow.pt"], "flow.pt")
    units = [torch.randint(0, facts.VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(n)).tolist()
             for n in (25, 10)]
    outs = {}
    for mode in ("stock", "cadence"):
        with model.session(mode) as session:
            session.start_turn()
            outs[mode] = [session.speak(units[0]), session.speak(units[1], final=True)]
    for k, (a, b) in enumerate(zip(outs["stock"], outs["cadence"])):
        compare_units("stepaudio2_mini checkpoint", k, a, b)
    assert outs["stock"][1].samples > 0 and np.std(outs["stock"][1].waveform) > 1e-3


@pytest.mark.parametrize("missing", ["flow.yaml", "flow.pt", "hift.pt", "directory"])
def test_a_missing_file_is_one_line_naming_it(checkpoint, tmp_path, missing):
    for name in sc.STEPAUDIO2_FILES:
        if name != missing:
            os.link(checkpoint[0] / name, tmp_path / name)
    directory = tmp_path / "absent" if missing == "directory" else tmp_path
    with pytest.raises(FileNotFoundError, match=re.escape(missing if missing != "directory" else "flow.yaml")) as exc:
        build.build_stepaudio2_token2wav(directory, n_timesteps=2)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("file,key,defect,message", [
    pytest.param("flow.pt", FLOW_KEY, "missing", "missing key", id="flow-missing-key"),
    pytest.param("hift.pt", "generator." + HIFT_KEY, "shape", f"key '{HIFT_KEY}' is", id="hift-wrong-shape"),
    pytest.param("hift.pt", "generator.extra.weight", "unexpected", "unexpected key 'extra.weight'", id="hift-extra"),
])
def test_a_mismatched_file_is_one_line_naming_the_file_and_key(checkpoint, tmp_path, file, key, defect, message):
    sc.write_defective_copy(*checkpoint, tmp_path, sc.STEPAUDIO2_FILES, file, key, defect)
    with pytest.raises(build.CheckpointError) as exc:
        build.build_stepaudio2_token2wav(tmp_path, n_timesteps=2)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(str(tmp_path / file)) and message in text
    assert key.removeprefix("generator.") in text and isinstance(exc.value, ValueError)


@pytest.mark.parametrize("file", ["flow.yaml", "flow.pt", "hift.pt"])
def test_a_file_that_does_not_load_is_one_line_naming_it(checkpoint, tmp_path, file):
    for name in sc.STEPAUDIO2_FILES:
        if name != file:
            os.link(checkpoint[0] / name, tmp_path / name)
    (tmp_path / file).write_bytes(b"garbage")
    with pytest.raises(build.CheckpointError) as exc:
        build.build_stepaudio2_token2wav(tmp_path, n_timesteps=2)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(str(tmp_path / file)) and isinstance(exc.value, InputError)
