"""One process's run of tasks: the runner, epochs, outcomes, progress, the replay audit, the summary."""
