"""`python -m fake_stage <suite.measure.stage arguments>`: a real stage process on the fake adapter of
tests/fakes.py (registered here, with fake workloads), for tests that start stage processes (on this machine
or as Ray tasks). A workload named "fail..." exits 1 after a line of output; FAKE_STAGE_SLEEP_S (seconds)
sleeps first, so stages last long enough to be seen side by side."""
from __future__ import annotations

import os
import sys
import time

import fakes
import workloads
from suite.measure import stage

fakes.register()
workloads.get = lambda name: fakes.workload(turns=2, speak_per_turn=4, name=name)


def main(argv: list[str]) -> int:
    time.sleep(float(os.environ.get("FAKE_STAGE_SLEEP_S", "0")))
    name = argv[argv.index("--workload") + 1]
    if name.startswith("fail"):
        print(f"{name}: boom", flush=True)
        return 1
    return stage.main(argv, entry="fake_stage")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
