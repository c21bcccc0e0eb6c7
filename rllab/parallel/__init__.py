"""Where the models live: placement strategies, data-parallel processes, sharded checkpoints."""
