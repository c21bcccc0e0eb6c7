"""rllab_hf plugin."""
