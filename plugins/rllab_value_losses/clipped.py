"""PPO's clipped value loss (Schulman et al. 2017; the form of OpenAI baselines, verl and TRL).

::

    V_clip = clip(V, V_old − c, V_old + c)
    loss   = ½ · aggregate(max((V − R)², (V_clip − R)²))

``values`` V (B, T) float, the current critic (carries the gradient); ``old_values`` V_old (B, T),
the critic at rollout time; ``returns`` R (B, T); ``mask`` (B, T) bool. ``critic/vf_clipfrac`` is
the share of valid tokens where the clipped term is strictly larger (the gradient is cut there),
exactly verl's ``compute_value_loss``. ``value_clip=None`` gives the unclipped ½·aggregate((V − R)²).

Masked positions are read through ``torch.where`` (NaN there changes nothing); NaN or inf at a
valid position raises :class:`rllab.RowError` naming the rows.
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab import ops
from rllab.ops import check_inputs, zero_masked



@attrs.frozen
class ClippedValueConfig:
    """Knobs of the ``clipped`` value loss."""

    value_clip: float | None = rllab.knob(
        0.5,
        help="c: V is kept within V_old ± c in the clipped term (verl cliprange_value; None: no clipping)",
        gt=0.0,
        optional=True,
    )


def clipped_value_loss(*, values, old_values, returns, mask, aggregate, config):
    """Clipped value loss: ½·aggregate(max((V − R)², (clip(V, V_old − c, V_old + c) − R)²)).

    All tensors (B, T); returns (0-d loss, metrics ``critic/vf_clipfrac``, ``critic/vpred_mean``).
    """
    finite = check_inputs("clipped value loss", mask, values=values, old_values=old_values, returns=returns)
    values = zero_masked(values, mask, finite)
    old_values = zero_masked(old_values.detach(), mask, finite)
    returns = zero_masked(returns.detach(), mask, finite)

    vf_losses1 = (values - returns) ** 2
    if config.value_clip is None:
        vf_losses = vf_losses1
        clipfrac = torch.zeros((), dtype=torch.float32, device=values.device)
    else:
        c = config.value_clip
        values_clipped = torch.clamp(values, old_values - c, old_values + c)
        vf_losses2 = (values_clipped - returns) ** 2
        vf_losses = torch.maximum(vf_losses1, vf_losses2)
        clipfrac = ops.masked_mean((vf_losses2 > vf_losses1).to(torch.float32), mask)
    loss = 0.5 * aggregate(vf_losses, mask)
    metrics = {
        "critic/vf_clipfrac": clipfrac,
        "critic/vpred_mean": ops.masked_mean(values.detach(), mask),
    }
    return loss, metrics
