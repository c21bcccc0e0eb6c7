"""Where the models live: the placement protocol and its strategies, data-parallel reductions and processes, sharded checkpoints."""
