"""REPORT.md from records alone (suite.records): a staged reproduction's merged report (`document`), a
single run's (`single`), their tables (`claims`, `runs`), figures (`figures`) and plots (`plots`).
`python -m suite.report FOLDER ...` rebuilds them; nothing here measures or imports torch."""
