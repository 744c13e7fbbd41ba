"""tools/graph_set.py: the distinct signatures a script's units meet, walked through a copy of the clocks."""
from __future__ import annotations

from types import SimpleNamespace as U

import pytest

from duplexcadence.errors import InputError
from suite.measure import slack
from tools import graph_set


class FakeClocks:
    """Signatures (turn, size, final) with a turn counter, so a missed start_turn shows."""

    def __init__(self):
        self.turns, self.copies = 0, 0

    def copy(self):
        self.copies += 1
        c = FakeClocks()
        c.turns = self.turns
        return c

    def start_turn(self):
        self.turns += 1

    def unit(self, size, final=False):
        return [("step", self.turns, size, final)]


def test_walk_counts_each_signature_once_opens_each_turn_and_leaves_the_clocks_alone():
    units = [U(kind="SPEAK", turn=0, final=False, payload=[1] * 25), U(kind="SPEAK", turn=0, final=False, payload=[1] * 25),
             U(kind="LISTEN", turn=0, final=False, payload=None), U(kind="SPEAK", turn=0, final=True, payload=[1] * 3),
             U(kind="SPEAK", turn=1, final=False, payload=[1] * 25), U(kind="LISTEN", turn=1, final=False, payload=[[1, 2]] * 8)]
    clocks = FakeClocks()
    sigs = graph_set.walk(clocks, units)
    assert sigs == [("step", 1, 25, False), ("step", 1, 3, True), ("step", 2, 25, False), ("step", 2, 2, False)]
    assert clocks.turns == 0 and clocks.copies == 1


def test_a_unit_runs_eagerly_when_one_of_its_signatures_was_never_captured_and_is_captured_after_it():
    script = [("a",), ("a", "b"), ("b",), ("c",), ("c", "a")]
    assert graph_set.eager_units(script, {"a"}) == (2, 3)          # the units that first meet b, then c
    assert graph_set.eager_units(script, set()) == (3, 3)
    assert graph_set.eager_units(script, {"a", "b", "c", "d"}) == (0, 4)


def test_signatures_rank_by_how_many_scripts_meet_them_once_per_script_ties_by_first_occurrence():
    from suite.measure.duplex_run import ranked
    scripts = [["b", "a", "a", "a"], ["c", "a"], ["c"], ["d", "b"]]
    assert ranked(scripts) == ["b", "a", "c", "d"]        # b, a, c in 2 scripts each (first met in that order); d in 1
    assert ranked([["a", "a", "a"], ["b"], ["b"]]) == ["b", "a"]       # a script meeting a three times counts once
    assert ranked([]) == []


class Caps:
    turn_state, max_payload = "reset", 25


def test_the_slack_walk_predicts_a_full_unit_after_each_unit_and_a_new_turn_after_a_final_one():
    units = [U(kind="SPEAK", turn=0, final=False, payload=[1] * 25), U(kind="SPEAK", turn=0, final=False, payload=[1] * 20),
             U(kind="SPEAK", turn=0, final=True, payload=[1] * 3), U(kind="LISTEN", turn=0, final=False, payload=None),
             U(kind="SPEAK", turn=1, final=False, payload=[1] * 25)]
    walked = graph_set.slack_walk(FakeClocks(), units, Caps)
    assert [w.position for w in walked] == ["turn_start", "short", "final", "turn_start"]
    assert [w.predicted for w in walked] == [(("step", 1, 25, False),), (("step", 1, 25, False),),
                                             (("step", 2, 25, False),), (("step", 2, 25, False),)]
    assert [w.signatures for w in walked] == [(("step", 1, 25, False),), (("step", 1, 20, False),),
                                              (("step", 1, 3, True),), (("step", 2, 25, False),)]


def test_predicted_signatures_captured_in_the_slack_spare_the_unit_that_meets_them():
    script = [("a",), ("b",), ("c",), ("b",)]
    predicted = [("b",), ("x",), ("y",), ()]
    positions = ["turn_start", "full", "final", "turn_start"]
    assert graph_set.eager_units(script, set(), positions=positions) == (3, 3, {"turn_start": 1, "full": 1, "final": 1})
    # b was predicted after the first unit: only a and c run eagerly; x and y are held though never met
    assert graph_set.eager_units(script, set(), predicted, positions) == (2, 5, {"turn_start": 1, "final": 1})


class RampClocks(FakeClocks):
    """A turn's full units ramp for two units, then repeat; the unit's signature names its place in the turn."""

    def copy(self):
        c = RampClocks()
        c.turns, c.k = self.turns, getattr(self, "k", 0)
        return c

    def start_turn(self):
        self.turns, self.k = self.turns + 1, 0

    def unit(self, size, final=False):
        if size > 25:
            raise InputError(f"size {size} > 25")
        place, self.k = min(self.k, 2), self.k + 1
        return [("step", place, size, final)]


def test_the_turn_family_holds_every_first_unit_every_final_after_the_ramp_and_the_steady_full_unit():
    fam = slack.turn_family(RampClocks(), Caps)
    firsts = {("step", 0, n, f) for n in range(26) for f in (False, True)}
    finals = {("step", p, n, True) for p in (1, 2) for n in range(26)}
    full = {("step", p, 25, False) for p in (0, 1, 2)}
    assert set(fam) == firsts | finals | full and len(fam) == len(set(fam))
    # a shorter unit inside a turn is not in it: the family is turns of full units between any first and last
    assert ("step", 1, 20, False) not in fam


@pytest.mark.parametrize("args, says", [
    (["--workload", "bogus"], "--workload: expected some of"),
    (["--units", "0"], "--units: expected an int >= 1, got '0'"),
    (["--units", "2"], "--units: no usable window of 2 s in the recordings"),
    (["--coverage", "8,0"], "--coverage: expected an int >= 1, got '0'"),
    (["--out", "/nonexistent-folder/x.json"], "--out: expected a file in an existing folder"),
])
def test_bad_arguments_are_usage_errors_before_any_walk(args, says, capsys):
    with pytest.raises(SystemExit) as exc:
        graph_set.main(args)
    assert exc.value.code == 2 and says in capsys.readouterr().err
