"""duplexcadence.rng: a build leaves the default generators as it found them and waits for a session's draw;
a session's draw refuses to run beside a build (CPU, reduced depth)."""
from __future__ import annotations

import threading

import pytest
import torch

import duplexcadence as dc
from duplexcadence import rng
from duplexcadence.errors import ConcurrencyError
from threaded import Held


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
    gen, builder = OwnGenerator("cpu", 0), Held(lambda: rng.LOCK)     # what a model build holds
    assert builder.entered.wait(10)
    with pytest.raises(ConcurrencyError, match="a model being built"):
        with gen.use():
            pass
    builder.let_go()
    builder.thread.join(10)
    with gen.use():                                     # free again
        torch.rand(1)


def test_a_step_audio_2_draw_waits_for_a_capture_and_holds_the_next_one_back(monkeypatch):
    """Every capture registers the device's default generator, so a session's draw must not run beside one:
    the draw's body starts only once the capture in progress has ended, and a capture asked for while the body
    runs starts only after it (the gate logic needs no device; the CUDA test below shows the failure it prevents)."""
    from duplexcadence import gate
    from duplexcadence.adapters.flow_hift.stock import OwnGenerator
    monkeypatch.setattr(gate.GATE, "mode", "concurrent")
    gen, log = OwnGenerator("cpu", 0), []
    capturing, end_capture, drawing, end_draw, second = (threading.Event() for _ in range(5))

    def capture(tag, started, finish):
        with gate.GATE.capture():
            log.append(f"{tag} starts")
            started.set()
            if finish is not None:
                finish.wait(10)
            log.append(f"{tag} ends")

    def draw():
        with gen.use():
            log.append("draw starts")
            drawing.set()
            end_draw.wait(10)
            torch.rand(1)
            log.append("draw ends")

    a = threading.Thread(target=capture, args=("capture 1", capturing, end_capture), daemon=True)
    a.start()
    assert capturing.wait(10)
    b = threading.Thread(target=draw, daemon=True)
    b.start()
    assert not drawing.wait(0.2)                        # the draw waits for the capture in progress
    end_capture.set()
    assert drawing.wait(10)
    c = threading.Thread(target=capture, args=("capture 2", second, None), daemon=True)
    c.start()
    assert not second.wait(0.2)                         # the next capture waits for the draw's body
    end_draw.set()
    for t in (a, b, c):
        t.join(10)
    assert log == ["capture 1 starts", "capture 1 ends", "draw starts", "draw ends", "capture 2 starts",
                   "capture 2 ends"]
    assert gate.GATE.counts() == {"work": 0, "device_wide": 0, "waiting": 0, "capturing": False, "alone": False}
    assert not rng.LOCK._is_owned()                     # the generator lock is free again


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a capture registers the default generator")
def test_cuda_a_step_audio_2_draw_beside_another_threads_capture_waits_and_keeps_its_bytes(monkeypatch):
    """While the main thread records a graph that draws nothing (GraphCache.capture, concurrent gate), a worker
    thread's Step-Audio 2 draw (OwnGenerator.use: torch.rand and randn_like on the device, as the HiFT's SineGen2)
    neither fails ("Offset increment outside graph capture encountered unexpectedly") nor runs inside the capture,
    and draws what it draws with no capture anywhere."""
    from duplexcadence import gate, graphs
    from duplexcadence.adapters.flow_hift.stock import OwnGenerator
    monkeypatch.setattr(gate.GATE, "mode", "concurrent")
    dev = torch.device("cuda")

    def draws(gen):
        with gen.use():
            x = torch.rand(64, device=dev)
            return torch.cat([x, torch.randn_like(x)]).cpu()

    expected = draws(OwnGenerator(dev, 5))
    worker_gen, got, errors, asked = OwnGenerator(dev, 5), [], [], threading.Event()

    def worker():
        try:
            asked.set()
            got.append(draws(worker_gen))
        except Exception as exc:                         # noqa: BLE001 - asserted below
            errors.append(exc)

    cache = graphs.GraphCache(dev, enabled=True, inline=False)
    a = torch.ones(256, 256, device=dev)
    aa = a @ a
    t = threading.Thread(target=worker, daemon=True)

    def step():
        t.start()
        assert asked.wait(10)
        t.join(0.5)                                      # the draw waits while this capture records
        assert t.is_alive() and not got and not errors
        return a @ a

    assert cache.capture(("beside a draw",), step)
    t.join(30)
    assert errors == [] and len(got) == 1 and torch.equal(got[0], expected)
    assert torch.equal(cache.run(("beside a draw",), step), aa)
    assert cache.stats.capture_failures == 0, cache.stats.failures
    cache.drop()
