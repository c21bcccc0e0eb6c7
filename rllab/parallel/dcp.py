"""Sharded checkpoints of an ``fsdp2`` run, through ``torch.distributed.checkpoint``.

The directory layout and guarantees are :mod:`rllab.parallel.checkpoint`'s (``checkpoints/step_NNNNNN``,
written under a temporary name and renamed into place by rank 0, ``checkpoints/latest``, the
newest ``keep`` kept, nothing written when a weight is NaN or inf); inside it::

    state.pt            rank 0: step, scheduler, KL controller, algorithm, config, history and
                        {"sharded": {"world_size": W, "critic": bool}}
    rng_rank{R}.pt      each rank's torch and Python RNG states
    model/              torch.distributed.checkpoint: each rank's shards of the policy (LoRA: of its
                        adapters only), its AdamW state, and the critic's (keyed by parameter name)

A resume must run on the same number of ranks as the save: the RNG streams are per rank. A
different world size is refused, naming both.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from rllab.parallel import checkpoint
from rllab.parallel.checkpoint import CHECKPOINTS
from rllab.parallel.reducer import Reducer
from rllab.errors import NonFiniteError, RllabError

_MODELS = ("policy", "optimizer", "critic", "critic_optimizer")


def _local(value: Any) -> Any:
    return value.to_local() if hasattr(value, "to_local") else value


def _nonfinite(tree: Any, prefix: str = "") -> list[str]:
    """Names of this rank's floating-point shards in a nested state dict that hold NaN or inf."""
    bad = []
    items = tree.items() if isinstance(tree, dict) else ()
    for k, v in items:
        name = f"{prefix}{k}"
        v = _local(v)
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            if v.numel() and not bool(torch.isfinite(v).all()):
                bad.append(name)
        elif isinstance(v, dict):
            bad.extend(_nonfinite(v, prefix=name + "."))
    return bad


def save(run_dir: Path, step: int, state: dict, *, reducer: Reducer, keep: int = 2) -> Path:
    """Write ``state`` (model entries as sharded state dicts) as the checkpoint after ``step``.

    Every rank calls it. Raises :class:`NonFiniteError` on every rank (and writes nothing) when
    any rank's policy or critic shard holds NaN or inf.
    """
    import torch.distributed.checkpoint as dcp

    bad = [f"{k}.{n}" for k in ("policy", "critic") if state.get(k) is not None for n in _nonfinite(state[k])]
    if reducer.sum(len(bad)):
        shown = ", ".join(bad[:5]) or "on another rank"
        raise NonFiniteError(f"refusing to write the checkpoint after step {step}: non-finite weights (rank {reducer.rank}: {shown})", step=step)
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if reducer.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    reducer.barrier()
    models = {k: state[k] for k in _MODELS if state.get(k) is not None}
    dcp.save(models, checkpoint_id=str(tmp / "model"))
    rest = {k: v for k, v in state.items() if k not in _MODELS and k != "rng"}
    rest["sharded"] = {"world_size": reducer.world_size, "critic": state.get("critic") is not None}
    torch.save(state["rng"], tmp / f"rng_rank{reducer.rank}.pt")
    if reducer.is_main:
        torch.save(rest, tmp / "state.pt")
    reducer.barrier()
    if reducer.is_main:
        checkpoint.publish(root, tmp, final, keep=keep)
    reducer.barrier()
    return final


def load(path: Path, *, reducer: Reducer) -> dict:
    """The non-model state of a sharded checkpoint, with this rank's RNG states under ``rng``."""
    path = Path(path)
    state = torch.load(path / "state.pt", weights_only=False)
    sharded = state.get("sharded")
    if sharded is None:
        raise RllabError(f"checkpoint {path} was written by model.strategy = 'single'; this run's strategy is 'fsdp2': resume it without torchrun")
    if sharded["world_size"] != reducer.world_size:
        raise RllabError(
            f"checkpoint {path} was written on {sharded['world_size']} rank(s) but this run has {reducer.world_size}: "
            f"resume with `torchrun --nproc-per-node {sharded['world_size']}` (the RNG streams are per rank)"
        )
    state["rng"] = torch.load(path / f"rng_rank{reducer.rank}.pt", weights_only=False)
    return state


def load_models(path: Path, state: dict, *, reducer: Reducer, policy, optimizer, critic, critic_optimizer) -> None:
    """Load this rank's shards of the models and optimizers from a checkpoint read by :func:`load`.
    ``policy`` is a policy handle (:class:`rllab.parallel.placement.PolicyWeights`): its module, of whose
    state dict the checkpoint holds :meth:`~rllab.parallel.placement.PolicyWeights.state_keys` (None: all)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    has_critic = state["sharded"]["critic"]
    if has_critic and critic is None:
        raise RllabError(f"checkpoint {path} has a critic but this run's algorithm does not use one")
    pairs = [("policy", "optimizer", policy.module, optimizer, policy.state_keys())]
    if has_critic:
        pairs.append(("critic", "critic_optimizer", critic, critic_optimizer, None))
    target = {}
    for m_key, o_key, module, opt, keys in pairs:
        # some of the module's state (e.g. adapters): the rest comes from the model directory
        target[m_key], target[o_key] = get_state_dict(module, opt)
        if keys is not None:
            target[m_key] = {k: target[m_key][k] for k in keys}
    dcp.load(target, checkpoint_id=str(Path(path) / "model"))
    for m_key, o_key, module, opt, keys in pairs:
        set_state_dict(module, opt, model_state_dict=target[m_key], optim_state_dict=target[o_key],
                       options=StateDictOptions(strict=keys is None))
