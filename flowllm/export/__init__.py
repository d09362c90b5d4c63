"""A saved run in other tools' formats: the neutral trace every export reads (trace.py, source.py), the Inspect AI
eval log (inspect_log.py) and GAIA's submission file (gaia.py). The ``flowllm inspect export`` command is
``flowllm/inspect/export_command.py``; OpenTelemetry spans are built in ``flowllm.telemetry``, dataframes in
``flowllm.analysis``."""
