"""DuplexCadence measurement suite: how to measure (DESIGN.md section 5).

* `suite.env`       provenance of a result (git, packages, device) and the `deterministic()` flags;
* `suite.memory`    peak-memory probes (driver-level, torch allocator, CPU RSS), keys in MiB;
* `suite.runner`    drive a workload's session script through an adapter, per-unit records, verdict;
* `suite.report`    results/<run_id>/: run.json, audio_<mode>.wav, REPORT.md (rebuildable from JSON);
* `suite.reproduce` the `make reproduce` entry point;
* `suite.duplex`    the live duplex path: N sessions on the one-second cadence, SPEAK time, misses,
                    sessions per GPU (`suite.ar_stage`: the AR stage; `suite.duplex_plot`: its plots).

No harness imports a model directly: models are reached through
`duplexcadence.runtime.adapter(workload.architecture)`. Importing the suite changes no torch state.
"""
