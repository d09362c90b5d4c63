"""A run directory: its layout (where every file goes), the tolerant readers of its records, and the JSON
comparison replay and diff use. Imports nothing heavy, so the providers, the recorder and inspect all build on it.
"""
