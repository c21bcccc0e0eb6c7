"""The ``single`` placement: one process, one device (a row of :data:`rllab.parallel.placement.STRATEGIES`).

Models are moved to ``model.device``, gradients clipped by ``clip_grad_norm_`` over plain
gradients, checkpoints are ``state.pt`` files (:mod:`rllab.parallel.checkpoint`), and the rollout backend
gets the policy's sampler module itself (:meth:`rllab.parallel.placement.PolicyWeights.sampler_module`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rllab.parallel import checkpoint
from rllab.parallel import distributed
from rllab.parallel.distributed import Reducer
from rllab.errors import RllabError


def _same(model: torch.nn.Module) -> torch.nn.Module:
    return model


class Single:
    """One process, one device (see the module docstring); implements :class:`rllab.parallel.placement.Placement`."""

    name = "single"
    data_parallel = False
    sharded = False

    def __init__(self, *, device: torch.device):
        self.device = device
        self.reducer = distributed.SINGLE

    @classmethod
    def start(cls, model_cfg: Any, *, device_type: str) -> Reducer:
        """The reducer of one process (no process group)."""
        return distributed.SINGLE

    @classmethod
    def for_config(cls, model_cfg: Any, *, device: torch.device, compute_dtype: torch.dtype | None) -> "Single":
        return cls(device=device)

    @property
    def speaks(self) -> bool:
        return True

    def quiet(self, hook: Any) -> Any:
        """The event hooks this rank announces to (all of them in one process)."""
        return hook

    def build_policy(self, load: Callable[[], torch.nn.Module], prepare: Callable[[torch.nn.Module], torch.nn.Module] = _same) -> torch.nn.Module:
        """``load()`` gives the float32 model on CPU; returns it placed for training, after
        ``prepare`` (gradient checkpointing, LoRA adapters) changed it in place."""
        return prepare(load().to(self.device))

    def build_reference(self, load: Callable[[], torch.nn.Module], device: torch.device) -> torch.nn.Module:
        return load().to(device).eval().requires_grad_(False)

    def build_critic(self, load: Callable[[], torch.nn.Module], current: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """A critic whose backbone is a copy of the policy's current one (``current()``)."""
        return current().to(self.device)

    def clip_grad_norm(self, params: list[torch.Tensor], limit: float) -> float:
        """The L2 norm of the gradients before clipping them to ``limit`` (``math.inf``: no clip)."""
        return float(torch.nn.utils.clip_grad_norm_(params, limit))

    def sync_weights(self, backend: Any, policy: Any) -> Any:
        """``backend.update_weights`` with the policy's sampler module (the policy itself, or a
        merged view of it); its metrics."""
        return backend.update_weights(policy.sampler_module())

    def full_state_dict(self, module: torch.nn.Module, *, cpu: bool) -> dict[str, torch.Tensor]:
        """``module``'s state dict (its tensors are full already; ``cpu``: copied there)."""
        return {k: v.cpu() if cpu else v for k, v in module.state_dict().items()}

    def gather_full(self, params: list[torch.Tensor], *, cpu: bool = False) -> list[torch.Tensor]:
        """The parameters' tensors, detached (they are full already; ``cpu``: copied there)."""
        return [p.detach().cpu() if cpu else p.detach() for p in params]

    def keeps_full_copy(self, cpu: bool) -> bool:
        """Nothing is gathered in one process: there is nothing to keep."""
        return False

    def model_states(self, *, policy: Any, optimizer: Any, critic: Any, critic_optimizer: Any) -> dict[str, Any]:
        """The policy handle's checkpoint state and the others' ``state_dict`` (None stays None)."""
        models = {"policy": policy, "optimizer": optimizer, "critic": critic, "critic_optimizer": critic_optimizer}
        return {k: None if v is None else v.state_dict() for k, v in models.items()}

    def save(self, run_dir, step: int, state: dict):
        return checkpoint.save(run_dir, step, state)

    def load(self, path) -> dict:
        state = checkpoint.load(path)
        if "sharded" in state:
            raise RllabError(
                f"checkpoint {path} was written by model.strategy = 'fsdp2' on {state['sharded']['world_size']} rank(s); "
                f"this run's strategy is 'single': resume it with torchrun and model.strategy = 'fsdp2'"
            )
        return state

    def load_model_states(self, path, state: dict, *, policy: Any, optimizer: Any, critic: Any, critic_optimizer: Any) -> None:
        """Load the models' and optimizers' states of a checkpoint read by :meth:`load`."""
        policy.load_state_dict(state["policy"])
        optimizer.load_state_dict(state["optimizer"])
        if state["critic"] is not None:
            if critic is None:
                raise RllabError(f"checkpoint {path} has a critic but this run's algorithm does not use one")
            critic.load_state_dict(state["critic"])
            critic_optimizer.load_state_dict(state["critic_optimizer"])
