"""rllab_algorithms — the training steps a run repeats (``register_algorithms``).

* :mod:`rllab_algorithms.rl` — ``rl``, the policy-gradient step (PPO, GRPO, RLOO, REINFORCE++,
  DAPO, … by the components chosen);
* :mod:`rllab_algorithms.distill` — ``opd``, on-policy distillation (a teacher's reverse KL on the
  student's own samples, alone or added to the RL loss);
* :mod:`rllab_algorithms.preference` — ``dpo`` (offline pairs) and ``online_dpo`` (fresh samples,
  best against worst of each group).
"""

import rllab


@rllab.hookimpl
def register_algorithms(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from . import distill, preference, rl

    register("rl", rl.rl, config=rl.RLConfig, uses=rl.RL.uses, provides=rl.RL.provides, data_parallel=True, replayable=True,
             async_rollouts=True)
    register("opd", distill.opd, config=distill.OPDConfig, uses=distill.OPD.uses, provides=distill.OPD.provides)
    for name, factory, cls, config in (
        ("dpo", preference.dpo, preference.DPO, preference.DPOConfig),
        ("online_dpo", preference.online_dpo, preference.OnlineDPO, preference.OnlineDPOConfig),
    ):
        register(name, factory, config=config, uses=cls.uses, provides=cls.provides)
