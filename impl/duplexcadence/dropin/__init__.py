"""Drop-ins for the stock decode calls serving loops make, each on one DuplexCadence session, same signature and
bytes (docs/dropins.md): `mimi.wrap`, `code2wav.wrap`, `token2wav.wrap`; each module loads its stock package."""
