"""The built-in environments of several turns (:class:`rllab.Environment`).

``tools`` (calculator, search, guess: what the tiny model learns), ``reasoning_retry``
(``reasoning_gym_retry``), and those of environment libraries: ``textarena``, ``gem``, ``openenv``.
"""

from .._former import FORMER

__getattr__ = FORMER.package_getattr(__name__)  # the names of the former module rllab_tasks.environments
