"""rllab_preference_losses — preference losses, the DPO family (``register_preference_losses``).

* :mod:`rllab_preference_losses.dpo` — ``dpo`` (alias ``sigmoid``), ``cdpo``, ``ipo``,
  ``hinge``, ``robust``, ``simpo``: the inputs, the equations and where rllab departs from TRL;
* :mod:`rllab_preference_losses.trl` — TRL 1.16's other loss types;
* :mod:`rllab_preference_losses.combined` — TRL's weighted loss-type list (``combined``, ``mpo``),
  LD-DPO's ``ld_alpha`` and WPO's weighting;
* :mod:`rllab_preference_losses.common` — the :class:`~rllab_preference_losses.common.PreferencePairs`
  record, the shared knobs and base configs, input checks and metrics.

Each loss is one plain function ``(pairs, config) -> (P,) losses`` that states its equation;
``common.component`` turns it into the registered loss (inputs checked, the record built once,
the ``dpo/…`` metrics added).

The steps that train with them (``dpo``, ``online_dpo``) are algorithms, in ``rllab_algorithms``.
"""

import rllab


@rllab.hookimpl
def register_preference_losses(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from . import combined, dpo, trl
    from .common import component

    register("dpo", component(dpo.sigmoid, "dpo"), config=dpo.DPOConfig, aliases=("sigmoid",))
    register("cdpo", component(dpo.cdpo), config=dpo.CDPOConfig)
    register("ipo", component(dpo.ipo), config=dpo.IPOConfig)
    register("hinge", component(dpo.hinge), config=dpo.DPOConfig)
    register("robust", component(dpo.robust), config=dpo.RobustConfig)
    register("simpo", dpo.simpo, config=dpo.SimPOConfig)
    trl.register(register)
    combined.register(register)
