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

from . import baselines, gae, group


@rllab.hookimpl
def register_advantage_estimators(register):
    register("gae", gae.gae, config=gae.GAEConfig, requires=("values",))
    register("reinforce", gae.reinforce, config=gae.ReturnConfig)
    register("remax", gae.remax, requires=("reward_baselines",))
    register("reinforce_plus_plus", gae.reinforce_plus_plus, config=gae.ReturnConfig, aliases=("reinforce++",))
    register("grpo", group.grpo, config=group.GRPOConfig)
    register("rloo", group.rloo, config=group.RLOOConfig)
    register("reinforce_plus_plus_baseline", group.reinforce_plus_plus_baseline, config=group.MaskScoresConfig)
    register("opo", group.opo, config=group.MaskScoresConfig)
    register("gpg", group.gpg, config=group.GPGConfig)
    register("grpo_passk", group.grpo_passk, config=group.PassKConfig)
    register("gdpo", baselines.gdpo, config=baselines.GDPOConfig)
    register("normalize_then_sum", baselines.normalize_then_sum, config=baselines.NormalizeThenSumConfig)
    otb_inputs = ("old_log_prob", "sum_pi_squared")
    register("optimal_token_baseline", baselines.optimal_token_baseline, config=baselines.OTBConfig, requires=otb_inputs)
    register(
        "tir_optimal_token_baseline", baselines.tir_optimal_token_baseline, config=baselines.OTBConfig, requires=otb_inputs
    )
