"""rllab_corrections — importance corrections for the rollout/training mismatch.

The rollout engine's log-probs differ from the training engine's for the same policy; these
components re-weight, reject or bypass accordingly (``register_importance_corrections``):

* :mod:`rllab_corrections.tis` — ``token_truncate`` (TIS), ``token_mask`` (MIS),
  ``sequence_truncate``, ``sequence_mask``, ``none``;
* :mod:`rllab_corrections.rejection` — ``rejection`` (alias ``rs``): verl's rejection sampling
  criteria, which may narrow the training step's response mask;
* :mod:`rllab_corrections.bypass` — ``bypass_mode``, verl's bypass mode: the correction folded
  into the policy loss, so it registers as a policy loss.
"""

import rllab


@rllab.hookimpl
def register_importance_corrections(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from .rejection import RejectionConfig, keep_mask, narrows_mask, rejection
    from .tis import CorrectionConfig, MaskConfig, no_correction, sequence_mask, sequence_truncate, token_mask, token_truncate

    register("token_truncate", token_truncate, config=CorrectionConfig, aliases=("tis",))
    register("token_mask", token_mask, config=MaskConfig, aliases=("mis",))
    register("sequence_truncate", sequence_truncate, config=CorrectionConfig)
    register("sequence_mask", sequence_mask, config=MaskConfig)
    register("none", no_correction, identity=True)
    register(
        "rejection", rejection, config=RejectionConfig, aliases=("rs",), keep_mask=keep_mask, narrows_mask=narrows_mask
    )


@rllab.hookimpl
def register_policy_losses(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from .bypass import BypassConfig, bypass_mode

    # the rl step passes the rollout engine's log-probs as old_log_prob and skips the old-log-prob forward
    register("bypass_mode", bypass_mode, config=BypassConfig, old_log_prob="rollout")
