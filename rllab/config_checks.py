"""Load-time checks of an experiment config that need only the config (no model, no batch).

Each refuses, with a :class:`~rllab.errors.ConfigError` naming the section, the component and its
plugin, a combination that would otherwise fail only after the model is built (or not at all):

- a policy loss that receives the rollout engine's log-probs as ``old_log_prob`` (its trait
  ``old_log_prob="rollout"``, bypass mode) with an importance correction other than ``none``,
  which would be applied on top of the loss's own;
- a rollout backend that needs the policy on CUDA for a config (its trait ``needs_cuda``, e.g.
  SGLang's ``weight_sync = "tensor"``) while ``[model] device`` is the CPU (``auto`` is checked by
  the trainer once resolved, before it builds anything).

Called by :func:`rllab.config.validate` after the components are built.
"""

from __future__ import annotations

from typing import Any, Mapping

from rllab.errors import ConfigError
from rllab.lab import Lab
from rllab.tomlio import line_of


def check_config_only(lab: Lab, components: Mapping[str, Any], model: Any, *, unused: frozenset, text: str, where: str) -> None:
    """Every check of this module, on the built ``components`` (section → ComponentRef) and the
    ``[model]`` settings; ``unused`` are the sections the algorithm does not read (not checked)."""
    if "policy_loss" not in unused and "correction" not in unused:
        _check_bypass_correction(lab, components, text=text, where=where)
    if "backend" not in unused:
        check_backend_device(lab, components, str(model.device), text=text, where=where)


def _check_bypass_correction(lab: Lab, components: Mapping[str, Any], *, text: str, where: str) -> None:
    loss, corr = components["policy_loss"], components["correction"]
    spec = lab.spec("policy_loss", loss.name)
    if spec.trait("old_log_prob", loss.config) != "rollout" or corr.name == "none":
        return
    raise ConfigError(
        f"{where}: [correction]{line_of(text, 'correction', 'name') or line_of(text, None, 'correction')} "
        f"policy_loss {loss.name!r} (plugin {spec.provider}) corrects for the sampler itself (bypass mode: it "
        f"receives the rollout engine's log-probs as old_log_prob), so correction {corr.name!r} would be applied "
        f"on top of it: set correction = \"none\", or use a policy loss without bypass mode with {corr.name!r}.",
        key="correction",
    )


def check_backend_device(lab: Lab, components: Mapping[str, Any], device: str, *, text: str = "", where: str = "<config>") -> None:
    """Refuse a backend whose ``needs_cuda`` trait is set for its config when the policy's
    ``device`` (``[model] device``, or the device ``auto`` resolved to) is not CUDA. ``auto`` is
    left to the trainer, which calls this with the resolved device before it builds anything
    (a config may be loaded on a machine without the run's GPU)."""
    backend = components["backend"]
    spec = lab.spec("rollout_backend", backend.name)
    reason = spec.trait("needs_cuda", backend.config)
    if reason is None or device == "auto" or device.startswith("cuda"):
        return
    raise ConfigError(
        f"{where}: [backend]{line_of(text, 'backend', 'name') or line_of(text, None, 'backend')} rollout_backend "
        f"{backend.name!r} (plugin {spec.provider}) needs the policy on CUDA: {reason}; but the policy is on {device} "
        f"([model] device). Set [model] device = \"cuda\" on a GPU machine, or change the backend's setting.",
        key="backend",
    )


def check_model_settings(model: Any, text: str, where: str) -> None:
    """Validate ``model.tiny`` / ``model.warm_start`` against the tiny model's own config classes,
    and ``model.lora`` when adapters are asked for."""
    from rllab import tinymodel
    from rllab.specs import ComponentSpec, build_config

    for key, cls in (("tiny", tinymodel.TinyModelConfig), ("warm_start", tinymodel.WarmStartConfig)):
        pseudo = ComponentSpec(kind="section", name=f"model.{key}", fn=lambda: None, config=cls, provider="rllab")
        try:
            build_config(pseudo, getattr(model, key))
        except ConfigError as e:
            msg = str(e).replace(f"section 'model.{key}' (plugin rllab)", f"[model] {key}")
            raise ConfigError(f"{where}: {msg}{line_of(text, 'model', key)}") from None
    if model.lora:  # rllab.lora imports torch: only when adapters are asked for
        from rllab import lora

        lora.check_settings(model, text=text, where=where)
