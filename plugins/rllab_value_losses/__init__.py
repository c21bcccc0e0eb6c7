"""rllab_value_losses — critic losses (``register_value_losses``).

* :mod:`rllab_value_losses.clipped` — PPO's clipped value loss, ``clipped`` (alias ``ppo``).
"""

import rllab


@rllab.hookimpl
def register_value_losses(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from .clipped import ClippedValueConfig, clipped_value_loss

    register("clipped", clipped_value_loss, config=ClippedValueConfig, aliases=("ppo",))
