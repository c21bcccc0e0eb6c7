"""rllab_kl — KL penalties and KL-coefficient controllers.

* :mod:`rllab_kl.penalties` (``register_kl_penalties``): per-token estimators of KL(π ‖ π_ref) —
  ``k1``, ``abs``, ``k2``, ``k3``, their straight-through ``+`` forms, and the exact ``full``.
* :mod:`rllab_kl.controllers` (``register_kl_controllers``): ``fixed`` and ``adaptive`` β.
"""

import rllab


@rllab.hookimpl
def register_kl_penalties(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from .penalties import FullKLConfig, K3Config, abs_kl, abs_plus, full, k1, k1_plus, k2, k2_plus, k3, k3_plus

    register("k1", k1, aliases=("kl",))
    register("abs", abs_kl)
    register("k2", k2, aliases=("mse",))
    register("k3", k3, config=K3Config, aliases=("low_var_kl",))
    register("k1+", k1_plus, aliases=("kl+",))
    register("abs+", abs_plus)
    register("k2+", k2_plus, aliases=("mse+",))
    register("k3+", k3_plus, config=K3Config, aliases=("low_var_kl+",))
    register("full", full, config=FullKLConfig, requires=("logits",))


@rllab.hookimpl
def register_kl_controllers(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from .controllers import AdaptiveKLConfig, FixedKLConfig, adaptive, fixed

    register("fixed", fixed, config=FixedKLConfig)
    register("adaptive", adaptive, config=AdaptiveKLConfig)
