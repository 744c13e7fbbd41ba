"""workloads.traffic: per-session real turn-taking scripts that join during a run."""
from __future__ import annotations

import pytest

from workloads import make_sessions, traffic
from workloads.common import ScriptError


def test_every_window_has_turns_and_speech_and_lies_in_its_recording():
    wins = traffic.windows(60)
    assert len({w.recording for w in wins}) == 27           # every recording of the timing file contributes
    for w in wins[::17]:
        ms = make_sessions.speech_ms(w.recording, w.speaker, w.start_ms, w.units)
        speak = [m >= make_sessions.SPEAK_MIN_MS for m in ms]
        assert sum(speak) >= traffic.MIN_SPEAK_UNITS
        turns = sum(1 for k, s in enumerate(speak) if s and (k == 0 or not speak[k - 1]))
        assert turns >= traffic.MIN_TURNS


def test_sessions_get_different_windows_and_join_inside_the_spread():
    run = traffic.traffic("flow_hift", 12, seed=3, join_within_s=20.0)
    assert [a.session for a in run] == list(range(12))
    assert len({a.window for a in run}) == 12
    assert run[0].join_s == 0.0 and all(0.0 <= a.join_s < 20.0 for a in run)
    assert len({round(a.join_s, 6) for a in run}) == 12
    for a in run:
        assert len(a.script.units) == 60
        assert all(len(u.tokens) <= 25 for u in a.script.speak_units)
        assert all(t[-1].final for t in a.script.turns)


def test_deterministic_for_a_seed_and_different_for_another():
    a = traffic.traffic("code2wav", 3, seed=5)
    b = traffic.traffic("code2wav", 3, seed=5)
    c = traffic.traffic("code2wav", 3, seed=6)
    assert [(x.window, x.join_s, x.script.units) for x in a] == [(x.window, x.join_s, x.script.units) for x in b]
    assert [x.window for x in a] != [x.window for x in c]


def test_moshi_sessions_carry_codes_on_every_unit_on_the_exact_clock():
    run = traffic.traffic("mimi", 2, seed=1)
    for a in run:
        frames = [len(u.codes[0]) for u in a.script.units]
        assert frames == [make_sessions.frames_in_unit(k) for k in range(60)]


def test_the_committed_window_is_one_of_the_generators_outputs():
    rows = make_sessions.rows_for("flow_hift", 1)
    again = make_sessions.rows_for("flow_hift", 1, recording=make_sessions.RECORDING,
                                   speaker=make_sessions.MODEL_SPEAKER, start_ms=make_sessions.WINDOW_START_MS,
                                   units=make_sessions.WINDOW_UNITS)
    assert rows == again


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_bad_counts_are_refused(bad):
    with pytest.raises(ValueError, match="expected an int >= 1"):
        traffic.traffic("flow_hift", bad)
    if bad is not True:
        with pytest.raises(ValueError, match="units"):
            traffic.windows(bad)


def test_script_rows_are_validated_like_a_file():
    rows = make_sessions.rows_for("flow_hift", 1)
    rows[5] = dict(rows[5], unit=99)
    with pytest.raises(ScriptError, match="unit"):
        traffic.script_from_rows(rows, traffic.FORMATS["flow_hift"], "bad")


def test_the_window_scan_counts_speech_as_make_sessions_does():
    """traffic.speech_ms (bisect over merged segments) gives make_sessions.speech_ms's ints, windows or not."""
    wins = traffic.windows(60)
    for w in wins[::29]:
        assert traffic.speech_ms(w.recording, w.speaker, w.start_ms, 60) == make_sessions.speech_ms(
            w.recording, w.speaker, w.start_ms, 60)
    for rec, spk, start in (("mpvoh", "spk01", 17_000), ("mpvoh", "spk00", 123), (wins[5].recording, "spk00", 999)):
        assert traffic.speech_ms(rec, spk, start, 90) == make_sessions.speech_ms(rec, spk, start, 90)


@pytest.mark.parametrize("units", [30, 60])
def test_every_flow_hift_script_is_one_step_audio_2s_clocks_accept(units):
    # The payload format is shared with MiniCPM-o; Step-Audio 2's token loop refuses a turn that ends in a call
    # of 1 token (its clocks, upstream's conformer conv cache), which a one-unit turn of 1 token made.
    from duplexcadence.adapters.flow_hift import facts, plan

    specs = {s.name: s for s in facts.regions("stepaudio2", 100, facts.StockLimits(10**6, 10**6, 10**6))}
    refused = []
    for w in traffic.windows(units):
        clock, turn = plan.StepAudio2Clocks(specs, 10), None
        for u in traffic.session_script("flow_hift", w, 0).units:
            if u.kind != "SPEAK":
                continue
            if u.turn != turn:
                clock.start_turn()
                turn = u.turn
            try:
                clock.plan(len(u.payload), u.final)
            except Exception as exc:    # noqa: BLE001
                refused.append((w.name, u.index, f"{type(exc).__name__}: {exc}"))
                break
    assert refused == []


def test_the_split_deals_the_recordings_alternately_into_two_disjoint_halves():
    learn, serve = traffic.split()
    names = traffic.recordings()
    assert len(names) == 27 and (len(learn), len(serve)) == (14, 13)
    assert not set(learn) & set(serve) and sorted(learn + serve) == names
    assert (learn[0], serve[0], learn[1]) == tuple(names[:3])


def test_traffic_drawn_from_some_recordings_has_windows_of_those_only():
    serve = traffic.split()[1]
    arrivals = traffic.traffic("flow_hift", 40, seed=3, recordings_in=serve)
    assert {a.window.recording for a in arrivals} <= set(serve) and len({a.window for a in arrivals}) == 40
    with pytest.raises(ValueError, match="recordings_in: no 60-unit window in"):
        traffic.traffic("flow_hift", 2, recordings_in=("not-a-recording",))
    with pytest.raises(ValueError, match="recordings_in: expected a collection of recording names, got the string"):
        traffic.traffic("flow_hift", 2, recordings_in=serve[0])           # would match substrings of names
