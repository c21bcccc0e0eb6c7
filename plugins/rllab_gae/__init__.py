"""rllab_gae plugin."""
