"""Sessions that share a model stay independent (flow_hift.flowstate and the sessions over it): every bind patch of
a shared module is undone after a step and after a step that raises; prepare captures ahead without changing the
session (warm-up restored); sessions speaking, opening and closing on several host threads give the bytes each
gives alone; close() frees a session's memory at once, without the cycle collector."""
from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import weakref
import pytest

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from reduced_flow_hift import model, token_maker  # noqa: E402, F401  (model: a fixture)
from session_state import same_state, snapshot  # noqa: E402
from torch_threads import two_threads  # noqa: E402, F401  (autouse: this module's tests at two intra-op threads)
from duplexcadence import bind  # noqa: E402
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.flow_hift import plan  # noqa: E402
from duplexcadence.graphs import GraphStats  # noqa: E402
from duplexcadence.session import SessionStats  # noqa: E402

tokens_for = token_maker(4000)


def shared_objects(model) -> dict:
    """What a step may repoint on the shared model: instance attributes and registered buffers, by identity."""
    t2w, cfm = model.t2w, model.t2w.flow.decoder
    out = {f"{name}.{k}": id(v) for name, mod in (("cfm", cfm), ("dit", cfm.estimator)) for k, v in mod._buffers.items()}
    for name, obj in (("t2w", t2w), ("hift", t2w.hift), ("cfm", cfm), ("t_embedder", cfm.estimator.t_embedder)) + \
            ((("bv", t2w.bounded_vocoder),) if model.variant == "minicpmo45" else ()):
        out.update({f"{name}.{k}": id(v) for k, v in vars(obj).items()})
    return out


@pytest.mark.parametrize("mode", fh.MODES)
def test_every_patch_is_undone_after_a_step_and_after_a_step_that_raises(model, mode):
    before = shared_objects(model)
    with fh.new_session(model, mode) as s:
        s.start_turn()
        for u in range(2):
            s.speak(tokens_for(u, 25))
        assert bind.live() == 0 and shared_objects(model) == before
        vocoder = model.t2w.hift
        for broken, name in ((model.t2w.flow.encoder, "forward_chunk"), (vocoder, "decode")):
            real = getattr(broken, name)

            def fail(*args, **kwargs):
                assert bind.live() > 0                        # inside a step: its patches are live
                raise RuntimeError("a step that raises")
            setattr(broken, name, fail)
            try:
                with pytest.raises(RuntimeError, match="a step that raises"):
                    s.speak(tokens_for(9, 25))
            finally:
                delattr(broken, name)
            assert getattr(broken, name) == real
            assert bind.live() == 0 and shared_objects(model) == before, name


class FakeGraphs:
    """GraphCache's interface on the CPU: `capture` records without running, `run` replays (here: runs) a captured
    signature, runs a family's first signature as a warm-up, anything else as an eager fallback."""

    def __init__(self):
        self.enabled, self.entries, self.warmed, self.stats = True, {}, set(), GraphStats()
        self.warm_key = lambda sig: sig.step

    def needs_warmup(self, sig):
        return self.warm_key(sig) not in self.warmed

    def run(self, sig, step):
        if self.warm_key(sig) not in self.warmed:
            self.warmed.add(self.warm_key(sig))
            self.stats.warmup_runs += 1
        elif sig in self.entries:
            self.stats.replays += 1
        else:
            self.stats.eager_fallbacks += 1
        return step()

    def capture(self, sig, step):
        self.entries[sig] = True
        self.stats.captures += 1
        return True

    def drop(self):
        self.entries.clear()


def test_prepare_captures_the_steady_set_and_leaves_the_session_as_it_was(model):
    """prepare(None) warms each step family once on the session's state and puts it back, captures the clocks'
    steady set, and changes neither state nor clocks: the units after it replay every step and give the bytes of
    a session that never prepared (a mid-turn prepare of one unit's signatures too). prepare(signatures) of
    another step is a ValueError."""
    with fh.new_session(model, "cadence") as plain:
        plain.start_turn()
        want = [plain.speak(tokens_for(u, 25)).sha256() for u in range(4)]
    with fh.new_session(model, "cadence") as s:
        s.start_turn()
        s.speak(tokens_for(0, 25))
        fake = s.graphs = FakeGraphs()                  # nothing warmed yet: prepare warms on a mid-turn state
        if model.variant == "minicpmo45":
            s.vocoder.graphs = fake
        before, clocks = snapshot(s), s.clocks().host()
        done = s.prepare()
        steady = plan.steady_signatures(_fresh_turn(s) if model.variant == "minicpmo45" else s.clocks())
        assert set(fake.entries) == set(steady) and done["captures"] == len(steady) and done["warmup_runs"] == 2
        assert set(done) == set(SessionStats.COUNTERS)
        assert same_state(before, snapshot(s)) and s.clocks().host() == clocks
        assert s.prepare(s.signatures(25))["captures"] == 0          # already captured
        got = [want[0]]
        for u in range(1, 4):
            sigs, was = s.signatures(25), fake.stats.replays
            got.append(s.speak(tokens_for(u, 25)).sha256())
            assert fake.stats.replays - was == len(sigs), u
        assert got == want and fake.stats.eager_fallbacks == 0
        with pytest.raises(ValueError, match="Signatures"):
            s.prepare([plan.signature("decode", 1)])


def _fresh_turn(s):
    c = s.clocks()
    c.start_turn()
    return c


def test_sessions_on_threads_opening_and_closing_mid_step_give_their_own_bytes(model):
    """Two sessions speaking on two threads while a third thread opens and closes sessions of the same model (a
    cadence session's open builds its state under the model's lock): every unit of both equals that session
    alone. MiniCPM-o's sessions run concurrently (capabilities.concurrent); Step-Audio 2's are refused on a second
    thread while one draws from the default generator, so its threads take turns."""
    modes = ("cadence", "stock")
    alone = {}
    for mode in modes:
        with fh.new_session(model, mode) as s:
            s.start_turn()
            alone[mode] = [s.speak(tokens_for(u, 25)).sha256() for u in range(4)]
    serial = threading.Lock() if model.variant == "stepaudio2" else None
    got, errors, stop = {m: [] for m in modes}, [], threading.Event()

    def speak(mode, delay):
        try:
            with fh.new_session(model, mode) as s:
                with serial or contextlib.nullcontext():
                    s.start_turn()
                for u in range(4):
                    time.sleep(delay)
                    with serial or contextlib.nullcontext():
                        got[mode].append(s.speak(tokens_for(u, 25)).sha256())
        except Exception as exc:          # noqa: BLE001 (reported below)
            errors.append(exc)

    def churn():
        try:
            while not stop.is_set():
                with serial or contextlib.nullcontext():
                    fh.new_session(model, "cadence").close()
                time.sleep(0.2)
        except Exception as exc:          # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=speak, args=("cadence", 0.01)), threading.Thread(target=speak, args=("stock", 0.03))]
    opener = threading.Thread(target=churn)
    for t in threads + [opener]:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    opener.join(60)
    assert not errors, errors
    assert got == alone
    assert fh.CadenceSession.capabilities.concurrent and not fh.StepAudio2CadenceSession.capabilities.concurrent


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_close_frees_the_session_at_once_without_the_cycle_collector(model):
    """With the cycle collector off: after close() and the last reference, the session and its vocoder state are
    gone (weak references dead) and, over repeated open / speak / close, resident memory stays flat (at most a
    few arenas of growth, where a session kept alive by a reference cycle would add one arena per session)."""
    gc.collect()
    gc.disable()
    try:
        growth, arena = [], None
        for cycle in range(12):
            s = fh.new_session(model, "cadence")
            arena = s.arena.bytes_reserved
            s.start_turn()
            s.speak(tokens_for(0, 25))
            parts = [weakref.ref(s), weakref.ref(s.vocoder if model.variant == "minicpmo45" else s.hift)]
            s.close()
            del s
            assert all(p() is None for p in parts), cycle
            growth.append(rss())
        assert growth[-1] - growth[2] < 3 * arena, (growth, arena)
    finally:
        gc.enable()


def test_prepare_at_open_before_any_unit_leaves_the_static_inputs_writable(model):
    """A server prepares a voice's graphs at open, before the first unit: the warm-up that runs then (nothing warmed
    in the process yet) must not make the static step inputs inference tensors, or the first unit's copy into
    them outside inference mode fails. The units after it give the bytes of a session that never prepared."""
    with fh.new_session(model, "cadence") as plain:
        plain.start_turn()
        want = [plain.speak(tokens_for(u, 25)).sha256() for u in range(2)]
    with fh.new_session(model, "cadence") as s:
        fake = s.graphs = FakeGraphs()
        if model.variant == "minicpmo45":
            s.vocoder.graphs = fake
        s.prepare()
        assert fake.stats.warmup_runs == 2 and fake.stats.captures > 0
        s.start_turn()
        assert [s.speak(tokens_for(u, 25)).sha256() for u in range(2)] == want
