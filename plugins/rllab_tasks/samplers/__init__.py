"""The built-in prompt samplers (:class:`rllab.Sampler`): ``pools`` (default, difficulty_pool,
advantage_gate) and ``curriculum`` (reasoning_gym_curriculum)."""

from .._former import FORMER

__getattr__ = FORMER.package_getattr(__name__)  # the names of the former module rllab_tasks.samplers
