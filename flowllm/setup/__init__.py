"""A run put together from its config: build, preflight, checks, fingerprint, provenance."""
