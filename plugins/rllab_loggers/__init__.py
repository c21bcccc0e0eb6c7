"""rllab_loggers plugin."""
