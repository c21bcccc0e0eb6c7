"""rllab_ppo plugin."""
