"""rllab_grpo plugin."""
