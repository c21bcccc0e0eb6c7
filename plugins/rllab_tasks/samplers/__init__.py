"""The built-in prompt samplers (:class:`rllab.Sampler`): ``pools`` (default, difficulty_pool,
advantage_gate) and ``curriculum`` (reasoning_gym_curriculum)."""

from .._former import former_names

__getattr__ = former_names(__name__)  # the names of the former module rllab_tasks.samplers
