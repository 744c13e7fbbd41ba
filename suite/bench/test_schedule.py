"""The signatures of a 60-unit turn, from a session's clocks alone (no model step runs): what `prepare` and
the oracle walk compute. A copy of the clocks (`session.clocks()`) advanced by 60 steady units of the
workload's largest payload (25 speech tokens, 13 codec frames) and a final one; only the walk is timed.
Reduced depth on CPU (the clocks do not depend on it)."""
from __future__ import annotations

import pytest

import workloads
from duplexcadence import runtime
from suite.measure.session import make_spec

UNITS = 60


@pytest.fixture(scope="module", params=["minicpmo45", "moshi", "qwen3_omni"])
def session(request):
    wl = workloads.get(request.param)
    adapter, spec = runtime.adapter(wl.architecture), make_spec(wl)
    s = adapter.new_session(adapter.build_model(spec, device="cpu", depth="reduced", seed=0), "cadence", spec)
    yield wl, s
    s.close()


@pytest.mark.benchmark(group="signatures of a 60-unit turn")
def test_turn_signatures(benchmark, session):
    wl, s = session
    size = wl.payload_format.max_len

    def walk():
        clocks = s.clocks()
        clocks.start_turn()
        return [clocks.unit(size, k == UNITS - 1) for k in range(UNITS)]

    units = benchmark(walk)
    assert len(units) == UNITS and units[-2] == units[-3]          # steady: the same signatures again
