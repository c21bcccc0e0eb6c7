"""The load-time checks of an experiment config: one package, run by :func:`rllab.config.validate`
on every config it builds (the run's, each ``[[schedule]]`` entry's, a swap's and a checkpoint's),
so that a run that starts has settings that fit together, and the trainer only builds.

- :mod:`rllab.checks.config`: what the config's sections and components decide alone (one source
  of episodes, the algorithm's sections and inputs, reward components, bypass corrections, the
  launcher against the strategy, what a schedule entry may change);
- :mod:`rllab.checks.run`: the run's settings against its components' traits (batches sampled
  ahead, partial rollouts, the sampler, data parallelism, a backend that needs CUDA).
"""

from rllab.checks.run import check_run

__all__ = ["check_run"]
