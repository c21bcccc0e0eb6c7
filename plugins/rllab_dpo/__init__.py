"""rllab_dpo plugin."""
