"""duplexcadence.graphs through real sessions (the public API: Qwen3-Omni Code2Wav at reduced depth, bfloat16, on
CUDA): a closed cadence session's capture stream is handed to the model's next cadence session, which replays the
same units byte for byte as the eager sessions (stock, and cadence with graphs off) speak them, and nothing of the
closed session's graph pool stays allocated: the stream's cuBLAS / cuBLASLt workspaces were made outside every
pool (graphs.prime_workspace), and they are all a session leaves behind. tests/test_graphs.py checks the same
hand-over on a bare GraphCache; CPU-only machines skip this module's test with the reason.
"""
from __future__ import annotations

import torch

import duplexcadence as dc
from cuda_checks import needs_fresh_streams, pool_segments, settled_allocated  # tests/ is on sys.path under pytest
from duplexcadence import graphs
from duplexcadence.graphs import StreamLeases, prime_workspace

TURN = [12, 13, 12, 13]            # frames @ 12.5 Hz per SPEAK unit; the last is final: every window is prepared


fresh_streams = needs_fresh_streams("graph capture on a driver stream that no earlier test ran a GEMM on")


def make_units(frames, seed: int = 11) -> list:
    """Codes int64 [16, n] in [0, 2048) per unit."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2048, (16, n), generator=gen) for n in frames]


def speak_turn(session, units) -> list:
    """One turn of `units` (the last final); the UnitOutputs."""
    session.start_turn()
    return [session.speak(codes, final=k == len(units) - 1) for k, codes in enumerate(units)]


def same_bytes(what: str, want: list, got: list) -> None:
    assert len(got) == len(want) == len(TURN), what
    for k, (a, b) in enumerate(zip(want, got)):
        dc.compare_units(f"qwen3_omni-reduced-cuda {what}", k, a, b)      # float32 and int16 bytes; BitMismatch
        assert a.samples > 0 and a.waveform.std() > 1e-3


def graphed_turn(session, units) -> list:
    """prepare(None) (every window of 12/13-frame turns), then the turn; every call must replay a graph."""
    session.prepare()
    outs = speak_turn(session, units)
    stats = session.stats()
    calls = sum(len(o.info["calls"]) for o in outs)
    assert stats.capture_failures == 0 and stats.eager_fallbacks == 0, stats
    assert stats.captures == stats.graphs > 0 and stats.replays == calls > 0, stats
    return outs


@fresh_streams
def test_cuda_a_closed_sessions_capture_stream_goes_to_the_next_session_and_keeps_nothing_of_its_pool(monkeypatch):
    """Open a cadence session, prepare, speak a turn (graphs replayed), close; the next cadence session gets the
    same capture stream, replays the same turn to the eager bytes, and neither leaves a block of its pool: what
    stays allocated after the first close is exactly one stream's workspaces, and after the second nothing more."""
    monkeypatch.setattr(graphs, "STREAMS", StreamLeases())    # new driver streams: the first capture primes one
    model = dc.open_model("qwen3_omni", device="cuda", depth="reduced", seed=0)
    units = make_units(TURN)
    eager = {}
    for mode, options in (("stock", {}), ("cadence", {"graphs": False})):   # also runs every lazy init eagerly
        session = model.session(mode, **options)
        eager[mode] = speak_turn(session, units)
        session.close()
    same_bytes("cadence without graphs vs stock", eager["stock"], eager["cadence"])

    # what one (host thread, stream) pair's cuBLAS and cuBLASLt workspaces take, on a stream of other leases
    probe = StreamLeases().acquire("cuda")
    before = settled_allocated()
    prime_workspace(probe)
    start = settled_allocated()
    workspace = start - before
    assert workspace > 0

    first = model.session("cadence")
    stream = first.graphs.capture_stream
    assert stream is not None and not graphs._is_primed(stream)
    outs = graphed_turn(first, units)
    assert graphs._is_primed(stream)                          # primed by the first capture, outside the pool
    pool = tuple(first.graphs.pool)
    assert pool_segments(pool), "the graphs' intermediates live in the session's pool while it is open"
    same_bytes("first graphed session vs stock", eager["stock"], outs)
    first.close()
    del first
    after_first = settled_allocated()
    assert pool_segments(pool) == [], "a block of the closed session's graph pool is still allocated"
    assert after_first - start == workspace, (after_first - start, workspace)    # only its stream's workspaces

    second = model.session("cadence")
    assert second.graphs.capture_stream.cuda_stream == stream.cuda_stream       # the closed session's stream
    pool2 = tuple(second.graphs.pool)
    assert pool2 != pool
    outs2 = graphed_turn(second, units)
    same_bytes("second graphed session (handed stream) vs stock", eager["stock"], outs2)
    same_bytes("second graphed session vs eager cadence", eager["cadence"], outs2)
    second.close()
    del second
    after_second = settled_allocated()                                           # empties the cache first
    assert pool_segments(pool2) == [] and after_second == after_first            # no second workspace, no pool left
    assert graphs.STREAMS.leased() == 0                                          # the stream was given back
