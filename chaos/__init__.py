"""The chaos suite: real agents under a seeded nemesis, invariants checked from their
journals, logs and CLI. `python -m chaos.run --help`; docs/chaos.md."""
