"""rllab_advantages — advantage estimators: per-token rewards in, advantages and returns out.

One module per family:

* :mod:`rllab_advantages.gae` — backward scans over a row's valid tokens: ``gae`` (needs a
  critic), ``reinforce`` (return-to-go), ``reinforce_plus_plus`` and ``remax`` (a greedy
  response's reward as the baseline).
* :mod:`rllab_advantages.group` — group baselines over the rows sampled from one prompt:
  ``grpo`` (and Dr.GRPO), ``rloo``, ``reinforce_plus_plus_baseline``, ``opo``, ``gpg``,
  ``grpo_passk``.
* :mod:`rllab_advantages.baselines` — several reward components and per-token baselines:
  ``gdpo``, ``normalize_then_sum``, ``optimal_token_baseline``, ``tir_optimal_token_baseline``.
"""

import rllab


@rllab.hookimpl
def register_advantage_estimators(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from . import baselines, gae, group

    # batch_step: a step that couples every row of the batch, for the contract suite's
    # group-isolation check (rllab.testing)
    register(
        "gae", gae.gae, config=gae.GAEConfig, requires=("values",),
        batch_step=lambda config: "whiten" if config.whiten else None,
    )
    register("reinforce", gae.reinforce, config=gae.ReturnConfig)
    register("remax", gae.remax, requires=("reward_baselines",))
    register(
        "reinforce_plus_plus", gae.reinforce_plus_plus, config=gae.ReturnConfig, aliases=("reinforce++",),
        batch_step="whiten",
    )
    register(
        "grpo", group.grpo, config=group.GRPOConfig,
        batch_step=lambda config: "batch std" if config.scale == "batch" and config.norm_by_std else None,
    )
    register("rloo", group.rloo, config=group.RLOOConfig)
    register(
        "reinforce_plus_plus_baseline", group.reinforce_plus_plus_baseline, config=group.MaskScoresConfig,
        batch_step="whiten",
    )
    register("opo", group.opo, config=group.MaskScoresConfig)
    register("gpg", group.gpg, config=group.GPGConfig, batch_step="α = B / #non-zero scores")
    register("grpo_passk", group.grpo_passk, config=group.PassKConfig)
    components = ("reward_components",)
    weights = _component_weights
    register("gdpo", baselines.gdpo, config=baselines.GDPOConfig, requires=components, batch_step="whiten", component_weights=weights)
    register(
        "normalize_then_sum", baselines.normalize_then_sum, config=baselines.NormalizeThenSumConfig,
        requires=components, batch_step="batch std", component_weights=weights,
    )
    otb_inputs = ("old_log_prob", "sum_pi_squared")
    register("optimal_token_baseline", baselines.optimal_token_baseline, config=baselines.OTBConfig, requires=otb_inputs)
    register(
        "tir_optimal_token_baseline", baselines.tir_optimal_token_baseline, config=baselines.OTBConfig, requires=otb_inputs
    )


def _component_weights(config):
    """The reward_weights knob (None: the task's own weights)."""
    return config.reward_weights
