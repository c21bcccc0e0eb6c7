"""Where the models live and how their parameters are sharded: the :class:`Placement` protocol and
the table of strategies that implement it, keyed by ``[model] strategy``.

The trainer asks its placement to build the policy, reference and critic, to clip gradients, to
hand weights to the rollout backend and to save and load checkpoints, and never branches on
which one it has; every other module asks a strategy's traits (:class:`Strategy`:
``data_parallel``, ``sharded``), never its name:

================ ==========================================================================
``single``       one process, one device (:mod:`rllab.parallel.single`): models moved to
                 ``model.device``, ``clip_grad_norm_`` over plain gradients, ``state.pt``
                 checkpoints
``fsdp2``        one process per device under ``torchrun`` (:mod:`rllab.parallel.fsdp2`):
                 PyTorch's FSDP2 on every decoder layer and at the root, data parallel over whole
                 prompt groups (:mod:`rllab.parallel.distributed`), sharded checkpoints through
                 ``torch.distributed.checkpoint`` (:mod:`rllab.parallel.dcp`)
================ ==========================================================================

A placement moves and gathers whole models and full state dicts; it knows nothing of adapters.
What it needs of the policy is a :class:`PolicyWeights` handle (:mod:`rllab.training.parts` builds the
plain one, :class:`rllab.models.lora.LoraPolicy` the LoRA one): which module trains, which of its state
keys a checkpoint holds, and the weights the rollout side samples from.

This module imports no torch: the config checks read the table before any model exists. A new
strategy is one module with a class that implements :class:`Placement` and one row in
:data:`STRATEGIES` (CONTRIBUTING.md, "Adding a placement strategy").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

import attrs

from rllab.errors import RllabError

if TYPE_CHECKING:
    import torch

    from rllab.parallel.distributed import Reducer


class PolicyWeights(Protocol):
    """What a placement asks of the policy handle (:mod:`rllab.training.parts`, :mod:`rllab.models.lora`)."""

    @property
    def module(self) -> "torch.nn.Module":
        """The module that trains (placed or sharded by :meth:`Placement.build_policy`)."""

    def state_keys(self) -> list[str] | None:
        """The keys of :attr:`module`'s state dict a checkpoint holds (None: all of them)."""

    def state_dict(self) -> dict[str, Any]:
        """An unsharded module's checkpoint state (:meth:`state_keys` of its state dict)."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load what :meth:`state_dict` gave back into an unsharded module."""

    def sampler_module(self) -> "torch.nn.Module":
        """A plain module (unsharded policy) holding the weights the rollout side samples from."""

    def sampler_state(self, placement: "Placement", *, cpu: bool) -> dict[str, "torch.Tensor"]:
        """A plain model's full state dict (sharded policy), gathered through ``placement``
        (``cpu``: on the speaking rank's CPU only, ``{}`` on the others)."""


class Placement(Protocol):
    """One strategy's answers to the trainer (``rllab.parallel.single.Single``, ``rllab.parallel.fsdp2.FSDP2``)."""

    name: str
    data_parallel: bool
    """One process per device under a launcher, each rank sampling and training on its own rows."""
    sharded: bool
    """Parameters are sharded over the ranks: full tensors must be gathered (:meth:`gather_full`)."""
    device: "torch.device"
    reducer: "Reducer"

    @property
    def speaks(self) -> bool:
        """Whether this rank writes the run directory's files and announces events."""

    def quiet(self, hook: Any) -> Any:
        """The event hooks this rank announces to (the run's own where it speaks)."""

    def build_policy(self, load: Callable[[], "torch.nn.Module"], prepare: Callable[["torch.nn.Module"], "torch.nn.Module"]) -> "torch.nn.Module": ...

    def build_reference(self, load: Callable[[], "torch.nn.Module"], device: "torch.device") -> "torch.nn.Module": ...

    def build_critic(self, load: Callable[[], "torch.nn.Module"], current: Callable[[], "torch.nn.Module"]) -> "torch.nn.Module":
        """A critic: ``current()`` (one from the policy's weights now) or from ``load()`` (the model on disk)."""

    def clip_grad_norm(self, params: list["torch.Tensor"], limit: float) -> float: ...

    def sync_weights(self, backend: Any, policy: PolicyWeights) -> Any:
        """The rollout backend gets the policy's sampler weights; its metrics."""

    def full_state_dict(self, module: "torch.nn.Module", *, cpu: bool) -> dict[str, "torch.Tensor"]: ...

    def gather_full(self, params: list["torch.Tensor"], *, cpu: bool = False) -> list["torch.Tensor"]: ...

    def keeps_full_copy(self, cpu: bool) -> bool:
        """Whether a caller may keep gathered full tensors between syncs (cheap where they land)."""

    def model_states(self, *, policy: PolicyWeights, optimizer: Any, critic: Any, critic_optimizer: Any) -> dict[str, Any]: ...

    def save(self, run_dir: Any, step: int, state: dict) -> Any: ...

    def load(self, path: Any) -> dict: ...

    def load_model_states(self, path: Any, state: dict, *, policy: PolicyWeights, optimizer: Any, critic: Any, critic_optimizer: Any) -> None: ...


@attrs.frozen(kw_only=True)
class Strategy:
    """A row of :data:`STRATEGIES`: a strategy's traits (readable without torch) and its class."""

    name: str
    data_parallel: bool
    """One process per device under ``torchrun`` (``WORLD_SIZE`` processes); False: one process."""
    sharded: bool
    """Parameters are sharded over the ranks (``model.cpu_offload`` applies)."""
    module: str
    """The module of the class implementing :class:`Placement` (it imports torch; loaded by name on
    first use, as an entry point is, so this table stays in the kernel without importing the
    machinery)."""
    attr: str
    """That class's name in :attr:`module`."""

    def cls(self) -> type:
        return getattr(importlib.import_module(self.module), self.attr)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(name="single", data_parallel=False, sharded=False, module="rllab.parallel.single", attr="Single"),
        Strategy(name="fsdp2", data_parallel=True, sharded=True, module="rllab.parallel.fsdp2", attr="FSDP2"),
    )
}
"""Every ``[model] strategy``, by name: the one place that names them."""


def strategy(name: str) -> Strategy:
    """The row of :data:`STRATEGIES` for ``name`` (refused, naming the choices, when there is none)."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise RllabError(f"[model] strategy = {name!r} is not a placement strategy; choose one of {', '.join(map(repr, STRATEGIES))}") from None


def names(**traits: bool) -> list[str]:
    """The strategies whose traits have these values, e.g. ``names(data_parallel=True)``."""
    return [s.name for s in STRATEGIES.values() if all(getattr(s, k) == v for k, v in traits.items())]


def for_config(model_cfg: Any, *, device: "torch.device", compute_dtype: "torch.dtype | None") -> Placement:
    """The placement ``model_cfg.strategy`` names, on ``device`` (a data-parallel one: this rank's device)."""
    return strategy(model_cfg.strategy).cls().for_config(model_cfg, device=device, compute_dtype=compute_dtype)


def start(model_cfg: Any, *, device_type: str) -> "Reducer":
    """The run's reducer, joining the process group first for a data-parallel strategy (the entry
    points agree on a run directory through it before a trainer exists)."""
    return strategy(model_cfg.strategy).cls().start(model_cfg, device_type=device_type)

