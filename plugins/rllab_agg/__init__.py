"""rllab_agg plugin."""
