"""duplexcadence.clocks: retention policies, RegionSpec.step, schedule phases, Signature keys.

Expected values are worked out by hand in the comments (MiniCPM-o 4.5's conformer cache: a prompt of
P = 300 mel frames, +50 mel per full 28-token call, kept to P + 100 once longer: token2wav.py L220-247).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from duplexcadence.clocks import (Clock, ClockError, Fixed, HeadTail, KeepAll, RegionSpec, Ring, Signature,
                                  bounds, schedule, signature)
from duplexcadence.errors import InputError, LimitError


# --- Clock ---------------------------------------------------------------------------------------
def test_clock_ratio_and_units_are_exact_fractions():
    token, mel, samples = Clock("token", Fraction(25), "token"), Clock("mel", Fraction(50), "frame"), \
        Clock("samples", Fraction(24000), "sample")
    assert mel.per(token) == 2 and isinstance(mel.per(token), Fraction)
    assert token.per(mel) == Fraction(1, 2)
    assert samples.per(mel) == 480
    assert samples.units_in(Fraction(1, 2)) == 12000
    assert Clock("codec", Fraction(25, 2), "frame").units_in(1) == Fraction(25, 2)   # 12.5 Hz, not rounded


# --- policies ------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy, before, grown, after, bound", [
    pytest.param(Fixed(6), 6, 6, 6, 6, id="fixed-conv-tail"),
    pytest.param(Fixed(6), 0, 50, 6, 6, id="fixed-ignores-growth"),
    pytest.param(KeepAll(5000), 100, 150, 150, 5000, id="keepall-grows"),
    pytest.param(HeadTail(300, 100, 50), 300, 350, 350, 450, id="headtail-below-trim"),
    pytest.param(HeadTail(300, 100, 50), 350, 400, 400, 450, id="headtail-at-head-plus-tail"),
    pytest.param(HeadTail(300, 100, 50), 400, 450, 400, 450, id="headtail-trims-to-400"),
    pytest.param(Ring(250), 200, 240, 240, 250, id="ring-below-capacity"),
    pytest.param(Ring(250), 240, 290, 250, 250, id="ring-full"),
])
def test_policy_after_and_bound(policy, before, grown, after, bound):
    assert policy.after(before, grown) == after
    assert policy.bound() == bound


def test_bounds_maps_every_region_to_its_policys_bound():
    regions = [RegionSpec("conformer_att", "mel", 300, HeadTail(300, 100, 50), axis=3),
               RegionSpec("conformer_cnn", "mel", 6, Fixed(6)),
               RegionSpec("positions", "token", 0, KeepAll(5000)),
               RegionSpec("kv", "frame", 0, Ring(250))]
    assert bounds(regions) == {"conformer_att": 450, "conformer_cnn": 6, "positions": 5000, "kv": 250}


# --- RegionSpec.step -----------------------------------------------------------------------------
def test_step_returns_peak_and_kept_length():
    att = RegionSpec("conformer_att", "mel", 300, HeadTail(300, 100, 50))
    assert att.step(300, 50) == (350, 350)
    assert att.step(350, 50) == (400, 400)
    assert att.step(400, 50) == (450, 400)     # peak P + 150, trimmed back to P + 100
    assert att.step(400, 0) == (400, 400)
    keep = RegionSpec("positions", "token", 0, KeepAll(5000))
    assert keep.step(4990, 10) == (5000, 5000)  # exactly at the bound is allowed
    assert RegionSpec("cnn", "mel", 6, Fixed(6)).step(6, 0) == (6, 6)


def test_step_past_the_bound_raises_a_clock_error_naming_region_bound_and_value():
    att = RegionSpec("conformer_att", "mel", 300, HeadTail(300, 100, 50))
    with pytest.raises(ClockError) as info:
        att.step(400, 51)                        # 451 > 300 + 100 + 50
    msg = str(info.value)
    assert "'conformer_att'" in msg and "451" in msg and "450" in msg and "HeadTail" in msg
    assert isinstance(info.value, LimitError) and isinstance(info.value, InputError)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ClockError, match=r"'positions'.*5001.*5000"):
        RegionSpec("positions", "token", 0, KeepAll(5000)).step(4990, 11)


def test_a_clock_error_is_caught_by_the_documented_session_error():
    try:
        RegionSpec("kv", "token", 0, KeepAll(10)).step(10, 1)
    except InputError as exc:                    # what a session's caller catches
        assert exc.session_usable is True
    else:
        pytest.fail("no error past the bound")


def test_ring_wraps_and_never_raises():
    kv = RegionSpec("kv", "frame", 0, Ring(250))
    assert kv.step(0, 100) == (100, 100)
    assert kv.step(200, 100) == (250, 250)
    assert kv.step(250, 100) == (250, 250)
    assert kv.step(0, 10_000) == (250, 250)      # one step longer than the ring: still its capacity


# --- schedule ------------------------------------------------------------------------------------
def _minicpmo_regions():
    return [RegionSpec("conformer_att", "mel", 300, HeadTail(300, 100, 50), axis=3),
            RegionSpec("conformer_cnn", "mel", 6, Fixed(6), axis=2)]


def test_schedule_of_five_full_calls_and_a_final_one():
    """Five full calls (28 tokens, +50 mel) then a last_chunk of 12 tokens (+24 mel), by hand:
    before 300, 350, 400, 400, 400, 400; peak 350, 400, 450, 450, 450, 424; kept 350, 400, 400, ..."""
    advances = [{"conformer_att": 50}] * 5 + [{"conformer_att": 24}]
    steps = schedule(_minicpmo_regions(), advances, [28] * 5 + [12], [False] * 5 + [True])
    assert [s.index for s in steps] == [0, 1, 2, 3, 4, 5]
    assert [s.phase for s in steps] == ["first", "ramp", "ramp", "steady", "steady", "final"]
    assert [s.size for s in steps] == [28, 28, 28, 28, 28, 12]
    assert [s.before["conformer_att"] for s in steps] == [300, 350, 400, 400, 400, 400]
    assert [s.peak["conformer_att"] for s in steps] == [350, 400, 450, 450, 450, 424]
    assert [s.after["conformer_att"] for s in steps] == [350, 400, 400, 400, 400, 400]
    assert all(s.before["conformer_cnn"] == s.peak["conformer_cnn"] == s.after["conformer_cnn"] == 6
               for s in steps)


def test_schedule_a_new_size_at_the_same_lengths_is_a_ramp():
    cnn = [RegionSpec("cnn", "mel", 6, Fixed(6))]
    steps = schedule(cnn, [{}] * 5, [5, 5, 7, 7, 7], [False] * 5)
    assert [s.phase for s in steps] == ["first", "steady", "ramp", "steady", "steady"]


def test_schedule_first_wins_over_final_and_inputs_are_not_changed():
    advances = [{"conformer_att": 24}]
    steps = schedule(_minicpmo_regions(), advances, [12], [True])
    assert steps[0].phase == "first" and steps[0].after["conformer_att"] == 324
    assert advances == [{"conformer_att": 24}]


def test_schedule_raises_at_the_step_that_crosses_a_bound():
    advances = [{"conformer_att": 50}, {"conformer_att": 50}, {"conformer_att": 51}]
    with pytest.raises(ClockError, match=r"'conformer_att'.*from 400 reaches 451"):
        schedule(_minicpmo_regions(), advances, [28, 28, 29], [False] * 3)


# --- Signature -----------------------------------------------------------------------------------
def test_signature_sorts_lengths_and_exact_values_by_name():
    sig = signature("flow", 28, {"estimator_att": 400, "conformer_att": 350}, offset=3, last_chunk=False)
    assert sig == Signature("flow", 28, (("conformer_att", 350), ("estimator_att", 400)),
                            (("last_chunk", False), ("offset", 3)))
    assert repr(sig) == "Signature(flow, size=28, conformer_att=350, estimator_att=400, last_chunk=False, offset=3)"
    assert repr(signature("decode", 12)) == "Signature(decode, size=12)"


def test_equal_shapes_give_equal_keys_whatever_the_order_or_int_type():
    a = signature("flow", 28, {"b": 2, "a": 1}, y=1, x=0)
    b = signature("flow", np.int64(28), {"a": np.int64(1), "b": 2}, x=0, y=1)
    assert a == b and hash(a) == hash(b)
    assert {a: "graph"}[b] == "graph"
    assert type(b.size) is int and all(type(v) is int for _, v in b.lengths)
    assert signature("flow", 28, {"a": 1, "b": 3}) != signature("flow", 28, {"a": 1, "b": 2})
    assert signature("vocoder", 28, {"a": 1, "b": 2}) != signature("flow", 28, {"a": 1, "b": 2})
    assert signature("flow", 28, last_chunk=True) != signature("flow", 28, last_chunk=False)


def test_an_unhashable_exact_value_raises_type_error():
    with pytest.raises(TypeError):
        signature("flow", 28, offsets=[0, 50])
    assert signature("flow", 28, offsets=(0, 50)).get("offsets") == (0, 50)


def test_a_non_integral_length_or_size_is_refused_not_truncated():
    """Clock arithmetic is exact (Fraction); a length of 101/2 frames means a wrong clock, and a key built
    from int(101/2) = 50 would name a step that reads 50 frames."""
    with pytest.raises((TypeError, ValueError)):
        signature("flow", 28, {"conformer_att": Fraction(101, 2)})
    with pytest.raises((TypeError, ValueError)):
        signature("flow", 27.5)
    assert signature("flow", 28, {"conformer_att": Fraction(100, 2)}).get("conformer_att") == 50


def test_signature_get_reads_lengths_and_exact_values():
    sig = signature("window", 16, {"codes": 60}, left=25)
    assert sig.get("codes") == 60 and sig.get("left") == 25
    assert sig.get("missing") is None and sig.get("missing", 7) == 7
    assert sig.step == "window" and sig.size == 16
