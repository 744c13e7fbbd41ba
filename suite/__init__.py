"""DuplexCadence measurement suite, in layers that import only downwards:

* `suite.records`  the records every harness writes and the report reads (schemas, read/write, constants);
* `suite.measure`  session timing, verify, duplex cadence, memory, kernels, the cadence scheduler;
* `suite.stages`   the staged reproduction: plan, state, running stages (one machine or Ray);
* `suite.report`   REPORT.md from records alone;
* `suite.reproduce` the `make reproduce` entry point (stages, then the report after each);
* `suite.asv`, `suite.bench`  asv and pytest-benchmark benchmarks.

No harness imports a model directly: models are reached through
`duplexcadence.runtime.adapter(workload.architecture)`. Importing the suite changes no torch state.
"""
