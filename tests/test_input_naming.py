"""Bad input names the argument that carried it: a unit past its clock's bound says `codes`, and a device this
machine lacks is refused by open_model before anything is built."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from duplexcadence import clocks, runtime
from duplexcadence.clocks import Signature
from duplexcadence.errors import ClosedError, InputError, LimitError, MissingFileError


def codes(frames: int, n_q: int, seed: int = 0) -> list:
    return np.random.default_rng(seed).integers(0, 2048, size=(n_q, frames)).tolist()


def test_argument_prefixes_a_clock_error_and_keeps_its_type_and_usability():
    with pytest.raises(clocks.ClockError, match=r"^codes: region 'unit'") as info:
        with clocks.argument("codes"):
            raise clocks.ClockError("region 'unit': past its bound", session_usable=False)
    assert isinstance(info.value, LimitError) and info.value.session_usable is False
    with clocks.argument("codes"):       # nothing raised: nothing changed
        pass
    with pytest.raises(ValueError, match="^other$"):
        with clocks.argument("codes"):
            raise ValueError("other")


@pytest.mark.parametrize("name, n_q, bound", [("moshi", 8, 13), ("qwen3_omni", 16, 13)])
@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_a_unit_past_the_bound_names_codes_and_the_session_goes_on(name, n_q, bound, mode):
    model = runtime.open_model(name, device="cpu", depth="reduced")
    bad, good = model.session(mode), model.session(mode)
    try:
        bad.start_turn(), good.start_turn()
        with pytest.raises(clocks.ClockError, match=rf"^codes: .*{bound}") as info:
            bad.speak(codes(bound + 1, n_q))
        assert info.value.session_usable
        unit = codes(bound - 1, n_q, seed=1)
        assert bad.speak(unit).sha256() == good.speak(unit).sha256()
    finally:
        bad.close(), good.close()


@pytest.mark.parametrize("device, match", [("tpu", "expected 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
                                           (3, "expected 'cpu', 'cuda' or 'cuda:N', got 3"),
                                           ("meta", "expected .*, got 'meta'")])
def test_open_model_refuses_a_device_it_cannot_use_naming_it(device, match):
    with pytest.raises(InputError, match=rf"^device: {match}"):
        runtime.open_model("moshi", device=device, depth="reduced")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch has no CUDA")
def test_open_model_refuses_cuda_without_cuda():
    with pytest.raises(InputError, match=r"^device: 'cuda' asked for, but this torch .* sees 0 CUDA device"):
        runtime.open_model("moshi", device="cuda", depth="reduced")
    assert runtime.check_device("cpu") == torch.device("cpu")


@pytest.fixture(scope="module")
def models():
    voice = "workloads/data/voice_prompts/ljspeech_LJ001-0001_24k.wav"
    flow = {"voice_prompt": voice, "prompt_seconds": 2.0, "n_timesteps": 2}
    return {name: runtime.open_model(name, device="cpu", depth="reduced", **kw) for name, kw in
            (("moshi", {}), ("qwen3_omni", {}), ("minicpmo45", flow), ("stepaudio2_mini", flow))}


@pytest.mark.parametrize("name", ["moshi", "qwen3_omni", "minicpmo45", "stepaudio2_mini"])
@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_prepare_names_signatures_and_a_closed_session_is_refused(models, name, mode):
    from duplexcadence.errors import ClosedError
    session = models[name].session(mode)
    try:
        for bad in (5, [5], "window", [None]):
            with pytest.raises(InputError, match=r"^signatures(\[0\])?: expected"):
                session.prepare(bad)
    finally:
        session.close()
    with pytest.raises(ClosedError):
        session.prepare()


def flow_script_signatures(session, seed: int = 0) -> list:
    """Every signature of 6 turns of 1-12 units of random sizes (each turn's last final), walked on the clocks."""
    rng, clock, out = np.random.default_rng(seed), session.clocks(), {}
    for _ in range(6):
        clock.start_turn()
        units = int(rng.integers(1, 13))
        for k in range(units):
            size = int(rng.integers(0, 26)) if k else 25
            try:
                out.update(dict.fromkeys(clock.copy().unit(size, k == units - 1)))
                clock.unit(size, k == units - 1)
            except InputError:                       # a size this clock refuses here (Step-Audio 2's 1-token call)
                continue
    return list(out)


@pytest.mark.parametrize("name", ["minicpmo45", "stepaudio2_mini"])
def test_a_flow_cadence_prepares_every_signature_its_clocks_give_and_refuses_others(models, name):
    session = models[name].session("cadence")
    try:
        real = flow_script_signatures(session)
        assert len({s.step for s in real}) == 2 and len(real) > 10
        assert session.prepare(real)["captures"] == 0            # CPU: checked, nothing captured
        first = {s.step: s for s in reversed(real)}
        flow, second = (first["flow"], first["vocoder"]) if name == "minicpmo45" else (first["dit"], first["hift"])
        length = flow.lengths[0][0]
        bad = [Signature(flow.step, 3), flow._replace(size=10**9), flow._replace(size=0),
               flow._replace(lengths=((length, -1),) + flow.lengths[1:]), flow._replace(step="window"),
               flow._replace(exact=flow.exact + (("zz", 1),)), second._replace(size=1.5),
               flow._replace(lengths=((length, 0),) + flow.lengths[1:]),       # shorter than the voice's P frames
               second._replace(exact=tuple((k, "x") for k, _ in second.exact))]
        bad.append(flow._replace(exact=(("last_chunk", "no"),)) if name == "minicpmo45"
                   else flow._replace(exact=(("n_timesteps", 3),)))
        state = session.clocks()
        for sig in bad:
            with pytest.raises(InputError, match=r"^signatures(\[1\]: .* \(build Signatures with|: expected Signatures of steps|: .* is not a step of this "
                                                 r"session \(e\.g\. Signature)"):
                session.prepare([real[0], sig])
        assert session.clocks() == state
    finally:
        session.close()


@pytest.mark.parametrize("name", ["moshi", "qwen3_omni"])
@pytest.mark.parametrize("size", [1.5, True, 1.0, None, "x", [1]])
def test_a_codec_cadence_refuses_a_signature_whose_size_is_not_an_int_and_nothing_moves(models, name, size):
    session = models[name].session("cadence")
    try:
        session.start_turn()
        good, state = session.signatures(12)[0], session.clocks()
        with pytest.raises(InputError, match=r"^signatures\[1\]: size .*: expected an int >= 0"):
            session.prepare([good, good._replace(size=size)])
        assert session.clocks() == state and session.prepare([good])["captures"] == 0
    finally:
        session.close()


@pytest.mark.parametrize("bad, match", [([[2**63]] * 8, r"code id 9223372036854775808 outside"),
                                        (np.full((8, 1), 2**64 - 1, dtype=np.uint64), r"code id 18446744073709551615"),
                                        (torch.zeros(8, 1, dtype=torch.int64).to_sparse(), r"dense integer tensor"),
                                        (np.array(5), r"got \[\]")])
def test_codes_that_do_not_fit_an_int64_or_a_dense_array_are_named(models, bad, match):
    session = models["moshi"].session("cadence")
    try:
        session.start_turn()
        with pytest.raises(InputError, match=rf"^codes.*{match}"):
            session.speak(bad)
        ref = models["moshi"].session("cadence")
        ref.start_turn()
        unit = codes(12, 8, seed=2)
        assert session.speak(unit).sha256() == ref.speak(unit).sha256()
        ref.close()
    finally:
        session.close()


@pytest.mark.parametrize("kw, match", [({"device": "cpu:1"}, r"^device: expected"), ({"seed": 1.5}, r"^seed: expected"),
                                       ({"seed": -1}, r"^seed: expected")])
def test_open_model_names_a_bad_device_index_or_seed(kw, match):
    with pytest.raises(InputError, match=match):
        runtime.open_model("moshi", depth="reduced", **kw)


def test_open_model_names_the_known_models_for_a_name_that_is_not_one():
    for bad in (["moshi"], None, "mimi"):
        with pytest.raises(InputError, match=r"^name: expected one of \['minicpmo45', 'moshi', 'qwen3_omni', "
                                             r"'stepaudio2_mini'\], got "):
            runtime.open_model(bad, device="cpu", depth="reduced")


@pytest.mark.parametrize("name", ["moshi", "qwen3_omni"])
def test_signatures_take_a_bool_final(models, name):
    session = models[name].session("cadence")
    try:
        with pytest.raises(InputError, match="^final: expected a bool"):
            session.signatures(2, final="x")
    finally:
        session.close()



@pytest.mark.parametrize("name", ["moshi", "qwen3_omni"])
def test_signatures_name_size_and_a_closed_session_says_signatures(models, name):
    session = models[name].session("cadence")
    session.start_turn()
    before = session.clocks()
    for bad, what in ((-1, "-1 (int)"), (True, "True (bool)"), ("3", "'3' (str)")):
        with pytest.raises(InputError, match=r"^size: expected an int in \[0, inf\], got " + re.escape(what)):
            session.signatures(bad)
    if name == "moshi":                                     # the unit region's bound, named by `size`
        with pytest.raises(LimitError, match=r"^size: region 'unit': a step of \+1000000 frames"):
            session.signatures(1_000_000)
        with pytest.raises(InputError, match=r"^size: expected an int in \[1, inf\], got 0 \(int\)"):
            session.signatures(0)
    assert session.clocks() == before
    session.close()
    with pytest.raises(ClosedError, match="^signatures: the session is closed"):
        session.signatures(1)


@pytest.mark.parametrize("name", ["minicpmo45", "stepaudio2_mini"])
def test_signatures_past_a_units_tokens_name_size(models, name):
    session = models[name].session("cadence")
    session.start_turn()
    before = session.clocks()
    try:
        with pytest.raises(InputError, match=r"^size: expected an int in \[0, 25\], got 26 \(int\)$"):
            session.signatures(26)
        assert session.clocks() == before
        assert session.signatures(25) == before.copy().unit(25)
    finally:
        session.close()


def test_signatures_without_an_open_turn_say_signatures_not_speak(models):
    session = models["qwen3_omni"].session("cadence")
    try:
        with pytest.raises(InputError, match=r"^signatures: no open turn \(call start_turn first"):
            session.signatures(2)
    finally:
        session.close()


@pytest.mark.parametrize("name, key, value", [("moshi", "checkpoint", "/nonexistent/mimi.safetensors"),
                                              ("qwen3_omni", "checkpoint", "/nonexistent/dir"),
                                              ("minicpmo45", "voice_prompt", "/nonexistent/voice.wav")])
def test_a_path_option_that_names_nothing_is_a_missing_file_input_error(name, key, value):
    with pytest.raises(MissingFileError, match=rf"^{key}: {value} does not exist$") as info:
        runtime.open_model(name, device="cpu", depth="reduced", **{key: value})
    assert isinstance(info.value, InputError) and isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize("name, mode, good", [("moshi", "cadence", {"cadence_graphs": "unit"}),
                                              ("moshi", "cadence", {"capture": "inline"}),
                                              ("qwen3_omni", "cadence", {"left_context": 30}),
                                              ("qwen3_omni", "stock", {"initial_frames": 2})])
def test_a_misspelled_session_option_is_named_not_ignored(name, mode, good):
    model = runtime.open_model(name, device="cpu", depth="reduced")
    bad = {k[:-1] + k[-1].upper(): v for k, v in good.items()}
    with pytest.raises(InputError, match=rf"^options: \[{list(bad)[0]!r}\] not taken by a {name} {mode!r} session"):
        model.session(mode, **bad)
    model.session(mode, **good).close()


def test_an_option_of_another_mode_is_refused():
    with pytest.raises(InputError, match=r"^options: \['cadence_graphs'\] not taken by a moshi 'stock' session"):
        runtime.open_model("moshi", device="cpu", depth="reduced").session("stock", cadence_graphs="unit")


VOICE = "workloads/data/voice_prompts/ljspeech_LJ001-0001_24k.wav"


@pytest.mark.parametrize("name, kw, match", [
    ("moshi", {"foo": 1}, r"^options: \['foo'\] not taken for moshi \(expected some of \['checkpoint'\]\)"),
    ("moshi", {"dtype": "float16"}, r"^options: \['dtype'\] not taken for moshi"),
    ("stepaudio2_mini", {"voice_prompt": VOICE, "n_timestep": 2}, r"^options: \['n_timestep'\] not taken"),
    ("stepaudio2_mini", {"voice_prompt": VOICE, "variant": "minicpmo45"},
     r"^options: \['variant'\] fixed by the model for stepaudio2_mini"),
    ("moshi", {"seed": 2 ** 64}, r"^seed: expected an int in \[0, 9223372036854775807\]"),
    ("minicpmo45", {"voice_prompt": 123}, r"^voice_prompt: expected a path \(str or os.PathLike\), got 123"),
    ("moshi", {"checkpoint": 123}, r"^checkpoint: expected a path"),
])
def test_open_model_refuses_an_option_it_does_not_take_or_a_bad_seed_or_path(name, kw, match):
    with pytest.raises(InputError, match=match):
        runtime.open_model(name, device="cpu", depth="reduced", **kw)


def test_open_model_takes_a_numpy_int_seed_as_the_same_int():
    a = runtime.open_model("moshi", device="cpu", depth="reduced", seed=np.int64(3))
    b = runtime.open_model("moshi", device="cpu", depth="reduced", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.native.state_dict().values(), b.native.state_dict().values()))


@pytest.mark.parametrize("seconds", [-1, 0, float("nan"), float("inf"), "2", True])
def test_prompt_seconds_that_is_not_a_positive_finite_number_is_named(seconds):
    with pytest.raises(ValueError, match=r"^spec\['prompt_seconds'\]: expected None \(the whole WAV\) or a finite"):
        runtime.open_model("minicpmo45", device="cpu", depth="reduced", voice_prompt=VOICE, prompt_seconds=seconds)


def test_a_voice_prompt_that_is_a_directory_is_called_one():
    with pytest.raises(ValueError, match=r"^voice_prompt: workloads is a directory, expected a 24 kHz WAV file"):
        runtime.open_model("minicpmo45", device="cpu", depth="reduced", voice_prompt="workloads")


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_qwen3_omni_left_context_is_bounded_by_the_model_s_longest_window(models, mode):
    longest = models["qwen3_omni"].native.config.max_position_embeddings     # 8000: C + a 13-frame unit
    models["qwen3_omni"].session(mode, left_context=longest - 13).close()
    for bad in (longest - 12, 10 ** 15):
        with pytest.raises(ValueError, match=rf"^spec\['left_context'\]: expected an int in \[1, {longest - 13}\], "
                                             rf"got {bad}"):
            models["qwen3_omni"].session(mode, left_context=bad)


@pytest.mark.parametrize("name", ["moshi", "qwen3_omni", "minicpmo45", "stepaudio2_mini"])
@pytest.mark.parametrize("kw", [{"graphs": 0}, {"graphs": ""}, {"graphs": "yes"}, {"strict": "yes"}])
def test_graphs_and_strict_take_a_bool_not_a_truthy_value(models, name, kw):
    if "strict" in kw and name in ("moshi", "qwen3_omni"):
        pytest.skip("strict is a flow_hift cadence option only")
    with pytest.raises(ValueError, match=rf"^spec\[{list(kw)[0]!r}\]: expected .*True or False, got "):
        models[name].session("cadence", **kw)
    models[name].session("cadence", graphs=False).close()


@pytest.mark.parametrize("name, kw, match", [
    ("moshi", {"arena_backend": "malloc"}, r"^arena_backend: expected 'auto', 'cpu', 'prealloc' or 'vmm', got 'malloc'"),
    ("moshi", {"arena_backend": "vmm"}, r"^arena_backend: 'vmm' does not match device cpu"),
    ("moshi", {"capture": "later"}, r"^spec\['capture'\]: expected one of"),
    ("moshi", {"graphs": "yes"}, r"^spec\['graphs'\]: expected None \(graphs on CUDA\), True or False, got 'yes'"),
    ("qwen3_omni", {"arena_backend": "prealloc"}, r"^arena_backend: 'prealloc' does not match device cpu"),
    ("qwen3_omni", {"capture": "later"}, r"^spec\['capture'\]: expected 'ahead' or 'inline', got 'later'"),
    ("qwen3_omni", {"left_context": 0}, r"^spec\['left_context'\]: expected an int in \[1, "),
    ("minicpmo45", {"arena_backend": "malloc"}, r"^arena_backend: expected"),
    ("minicpmo45", {"noise": "pink"}, r"^noise: expected one of"),
    ("minicpmo45", {"capture": "later"}, r"^capture: expected 'ahead' or 'inline', got 'later'"),
    ("minicpmo45", {"strict": 1}, r"^spec\['strict'\]: expected True or False, got 1"),
    ("stepaudio2_mini", {"arena_backend": "malloc"}, r"^arena_backend: expected"),
    ("stepaudio2_mini", {"graphs": 0}, r"^spec\['graphs'\]: expected None"),
])
def test_a_bad_session_option_value_is_an_input_error_naming_it(models, name, kw, match):
    """The value of an option a cadence session takes, refused with the option's name before anything is
    allocated; the model's next session opens as before."""
    with pytest.raises(InputError, match=match):
        models[name].session("cadence", **kw)
    models[name].session("cadence").close()


@pytest.mark.parametrize("name", ["moshi", "qwen3_omni", "minicpmo45", "stepaudio2_mini"])
def test_an_unknown_mode_is_an_input_error_naming_the_modes(models, name):
    with pytest.raises(InputError, match=r"^mode: expected one of \("):
        models[name].session("fast")


@pytest.mark.parametrize("kw, match", [
    ({}, r"voice_prompt is required"),
    ({"voice_prompt": VOICE, "n_timesteps": 0}, r"^n_timesteps: expected an int in \[1, 16\]"),
    ({"voice_prompt": VOICE, "prompt_seconds": -1}, r"^spec\['prompt_seconds'\]: expected None"),
])
def test_open_model_refuses_a_missing_voice_or_a_bad_step_count_as_input_errors(kw, match):
    with pytest.raises(InputError, match=match):
        runtime.open_model("minicpmo45", device="cpu", depth="reduced", **kw)


@pytest.mark.parametrize("name, bad, good", [("moshi", 14, 2), ("qwen3_omni", 14, 2), ("minicpmo45", 26, 25),
                                             ("stepaudio2_mini", 26, 25)])
def test_clocks_compare_by_value_and_a_refused_unit_leaves_them_equal(models, name, bad, good):
    """Two copies of a session's clocks are equal until one advances; a unit its clocks refuse leaves them equal
    to a copy taken before; repr names every host clock."""
    session = models[name].session("cadence")
    try:
        session.start_turn()
        before = session.clocks()
        assert before == session.clocks() and before is not session.clocks() and repr(before) == repr(session.clocks())
        with pytest.raises(InputError):
            before.copy().unit(bad)
        with pytest.raises(InputError):
            session.signatures(bad)
        assert session.clocks() == before
        after = before.copy()
        after.unit(good)
        assert after != before and after != "clocks" and type(before).__name__ in repr(before)
        assert all(f"{k}=" in repr(after) for k in after.host())
        with pytest.raises(TypeError):
            hash(before)
    finally:
        session.close()


class BadRepr:
    """A caller's object whose __repr__ raises: an error message quoting it must still be the InputError."""
    def __repr__(self):
        raise RuntimeError("repr")


@pytest.mark.parametrize("call, name", [
    (lambda m: runtime.open_model(BadRepr()), "name"),
    (lambda m: runtime.open_model("moshi", device=BadRepr(), depth="reduced"), "device"),
    (lambda m: m["moshi"].session(BadRepr()), "mode"),
    (lambda m: m["qwen3_omni"].session(BadRepr()), "mode"),
    (lambda m: m["minicpmo45"].session("cadence", capture=BadRepr()), "capture"),
    (lambda m: m["minicpmo45"].session("cadence", noise=BadRepr()), "noise"),
    (lambda m: m["stepaudio2_mini"].session("cadence", graphs=BadRepr()), "graphs"),
    (lambda m: m["moshi"].session("cadence", arena_backend=BadRepr()), "arena_backend"),
])
def test_an_argument_whose_repr_raises_is_still_named_in_an_input_error(models, call, name):
    with pytest.raises(InputError, match=rf"^(spec\['{name}'\]|{name}): expected .*got <BadRepr>"):
        call(models)
