"""The command line around the Hydra app: exit codes, config checks before a run, the ``flowllm`` command."""
