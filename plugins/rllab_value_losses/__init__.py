"""rllab_value_losses — critic losses (``register_value_losses``).

* :mod:`rllab_value_losses.clipped` — PPO's clipped value loss, ``clipped`` (alias ``ppo``).
"""

import rllab

from .clipped import ClippedValueConfig, clipped_value_loss

__all__ = ["ClippedValueConfig", "clipped_value_loss"]


@rllab.hookimpl
def register_value_losses(register):
    register("clipped", clipped_value_loss, config=ClippedValueConfig, aliases=("ppo",))
