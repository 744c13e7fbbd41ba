"""flow_hift.build: loading a MiniCPM-o 4.5 checkpoint directory in the released layout (minicpmo-utils 1.0.7's
Token2wav files, token2wav.py L100-104, less the two ONNX models) through build_token2wav, and the stock DiT
cache buffers of a reduced-depth model (same layout, its steps and layers only, never the 16 x 16 buffer).

The checkpoint is synthetic and reduced-depth, written by tests/synthetic_checkpoint.py from the committed
key/shape manifest tests/data/flow_hift_manifest.json, independently of the loader's code. Expected values
are the tensors written, compared with torch.equal key by key.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import synthetic_checkpoint as sc  # noqa: E402  (tests/ is on sys.path under pytest)
from alloc_spy import BigAllocs  # noqa: E402
from torch_threads import torch_threads  # noqa: E402
from duplexcadence.adapters.flow_hift import build, facts  # noqa: E402
from duplexcadence.adapters.flow_hift.stock import StockSession  # noqa: E402
from duplexcadence.errors import InputError  # noqa: E402

VOICE = Path(__file__).resolve().parents[1] / "workloads" / "data" / "voice_prompts" / "ljspeech_LJ001-0001_24k.wav"
FILES = sc.TEXT_FILES + sc.TENSOR_FILES
FLOW_KEY = "decoder.estimator.blocks.1.attn.to_q.weight"
HIFT_KEY = "f0_predictor.classifier.weight"


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    with torch_threads(2):      # this module's tests at 2 intra-op threads; the count before is back after
        yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpt")
    return directory, sc.write_checkpoint(directory, seed=3)


@pytest.fixture(scope="module")
def t2w(checkpoint):
    return build.build_token2wav(model_dir=checkpoint[0], n_timesteps=2, device="cpu")


def assert_state_equal(module: torch.nn.Module, written: dict, what: str, float64: str | None = None) -> None:
    """Every key loaded, bit-equal. Keys under `float64` are held widened to float64 by the stock code
    (exact for float32 values), so they are compared with the written tensor widened the same way."""
    loaded = module.state_dict()
    assert set(loaded) == set(written), f"{what}: keys differ: {sorted(set(loaded) ^ set(written))[:5]}"
    for key, tensor in written.items():
        if float64 is not None and key.startswith(float64):
            tensor = tensor.to(torch.float64)
        assert loaded[key].dtype == tensor.dtype and torch.equal(loaded[key], tensor), f"{what}: {key}"


def test_manifest_is_the_reduced_configuration():
    manifest = sc.load_manifest()
    assert manifest["versions"]["minicpmo-utils"] == "1.0.7"
    assert manifest["depth"] == {"num_blocks": 2, "num_up_blocks": 1, "dit_depth": 2}
    assert "num_blocks: 2\n" in manifest["texts"]["flow.yaml"] and "depth: 2\n" in manifest["texts"]["flow.yaml"]
    assert set(manifest["tensors"]) == set(sc.TENSOR_FILES)
    assert all(k.startswith("generator.") for k in manifest["tensors"]["hift_original.pt"])


def test_every_written_tensor_is_loaded(checkpoint, t2w):
    directory, written = checkpoint
    assert_state_equal(t2w.flow, written["flow.pt"], "flow.pt")
    # BoundedVocoder.__init__ runs the F0 predictor in float64 (bounded_vocoder.py L64).
    assert_state_equal(t2w.hift, written["hift.pt"], "hift.pt", float64="f0_predictor.")
    assert Path(t2w.vocoder_checkpoint) == directory / "hift.pt"
    # hift_original.pt is read lazily by the stock whole-utterance path (token2wav.py L158-165).
    original = t2w._get_original_vocoder()
    assert_state_equal(original, {k.removeprefix("generator."): v for k, v in written["hift_original.pt"].items()},
                       "hift_original.pt")


def test_first_unit_of_a_turn_gives_one_second(t2w):
    prompt = build.prepare_prompt(VOICE, seconds=2.0)
    build.install_prompt(t2w, prompt)
    session = StockSession(build.Model(t2w, prompt, {}, "minicpmo45", 0))
    session.start_turn()
    tokens = torch.randint(0, facts.VOCAB_SIZE, (25,), generator=torch.Generator().manual_seed(4)).tolist()
    out = session.speak(tokens)
    assert out.info["calls"] == [28]                       # [4218]*3 + 25 new tokens
    assert out.waveform.dtype == np.float32 and out.samples == 24000
    # 1.0.7: the first non-empty vocoder output is preceded by 8 x 480 zero samples (token2wav.py L206-218).
    assert not out.waveform[:3840].any()
    assert np.isfinite(out.waveform).all() and np.abs(out.waveform[3840:]).max() > 1e-3
    assert out.pcm16.dtype == np.dtype("<i2") and out.pcm16.shape == (24000,)
    session.close()


@pytest.mark.parametrize("missing", FILES + ("directory",))
def test_missing_file_is_named(tmp_path, missing):
    for name in FILES:
        if name != missing:
            (tmp_path / name).write_bytes(b"")
    model_dir = tmp_path / "absent" if missing == "directory" else tmp_path
    with pytest.raises(FileNotFoundError, match=re.escape("absent" if missing == "directory" else missing)):
        build.build_token2wav(model_dir=model_dir, n_timesteps=2, device="cpu")


@pytest.mark.parametrize("file,key,defect", [
    pytest.param("flow.pt", FLOW_KEY, "missing", id="flow-missing-key"),
    pytest.param("hift.pt", HIFT_KEY, "shape", id="hift-wrong-shape"),
])
def test_checkpoint_defects_raise_naming_the_key(checkpoint, tmp_path, file, key, defect):
    sc.write_defective_copy(*checkpoint, tmp_path, FILES, file, key, defect)
    message = "missing key" if file == "flow.pt" else "size mismatch"      # hift.pt: upstream's loader's words
    with pytest.raises(build.CheckpointError, match=re.escape(message) + ".*" + re.escape(key)) as info:
        build.build_token2wav(model_dir=tmp_path, n_timesteps=2, device="cpu")
    text = str(info.value)
    assert text.startswith(str(tmp_path / file)) and "\n" not in text and isinstance(info.value, InputError)


def test_reduced_model_has_small_dit_buffers_of_the_stock_layout_and_never_allocates_the_stock_one():
    """A 2-layer DiT with 2 Euler steps gets CFM buffers [2, 2, 2, 8, 1000, 128] / [2, 2, 2, 1024, 2] and DiT
    buffers [2, 2, 8, 1000, 128] / [2, 2, 1024, 2] (the frame axis, a stock limit, kept); building it never makes
    a tensor of the stock 16 x 16 buffer's size (the detector is shown to see one on the meta device first)."""
    stock = 16 * 16 * 2 * 8 * 1000 * 128
    with BigAllocs(stock) as control:
        torch.zeros(16, 16, 2, 8, 1000, 128, device="meta")
    assert control.big
    with BigAllocs(stock) as spy:
        t2w = build.build_token2wav(n_timesteps=2, device="cpu", depth=facts.REDUCED)
    assert spy.big == []
    cfm = t2w.flow.decoder
    shapes = [tuple(b.shape) for b in (cfm.att_cache_buffer, cfm.cnn_cache_buffer, cfm.estimator.att_cache_buffer,
                                       cfm.estimator.cnn_cache_buffer)]
    assert shapes == [(2, 2, 2, 8, 1000, 128), (2, 2, 2, 1024, 2), (2, 2, 8, 1000, 128), (2, 2, 1024, 2)]
    assert all(b.stride()[-1] == 1 for b in (cfm.att_cache_buffer, cfm.estimator.att_cache_buffer))
    assert facts.stock_limits(t2w.flow) == (facts.DIT_BUFFER_FRAMES, facts.POSITION_TABLE, facts.NOISE_FRAMES)


def test_build_model_names_a_missing_or_bad_spec_key():
    """build_model's spec errors are ValueErrors naming the key (a missing voice prompt was a bare KeyError)."""
    from duplexcadence.adapters import flow_hift as fh
    for spec, key in (({}, "voice_prompt"), ({"variant": "cosyvoice", "voice_prompt": str(VOICE)}, "variant"),
                      ({"voice_prompt": str(VOICE), "n_timesteps": 17}, "n_timesteps")):
        with pytest.raises(ValueError, match=key):
            fh.build_model(spec, depth="reduced")
    with pytest.raises(FileNotFoundError, match=r"^spec\['checkpoint'\] x: missing"):    # Step-Audio 2's layout
        fh.build_model({"variant": "stepaudio2", "voice_prompt": str(VOICE), "checkpoint": "x"}, depth="reduced")
    with pytest.raises(ValueError, match="depth"):
        fh.build_model({"voice_prompt": str(VOICE)}, depth="tiny")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("variant", ["minicpmo45", "stepaudio2"])
def test_a_voice_prompt_of_non_finite_samples_is_refused_before_a_build(tmp_path, bad, variant):
    import soundfile as sf
    from duplexcadence.adapters import flow_hift as fh
    audio = np.full(24000, 0.1, np.float32)
    audio[1000] = bad
    voice = tmp_path / "voice.wav"
    sf.write(voice, audio, 24000, subtype="FLOAT")
    empty = tmp_path / "ckpt"                # a checkpoint the build would refuse: the voice is named first
    empty.mkdir()
    for checkpoint in (None, str(empty)):
        with pytest.raises(InputError, match=rf"^voice_prompt: {re.escape(str(voice))} holds non-finite samples"):
            fh.build_model({"variant": variant, "voice_prompt": str(voice), "checkpoint": checkpoint}, depth="reduced")


@pytest.mark.parametrize("variant", ["minicpmo45", "stepaudio2"])
def test_a_voice_prompt_too_loud_for_a_finite_mel_is_refused_before_a_build(tmp_path, variant):
    import soundfile as sf
    from duplexcadence.adapters import flow_hift as fh
    audio = np.sin(np.arange(24000, dtype=np.float32) / 7) * np.float32(1e30)    # finite, far outside [-1, 1]
    voice = tmp_path / "loud.wav"
    sf.write(voice, audio, 24000, subtype="FLOAT")
    with pytest.raises(InputError, match=rf"^voice_prompt: {re.escape(str(voice))} gives a non-finite mel "
                                         r"spectrogram \(samples up to 1e\+30; expected audio in \[-1, 1\]\)"):
        fh.build_model({"variant": variant, "voice_prompt": str(voice)}, depth="reduced")


def test_prompt_seconds_past_the_wav_keeps_the_whole_wav_even_past_a_float_sample_count():
    from duplexcadence.adapters.flow_hift import build
    whole = build.prepare_prompt(VOICE, seconds=None)
    for seconds in (1e6, 1e305):
        cut = build.prepare_prompt(VOICE, seconds=seconds)
        assert torch.equal(cut.mel, whole.mel) and torch.equal(cut.tokens, whole.tokens)
    assert build.prepare_prompt(VOICE, seconds=2.0).mel_frames < whole.mel_frames


def test_a_voice_prompt_that_is_not_a_regular_file_says_so(tmp_path):
    from duplexcadence.runtime import open_model
    fifo = tmp_path / "voice.fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=rf"^voice_prompt: {re.escape(str(fifo))} is not a regular file"):
        open_model("minicpmo45", depth="reduced", voice_prompt=str(fifo))


def test_n_timesteps_takes_a_numpy_int_as_a_plain_int():
    assert build.check_steps(np.int64(3)) == 3 and type(build.check_steps(np.int64(3))) is int
    for bad in (np.float64(3), True, 17, np.int64(0)):
        with pytest.raises(InputError, match=r"^n_timesteps: expected an int in \[1, 16\]"):
            build.check_steps(bad)


def test_a_flow_yaml_with_a_plain_mapping_is_a_checkpoint_error(checkpoint, tmp_path):
    for name in FILES:
        if name != "flow.yaml":
            os.link(checkpoint[0] / name, tmp_path / name)
    (tmp_path / "flow.yaml").write_text("flow:\n  decoder: 1\n")
    with pytest.raises(build.CheckpointError, match=rf"^{re.escape(str(tmp_path / 'flow.yaml'))}: not a flow config"):
        build.build_token2wav(model_dir=tmp_path, n_timesteps=2, device="cpu")


@pytest.mark.parametrize("name", ["minicpmo45", "stepaudio2_mini"])
def test_every_released_model_opens_by_name_and_speaks(name):
    """duplexcadence.runtime.open_model reaches both models of the family (Step-Audio 2 through spec variant
    "stepaudio2"); stock and cadence sessions opened from it give the same bytes."""
    from duplexcadence.runtime import MODELS, compare_units, open_model
    m = open_model(name, depth="reduced", voice_prompt=str(VOICE), prompt_seconds=2.0, n_timesteps=2)
    assert m.native.spec["variant"] == MODELS[name].spec["variant"]
    tokens = [torch.randint(0, facts.VOCAB_SIZE, (25,), generator=torch.Generator().manual_seed(u)).tolist()
              for u in range(2)]
    outs = {}
    for mode in ("stock", "cadence"):
        with m.session(mode, capture="ahead") if mode == "cadence" else m.session(mode) as s:
            s.start_turn()
            outs[mode] = [s.speak(t) for t in tokens]
    for u, (a, b) in enumerate(zip(outs["stock"], outs["cadence"])):
        compare_units(name, u, a, b)
    assert outs["stock"][1].samples > 0
