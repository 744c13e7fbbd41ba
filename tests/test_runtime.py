"""duplexcadence.runtime: the released models by name, open_model's errors (before anything is built), the
per-model state and lock, and the byte-for-byte comparison of stock and cadence units. No model is built."""
from __future__ import annotations

import copy
import gc
import threading
import weakref

import numpy as np
import pytest
import torch

from duplexcadence import runtime
from duplexcadence.errors import InputError
from duplexcadence.runtime import (ADAPTERS, MODELS, BitMismatch, ModelEntry, OpenModel, compare_units,
                                   first_difference, model_lock, model_state, open_model)
from duplexcadence.session import UnitOutput, to_pcm16


# --- names ---------------------------------------------------------------------------------------
def test_every_released_model_is_named_with_its_architecture():
    assert {n: e.architecture for n, e in MODELS.items()} == {
        "minicpmo45": "flow_hift", "stepaudio2_mini": "flow_hift", "moshi": "mimi", "qwen3_omni": "code2wav"}
    assert all(e.name == n for n, e in MODELS.items())
    assert set(ADAPTERS) == {"flow_hift", "mimi", "code2wav"}
    assert MODELS["minicpmo45"].needs == ("voice_prompt",) and MODELS["stepaudio2_mini"].needs == ("voice_prompt",)
    assert MODELS["moshi"].needs == () and MODELS["qwen3_omni"].needs == ()


def test_open_model_of_an_unknown_name_names_the_known_ones():
    with pytest.raises(InputError) as info:
        open_model("minicpm-o")
    msg = str(info.value)
    assert msg.startswith("name: expected one of ") and msg.endswith("got 'minicpm-o'")
    assert all(repr(n) in msg for n in ("minicpmo45", "moshi", "qwen3_omni", "stepaudio2_mini"))


@pytest.mark.parametrize("name", ["minicpmo45", "stepaudio2_mini"])
@pytest.mark.parametrize("spec", [{}, {"voice_prompt": None}], ids=["absent", "none"])
def test_open_model_without_a_voice_prompt_says_so_before_building(name, spec):
    with pytest.raises(ValueError, match=rf"open_model\('{name}'\): voice_prompt is required"):
        open_model(name, device="not-a-device", **spec)       # raised before the device is even parsed


def test_adapter_of_an_unknown_architecture_names_the_known_ones():
    with pytest.raises(KeyError, match=r"architecture 'hifigan': expected one of \['code2wav', 'flow_hift', 'mimi'\]"):
        runtime.adapter("hifigan")


def test_a_key_error_inside_an_adapters_import_is_not_reported_as_an_unknown_architecture(tmp_path, monkeypatch):
    """An adapter module that fails at import with a KeyError (a missing table entry, say) must surface that
    error, not "architecture ...: expected one of" for an architecture that is in the list."""
    (tmp_path / "broken_adapter_for_test.py").write_text("TABLE = {}\nSIZE = TABLE['missing']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ADAPTERS, "broken", "broken_adapter_for_test")
    with pytest.raises(KeyError) as info:
        runtime.adapter("broken")
    assert "expected one of" not in str(info.value) and "missing" in str(info.value)


def test_an_open_model_hands_its_native_object_mode_and_options_to_the_adapter():
    class FakeAdapter:
        def __init__(self):
            self.calls = []

        def new_session(self, native, mode, spec):
            self.calls.append((native, mode, spec))
            return "a session"

        def session_options(self, native, mode):
            return ("capture",)

    fake, native = FakeAdapter(), object()
    opened = OpenModel(ModelEntry("m", "M", "mimi"), fake, native, {"dtype": "float32"})
    assert opened.session("stock", capture="inline") == "a session"
    assert opened.session() == "a session"
    assert fake.calls == [(native, "stock", {"capture": "inline"}), (native, "cadence", {})]
    with pytest.raises(InputError, match=r"^options: \['captrue'\] not taken by a m 'stock' session"):
        opened.session("stock", captrue="inline")
    assert len(fake.calls) == 2                        # refused before the adapter was asked


def test_use_expandable_segments_is_a_no_op_off_cuda():
    assert runtime.use_expandable_segments("cpu") == {}


# --- model_state / model_lock --------------------------------------------------------------------
def test_model_state_is_one_dict_per_instance_kept_beside_it():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    state = model_state(a)
    state["voices"] = {"f1": 1}
    assert model_state(a) is state and model_state(b) is not state and model_state(b) == {}
    assert "voices" not in vars(a)                                  # beside the model, not on it
    clone = copy.deepcopy(a)
    assert model_state(clone) == {} and model_state(clone) is not state


def test_model_state_goes_with_its_model():
    class Marker:
        pass

    model, marker = torch.nn.Linear(2, 2), Marker()
    model_state(model)["marker"] = marker
    ref = weakref.ref(marker)
    del model, marker
    gc.collect()
    assert ref() is None


def test_model_state_of_an_object_without_weak_references_is_a_type_error():
    with pytest.raises(TypeError):
        model_state(7)
    with pytest.raises(TypeError):
        model_state([1, 2])


def test_model_lock_is_one_reentrant_lock_per_model_even_when_asked_from_many_threads():
    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    got, start = [], threading.Barrier(8)

    def ask():
        start.wait()
        got.append(model_lock(model))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 8 and all(lock is got[0] for lock in got)
    lock = model_lock(model)
    assert lock is got[0] and model_state(model)["lock"] is lock and model_lock(other) is not lock
    with lock:
        with lock:                                                   # reentrant: a step inside a step
            pass
    assert lock.acquire(blocking=False)
    lock.release()


# --- compare_units / first_difference --------------------------------------------------------------
def _unit(wave):
    wave = np.asarray(wave, np.float32)
    return UnitOutput(wave, to_pcm16(wave))


def test_identical_units_pass():
    compare_units("w", 0, _unit([0.0, 0.5, -0.25]), _unit([0.0, 0.5, -0.25]))
    nan = np.array([np.nan], np.float32)
    compare_units("w", 0, UnitOutput(nan, np.zeros(1, np.int16)), UnitOutput(nan.copy(), np.zeros(1, np.int16)))


def test_a_differing_sample_names_the_workload_unit_and_sample():
    with pytest.raises(BitMismatch) as info:
        compare_units("minicpmo45.f1", 3, _unit([0.0, 0.5, 0.25, 1.0]), _unit([0.0, 0.5, 0.125, 1.0]))
    msg = str(info.value)
    assert msg.startswith("minicpmo45.f1: unit 3: float32 waveform differs: first differing sample 2 of 4")
    assert "max |diff| 0.125" in msg
    assert issubclass(BitMismatch, AssertionError)


def test_minus_zero_is_not_zero():
    with pytest.raises(BitMismatch, match="float32 waveform differs: first differing sample 0 of 1"):
        compare_units("w", 0, _unit([0.0]), _unit([-0.0]))


def test_pcm_alone_differing_is_caught():
    wave = np.array([0.5, 0.5], np.float32)
    with pytest.raises(BitMismatch, match=r"unit 1: int16 PCM differs: first differing sample 1 of 2"):
        compare_units("w", 1, UnitOutput(wave, np.array([16383, 16383], np.int16)),
                      UnitOutput(wave.copy(), np.array([16383, 16384], np.int16)))


def test_a_different_length_is_reported_as_shapes():
    with pytest.raises(BitMismatch, match=r"float32 waveform differs: shape \(3,\) vs \(4,\)"):
        compare_units("w", 2, _unit([0.0] * 3), _unit([0.0] * 4))


def test_a_different_dtype_is_a_bit_mismatch_naming_it():
    """A float64 waveform of the same values is not the stock float32 bytes: a BitMismatch, not a crash."""
    a = UnitOutput(np.zeros(3, np.float32), np.zeros(3, np.int16))
    b = UnitOutput(np.zeros(3, np.float64), np.zeros(3, np.int16))
    with pytest.raises(BitMismatch, match=r"unit 4: float32 waveform differs") as info:
        compare_units("w", 4, a, b)
    assert "float64" in str(info.value)


def test_first_difference_by_hand():
    assert first_difference(np.array([1, 2, 3], np.int16), np.array([1, 2, 3], np.int16)) == "identical"
    msg = first_difference(np.array([1, 2, 3], np.int16), np.array([1, 5, 3], np.int16))
    assert msg.startswith("first differing sample 1 of 3:") and msg.endswith("max |diff| 3")
    assert first_difference(np.zeros((2, 3)), np.zeros((3, 2))) == "shape (2, 3) vs (3, 2)"
    two_d = first_difference(np.array([[0.0, 1.0], [2.0, 3.0]], np.float32),
                             np.array([[0.0, 1.0], [2.0, 7.0]], np.float32))
    assert two_d.startswith("first differing sample 3 of 4:") and "max |diff| 4" in two_d
