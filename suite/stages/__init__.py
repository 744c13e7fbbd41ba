"""The staged, resumable reproduction: the plan (`plan`), its state on disk (`state`), running it one stage at
a time (`run`) or on Ray (`on_ray`), and a stage's process (`process`). Stages reach the measurements
only through a process boundary: they start `python -m suite.measure.*` and read the records it writes."""
