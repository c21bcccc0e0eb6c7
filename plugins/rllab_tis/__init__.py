"""rllab_tis plugin."""
