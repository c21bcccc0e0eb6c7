"""rllab_algorithms — the training steps a run repeats (``register_algorithms``).

* :mod:`rllab_algorithms.rl` — ``rl``, the policy-gradient step (PPO, GRPO, RLOO, REINFORCE++,
  DAPO, … by the components chosen);
* :mod:`rllab_algorithms.preference` — ``dpo`` (offline pairs) and ``online_dpo`` (fresh samples,
  best against worst of each group).
"""

import rllab

from . import preference, rl


@rllab.hookimpl
def register_algorithms(register):
    register("rl", rl.rl, config=rl.RLConfig)
    register("dpo", preference.dpo, config=preference.DPOConfig)
    register("online_dpo", preference.online_dpo, config=preference.OnlineDPOConfig)
