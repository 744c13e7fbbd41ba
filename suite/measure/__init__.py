"""How to measure: a session's units timed (`session`), stock against DuplexCadence (`verify`), the duplex
cadence with many sessions (`duplex`, `duplex_session`, `scheduler`, `ar_stage`), memory (`memory`), kernels
(`kernels`), provenance and host probes (`env`), and one stage's process (`stage`). Sessions are reached
only through the session protocol (duplexcadence.session.Session)."""
