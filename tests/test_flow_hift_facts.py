"""flow_hift.facts: the drivers' token loops on counts, the per-unit token limit, the regions and the stock tables
that bound them (pure host arithmetic; no model is built)."""
from __future__ import annotations

import pytest

from duplexcadence.adapters.flow_hift import facts
from duplexcadence.adapters.flow_hift.facts import Call, plan_calls
from duplexcadence.clocks import ClockError, HeadTail, KeepAll

LIMITS = facts.StockLimits(facts.DIT_BUFFER_FRAMES, facts.POSITION_TABLE, facts.NOISE_FRAMES)


def test_the_per_unit_token_limit_is_generate_chunks_25():
    """generate_chunk(max_new_token=25 + 1) returns at most max_new_token - 1 tokens (unified L5188, L6835)."""
    assert facts.MAX_UNIT_TOKENS == 25 == facts.CHUNK_TOKENS


def test_minicpmo_duplex_loop_on_counts():
    """unified L5446-5525: while >= 8 buffered stream min(28, len) and keep from min(25, n - 3); a turn's final
    unit streams the rest (even none) with last_chunk."""
    assert plan_calls("minicpmo45", 3, 25, False) == ([Call(0, 28, False)], 25)
    assert plan_calls("minicpmo45", 3, 16, False) == ([Call(0, 19, False)], 16)
    assert plan_calls("minicpmo45", 3, 4, False) == ([], 0)                       # 7 < 8: nothing yet
    assert plan_calls("minicpmo45", 3, 25, True) == ([Call(0, 28, False), Call(25, 3, True)], 28)
    assert plan_calls("minicpmo45", 3, 0, True) == ([Call(0, 3, True)], 3)
    assert plan_calls("minicpmo45", 7, 25, False) == ([Call(0, 28, False)], 25)     # 7 left: < 8


def test_stepaudio2_driver_loop_on_counts():
    """ex L20-27: while >= 28 buffered stream buffer[:28] and keep buffer[25:]; flush a non-empty rest."""
    assert plan_calls("stepaudio2", 0, 25, False) == ([], 0)
    assert plan_calls("stepaudio2", 25, 25, False) == ([Call(0, 28, False)], 25)
    assert plan_calls("stepaudio2", 25, 3, True) == ([Call(0, 28, False), Call(25, 3, True)], 28)
    assert plan_calls("stepaudio2", 0, 0, True) == ([], 0)                        # nothing buffered: no flush
    assert [c.n for c in plan_calls("stepaudio2", 35, 25, False)[0]] == [28, 28]


def test_mel_advance():
    assert facts.mel_advance(28, False) == 50 and facts.mel_advance(7, True) == 14


@pytest.mark.parametrize("variant,longest", [("minicpmo45", 850), ("stepaudio2", 846)])
def test_a_prompt_past_the_dit_buffer_is_one_limit_error_naming_it(variant, longest):
    """The DiT cache buffers hold 1000 frames: MiniCPM-o's caches reach P + 150, Step-Audio 2's P + 154."""
    assert facts.regions(variant, longest, LIMITS)
    with pytest.raises(ClockError, match=rf"estimator_att.*DiT cache buffers.*1000.*at most {longest} frames") as err:
        facts.regions(variant, longest + 2, LIMITS)
    assert err.value.session_usable is False
    with pytest.raises(ValueError, match="even"):
        facts.regions(variant, 301, LIMITS)


def test_each_stock_table_bounds_its_region():
    small = facts.StockLimits(10_000, 300, 200)
    with pytest.raises(ClockError, match="noise table.*200"):
        facts.regions("minicpmo45", 100, small)
    with pytest.raises(ClockError, match=r"conformer_att.*position table.*180"):
        facts.regions("minicpmo45", 100, facts.StockLimits(10_000, 180, 30_000))
    specs = {r.name: r for r in facts.regions("stepaudio2", 258, LIMITS)}
    assert specs["conformer_att"].policy == KeepAll(5000)
    assert specs["estimator_att"].policy == HeadTail(258, 100, 54) and specs["estimator_att"].policy.bound() == 412
    assert specs["conformer_att"].step(4950, 50) == (5000, 5000)
    with pytest.raises(ClockError, match="conformer_att.*5002.*5000"):
        specs["conformer_att"].step(4950, 52)
    mini = {r.name: r for r in facts.regions("minicpmo45", 300, LIMITS)}
    assert mini["conformer_att"].policy == mini["estimator_att"].policy == HeadTail(300, 100, 50)
