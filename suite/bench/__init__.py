"""pytest-benchmark microbenchmarks of the runtime's own parts (`make bench`); not part of `make test`.

Each file is one part: schedule computation (test_schedule.py), arena set-up and views (test_arena.py),
the estimator-cache trim stock vs in place (test_trim.py), graph dispatch and replay (test_graphs.py).
Asserts in these files check what was timed, never how fast it was.
"""
