"""Concurrent sessions of one model on host threads, meeting signatures that were not captured and capturing them in
their slack while the others speak, give every session the bytes of that session run alone (the real adapters,
reduced depth, each session its own real script; suite.measure.duplex_run on the "threads" policy).

On the CPU GraphCache is disabled, so the capture path runs through `GraphDouble`, GraphCache's interface as the
adapters use it, installed on each session's cache(s): `capture` records the signature without running anything,
a "replay" runs the step eagerly under the model's lock (as an eager run of the real cache does), a family's first
signature is its warm-up, anything else not captured is an eager fallback. MiniCPM-o meets uncaptured signatures
on its own (turn starts of fewer than 25 tokens, final flushes); Moshi's and Qwen3-Omni's voice sets cover every
unit of a real script, so their sessions lose their voice registration here (`prepare(None)` captures nothing)
and every first occurrence is uncaptured. The CUDA test runs the real caches, released MiniCPM-o, on an H200."""
from __future__ import annotations

import os
import threading
import types

import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import workloads  # noqa: E402
from duplexcadence import runtime  # noqa: E402
from duplexcadence.graphs import GraphStats  # noqa: E402
from suite.measure import ar_stage, duplex_run, duplex_session  # noqa: E402
from suite.measure.duplex_run import Traffic  # noqa: E402
from suite.measure.session import make_spec  # noqa: E402
from torch_threads import torch_threads  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with torch_threads(1):
        yield


class GraphDouble:
    """GraphCache's interface on the CPU (module docstring). Built from the session's real cache: its lock, its
    warm-up key and the model's set of warmed families. `threads`: the host threads captures ran on."""

    def __init__(self, real):
        self.enabled, self.closed, self.inline = True, False, False
        self.lock, self.warm_key, self.warmed = real.lock, real.warm_key, real.warmed
        self.entries, self.eager_only, self.stats, self.pool_bytes = {}, set(), GraphStats(), 0
        self.threads: set = set()

    def __contains__(self, sig) -> bool:
        return sig in self.entries

    def needs_warmup(self, sig) -> bool:
        """As GraphCache: a family is warmed once per host thread (the model's WarmSet)."""
        return self.warm_key(sig) not in self.warmed

    def run(self, sig, step):
        with self.lock:
            if sig in self.entries:
                self.stats.replays += 1
            elif self.needs_warmup(sig):
                self.warmed.add(self.warm_key(sig))
                self.stats.warmup_runs += 1
            else:
                self.stats.eager_fallbacks += 1
            return step()

    def capture(self, sig, step) -> bool:
        with self.lock:
            if sig in self.entries:
                return True
            if self.needs_warmup(sig):
                return False              # as GraphCache: a family's first capture on a thread follows its warm-up
            self.entries[sig] = True
            self.stats.captures += 1
            self.pool_bytes += 4096
            self.threads.add(threading.get_ident())
            return True

    def close(self):
        self.closed = True

    def drop(self):
        self.closed = True
        self.entries.clear()


def doubled(adapter, *, voice: bool):
    """An adapter module whose sessions carry GraphDouble caches; voice=False: prepare(None) captures nothing."""
    mod = types.ModuleType(f"{adapter.__name__}_doubled")
    mod.MODES, mod.build_model, mod.doubles = adapter.MODES, adapter.build_model, []

    def new_session(model, mode, spec):
        s = adapter.new_session(model, mode, spec)
        if mode == "cadence":
            double = GraphDouble(s.graphs)
            s.graphs = double
            if hasattr(s, "vocoder"):             # MiniCPM-o's vocoder blocks run through the same cache
                s.vocoder.graphs = double
            mod.doubles.append(double)
            if not voice:
                real = s.prepare
                s.prepare = lambda signatures=None: (real(signatures) if signatures is not None
                                                     else dict.fromkeys(("captures", "replays"), 0))
        return s
    mod.new_session = new_session
    return mod


CASES = {   # workload, Euler steps, voice registration kept, traffic seed, script seconds
    "minicpmo45": ("minicpmo45", 2, True, 4, 4.0),
    "moshi": ("moshi", None, False, 4, 2.0),
    "qwen3_omni": ("qwen3_omni", None, False, 4, 3.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sessions_on_threads_meeting_uncaptured_signatures_give_their_bytes_alone(case, monkeypatch):
    name, steps, voice, seed, seconds = CASES[case]
    monkeypatch.setattr(duplex_session, "WARMUP_TURN_UNITS", 1)
    wl = workloads.get(name)
    spec = make_spec(wl, steps)
    real = runtime.adapter(wl.architecture)
    model = real.build_model(spec, device="cpu", depth="reduced", seed=0)
    adapter = doubled(real, voice=voice)
    plans = duplex_run.plans(wl, 3, Traffic(seconds=seconds, seed=seed, join_within_s=0.6))
    refs = {p.key: duplex_run.reference(wl, "cadence", p, model, adapter, spec, ar_stage.NoAR(), "cpu") for p in plans}
    assert len({tuple(r) for r in refs.values()}) == 3 and all(refs.values())
    run = duplex_run.run_sessions(wl, "cadence", plans, model=model, adapter=adapter, spec=spec, ar=ar_stage.NoAR(),
                                  device="cpu", policy="threads", progress=False)
    assert duplex_session.check_bytes(run, refs, [p.key for p in plans]) == {"checked": 3, "unchecked": [],
                                                                            "mismatches": []}
    # uncaptured signatures were met (eagerly: a fallback, or a family's first run on a session's thread) ...
    assert run["eager_fallbacks_during_cadence"] + run["warmup_runs_during_cadence"] > 0
    assert run["captures_during_cadence"] > 0                  # ... and captured in the slack, on the cadence
    assert run["captures_inside_timed_units"] == 0 and run["slack_overlapping_timed_units"] == 0
    assert sum(c["replays"] for c in run["cadence_counters"]) > 0
    cadence_doubles = adapter.doubles[len(refs):]
    assert len({t for d in cadence_doubles for t in d.threads}) > 1     # captured on the sessions' own threads


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture on the sessions' threads")
def test_cuda_sessions_capturing_in_their_slack_on_threads_give_their_bytes_alone():
    """Released MiniCPM-o 4.5 (10 steps) on CUDA, real GraphCaches: 6 sessions, each its own 12 s script, on the
    threads policy (a thread and a stream each), capturing what their units met without a graph in their slack
    while the others replay; every session's bytes equal the same session run alone, no capture inside a timed
    unit, and the uncaptured path really ran (eager first occurrences, captures during the cadence)."""
    wl = workloads.get("minicpmo45")
    spec = make_spec(wl)
    adapter = runtime.adapter(wl.architecture)
    model = adapter.build_model(spec, device="cuda", depth="released", seed=0)
    plans = duplex_run.plans(wl, 6, Traffic(seconds=12.0, seed=4, join_within_s=2.0))
    refs = {p.key: duplex_run.reference(wl, "cadence", p, model, adapter, spec, ar_stage.NoAR(), "cuda") for p in plans}
    run = duplex_run.run_sessions(wl, "cadence", plans, model=model, adapter=adapter, spec=spec, ar=ar_stage.NoAR(),
                                  device="cuda", policy="threads", progress=False)
    assert duplex_session.check_bytes(run, refs, [p.key for p in plans])["mismatches"] == []
    assert run["captures_inside_timed_units"] == 0 and run["slack_overlapping_timed_units"] == 0
    assert run["eager_fallbacks_during_cadence"] > 0 and run["captures_during_cadence"] > 0
    assert all(c["capture_failures"] == 0 for c in run["capture"])
    assert run["metrics"]["rejected_units"] == 0
