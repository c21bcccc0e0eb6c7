"""The rollout side: episodes from environments (a task is a one-turn environment), scoring,
the rollout stage that turns them into batches, asynchronous rollouts, evaluation."""

from rllab._compat import former_names

__getattr__ = former_names(__name__)  # names of the former module rllab.rollout, with a warning, until rllab 1.0
