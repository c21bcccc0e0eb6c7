"""rllab_tasks plugin."""
