"""DuplexCadence measurement suite, in layers that import only downwards: `suite.records` (what every
harness writes and the report reads) <- `suite.measure` (session timing, verify, duplex, memory, kernels,
the cadence scheduler) <- `suite.stages` (plan, state, running stages on one machine or Ray) <-
`suite.report` (REPORT.md from records alone); `suite.reproduce` (`make reproduce`) runs the stages and the
report; `suite.asv`, `suite.bench` are benchmarks. Importing the suite changes no torch state.
"""
