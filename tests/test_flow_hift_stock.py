"""flow_hift.stock: one live stock session per model instance, the stock limits checked before anything runs in
both modes, and Step-Audio 2's generators: every session draws from its own, opening or speaking changes no
global state, and sessions interleaved on one thread give the bytes each gives alone."""
from __future__ import annotations

import dataclasses
import os
import threading

import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from reduced_flow_hift import VOICES, model, reduced_model, token_maker  # noqa: E402, F401  (model: a fixture)
from torch_threads import two_threads  # noqa: E402, F401  (autouse: this module's tests at two intra-op threads)
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.flow_hift.stock import OwnGenerator  # noqa: E402
from duplexcadence.clocks import ClockError  # noqa: E402
from duplexcadence.errors import ConcurrencyError  # noqa: E402

tokens_for = token_maker(3000)


def test_a_second_live_stock_session_is_refused_until_the_first_closes(model):
    """Upstream returns the CFM's module buffers as the stream cache: two stock sessions on one instance would
    overwrite each other, so the second is refused while the first is open (or referenced); cadence sessions are
    not affected."""
    first = fh.new_session(model, "stock")
    with pytest.raises(ConcurrencyError, match="flow_matching.py"):
        fh.new_session(model, "stock")
    fh.new_session(model, "cadence").close()
    first.close()
    second = fh.new_session(model, "stock")
    del second                                           # dropped without close: not live any more
    fh.new_session(model, "stock").close()


def test_a_prompt_past_the_dit_buffers_is_one_limit_error_in_both_modes(model, monkeypatch):
    """With the stock DiT buffers' frame axis cut to 200 (what stock_limits reads), the 2 s voice (P = 100) would
    reach P + 150 (or + 154): both modes refuse the session with the same ClockError before anything runs;
    control: the stock code itself fails with a raw shape error on the call that crosses the buffer."""
    cfm = model.t2w.flow.decoder
    for mod, axis in ((cfm, 4), (cfm.estimator, 3)):
        buf = mod._buffers["att_cache_buffer"]
        monkeypatch.setitem(mod._buffers, "att_cache_buffer", buf.narrow(axis, 0, 200).clone())
    messages = set()
    for mode in fh.MODES:
        with pytest.raises(ClockError, match=r"voice prompt of 100 mel frames.*DiT cache buffers.*200") as err:
            fh.new_session(model, mode)
        assert err.value.session_usable is False
        messages.add(str(err.value))
    assert len(messages) == 1
    t2w, key = model.t2w, model.prompt.key
    with pytest.raises(RuntimeError):
        t2w.set_stream_cache(key)
        for u in range(3):
            if model.variant == "minicpmo45":
                t2w.stream(tokens_for(u, 28))
            else:
                t2w.stream(tokens_for(u, 28), key)


def test_a_real_18_s_prompt_is_one_limit_error_in_both_modes(tmp_path):
    """An 18 s voice (P = 900 mel frames) would make the DiT caches reach 1050 frames, past the stock 1000-frame
    buffers (stock failed with a raw shape error on its third call): both modes refuse the session with the
    same ClockError naming the longest prompt the model takes (850 frames, 17 s)."""
    import numpy as np
    import soundfile as sf
    audio, rate = sf.read(str(VOICES["minicpmo45"]), dtype="float32")
    long = tmp_path / "long.wav"
    sf.write(str(long), np.tile(audio, 3)[: 18 * rate], rate)
    m = fh.build_model({"n_timesteps": 2, "voice_prompt": str(long), "prompt_seconds": None}, depth="reduced")
    assert m.prompt.mel_frames == 900
    for mode in fh.MODES:
        with pytest.raises(ClockError, match=r"900 mel frames.*1050.*1000.*at most 850 frames \(17.00 s\)"):
            fh.new_session(m, mode)


def run(session, units):
    session.start_turn()
    return [session.speak(tokens_for(u, 25)).sha256() for u in range(units)]


def test_stepaudio2_sessions_draw_from_their_own_generators():
    """Opening and speaking leave the process's generators as they were; two sessions with other seeds interleaved
    on one thread give exactly the bytes each gives alone (a stock and a cadence session, and two cadence
    sessions); the same seed gives the same bytes."""
    m = reduced_model("stepaudio2")
    other = dataclasses.replace(m, seed=7)
    global_before = torch.get_rng_state()
    alone = {}
    for name, (mdl, mode) in {"stock0": (m, "stock"), "cad0": (m, "cadence"), "cad7": (other, "cadence")}.items():
        with fh.new_session(mdl, mode) as s:
            alone[name] = run(s, 3)
    assert alone["stock0"] == alone["cad0"] != alone["cad7"]
    assert torch.equal(torch.get_rng_state(), global_before)
    for pair in (("stock0", "cad7"), ("cad0", "cad7")):
        sessions = {"stock0": lambda: fh.new_session(m, "stock"), "cad0": lambda: fh.new_session(m, "cadence"),
                    "cad7": lambda: fh.new_session(other, "cadence")}
        a, b = sessions[pair[0]](), sessions[pair[1]]()
        with a, b:
            a.start_turn()
            b.start_turn()
            got = {pair[0]: [], pair[1]: []}
            for u in range(3):
                for name, s in zip(pair, (a, b)):
                    got[name].append(s.speak(tokens_for(u, 25)).sha256())
        assert got == {k: alone[k] for k in pair}
    assert torch.equal(torch.get_rng_state(), global_before)


def test_own_generator_refuses_a_second_thread_and_restores_the_default():
    """While one thread draws through a session's generator, another thread's session is refused (the default
    generator is the process's); the default generator's state is back after every use."""
    gen, second = OwnGenerator("cpu", 5), OwnGenerator("cpu", 6)
    before = torch.get_rng_state()
    inside, leave, errors = threading.Event(), threading.Event(), []

    def hold():
        with gen.use():
            torch.rand(3)
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    inside.wait(10)
    try:
        with second.use():
            pass
    except ConcurrencyError as exc:
        errors.append(exc)
    leave.set()
    t.join()
    assert errors and torch.equal(torch.get_rng_state(), before)
    want = torch.Generator().manual_seed(5)
    torch.rand(3, generator=want)
    assert torch.equal(gen.state, want.get_state())
