"""rllab_kl plugin."""
