"""rllab_ppo — policy-gradient losses and PPO's clipped value loss.

Policy losses (``register_policy_losses``): ``ppo_clip`` (alias ``ppo``), ``ppo_dual_clip``
(alias ``dual_clip``), ``gspo``, ``cispo``, ``vanilla_pg``, ``sapo``, ``clip_cov``, ``kl_cov``;
their equations, shapes and the differences from verl and TRL are in :mod:`rllab_ppo.losses`.
Value loss (``register_value_losses``): ``clipped`` (alias ``ppo``), in :mod:`rllab_ppo.value`.
:mod:`rllab_ppo.fused` computes PPO-clip + KL (k3) + entropy bonus as one autograd node, for
trainers that want fewer temporaries; it is a plain function, not a registered component.

More losses — ``geo_mean`` (GMPO), ``dppo_tv``, ``dppo_kl``, ``dro``, ``vespo`` — are in
:mod:`rllab_ppo.variants`. ``geo_mean`` is one number per sequence, averaged over rows whatever
the run's aggregation mode; it says so (``geo_mean.aggregation = "seq-mean"``) and the contract
suite checks it ignores ``aggregate`` instead of honouring it. The off-policy sequence mask
(``off_policy_mask_threshold``) is in :mod:`rllab_ppo.opsm`.
"""

import rllab

from .losses import (
    CISPOConfig,
    ClipCovConfig,
    GSPOConfig,
    KLCovConfig,
    PPOClipConfig,
    PPODualClipConfig,
    SAPOConfig,
    cispo,
    clip_cov,
    gspo,
    kl_cov,
    ppo_clip,
    ppo_dual_clip,
    sapo,
    vanilla_pg,
)
from .value import ClippedValueConfig, clipped_value_loss
from .variants import DPPOConfig, DROConfig, GeoMeanConfig, VESPOConfig, dppo_kl, dppo_tv, dro, geo_mean, vespo

__all__ = [
    "CISPOConfig",
    "ClipCovConfig",
    "ClippedValueConfig",
    "GSPOConfig",
    "KLCovConfig",
    "PPOClipConfig",
    "PPODualClipConfig",
    "SAPOConfig",
    "cispo",
    "clip_cov",
    "clipped_value_loss",
    "gspo",
    "kl_cov",
    "ppo_clip",
    "ppo_dual_clip",
    "sapo",
    "vanilla_pg",
    "DPPOConfig",
    "DROConfig",
    "GeoMeanConfig",
    "VESPOConfig",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "geo_mean",
    "vespo",
]


@rllab.hookimpl
def register_policy_losses(register):
    register("ppo_clip", ppo_clip, config=PPOClipConfig, aliases=("ppo",))
    register("ppo_dual_clip", ppo_dual_clip, config=PPODualClipConfig, aliases=("dual_clip",))
    register("gspo", gspo, config=GSPOConfig)
    register("cispo", cispo, config=CISPOConfig)
    register("vanilla_pg", vanilla_pg)
    register("sapo", sapo, config=SAPOConfig)
    register("clip_cov", clip_cov, config=ClipCovConfig)
    register("kl_cov", kl_cov, config=KLCovConfig)
    register("geo_mean", geo_mean, config=GeoMeanConfig, aliases=("gmpo",))
    register("dppo_tv", dppo_tv, config=DPPOConfig)
    register("dppo_kl", dppo_kl, config=DPPOConfig)
    register("dro", dro, config=DROConfig)
    register("vespo", vespo, config=VESPOConfig)


@rllab.hookimpl
def register_value_losses(register):
    register("clipped", clipped_value_loss, config=ClippedValueConfig, aliases=("ppo",))
