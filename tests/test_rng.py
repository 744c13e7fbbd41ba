"""duplexcadence.rng: a build leaves the default generators as it found them and waits for a session's draw;
a session's draw refuses to run beside a build (CPU, reduced depth)."""
from __future__ import annotations

import threading

import pytest
import torch

import duplexcadence as dc
from duplexcadence import rng
from duplexcadence.errors import ConcurrencyError


def test_opening_a_model_leaves_the_default_generator_as_it_was():
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    expected = torch.rand(3)
    torch.set_rng_state(before)
    dc.open_model("moshi", device="cpu", depth="reduced")
    assert torch.equal(torch.get_rng_state(), before) and torch.equal(torch.rand(3), expected)


def test_a_build_waits_for_the_generator_and_gives_the_weights_it_gives_alone():
    alone = dc.open_model("moshi", device="cpu", depth="reduced", seed=3)
    want = {k: v.clone() for k, v in alone.native.state_dict().items()}
    built, started = [], threading.Event()

    def build():
        started.set()
        built.append(dc.open_model("moshi", device="cpu", depth="reduced", seed=3))

    with rng.LOCK:                                      # what a Step-Audio 2 session's draw holds
        t = threading.Thread(target=build, daemon=True)
        t.start()
        assert started.wait(10)
        torch.manual_seed(99)                           # the holder's own use of the generator
        t.join(0.5)
        assert t.is_alive() and not built               # the build waits
    t.join(120)
    got = built[0].native.state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())


def test_a_step_audio_2_draw_beside_a_build_is_refused():
    from duplexcadence.adapters.flow_hift.stock import OwnGenerator
    gen, held, done = OwnGenerator("cpu", 0), threading.Event(), threading.Event()

    def builder():
        with rng.LOCK:
            held.set()
            done.wait(10)

    t = threading.Thread(target=builder, daemon=True)
    t.start()
    assert held.wait(10)
    with pytest.raises(ConcurrencyError, match="a model being built"):
        with gen.use():
            pass
    done.set()
    t.join(10)
    with gen.use():                                     # free again
        torch.rand(1)
