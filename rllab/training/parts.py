"""The trainable parts of a run, built from its config: one construction for every caller.

:class:`rllab.Trainer` builds its run with these functions, and so does ``rllab replay`` (on the
recorded models), so what a config's ``[algorithm]``, component sections and ``[train]`` mean is
said once::

    parts = build_parts(cfg, lab)                         # the algorithm, the KL controller, the components by section
    ctx = run_context(cfg, parts.components, step=…, policy=…, reference=…, critic=…, rollout=…)
    optimizer, critic_optimizer = build_optimizers(cfg, handle, critic)   # AdamW, train.lr / critic_lr / weight_decay
    outcome = optimizers(cfg, policy=…, optimizer=…, critic=…, critic_optimizer=…).drive(parts.algorithm.step(ctx), …)

The policy is a :class:`PolicyHandle` (:func:`policy_handle`: the model whole, or with LoRA adapters).
Which models exist (policy, reference, critic by the algorithm's ``needs``), where they live and
the LR schedule stay the caller's.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Callable, Protocol

import attrs
import torch

from rllab.models import lora
from rllab.algorithm import RunContext
from rllab.config import COMPONENT_SECTIONS, ExperimentConfig
from rllab.errors import RllabError, UnknownComponentError
from rllab.parallel.reducer import SINGLE, Reducer
from rllab.training.optimizer import Optimizers
from rllab.specs import Component

if TYPE_CHECKING:
    from rllab.lab import Lab

STATEFUL = frozenset({"task", "env", "algorithm", "kl_controller", "backend", "sampler"})
"""Sections whose component holds state (or is built by its own stage): not in :func:`build_components`."""


def component(cfg: ExperimentConfig, lab: Lab, section: str) -> Component:
    """The configured component of ``section`` (not yet instantiated): its spec and frozen config."""
    ref = cfg.component(section)
    return Component(spec=lab.spec(COMPONENT_SECTIONS[section][0], ref.name), config=ref.config)


def check_installed(cfg: ExperimentConfig, lab: Lab) -> None:
    """Refuse a run whose components need a package that is not installed, before anything is
    built or created (a run directory): each configured component and logger whose registered
    function carries ``check_installed`` (a callable that raises :class:`rllab.MissingExtraError`,
    naming the ``pip install``) is asked. An environment adapter (gem, openenv, textarena) or a
    tracker's logger (wandb, mlflow, trackio, tensorboard) declares its package so. A component
    whose registered function carries ``needs`` (a callable given the component's config, returning
    the ``(kind, name)`` of the other registered components that config uses) has those asked too:
    the dataset task names the reward functions of its ``rewards`` knob (``rewards = ["remote"]``:
    requests)."""
    refs = [(COMPONENT_SECTIONS[sec][0], cfg.component(sec).name) for sec in cfg.components]
    refs += [("logger", ref.name) for ref in cfg.loggers]
    needed: list[tuple[str, str]] = []
    for sec in cfg.components:
        ref = cfg.component(sec)
        needs = getattr(lab.spec(COMPONENT_SECTIONS[sec][0], ref.name).fn, "needs", None)
        if needs is not None and not callable(needs):
            raise RllabError(f"{COMPONENT_SECTIONS[sec][0]} {ref.name!r}: its needs is {needs!r}, not a function to call (one "
                             f"given the component's config, returning (kind, name) pairs)")
        for pair in needs(ref.config) if needs is not None else ():
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise RllabError(f"{COMPONENT_SECTIONS[sec][0]} {ref.name!r}: its needs gave {pair!r}, not a (kind, name) "
                                 f"pair of strings such as ('reward_function', 'remote')")
            needed.append(tuple(pair))
    for kind, name in refs + needed:
        try:
            spec = lab.spec(kind, name)
        except UnknownComponentError:
            if (kind, name) in needed:  # not a registered name: the component says so when it loads it
                continue
            raise
        check = getattr(spec.fn, "check_installed", None)
        if check is not None and not callable(check):
            raise RllabError(f"{kind} {name!r}: its check_installed is {check!r}, not a function to call (one that raises "
                             f"rllab.MissingExtraError when a package is missing)")
        if check is not None:
            check()


def build_components(cfg: ExperimentConfig, lab: Lab, *, kl_controller: Any) -> dict[str, Any]:
    """The stateless components by section (not instantiated), and the KL controller (its instance)."""
    components: dict[str, Any] = {sec: component(cfg, lab, sec) for sec in cfg.components if sec not in STATEFUL}
    components["kl_controller"] = kl_controller
    return components


@attrs.frozen(kw_only=True)
class Parts:
    """What :func:`build_parts` builds."""

    algorithm: Any
    kl_controller: Any
    components: dict[str, Any]
    """By section, the KL controller included: :attr:`RunContext.components`."""


def build_parts(cfg: ExperimentConfig, lab: Lab) -> Parts:
    """The algorithm, the KL controller and the components of ``cfg`` (in that order)."""
    algorithm = component(cfg, lab, "algorithm")()
    kl_controller = component(cfg, lab, "kl_controller")()
    return Parts(algorithm=algorithm, kl_controller=kl_controller, components=build_components(cfg, lab, kl_controller=kl_controller))


def run_context(
    cfg: ExperimentConfig, components: dict[str, Any], *, step: int, policy: torch.nn.Module, reference: torch.nn.Module | None = None,
    critic: torch.nn.Module | None = None, rollout: Any = None, device: torch.device = torch.device("cpu"),
    autocast_dtype: torch.dtype | None = None, hook: Any = None, reducer: Reducer = SINGLE, run_dir: Any = None,
) -> RunContext:
    """What the algorithm sees at ``step``; ``kl_coef`` is the KL controller's value now."""
    return RunContext(
        step=step, config=cfg, components=components, rollout=rollout, policy=policy, reference=reference, critic=critic,
        kl_coef=float(components["kl_controller"].value), device=device, autocast_dtype=autocast_dtype, hook=hook, reducer=reducer, run_dir=run_dir,
    )


def adamw(cfg: ExperimentConfig, params, lr: float) -> torch.optim.AdamW:
    """AdamW over ``params`` at ``lr``, with ``train.weight_decay``."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.train.weight_decay)


def build_optimizers(cfg: ExperimentConfig, policy: "PolicyHandle", critic: torch.nn.Module | None = None, *,
                     state: dict | None = None, lr: float | None = None) -> tuple[torch.optim.AdamW, torch.optim.AdamW | None]:
    """The policy's optimizer (the handle's trainable parameters: all, or the LoRA adapters; ``train.lr``)
    and the critic's (``train.critic_lr``; None without a critic). ``state``: a policy optimizer's
    ``state_dict`` to continue from (AdamW's moments); ``lr``: the policy's learning rate now, in
    place of ``train.lr`` (e.g. the LR schedule's value at a recorded step)."""
    optimizer = adamw(cfg, policy.trainable_parameters(), cfg.train.lr)
    if state is not None:
        optimizer.load_state_dict(copy.deepcopy(state))
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    critic_optimizer = adamw(cfg, critic.parameters(), cfg.train.critic_lr) if critic is not None else None
    return optimizer, critic_optimizer


def optimizers(cfg: ExperimentConfig, *, policy: torch.nn.Module, optimizer, critic: torch.nn.Module | None = None, critic_optimizer=None,
               observe: Callable | None = None, clip: Callable | None = None) -> Optimizers:
    """The driver that answers the algorithm's optimizer steps (``train.max_grad_norm``; ``observe``
    and ``clip``: see :class:`rllab.Optimizers`)."""
    return Optimizers(policy=policy, optimizer=optimizer, critic=critic, critic_optimizer=critic_optimizer,
                      max_grad_norm=cfg.train.max_grad_norm, observe=observe, clip=clip)


class PolicyHandle(Protocol):
    """The trainer's one view of its policy: :class:`FullPolicy` (every weight trains) or
    :class:`rllab.models.lora.LoraPolicy` (adapters through peft). Besides what a placement asks of it
    (:class:`rllab.parallel.placement.PolicyWeights`: the module, its checkpoint state, the weights the
    rollout side samples from), it owns the trainable parameters, the reference, the critic's
    starting weights and what the run reports and writes at its end."""

    @property
    def module(self) -> torch.nn.Module: ...

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...

    def counts(self) -> dict[str, float]:
        """Metrics added to each step's row."""

    def summary(self) -> dict[str, Any]:
        """Entries added to ``final.json``."""

    def build_reference(self, placement: Any, load: Callable[[], torch.nn.Module], device: torch.device) -> torch.nn.Module: ...

    def critic(self) -> torch.nn.Module:
        """A critic from the policy's weights now (:meth:`rllab.parallel.placement.Placement.build_critic`'s ``current``)."""

    def state_keys(self) -> list[str] | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Any) -> None: ...

    def sampler_module(self) -> torch.nn.Module: ...

    def sampler_state(self, placement: Any, *, cpu: bool) -> dict[str, torch.Tensor]: ...

    def save_final(self, run_dir: Any, placement: Any, *, tokenizer: Any = None) -> None:
        """What the run writes of the policy besides its checkpoints, when it ends (``tokenizer``:
        the run's, for a model directory written there)."""


@attrs.define(eq=False)
class FullPolicy:
    """The policy handle of full fine-tuning: every parameter trains and is checkpointed, the
    rollout side samples from the policy itself, the reference is a second copy the placement
    builds (:class:`PolicyHandle`)."""

    module: torch.nn.Module

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return lora.trainable_parameters(self.module)

    def counts(self) -> dict[str, float]:
        return {}

    def summary(self) -> dict[str, Any]:
        return {}

    def build_reference(self, placement: Any, load: Callable[[], torch.nn.Module], device: torch.device) -> torch.nn.Module:
        return placement.build_reference(load, device)

    def critic(self) -> torch.nn.Module:
        from rllab.models.forward import CriticModel

        return CriticModel.from_causal_lm(self.module)

    def state_keys(self) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.module.load_state_dict(state)

    def sampler_module(self) -> torch.nn.Module:
        return self.module

    def sampler_state(self, placement: Any, *, cpu: bool) -> dict[str, torch.Tensor]:
        return placement.full_state_dict(self.module, cpu=cpu)

    def save_final(self, run_dir: Any, placement: Any, *, tokenizer: Any = None) -> None:
        """The final policy as a Hugging Face model directory, ``RUN_DIR/model``
        (:func:`rllab.models.hfdir.write_model_dir`); sharded: gathered in full, written by rank
        0; every rank calls it."""
        from pathlib import Path

        from rllab.models.hfdir import MODEL_DIR, write_model_dir

        state = placement.full_state_dict(self.module, cpu=True) if placement.sharded else None
        if placement.speaks:
            write_model_dir(self.module, tokenizer, Path(run_dir) / MODEL_DIR, state_dict=state)
        if placement.sharded:
            placement.reducer.barrier()


def policy_handle(model: torch.nn.Module, model_cfg: Any) -> PolicyHandle:
    """``model`` as the run's policy handle: adapters attached in place (``[model] lora``), or the
    model whole (the one place that tells full fine-tuning from LoRA)."""
    lora_cfg = lora.lora_config(model_cfg)
    return FullPolicy(model) if lora_cfg is None else lora.LoraPolicy.attach(model, lora_cfg)
