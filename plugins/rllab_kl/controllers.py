"""KL-coefficient controllers: they hold β, the weight of the KL penalty.

* ``fixed``: β never changes.
* ``adaptive``: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", §2.2:
  e = clip(KL / KL_target − 1, −0.2, 0.2); β ← β·(1 + e·n_steps / horizon). ``n_steps`` counts
  samples (verl passes the batch size), so ``horizon`` is measured in samples too.
"""

from __future__ import annotations

import math

import attrs

import rllab


@attrs.frozen
class FixedKLConfig:
    """Knobs of the fixed KL controller."""

    kl_coef: float = rllab.knob(0.001, help="β, the KL coefficient (verl's default 0.001)", ge=0.0)


class FixedKLController:
    """β stays at ``kl_coef``."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl, n_steps) -> None:
        """No-op."""

    def __repr__(self):
        return f"FixedKLController(value={self.value!r})"


@attrs.frozen
class AdaptiveKLConfig:
    """Knobs of the adaptive KL controller (Ziegler et al. 2019)."""

    kl_coef: float = rllab.knob(0.001, help="initial β (verl's default 0.001)", gt=0.0)
    target_kl: float = rllab.knob(0.1, help="KL_target the controller steers towards (verl's default 0.1)", gt=0.0)
    horizon: float = rllab.knob(
        10000.0, help="samples over which a ±20% correction of β is spread (verl's default 10000)", gt=0.0
    )


class AdaptiveKLController:
    """β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·n_steps/horizon), once per training step."""

    def __init__(self, kl_coef: float, target_kl: float, horizon: float):
        self.value = float(kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl, n_steps) -> None:
        """Move β towards keeping ``current_kl`` at the target.

        :param current_kl: the KL measured this step (float or 0-d tensor), typically the batch
            mean of the per-token penalty.
        :param n_steps: samples this step contributed (verl passes the batch size).
        """
        kl = float(current_kl)
        if not math.isfinite(kl):
            raise ValueError(f"AdaptiveKLController.update: current_kl must be finite, got {kl}")
        if n_steps < 0:
            raise ValueError(f"AdaptiveKLController.update: n_steps must be ≥ 0, got {n_steps}")
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        mult = 1.0 + error * n_steps / self.horizon
        if mult <= 0.0:
            raise ValueError(
                f"AdaptiveKLController.update: n_steps / horizon = {n_steps}/{self.horizon} is so large that β "
                f"would become {self.value * mult}; use a horizon well above the samples per step"
            )
        self.value *= mult

    def __repr__(self):
        return f"AdaptiveKLController(value={self.value!r}, target={self.target!r}, horizon={self.horizon!r})"


def fixed(*, config):
    """Fixed β."""
    return FixedKLController(config.kl_coef)


def adaptive(*, config):
    """Adaptive β (Ziegler et al. 2019): proportional control of the measured KL towards a target."""
    return AdaptiveKLController(config.kl_coef, config.target_kl, config.horizon)
