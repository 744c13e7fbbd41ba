"""duplexcadence.dropin.mimi: moshi's own server loop (moshi==0.2.13 server.py, `ServerState`) run once on the
stock MimiModel and once on `wrap(mimi)`, every decoded frame compared byte for byte.

The server module is the installed file, executed without its last two lines (`with torch.no_grad(): main()`,
which parse sys.argv and download weights at import): the test checks that those are exactly the lines left
out. What it needs from outside is faked: the websocket (aiohttp), the Opus codec (sphn: PCM passes as float32
bytes, every `append_pcm` is recorded), and the language model (LMGen: seeded random tokens [1, 9, 1], none for
its first two steps, as the real one while its delays fill). ServerState.__init__ (`mimi.streaming_forever(1)`),
`warmup()`, `handle_chat` (`mimi.reset_streaming()` per connection) and `recv_loop` / `decode_and_send`
(`mimi.decode(tokens[:, 1:])` then `.cpu()`) are moshi's. Two builds of the same seed: one streams stock, the
other through the drop-in. Reduced depth on CPU; the CUDA class runs the released depth.
"""
from __future__ import annotations

import asyncio
import importlib.machinery
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import moshi
from duplexcadence.adapters import mimi as adapter
from duplexcadence.adapters.mimi.cadence import CadenceSession
from duplexcadence.dropin import mimi as dropin
from duplexcadence.errors import InputError
from torch_threads import torch_threads

FRAMES_PER_CONNECTION = 7          # the first 2 LM steps give no tokens: 5 decodes per connection
SERVER_TAIL = "\n\nwith torch.no_grad():\n    main()\n"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


class FakeWebSocket:
    """aiohttp.web.WebSocketResponse as handle_chat uses it; `inbox`: the messages every connection receives."""
    inbox: list = []

    def __init__(self):
        self.messages, self.sent = list(FakeWebSocket.inbox), []

    async def prepare(self, request):
        pass

    async def send_bytes(self, data):
        self.sent.append(data)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.messages:
            raise StopAsyncIteration
        return self.messages.pop(0)


class FakeOpusWriter:
    """sphn.OpusStreamWriter: records every PCM frame the server sends (a copy)."""
    made: list = []

    def __init__(self, sample_rate):
        self.pcm = []
        FakeOpusWriter.made.append(self)

    def append_pcm(self, pcm):
        self.pcm.append(np.array(pcm, copy=True))
        return b""


class FakeOpusReader:
    def __init__(self, sample_rate):
        pass

    def append_bytes(self, data):
        return np.frombuffer(data, dtype=np.float32).copy()


class FakeLMGen:
    """moshi's LMGen as the server drives it: `step(codes [1, 8, 1])` -> None for its first two steps after a
    reset, then int64 [1, 9, 1] (text token 0, then 8 audio codes) from one seeded generator that runs on across
    connections; `lm_model.dep_q` 8."""

    def __init__(self, *args, device="cpu", **kwargs):
        self.gen, self.device, self.steps = torch.Generator().manual_seed(7), device, 0
        self.lm_model = types.SimpleNamespace(dep_q=adapter.N_Q)

    def streaming_forever(self, batch_size):
        pass

    def reset_streaming(self):
        self.steps = 0

    def step(self, codes):
        assert tuple(codes.shape) == (1, adapter.N_Q, 1)
        self.steps += 1
        if self.steps <= 2:
            return None
        tokens = torch.randint(0, adapter.schedule.CARDINALITY, (1, adapter.N_Q + 1, 1), generator=self.gen)
        tokens[0, 0, 0] = 0
        return tokens.to(self.device)


def load_server(monkeypatch):
    """moshi/server.py as installed, less its import-time `main()`, with the fakes in place of aiohttp / sphn."""
    web = types.SimpleNamespace(WebSocketResponse=FakeWebSocket)
    fakes = {"aiohttp": types.ModuleType("aiohttp"), "aiohttp.web": types.ModuleType("aiohttp.web"),
             "sphn": types.ModuleType("sphn")}
    fakes["aiohttp"].web, fakes["aiohttp"].WSMsgType = fakes["aiohttp.web"], types.SimpleNamespace(
        ERROR=1, CLOSED=2, BINARY=3)
    vars(fakes["aiohttp.web"]).update(vars(web))
    fakes["sphn"].OpusStreamWriter, fakes["sphn"].OpusStreamReader = FakeOpusWriter, FakeOpusReader
    for name, module in fakes.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    source = Path(moshi.__file__).parent / "server.py"
    text = source.read_text()
    assert text.endswith(SERVER_TAIL), "moshi/server.py no longer ends in `main()` under no_grad: re-read it"
    server = types.ModuleType("moshi.server")
    server.__file__, server.__package__ = str(source), "moshi"
    monkeypatch.setitem(sys.modules, "moshi.server", server)      # dataclasses look their module up there
    exec(compile(text[:-len(SERVER_TAIL)], str(source), "exec"), vars(server))
    server.LMGen, server.get_condition_tensors = FakeLMGen, lambda *args, **kwargs: None
    return server


def serve(server, mimi, device, connections: int = 2) -> list[np.ndarray]:
    """ServerState(mimi) (its __init__ streams forever), its warm-up, then `connections` chats of
    FRAMES_PER_CONNECTION frames of seeded noise each, as the module's `main()` runs them (under no_grad).
    Returns every PCM frame sent, in order."""
    pcm = np.random.default_rng(3).standard_normal(1920 * FRAMES_PER_CONNECTION).astype(np.float32)
    FakeWebSocket.inbox = [types.SimpleNamespace(type=3, data=b"\x01" + pcm.tobytes())]
    FakeOpusWriter.made = []
    with torch.no_grad():
        state = server.ServerState("moshi", mimi, None, None, 1.0, device)
        state.lm_gen = FakeLMGen(device=device)
        state.warmup()
        for _ in range(connections):
            asyncio.run(state.handle_chat(None))
    return [frame for writer in FakeOpusWriter.made for frame in writer.pcm]


def assert_frames_equal(stock: list, cadence: list) -> None:
    assert len(stock) == len(cadence) > 0
    for k, (a, b) in enumerate(zip(stock, cadence)):
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape == (1920,), k
        assert a.tobytes() == b.tobytes(), f"frame {k}: max |diff| {np.abs(a - b).max()}"
    assert np.std(np.concatenate(stock)) > 1e-3                  # audio, not silence


@pytest.fixture()
def server(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)     # warmup() ends in one
    return load_server(monkeypatch)


def build(device="cpu", depth="reduced"):
    return adapter.build_model({}, device=device, depth=depth, seed=0)


def test_moshi_server_loop_through_the_drop_in_equals_stock(server):
    stock = serve(server, build(), "cpu")
    mimi = dropin.wrap(build())
    cadence = serve(server, mimi, "cpu")
    assert_frames_equal(stock, cadence)
    assert len(stock) == 2 * (FRAMES_PER_CONNECTION - 2)
    # every decode of the last connection went through the one cadence session reset_streaming opened for it
    assert isinstance(mimi.session, CadenceSession) and mimi.session.stats().units == FRAMES_PER_CONNECTION - 2


def test_streaming_context_opens_and_ends_one_session():
    mimi = dropin.wrap(build())
    codes = torch.randint(0, 2048, (1, adapter.N_Q, 1), generator=torch.Generator().manual_seed(0))
    with mimi.streaming(1):
        session = mimi.session
        assert isinstance(session, CadenceSession) and mimi.native.is_streaming
        mimi.decode(codes)
        assert session.stats().units == 1
    assert mimi.session is None and session.closed and not mimi.native.is_streaming
    assert all(s is None for s in mimi.native.get_streaming_state().values())


def test_decode_outside_streaming_is_the_stock_call():
    mimi, stock = dropin.wrap(build()), build()
    codes = torch.randint(0, 2048, (1, adapter.N_Q, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(mimi.decode(codes), stock.decode(codes))
    assert mimi.session is None
    assert mimi.sample_rate == stock.sample_rate and mimi.frame_rate == stock.frame_rate   # the model's own


@pytest.mark.parametrize("shape", [(2, 8, 1), (1, 8, 2), (1, 7, 1), (8, 1)])
def test_another_shape_is_refused_and_the_stream_goes_on(shape):
    mimi, stock = dropin.wrap(build()), build()
    gen = torch.Generator().manual_seed(2)
    frames = [torch.randint(0, 2048, (1, adapter.N_Q, 1), generator=gen) for _ in range(2)]
    mimi.streaming_forever(1)
    stock.streaming_forever(1)
    with torch.no_grad():
        first = mimi.decode(frames[0])
        with pytest.raises(InputError, match=r"codes: expected \[1, 8, 1\]"):
            mimi.decode(torch.zeros(shape, dtype=torch.int64))
        assert torch.equal(first, stock.decode(frames[0])) and torch.equal(mimi.decode(frames[1]),
                                                                           stock.decode(frames[1]))


def test_batch_other_than_one_is_refused():
    mimi = dropin.wrap(build())
    with pytest.raises(InputError, match="batch_size"):
        mimi.streaming(2)
    assert mimi.session is None and not mimi.native.is_streaming
    mimi.streaming_forever(1)
    with pytest.raises(InputError, match="reset_mask"):
        mimi.reset_streaming(torch.ones(1, dtype=torch.bool))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_released_server_loop_replays_and_equals_stock_eager(server):
    """Released depth on the GPU: stock with moshi's own CUDA graphs and compile off (the eager reference, as
    the adapter's "stock" mode), the drop-in's session replaying the frame graph its `prepare` captured."""
    from moshi.utils import compile as mcompile
    with mcompile.no_cuda_graph(), mcompile.no_compile():
        stock = serve(server, build("cuda", "released"), "cuda")
        mimi = dropin.wrap(build("cuda", "released"))
        cadence = serve(server, mimi, "cuda")
    assert_frames_equal(stock, cadence)
    stats = mimi.session.stats()
    assert stats.units == FRAMES_PER_CONNECTION - 2 and stats.replays == stats.units
    assert stats.eager_fallbacks == 0 and stats.capture_failures == 0


def test_wrap_refuses_another_model_and_an_option_the_cadence_session_does_not_take():
    from duplexcadence.adapters import code2wav
    with pytest.raises(InputError, match=r"^native: expected a moshi MimiModel or open_model\('moshi'\), got "
                                         r"Qwen3OmniMoeCode2Wav"):
        dropin.wrap(code2wav.build_model({}, device="cpu", depth="reduced", seed=0))
    with pytest.raises(InputError, match=r"^options: \['bogus'\] not taken by the drop-in's cadence session"):
        dropin.wrap(build(), bogus=1)
    assert dropin.wrap(build(), cadence_graphs="unit").options == {"cadence_graphs": "unit"}
