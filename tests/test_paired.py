"""suite.paired with fake sessions on a fake host whose true ratios the tests set.

The fake host has a state ("fast" or "slow") that may switch before any timed call (a seeded Markov chain),
a clock that the fake sessions advance by their unit time, and a probe that reads 7.3 (fast) or 10.5
(slow) microseconds per launch, as the lent H200's eager-launch probe does. Stock units take 100 ms on the
fast host and 140 ms on the slow one, DuplexCadence units 40 ms on both (true ratios 2.5 and 3.5), each
with log-normal noise, and each process may carry its own factor on stock's time.
"""
from __future__ import annotations

import hashlib
import types
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from suite.measure import paired
from workloads.common import Unit

ROOT = Path(__file__).resolve().parents[1]
PROBE = {"fast": 7.3, "slow": 10.5}
STOCK = {"fast": 100.0, "slow": 140.0}
CADENCE = {"fast": 40.0, "slow": 40.0}


class Host:
    """A fake host: state, clock (ms), the order of speak calls, and a timer over that clock."""

    def __init__(self, seed: int, *, switch=0.0, state: str = "fast", noise: float = 0.03):
        """switch: the chance to change state before a timed call; a pair (fast -> slow, slow -> fast)."""
        self.rng = np.random.default_rng(seed)
        self.switch = dict(zip(("fast", "slow"), switch if isinstance(switch, tuple) else (switch, switch)))
        self.state, self.noise = state, noise
        self.now = 0.0
        self.log: list[str] = []

    def probe(self) -> float:
        return PROBE[self.state] + 0.05 * self.rng.standard_normal()

    def timer(self, fn, *args, **kwargs):
        if self.rng.random() < self.switch[self.state]:
            self.state = "slow" if self.state == "fast" else "fast"
        t0 = self.now
        out = fn(*args, **kwargs)
        return out, self.now - t0, "wall ms (ignored)"


class Output:
    def __init__(self, payload, tag: str = ""):
        self.key = repr(payload) + tag

    def sha256(self):
        h = hashlib.sha256(self.key.encode()).hexdigest()
        return h, h[::-1]


class FakeSession:
    """Advances the host clock by its unit time; records every call; `corrupt`: unit payloads whose output
    it changes (a byte mismatch)."""

    def __init__(self, name: str, host: Host, ms: dict, *, factor: float = 1.0, corrupt=()):
        self.name, self.host, self.ms, self.factor, self.corrupt = name, host, ms, factor, set(corrupt)
        self.calls: list[tuple] = []

    def start_turn(self):
        self.calls.append(("start_turn",))

    def speak(self, payload, *, final=False):
        self.calls.append(("speak", payload, final))
        self.host.log.append(self.name)
        self.host.now += self.ms[self.host.state] * self.factor * float(np.exp(self.host.noise *
                                                                               self.host.rng.standard_normal()))
        return Output(payload, "corrupt" if tuple(payload) in self.corrupt else "")


def script(n_speak: int, *, turn_len: int = 5, listen_every: int = 0, listen_payload: bool = False) -> list[Unit]:
    """n_speak SPEAK units in turns of turn_len (last one final), a LISTEN unit before every listen_every-th
    SPEAK unit (with a payload if listen_payload). Payloads are distinct token tuples."""
    units = []
    for k in range(n_speak):
        if listen_every and k % listen_every == 0:
            units.append(Unit(len(units), float(len(units)), "LISTEN", None, False,
                              tokens=(9000 + k,) if listen_payload else None))
        units.append(Unit(len(units), float(len(units)), "SPEAK", k // turn_len, k % turn_len == turn_len - 1
                          or k == n_speak - 1, tokens=(k, k + 1, k + 2)))
    return units


def process(seed: int, n_speak: int = 60, *, a=STOCK, b=CADENCE, switch=0.0, state="fast", factor=1.0,
            block=1, corrupt=(), noise=0.03, warmup=0):
    host = Host(seed, switch=switch, state=state, noise=noise)
    sa = FakeSession("a", host, a, factor=factor)
    sb = FakeSession("b", host, b, corrupt=corrupt)
    pairs = paired.run_pairs(sa, sb, script(n_speak), timer=host.timer, probe=host.probe, block=block,
                             warmup=warmup)
    return pairs, sa, sb, host


def run(n_proc: int, n_speak: int, seed: int = 0, factors=None, **kw) -> list[list[paired.Pair]]:
    """n_proc processes; factors: each process's factor on stock's time (default 1.0 for all)."""
    factors = factors or [1.0] * n_proc
    return [process(seed * 100 + i, n_speak, factor=factors[i], **kw)[0] for i in range(n_proc)]


# --- run_pairs -------------------------------------------------------------------------------------
def test_blocks_alternate_abba():
    _, _, _, host = process(1, 8, block=1)
    assert "".join(host.log) == "abbaabbaabbaabba"
    _, _, _, host = process(1, 8, block=2)
    assert "".join(host.log) == "aabbbbaaaabbbbaa"


def test_pairs_record_order_and_block():
    pairs, *_ = process(1, 6, block=2)
    assert [p.order for p in pairs] == ["ab", "ab", "ba", "ba", "ab", "ab"]
    assert [p.block for p in pairs] == [0, 0, 1, 1, 2, 2]
    assert [p.index for p in pairs] == list(range(6))


def test_both_sessions_get_identical_payloads_turns_and_finals():
    host = Host(3)
    sa, sb = FakeSession("a", host, STOCK), FakeSession("b", host, CADENCE)
    units = script(12, turn_len=4, listen_every=3, listen_payload=True)
    pairs = paired.run_pairs(sa, sb, units, timer=host.timer, block=1)
    expected = []
    open_turn = None
    for u in units:
        if u.kind == "SPEAK" and u.turn != open_turn:
            expected.append(("start_turn",))
            open_turn = u.turn
        expected.append(("speak", u.tokens, bool(u.kind == "SPEAK" and u.final)))
        if u.kind == "SPEAK" and u.final:
            open_turn = None
    assert sa.calls == expected
    assert sb.calls == expected
    # LISTEN units with a payload run on both, hashed, never measured
    listen = [p for p in pairs if p.kind == "LISTEN"]
    assert len(listen) == 4 and not any(p.measured for p in listen)
    assert all(p.equal for p in pairs)


def test_listen_units_without_payload_are_skipped_and_warmup_is_not_measured():
    host = Host(4)
    sa, sb = FakeSession("a", host, STOCK), FakeSession("b", host, CADENCE)
    units = script(9, listen_every=2, listen_payload=False)
    pairs = paired.run_pairs(sa, sb, units, timer=host.timer, warmup=3)
    assert [p.kind for p in pairs] == ["SPEAK"] * 9
    assert [p.measured for p in pairs] == [False] * 3 + [True] * 6


def test_probe_is_read_around_each_block():
    reads = []

    def probe():
        reads.append(len(host.log))          # how many speak calls had run when it was read
        return 7.0
    host = Host(5)
    sa, sb = FakeSession("a", host, STOCK), FakeSession("b", host, CADENCE)
    pairs = paired.run_pairs(sa, sb, script(4), timer=host.timer, probe=probe, block=2)
    assert reads == [0, 2, 4, 4, 6, 8]
    assert all(p.probes == [7.0, 7.0, 7.0] for p in pairs)


def test_bad_arguments_are_named():
    host = Host(6)
    s = FakeSession("a", host, STOCK)
    with pytest.raises(ValueError, match="two sessions"):
        paired.run_pairs(s, s, script(2), timer=host.timer)
    other = FakeSession("b", host, CADENCE)
    with pytest.raises(ValueError, match="block"):
        paired.run_pairs(s, other, script(2), timer=host.timer, block=0)
    with pytest.raises(ValueError, match="timer"):
        paired.run_pairs(s, other, script(2), timer=lambda fn, *a, **k: (fn(*a, **k), 0.0))
    bad = [Unit(0, 0.0, "THINK", None, False)]
    with pytest.raises(ValueError, match="THINK"):
        paired.run_pairs(s, other, bad, timer=host.timer)


def test_a_mismatched_pair_is_counted_and_flagged():
    procs = [process(10 + i, 20, corrupt={(5, 6, 7)} if i == 1 else ())[0] for i in range(3)]
    bad = [p for p in procs[1] if not p.equal]
    assert [p.index for p in bad] == [5]
    s = paired.summarise(procs)
    assert s.mismatched == 1 and s.mismatches == [(1, 5)]
    assert any("differ" in f for f in s.flags)


# --- summarise ---------------------------------------------------------------------------------------
def test_interval_covers_the_true_ratio_and_shrinks_with_more_pairs():
    small = paired.summarise(run(3, 20, seed=1))
    large = paired.summarise(run(3, 400, seed=1))
    for s in (small, large):
        assert s.ci_low < 2.5 < s.ci_high
        assert s.processes == 3 and not s.flags
        assert s.states == {}                  # one host state: no per-state figures
    assert large.pairs == 1200 and small.pairs == 60
    assert (large.ci_high - large.ci_low) < 0.5 * (small.ci_high - small.ci_low)
    assert abs(large.speedup - 2.5) < 0.02


def test_interval_carries_the_spread_between_processes():
    # each process's stock runs at its own speed (x0.92, x1.0, x1.08: true ratios 2.3, 2.5, 2.7): pairs
    # within one process are precise, so a bootstrap over pairs alone would be far too narrow
    procs = [process(20 + i, 200, factor=f)[0] for i, f in enumerate((0.92, 1.0, 1.08))]
    hier = paired.summarise(procs)
    flat = paired.summarise([[p for proc in procs for p in proc]] * 3)   # the same pairs, no process effect
    assert hier.ci_low < 2.4 and hier.ci_high > 2.6
    assert (hier.ci_high - hier.ci_low) > 3 * (flat.ci_high - flat.ci_low)
    assert np.allclose(hier.process_medians, [2.3, 2.5, 2.7], atol=0.03)


def test_two_host_states_are_separated():
    s = paired.summarise(run(3, 300, seed=2, switch=0.08))
    assert set(s.states) == {"fast", "slow"}
    assert PROBE["fast"] < s.probe_split < PROBE["slow"]
    fast, slow = s.states["fast"], s.states["slow"]
    assert fast.ci_low < 2.5 < fast.ci_high and fast.ci_high < 3.0
    assert slow.ci_low < 3.5 < slow.ci_high and slow.ci_low > 3.0
    assert fast.pairs + slow.pairs + s.mixed_pairs == s.pairs
    assert s.mixed_pairs > 0
    assert abs(fast.probe_median - 7.3) < 0.1 and abs(slow.probe_median - 10.5) < 0.1


def test_fewer_than_three_processes_is_flagged():
    s = paired.summarise(run(2, 30, seed=3))
    assert s.processes == 2
    assert any("< 3" in f for f in s.flags)
    with pytest.raises(ValueError, match="processes"):
        paired.summarise([])


@pytest.mark.parametrize("values, two", [
    pytest.param([7.3] * 30 + [10.5] * 20, True, id="two-modes"),
    pytest.param(list(np.random.default_rng(0).normal(8.5, 0.8, 200)), False, id="one-normal"),
    pytest.param([7.3] * 49 + [10.5], False, id="one-outlier"),
    pytest.param([7.3, 10.5, 7.3], False, id="too-few"),
])
def test_split_states_rule(values, two):
    t = paired.split_states(values)
    assert (t is not None) == two
    if two:
        assert 7.3 < t < 10.5


# --- the floor and the bar ---------------------------------------------------------------------------
def test_aa_run_gives_a_floor_around_one_that_a_real_speedup_clears():
    floor = paired.noise_floor(run(3, 100, seed=4, b=STOCK))
    assert floor.ci_low < 1.0 < floor.ci_high
    assert floor.ci_high - floor.ci_low < 0.05
    assert not floor.flags
    assert paired.clears_floor(paired.summarise(run(3, 100, seed=5)), floor)
    near = paired.summarise(run(3, 100, seed=6, b={k: v / 1.003 for k, v in STOCK.items()}))
    assert not paired.clears_floor(near, floor)


def test_aa_floor_flags_an_interval_that_excludes_one():
    floor = paired.noise_floor(run(3, 100, seed=7, b={k: v / 1.2 for k, v in STOCK.items()}))
    assert any("excludes 1.0" in f for f in floor.flags)


def test_reproduces_yes_and_no():
    first = {"moshi": paired.summarise(run(3, 200, seed=8))}
    again = {"moshi": paired.summarise(run(3, 400, seed=9))}
    off = {"moshi": paired.summarise(run(3, 200, seed=10, b={k: v * 0.9 for k, v in CADENCE.items()}))}
    yes = paired.reproduces(first, again)
    assert yes.ok and yes.failures == [] and "inside" in yes.reasons[0]
    no = paired.reproduces(first, off)
    assert not no.ok and "moshi" in no.failures[0] and "outside" in no.failures[0]
    missing = paired.reproduces({**first, "qwen3_omni": first["moshi"]}, again)
    assert not missing.ok and "qwen3_omni: not in the second run" in missing.failures


def test_reproduces_judges_each_host_state_both_runs_saw():
    # Processes differ by a few percent (as on the lent host), so each run's interval is that spread; the
    # second run's host spends about 80% of its time slow (half in the first), which moves the pooled median but not the
    # per-state ones. Then a run whose slow-state stock is slower (160 ms: ratio 4.0) fails on that state.
    factors = [0.98, 1.0, 1.02]
    first = {"w": paired.summarise(run(3, 300, seed=11, factors=factors, switch=0.08))}
    same = {"w": paired.summarise(run(3, 300, seed=12, factors=factors, switch=(0.08, 0.02), state="slow"))}
    slow_moved = {"w": paired.summarise(run(3, 300, seed=13, factors=factors, switch=0.08,
                                            a={"fast": 100.0, "slow": 160.0}))}
    assert set(first["w"].states) == set(same["w"].states) == {"fast", "slow"}
    assert same["w"].states["slow"].pairs > 1.4 * first["w"].states["slow"].pairs
    ok = paired.reproduces(first, same)
    assert ok.ok, ok.failures
    assert [r for r in ok.reasons if "(all pairs)" in r and "outside" in r]    # pooled alone would fail
    no = paired.reproduces(first, slow_moved)
    assert not no.ok
    assert [f for f in no.failures if "slow host" in f] and not [f for f in no.failures if "fast host" in f]


def test_reproduces_fails_a_flagged_run():
    first = {"w": paired.summarise(run(3, 100, seed=14))}
    short = {"w": paired.summarise(run(2, 100, seed=15))}
    v = paired.reproduces(first, short)
    assert not v.ok and any("second run" in f and "< 3" in f for f in v.failures)
    with pytest.raises(TypeError, match="mapping"):
        paired.reproduces(first["w"], short)


def test_importing_suite_measure_paired_loads_no_torch():
    code = "import sys, suite.measure.paired; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# --- passes, the profiled tail, captures after a first occurrence ----------------------------------------
def test_passes_number_the_walks_keep_alternating_and_restart_the_turns():
    host = Host(16)
    sa, sb = FakeSession("a", host, STOCK), FakeSession("b", host, CADENCE)
    units = script(5, turn_len=5)                    # one turn, its last unit final
    pairs = paired.run_pairs(sa, sb, units, timer=host.timer, passes=2, warmup=5)
    assert [p.walk for p in pairs] == [0] * 5 + [1] * 5
    assert [p.order for p in pairs] == ["ab", "ba"] * 5          # the blocks alternate across the pass boundary
    assert [p.measured for p in pairs] == [False] * 5 + [True] * 5
    assert sa.calls.count(("start_turn",)) == 2 and sb.calls.count(("start_turn",)) == 2
    unflushed = script(4, turn_len=10)               # a turn cut before its final unit: the next pass starts it again
    sa, sb = FakeSession("a", host, STOCK), FakeSession("b", host, CADENCE)
    paired.run_pairs(sa, sb, unflushed[:3], timer=host.timer, passes=2)
    assert sa.calls.count(("start_turn",)) == 2


def test_the_profiled_tail_runs_under_the_profiler_and_is_not_measured():
    host = Host(17)
    sa, sb = FakeSession("a", host, STOCK), FakeSession("b", host, CADENCE)
    seen = []

    def profile(fn, *args, **kwargs):
        seen.append(args[0])
        return fn(*args, **kwargs), {"wall_ms": 500.0, "kernel_launches": 3}
    pairs = paired.run_pairs(sa, sb, script(8), timer=host.timer, profile=profile, profiled=3, warmup=1)
    assert [p.profiled for p in pairs] == [False] * 5 + [True] * 3
    assert [p.measured for p in pairs] == [False] + [True] * 4 + [False] * 3
    assert seen == [u.tokens for u in script(8)[-3:] for _ in (0, 1)]
    assert all(p.a_kernels == {"wall_ms": 500.0, "kernel_launches": 3} and p.a_ms == 500.0 for p in pairs[-3:])
    with pytest.raises(ValueError, match="no profile callable"):
        paired.run_pairs(sa, sb, script(2), timer=host.timer, profiled=1)


class GraphSession(FakeSession):
    """A fake session with graphs: its first unit of each size runs a step eagerly (counted: the very first as a
    warm-up run, as GraphCache counts a family's first run on a host thread, the others as eager fallbacks);
    prepare() captures the signatures it is given. Logs when prepare runs (inside the timer or not)."""

    class capabilities:
        graphs = True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.graphs, self.eager, self.warmups, self.captures, self.prepared = set(), 0, 0, 0, []

    def signatures(self, size, final=False):
        return [("step", size, bool(final))]

    def speak(self, payload, *, final=False):
        if ("step", len(payload), bool(final)) not in self.graphs:
            if self.warmups == 0:
                self.warmups += 1
            else:
                self.eager += 1
        return super().speak(payload, final=final)

    def stats(self):
        return types.SimpleNamespace(eager_fallbacks=self.eager, warmup_runs=self.warmups, captures=self.captures)

    def prepare(self, sigs=None):
        self.prepared.append((list(sigs), self.host.timing))
        new = [s for s in sigs if s not in self.graphs]
        self.graphs.update(new)
        self.captures += len(new)
        return {"captures": len(new)}


def test_a_first_occurrence_is_captured_right_after_its_timed_call():
    host = Host(18)
    host.timing = False
    real_timer = host.timer

    def timer(fn, *args, **kwargs):
        host.timing = True
        try:
            return real_timer(fn, *args, **kwargs)
        finally:
            host.timing = False
    host.timer = timer
    sa, sb = FakeSession("a", host, STOCK), GraphSession("b", host, CADENCE)
    units = [Unit(i, float(i), "SPEAK", 0, i == 5, tokens=tuple(range(3 if i < 5 else 1))) for i in range(6)]
    pairs = paired.run_pairs(sa, sb, units, timer=host.timer)
    assert [p.b_eager for p in pairs] == [1, 0, 0, 0, 0, 1]              # the 3-token unit, then the final one
    assert [p.b_captured for p in pairs] == [1, 0, 0, 0, 0, 1]
    assert sb.prepared == [([("step", 3, False)], False), ([("step", 1, True)], False)]   # outside the timer
    assert all(p.a_eager == p.a_captured == 0 for p in pairs)            # a session without graphs is left alone
    nocapture = GraphSession("b", host, CADENCE)
    paired.run_pairs(FakeSession("a", host, STOCK), nocapture, units, timer=host.timer, capture_after=False)
    assert nocapture.prepared == []
