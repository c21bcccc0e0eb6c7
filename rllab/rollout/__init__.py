"""The rollout side: episodes from environments (a task is a one-turn environment), scoring,
the rollout stage that turns them into batches, asynchronous rollouts, evaluation."""

from rllab._compat import FORMER

__getattr__ = FORMER.package_getattr(__name__)  # names of the former module rllab.rollout, with a warning, until rllab 1.0
