"""`python -m fake_floor <suite.measure.floor arguments>`: the floor command on the fake adapter of tests/fakes.py
(registered here, with fake workloads), its processes started as `python -m fake_floor --child ...` too."""
from __future__ import annotations

import sys

import fakes
import workloads
from suite.measure import floor

fakes.register()
workloads.get = lambda name: fakes.workload(turns=2, speak_per_turn=5, name=name)


if __name__ == "__main__":
    sys.exit(floor.main(sys.argv[1:], entry="fake_floor"))
