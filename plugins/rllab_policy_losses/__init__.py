"""rllab_policy_losses — policy-gradient losses (``register_policy_losses``).

One module per family; each gives its equations, shapes and the differences from verl and TRL:

* :mod:`rllab_policy_losses.ppo` — ``ppo_clip`` (alias ``ppo``), ``ppo_dual_clip`` (alias
  ``dual_clip``), ``gspo``, ``cispo``, ``vanilla_pg``, ``sapo``;
* :mod:`rllab_policy_losses.covariance` — ``clip_cov``, ``kl_cov``;
* :mod:`rllab_policy_losses.variants` — ``geo_mean`` (GMPO), ``dppo_tv``, ``dppo_kl``, ``dro``,
  ``vespo``. ``geo_mean`` is one number per sequence, averaged over rows whatever the run's
  aggregation mode; it declares so and the contract suite checks it ignores ``aggregate``;
* :mod:`rllab_policy_losses.opsm` — TRL's off-policy sequence mask (``off_policy_mask_threshold``);
* :mod:`rllab_policy_losses.fused` — PPO-clip + KL (k3) + entropy bonus as one autograd node, for
  trainers that want fewer temporaries (a plain function, not a registered component).

Critic losses are in ``rllab_value_losses``; the bypass-mode loss, which is an importance
correction folded into the policy loss, in ``rllab_corrections``.
"""

import rllab


@rllab.hookimpl
def register_policy_losses(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from .covariance import ClipCovConfig, KLCovConfig, clip_cov, kl_cov
    from .ppo import (
        CISPOConfig,
        GSPOConfig,
        PPOClipConfig,
        PPODualClipConfig,
        SAPOConfig,
        cispo,
        gspo,
        ppo_clip,
        ppo_dual_clip,
        sapo,
        vanilla_pg,
    )
    from .variants import DPPOConfig, DROConfig, GeoMeanConfig, VESPOConfig, dppo_kl, dppo_tv, dro, geo_mean, vespo

    rollout = ("rollout_log_prob",)  # read by the off-policy sequence mask (rllab_policy_losses.opsm)
    register("ppo_clip", ppo_clip, config=PPOClipConfig, aliases=("ppo",), requires=rollout)
    register("ppo_dual_clip", ppo_dual_clip, config=PPODualClipConfig, aliases=("dual_clip",))
    register("gspo", gspo, config=GSPOConfig, requires=rollout)
    register("cispo", cispo, config=CISPOConfig, requires=rollout)
    register("vanilla_pg", vanilla_pg)
    register("sapo", sapo, config=SAPOConfig, requires=rollout)
    # the covariance's means and the share of tokens picked are taken over the batch the loss is given: the rl
    # step gives it each micro-batch, as verl does (declared, so the partition-invariance check states it)
    picked = "the means of its covariance and the {} share of tokens it {} are taken over the micro-batch it is given (as verl)"
    register("clip_cov", clip_cov, config=ClipCovConfig, partition=picked.format("clip_cov_ratio", "clips"))
    register("kl_cov", kl_cov, config=KLCovConfig, partition=picked.format("kl_cov_ratio", "penalises"))
    # one number per sequence, averaged over rows: the loss reduces itself (checked by rllab.testing)
    register("geo_mean", geo_mean, config=GeoMeanConfig, aliases=("gmpo",), aggregation="seq-mean")
    register("dppo_tv", dppo_tv, config=DPPOConfig)
    register("dppo_kl", dppo_kl, config=DPPOConfig)
    register("dro", dro, config=DROConfig)
    register("vespo", vespo, config=VESPOConfig, requires=rollout)
