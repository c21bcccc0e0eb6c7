"""The run: the trainer, the optimizer step, its parts, run directories, resuming, listeners."""
