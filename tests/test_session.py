"""duplexcadence.session: Capabilities, SessionStats, UnitOutput and its hashes, the stock int16 quantisation,
host copies, check_final, and the Session / ClockState base classes (with a minimal fake session)."""
from __future__ import annotations

import dataclasses
import hashlib
import struct

import numpy as np
import pytest
import torch

from duplexcadence.clocks import signature
from duplexcadence.errors import ClosedError, InputError
from duplexcadence.graphs import GraphCache
from duplexcadence.session import (Capabilities, ClockState, Session, SessionStats, UnitOutput, check_final,
                                   host_waveform, to_pcm16, unit_output)


# --- Capabilities --------------------------------------------------------------------------------
def test_capabilities_accept_the_declared_kinds_and_are_frozen():
    caps = Capabilities(turn_state="carried", concurrent=False, graphs=True, payload="tokens", max_payload=28)
    assert caps.turn_state == "carried" and caps.max_payload == 28
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.concurrent = True
    for turn_state in ("reset", "carried", "stream"):
        Capabilities(turn_state, True, False, "frames", 16)


@pytest.mark.parametrize("kw, message", [
    pytest.param({"turn_state": "keep"}, r"turn_state: expected one of \('reset', 'carried', 'stream'\), got 'keep'",
                 id="turn-state"),
    pytest.param({"payload": "codes"}, r"payload: expected one of \('tokens', 'frames'\), got 'codes'", id="payload"),
])
def test_capabilities_refuse_an_unknown_kind(kw, message):
    args = {"turn_state": "reset", "concurrent": True, "graphs": True, "payload": "tokens", "max_payload": 28, **kw}
    with pytest.raises(ValueError, match=message):
        Capabilities(**args)


# --- SessionStats --------------------------------------------------------------------------------
class _FakeGraphStats:
    captures, replays, eager_runs, warmup_runs, eager_fallbacks, capture_failures = 3, 40, 2, 1, 5, 4

    def __init__(self, failures):
        self.failures = failures


class _FakeGraphs:
    def __init__(self, failures=()):
        self.stats = _FakeGraphStats(list(failures))
        self.entries = {"a": 1, "b": 2, "c": 3}
        self.pool_bytes = 6 << 20


class _FakeArena:
    bytes_reserved, bytes_mapped = 10 << 20, 4 << 20


def test_session_stats_of_reads_the_graph_cache_and_the_arena():
    failures = ["x" * 400, "second", "third", "fourth"]
    stats = SessionStats.of(units=7, graphs=_FakeGraphs(failures), arena=_FakeArena(), voice="f1")
    assert (stats.units, stats.captures, stats.replays, stats.eager_runs, stats.warmup_runs,
            stats.eager_fallbacks, stats.capture_failures) == (7, 3, 40, 2, 1, 5, 4)
    assert stats.graphs == 3 and stats.graph_bytes == 6 << 20
    assert stats.arena_bytes_reserved == 10 << 20 and stats.arena_bytes_mapped == 4 << 20
    assert stats.detail == {"voice": "f1", "capture_failure_messages": ["x" * 300, "second", "third"]}
    assert stats.to_dict()["detail"]["voice"] == "f1" and stats.to_dict()["replays"] == 40


def test_session_stats_of_nothing_is_zeros_and_details_are_not_shared():
    a = SessionStats.of(units=2, mode="stock")
    b = SessionStats.of(units=0)
    assert a.to_dict() == {"units": 2, "captures": 0, "replays": 0, "eager_runs": 0, "warmup_runs": 0,
                           "eager_fallbacks": 0, "capture_failures": 0, "graphs": 0, "graph_bytes": 0,
                           "arena_bytes_reserved": 0, "arena_bytes_mapped": 0, "detail": {"mode": "stock"}}
    assert b.detail == {} and "capture_failure_messages" not in SessionStats.of(units=1, graphs=_FakeGraphs()).detail


def test_session_stats_of_a_real_cpu_graph_cache():
    cache = GraphCache("cpu")
    for size in (28, 28, 12):
        cache.run(signature("flow", size), lambda: None)
    stats = SessionStats.of(units=2, graphs=cache)
    assert stats.eager_runs == 3 and stats.captures == stats.replays == stats.graphs == stats.graph_bytes == 0


# --- UnitOutput, to_pcm16, host_waveform, unit_output ---------------------------------------------
def test_unit_output_sha256_is_of_the_little_endian_bytes():
    out = UnitOutput(np.array([0.0, 1.0, -2.5], np.float32), np.array([1, -2, 32767], np.int16))
    f32 = hashlib.sha256(struct.pack("<3f", 0.0, 1.0, -2.5)).hexdigest()
    i16 = hashlib.sha256(struct.pack("<3h", 1, -2, 32767)).hexdigest()
    assert out.sha256() == (f32, i16) and out.samples == 3
    big_endian = UnitOutput(np.array([0.0, 1.0, -2.5], ">f4"), np.array([1, -2, 32767], ">i2"))
    assert big_endian.sha256() == (f32, i16)
    assert UnitOutput(np.zeros(0, np.float32), np.zeros(0, np.int16)).sha256() == (
        hashlib.sha256(b"").hexdigest(), hashlib.sha256(b"").hexdigest())


def test_to_pcm16_clips_scales_by_32767_and_truncates_toward_zero():
    wave = np.array([-2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0 ** -15, 0.9999], np.float32)
    # by hand: clip to [-1, 1], x 32767, drop the fraction: -32767 (not -32768), 16383.5 -> 16383,
    # 2^-15 x 32767 = 0.99997 -> 0 (truncated, not rounded), 0.9999 x 32767 = 32763.7 -> 32763
    expected = [-32767, -32767, -16383, -8191, 0, 8191, 16383, 32767, 32767, 0, 32763]
    pcm = to_pcm16(wave)
    assert pcm.dtype == np.dtype("<i2") and pcm.tolist() == expected
    assert to_pcm16(np.array([0.5])).tolist() == [16383]


def test_host_waveform_is_a_flat_float32_copy():
    src = torch.tensor([[[0.5, -0.25, 1.0, 2.0]]])
    out = host_waveform(src)
    assert out.dtype == np.float32 and out.shape == (4,)
    src.fill_(9.0)
    assert out.tolist() == [0.5, -0.25, 1.0, 2.0]
    doubles = torch.tensor([0.1, 0.2], dtype=torch.float64, requires_grad=True)
    assert host_waveform(doubles).dtype == np.float32
    assert host_waveform(doubles).tolist() == np.array([0.1, 0.2], np.float32).tolist()


def test_unit_output_concatenates_the_calls_and_quantises():
    out = unit_output([np.array([0.5, -0.5], np.float32), np.array([[1.0]]), np.zeros(0, np.float32)], calls=3)
    assert out.waveform.dtype == np.float32 and out.waveform.tolist() == [0.5, -0.5, 1.0]
    assert out.pcm16.tolist() == [16383, -16383, 32767] and out.info == {"calls": 3}
    empty = unit_output([])
    assert empty.samples == 0 and empty.waveform.dtype == np.float32 and empty.pcm16.dtype == np.int16
    assert unit_output(w for w in [np.array([0.25], np.float32)]).pcm16.tolist() == [8191]


def test_check_final_takes_bools_only():
    assert check_final(True) is True and check_final(False) is False
    assert check_final(np.bool_(True)) is True
    for bad, shown in (("no", "'no' (str)"), (1, "1 (int)"), (0, "0 (int)"), (None, "None (NoneType)")):
        with pytest.raises(InputError) as info:
            check_final(bad)
        assert str(info.value) == f"final: expected a bool, got {shown}"


# --- Session and ClockState base classes --------------------------------------------------------
class _Clocks(ClockState):
    def __init__(self):
        self.mel = 300

    def start_turn(self):
        self.mel = 300

    def unit(self, size, final=False):
        sig = signature("flow", size, {"conformer_att": self.mel}, last_chunk=final)
        self.mel = min(self.mel + 2 * size, 400)
        return [sig]


class _Session(Session):
    capabilities = Capabilities("reset", True, False, "tokens", 28)

    def __init__(self):
        self._clocks = _Clocks()

    def start_turn(self):
        self.check_open("start_turn")
        self._clocks.start_turn()

    def speak(self, payload, *, final=False):
        self.check_open("speak")
        final = check_final(final)
        self._clocks.unit(len(payload), final)
        return unit_output([np.zeros(len(payload), np.float32)])

    def clocks(self):
        self.check_open("clocks")
        return self._clocks.copy()

    def state(self):
        return {"mel": self._clocks.mel}

    def stats(self):
        return SessionStats.of(units=0)


def test_a_session_without_every_abstract_method_cannot_be_made():
    class Partial(Session):
        capabilities = Capabilities("reset", True, False, "tokens", 28)

        def start_turn(self):
            pass

        def speak(self, payload, *, final=False):
            return unit_output([])

    with pytest.raises(TypeError, match="abstract"):
        Partial()
    with pytest.raises(TypeError, match="abstract"):
        ClockState()


def test_signatures_come_from_a_copy_of_the_clocks_and_prepare_is_a_no_op_by_default():
    s = _Session()
    assert s.signatures(25) == [signature("flow", 25, {"conformer_att": 300}, last_chunk=False)]
    assert s.signatures(25, final=True) == [signature("flow", 25, {"conformer_att": 300}, last_chunk=True)]
    assert s.state() == {"mel": 300}                          # predicting moved nothing
    copy = s.clocks()
    copy.unit(25)
    assert copy.mel == 350 and s.state() == {"mel": 300}
    assert s.prepare() == {k: 0 for k in SessionStats.COUNTERS}
    assert set(SessionStats.COUNTERS) == {"captures", "replays", "eager_runs", "warmup_runs", "eager_fallbacks",
                                          "capture_failures"}


def test_close_then_every_checked_call_raises_closed_error():
    s = _Session()
    assert s.speak([1, 2], final=False).samples == 2
    with pytest.raises(InputError, match="final"):
        s.speak([1], final="yes")
    s.close()
    s.close()                                                  # idempotent
    assert s.closed
    for call in (s.start_turn, lambda: s.speak([1]), s.clocks, lambda: s.signatures(3)):
        with pytest.raises(ClosedError, match="the session is closed"):
            call()
    assert issubclass(ClosedError, InputError)
    assert _Session().closed is False                          # one session's close is its own


def test_a_session_is_a_context_manager_that_closes():
    with _Session() as s:
        assert not s.closed
    assert s.closed
    with pytest.raises(RuntimeError, match="body"):
        with _Session() as t:
            raise RuntimeError("body")
    assert t.closed


# --- one caller per session ---------------------------------------------------------------------------
class _SlowSession(Session):
    """A session whose speak waits on an event (to hold the call open) and records what ran."""
    capabilities = Capabilities("reset", True, False, "tokens", 25)

    def __init__(self):
        import threading
        self.inside, self.release, self.ran = threading.Event(), threading.Event(), []

    def start_turn(self):
        self.ran.append("start_turn")

    def speak(self, payload, *, final=False):
        self.inside.set()
        self.release.wait(10)
        self.ran.append("speak")
        return UnitOutput(np.zeros(4, np.float32), np.zeros(4, np.int16))

    def clocks(self):
        return None

    def state(self):
        return {}

    def stats(self):
        return SessionStats(units=0)

    def close(self):
        self.ran.append("close")
        super().close()


def test_a_second_thread_inside_one_session_is_refused_and_nothing_runs():
    import threading

    from duplexcadence.errors import ConcurrencyError
    s = _SlowSession()
    t = threading.Thread(target=lambda: s.speak([1]), daemon=True)
    t.start()
    assert s.inside.wait(10)
    for call in (lambda: s.speak([1]), s.start_turn, s.close, s.prepare):
        with pytest.raises(ConcurrencyError, match=r"another thread is inside this session's speak\(\)"):
            call()
    assert s.ran == [] and not s.closed                    # the refused calls changed nothing
    s.release.set()
    t.join(10)
    assert s.ran == ["speak"]
    s.close()                                              # the first caller is done: any thread may go on
    assert s.ran[-1] == "close" and s.closed


def test_prepare_takes_signatures_only_and_refuses_a_closed_session():
    s = _SlowSession()
    assert s.prepare([signature("decode", 1)]) == {k: 0 for k in SessionStats.COUNTERS}
    for bad in (5, "decode", signature("decode", 1), [5]):
        with pytest.raises(InputError, match=r"^signatures(\[0\])?: expected"):
            s.prepare(bad)
    s.close()
    with pytest.raises(ClosedError):
        s.prepare()


@pytest.mark.parametrize("inner", ["speak", "start_turn", "prepare", "close"])
def test_any_method_re_entered_from_inside_speak_on_the_same_thread_is_refused(inner):
    """A payload's iterator (or any callback inside speak) that speaks again, opens a turn, prepares or closes
    the session whose speak() is reading it may not pull the state from under the running unit: refused with
    ConcurrencyError naming both methods, nothing of it ran, and the outer unit (its subclass's super().speak()
    call too) completes."""
    from duplexcadence.errors import ConcurrencyError
    refused = []

    class Payload(list):
        def __iter__(self):
            try:
                getattr(s, inner)(*([[1]] if inner == "speak" else []))
            except ConcurrencyError as exc:
                refused.append(str(exc))
            return super().__iter__()

    class Reads(_SlowSession):
        def speak(self, payload, *, final=False):
            list(payload)
            return super().speak(payload, final=final)

    s = Reads()
    s.release.set()
    assert s.speak(Payload([1])).samples == 4
    assert s.ran == ["speak"] and not s.closed              # the inner call ran nothing
    assert refused == [f"{inner}: called from inside this session's speak() on the same thread (from a payload's "
                       f"iterator or a callback?); call it once speak() has returned"]
    s.speak([1])                                            # the caller's lock was released: it goes on
    assert s.ran == ["speak", "speak"]


def test_a_subclass_chain_of_super_calls_passes_through_every_level():
    class Base(_SlowSession):
        def start_turn(self):
            self.ran.append("base")

    class Mid(Base):
        def start_turn(self):
            self.ran.append("mid")
            super().start_turn()

    class Top(Mid):
        def start_turn(self):
            self.ran.append("top")
            super().start_turn()

    t = Top()
    t.start_turn()
    assert t.ran == ["top", "mid", "base"]
