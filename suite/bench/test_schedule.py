"""Schedule computation for a 60-unit turn, on the host from the declarations alone (no model).

flow_hift: 59 steady units of 25 speech tokens (one 28-token call each) and a final flush, through
`plan_calls` (the MiniCPM-o duplex token loop) and `turn_schedule` (clocks.schedule over the flow's
regions) for the minicpmo45 voice prompt (P = 300 mel frames). code2wav: 60 units of 12 / 13 codec
frames (the exact 12.5 Hz clock) through `turn_schedule`. Only the schedule call is timed.
"""
from __future__ import annotations

import pytest

from duplexcadence import runtime

UNITS = 60
PROMPT_FRAMES = 300      # minicpmo45: 6.0 s prompt -> 150 tokens -> 300 mel frames @ 50 Hz


def flow_hift_calls(fh) -> list:
    """The stream calls of a turn of UNITS units: 25 tokens each, then an empty final unit."""
    buffer, calls = [fh.SILENCE_TOKEN] * fh.PRE_LOOKAHEAD, []
    for k in range(UNITS):
        final = k == UNITS - 1
        tokens = [] if final else [(25 * k + i) % fh.VOCAB_SIZE for i in range(fh.CHUNK_TOKENS)]
        unit_calls, buffer = fh.plan_calls(buffer, tokens, final)
        calls += unit_calls
    return calls


@pytest.mark.benchmark(group="schedule of a 60-unit turn")
def test_flow_hift_turn_schedule(benchmark):
    fh = runtime.adapter("flow_hift")
    calls = flow_hift_calls(fh)
    steps = benchmark(fh.turn_schedule, PROMPT_FRAMES, calls)
    assert len(steps) == UNITS                       # 59 calls of 28 tokens + the final 3-token flush
    assert [s.phase for s in steps[-3:]] == ["steady", "steady", "final"]


@pytest.mark.benchmark(group="schedule of a 60-unit turn")
def test_code2wav_turn_schedule(benchmark):
    c2w = runtime.adapter("code2wav")
    frames = [12 + k % 2 for k in range(UNITS)]
    units = benchmark(c2w.turn_schedule, frames)
    assert len(units) == UNITS
    assert [c.phase for c in units[0]] == ["initial", "ramp"] and units[-1][0].phase == "final"
