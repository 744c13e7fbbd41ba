"""suite.measure.slack.SlackCapture: the slack job captures the likely next unit's signatures first and always,
then what the last units met, one prepare each, and starts none of those whose step's cost does not fit in the
time left; what it does not start waits for a later slack. On the fake adapter (tests/fakes.py): one "step" signature per unit,
(size, history, last), history 0..2."""
from __future__ import annotations

import time
import types

import torch

import fakes
from duplexcadence.clocks import signature
from suite.measure.slack import SlackCapture


def session():
    model = fakes.FakeModel(open=[], spec={}, zero_units=set(), cadence_off_units=set(), device=torch.device("cpu"))
    return fakes.FakeSession(model, "cadence")


def unit(index, size, final=False):
    """What `note` reads of a suite.measure.duplex_session.DuplexUnit."""
    return types.SimpleNamespace(index=index, size=size, kind="SPEAK", final=final)


def sig(size, history, last=False):
    return signature("step", size, {"history": history}, last=last)


def spoken(sizes):
    """A cadence session that spoke units of `sizes` tokens in one open turn, its slack noted after each (no job
    run): the signatures those units met wait in the slack."""
    s = session()
    s.prepare(None)
    s.start_turn()
    slack = SlackCapture(s)
    slack.start(turn_open=True)
    for i, n in enumerate(sizes):
        s.speak(list(range(n)))
        slack.note(unit(i, n), opened_turn=False, turn_open=True)
    return s, slack


def test_an_unbounded_job_captures_the_next_units_signatures_then_what_units_met():
    s, slack = spoken([7, 9])
    out = slack.job(None)
    # next: a full unit at history 2 (the voice's set holds it: prepared, nothing captured); met: (7, history 0)
    # and (9, history 1), captured
    assert out["signatures"] == 3 and out["captures"] == 2 and out["deferred"] == 0
    assert {sig(7, 0), sig(9, 1)} <= s.graphs and slack.pending == {}
    assert slack.summary()["signatures_deferred"] == 0


def test_a_job_with_no_time_left_prepares_only_the_next_units_and_keeps_what_units_met_for_a_later_slack():
    s, slack = spoken([7, 9])
    before = set(s.graphs)
    out = slack.job(lambda: 0.0)
    # the next unit's (25, history 2) is asked for (the voice's set holds it: no capture); the met ones wait
    assert out["signatures"] == 1 and out["captures"] == 0 and out["deferred"] == 2 and s.graphs == before
    assert list(slack.pending) == [sig(7, 0), sig(9, 1)]
    later = slack.job(lambda: 10.0)
    assert later["captures"] == 2 and later["deferred"] == 0 and slack.pending == {}
    assert slack.summary()["signatures_deferred"] == 2 and slack.summary()["signatures_asked"] == 3


def test_a_session_always_late_still_captures_what_its_next_unit_needs():
    """A session whose slack is always over (left() < 0, as on a slow host) is not starved: each job captures
    the next unit's signatures, so the next unit replays instead of running eagerly again."""
    s, slack = spoken([7, 9])
    s.graphs.discard(sig(fakes.MAX_TOKENS, 2))              # the next unit's signature, not held
    out = slack.job(lambda: -1.0)
    assert out["signatures"] == 1 and out["captures"] == 1 and out["deferred"] == 2
    assert sig(fakes.MAX_TOKENS, 2) in s.graphs and sig(7, 0) not in s.graphs
    before = s.stats()
    s.speak(list(range(fakes.MAX_TOKENS)))
    after = s.stats()
    assert (after.replays - before.replays, after.eager_fallbacks - before.eager_fallbacks) == (1, 0)


def test_the_next_units_signatures_come_before_what_units_met():
    s, slack = spoken([7])                                  # met (7, h0); next: a full unit at history 1
    asked = []
    s.prepare = lambda sigs: asked.extend(sigs) or {}
    slack.job(None)
    assert asked == [sig(fakes.MAX_TOKENS, 1), sig(7, 0)]


def test_a_signature_whose_steps_last_prepare_took_longer_than_what_is_left_waits():
    """Each prepare takes 200 ms here; the job has 300 ms. The first signature (the next unit's, not held)
    starts in any case and is captured; the second, a past unit's, does not: at most 100 ms left is less than
    the 200 ms or more the step's last capture took. What the units met waits."""
    s, slack = spoken([7, 9])
    s.graphs.discard(sig(fakes.MAX_TOKENS, 2))
    real = s.prepare

    def slow(sigs):
        time.sleep(0.2)
        return real(sigs)
    s.prepare = slow
    end = time.perf_counter() + 0.3
    out = slack.job(lambda: end - time.perf_counter())
    assert out["signatures"] == 1 and out["deferred"] == 2 and out["captures"] == 1
    assert slack.cost["step"] >= 0.2
    assert list(slack.pending) == [sig(7, 0), sig(9, 1)]


def test_a_prepare_of_a_signature_held_already_does_not_lower_its_steps_cost():
    """A capture takes 200 ms, a prepare of a held signature nothing. The next unit's signature (25, history 2)
    is in the voice's set: preparing it is instant and must not make the step look free, so with 50 ms left
    the capture of a past unit's (9, history 1) waits."""
    s, slack = spoken([7])
    real = s.prepare

    def costly(sigs):
        if any(sig not in s.graphs for sig in sigs):
            time.sleep(0.2)
        return real(sigs)
    s.prepare = costly
    slack.job(None)                                         # learns the step's cost from (7, history 0)
    assert slack.cost["step"] >= 0.2
    s.speak(list(range(9)))
    slack.note(unit(1, 9), opened_turn=False, turn_open=True)
    end = time.perf_counter() + 0.05
    out = slack.job(lambda: end - time.perf_counter())
    assert out["captures"] == 0 and out["deferred"] == 1 and list(slack.pending) == [sig(9, 1)]
    assert slack.cost["step"] >= 0.2
