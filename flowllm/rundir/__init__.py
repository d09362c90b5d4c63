"""A run directory: its layout (where every file goes), the tolerant readers of its records, the typed records of
its result files (``results``: summary.json, result.json, the ledger's lines; their JSON Schema in ``schema/``)
and the JSON comparison replay and diff use. Imports nothing heavy, so the providers, the recorder and inspect
all build on it.
"""
