"""A saved run in other tools' formats: the neutral trace every export reads (trace.py, source.py), the Inspect AI
eval log (inspect_log.py), GAIA's submission file (gaia.py) (the ``flowllm inspect export`` command is flowllm/inspect/export_command.py).
OpenTelemetry spans are built in ``flowllm.telemetry``, dataframes in ``flowllm.analysis``."""
