"""OpenTelemetry spans of a run (GenAI semantic conventions), live or from a saved run; see spans.py."""
