"""The ``fsdp2`` placement: one process per device under ``torchrun`` (a row of
:data:`rllab.parallel.placement.STRATEGIES`): PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) on
every decoder layer and at the root, data parallel over whole prompt groups
(:mod:`rllab.parallel.distributed`), sharded checkpoints through ``torch.distributed.checkpoint``
(:mod:`rllab.parallel.dcp`).

* Mixed precision: parameters are float32 master weights; the forward/backward compute dtype is
  ``model.dtype`` (``auto``: bfloat16 on CUDA, float32 on CPU) and gradients are reduced in
  float32 (``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``). On CPU with gloo
  everything is float32.
* Gradients: FSDP averages them over ranks; a rank's loss is its share of the *global* loss (the
  aggregation's normalisers are all-reduced), so the gradient of the global loss is the sum, and
  :meth:`FSDP2.clip_grad_norm` multiplies by the world size before measuring and clipping the
  global norm over the sharded (DTensor) gradients.
* ``model.cpu_offload`` (CUDA only): parameters, gradients and optimizer state live in CPU memory between
  uses (``CPUOffloadPolicy``).
* The reference is sharded like the policy, or a full frozen copy on CPU when
  ``model.reference_device = "cpu"``; the critic (backbone and value head) is sharded like the
  policy and starts from the model's weights on disk.
* The chunked hidden-state log-prob path (and the fused/Triton head) reads the LM head's weight
  outside the model's forward, where FSDP2 holds only a shard: sharded models take the model's
  own forward instead (:func:`rllab.models.forward.supports_hidden_path`).
* Weights to the rollout side (:meth:`FSDP2.sync_weights`): the policy handle gives a plain
  model's full state dict (:meth:`rllab.parallel.placement.PolicyWeights.sampler_state`), gathered through
  :meth:`FSDP2.full_state_dict` / :meth:`FSDP2.gather_full`. The ``hf`` backend on each rank
  samples that rank's prompts from a full copy of the weights, gathered after every update. A
  backend whose servers every rank shares (one with a ``follow_weights`` method: ``sglang``)
  gets them from rank 0 alone: the full state dict is gathered into rank 0's CPU memory, loaded
  into a plain CPU copy of the model and pushed (``sglang``: saved as a model directory the
  servers load); the other ranks wait for the push, then ``follow_weights()`` counts the new
  weight version without sending anything.
* Adapters are the policy handle's (:mod:`rllab.models.lora`): it adds them in ``prepare`` before the
  model is sharded, names the state keys a checkpoint keeps, merges the gathered weights and
  decides what to keep between syncs (:meth:`FSDP2.keeps_full_copy` says where that is cheap).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rllab.parallel import checkpoint
from rllab.parallel import distributed
from rllab.parallel.distributed import Reducer
from rllab.errors import RllabError
from rllab.members import member


def _same(model: torch.nn.Module) -> torch.nn.Module:
    return model


class Silent:
    """The event hooks of a rank that does not speak: each hook of ``hook`` (by name) drops its
    event and returns no results; a name the run's hooks lack is an ``AttributeError``, as there."""

    def __init__(self, hook: Any):
        for name, caller in vars(hook).items():
            if callable(caller):
                setattr(self, name, _drop)


def _drop(**kwargs: Any) -> list:
    return []


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model (the classes its ``_no_split_modules`` names)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not layers:
        raise RllabError(
            f"model.strategy = 'fsdp2': cannot find the decoder layers of {type(model).__name__} "
            f"(no module of the classes in its _no_split_modules = {sorted(names)})"
        )
    return layers


class FSDP2:
    """FSDP2 data parallel under ``torchrun`` (see the module docstring)."""

    name = "fsdp2"
    data_parallel = True
    sharded = True

    def __init__(self, *, device: torch.device, reducer: Reducer, compute_dtype: torch.dtype | None, cpu_offload: bool):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        if cpu_offload and device.type == "cpu":
            raise RllabError(
                "model.cpu_offload = true moves shards from an accelerator to CPU memory between uses, but this run "
                "trains on cpu already (model.device); drop model.cpu_offload"
            )
        self.device = device
        self.reducer = reducer
        self.mesh = init_device_mesh(device.type, (reducer.world_size,))
        self.mp = MixedPrecisionPolicy(param_dtype=compute_dtype or torch.float32, reduce_dtype=torch.float32)
        self.offload = CPUOffloadPolicy() if cpu_offload else None
        self._sampler_ready = False
        self._server_copy: torch.nn.Module | None = None  # rank 0's CPU copy for a backend with shared servers

    @classmethod
    def start(cls, model_cfg: Any, *, device_type: str) -> Reducer:
        """Join ``torchrun``'s process group (``model.world_size``: the number of processes it must have)."""
        return distributed.init_from_env(device_type=device_type, expected=model_cfg.world_size,
                                         timeout_s=model_cfg.collective_timeout_s)

    @classmethod
    def for_config(cls, model_cfg: Any, *, device: torch.device, compute_dtype: torch.dtype | None) -> "FSDP2":
        """This rank's placement (on CUDA: the device ``torchrun``'s ``LOCAL_RANK`` picked)."""
        reducer = cls.start(model_cfg, device_type=device.type)
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        return cls(device=device, reducer=reducer, compute_dtype=compute_dtype, cpu_offload=model_cfg.cpu_offload)

    @property
    def speaks(self) -> bool:
        """Rank 0 alone writes the run directory's files and announces events."""
        return self.reducer.is_main

    def quiet(self, hook: Any) -> Any:
        """The run's event hooks on rank 0; :class:`Silent` ones on the other ranks."""
        return hook if self.reducer.is_main else Silent(hook)

    def _shard(self, model: torch.nn.Module, *, layers_of: torch.nn.Module, units: tuple[torch.nn.Module, ...]) -> torch.nn.Module:
        """``fully_shard`` every decoder layer of ``layers_of``, then each of ``units`` (the modules
        whose own forward is called: the root of a causal LM, a critic's backbone and value head)."""
        from torch.distributed.fsdp import fully_shard

        kwargs: dict[str, Any] = {"mesh": self.mesh, "mp_policy": self.mp}
        if self.offload is not None:
            kwargs["offload_policy"] = self.offload
        else:
            model.to(self.device)
        for layer in _decoder_layers(layers_of):
            fully_shard(layer, **kwargs)
        for unit in units:
            fully_shard(unit, **kwargs)
        return model

    def build_policy(self, load: Callable[[], torch.nn.Module], prepare: Callable[[torch.nn.Module], torch.nn.Module] = _same) -> torch.nn.Module:
        """``prepare`` (gradient checkpointing, LoRA adapters) runs on the loaded model before it is sharded."""
        model = prepare(load())
        return self._shard(model, layers_of=model, units=(model,))

    def build_reference(self, load: Callable[[], torch.nn.Module], device: torch.device) -> torch.nn.Module:
        model = load().eval().requires_grad_(False)
        if device.type == "cpu" and self.device.type != "cpu":
            return model  # a full frozen copy on CPU, unsharded
        return self._shard(model, layers_of=model, units=(model,))

    def build_critic(self, load: Callable[[], torch.nn.Module], current: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """A critic from the model's weights on disk (``load()``: the policy's are sharded, so
        ``current`` is not asked), sharded like it; its ``values`` calls the backbone and the value
        head, each a unit of its own."""
        from rllab.models.forward import CriticModel

        import warnings

        # the value head's (B, T) output is a squeeze view; rllab never changes it in place, which is
        # what FSDP2's warning about views guards against
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPValueHead\) returned a view tensor")
        base = load()
        critic = CriticModel.from_causal_lm(base)
        return self._shard(critic, layers_of=critic.backbone, units=(critic.backbone, critic.value_head))

    def clip_grad_norm(self, params: list[torch.Tensor], limit: float) -> float:
        """Scale FSDP's rank-averaged gradients to the global loss's (× world size), then the
        global L2 norm over the sharded gradients, clipped to ``limit``."""
        with torch.no_grad():
            for p in params:
                p.grad.mul_(self.reducer.world_size)
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    def sync_weights(self, backend: Any, policy: Any) -> Any:
        """Full (gathered) weights to the backend: the policy handle's
        :meth:`~rllab.parallel.placement.PolicyWeights.sampler_state`; its metrics (rank 0's).

        Every rank calls it. A backend of its own on each rank (``hf``) gets a plain module the
        first time, a state dict after. A backend with ``follow_weights`` (shared servers) gets a
        plain CPU module from rank 0 only, and the other ranks follow once it is pushed. The
        tensors handed over may be ones the handle keeps between syncs: a backend copies them
        (``load_state_dict``), never writes into them."""
        shared = callable(member(backend, "rollout_backend", "follow_weights"))
        # shared servers: the full tensors land in rank 0's CPU memory only (the other ranks get {})
        full = policy.sampler_state(self, cpu=shared)
        if shared:
            metrics = None
            if self.reducer.is_main:
                if self._server_copy is None:
                    self._server_copy = _plain_model(policy.module.config, torch.device("cpu"))
                self._server_copy.load_state_dict(full, assign=True)  # the gathered tensors themselves, no copy
                del full
                self._server_copy.tie_weights()
                metrics = backend.update_weights(self._server_copy)
            self.reducer.barrier(slow=True)  # no rank samples before the servers hold the new weights
            if not self.reducer.is_main:
                backend.follow_weights()
            return metrics
        if self._sampler_ready:
            return backend.update_weights(full)
        self._sampler_ready = True
        plain = _plain_model(policy.module.config, self.device)
        plain.load_state_dict(full)
        return backend.update_weights(plain)

    def full_state_dict(self, module: torch.nn.Module, *, cpu: bool) -> dict[str, torch.Tensor]:
        """The full state dict of a sharded ``module``; every rank calls it. ``cpu``: the full
        tensors land in rank 0's CPU memory only (the other ranks get ``{}``)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu))

    def keeps_full_copy(self, cpu: bool) -> bool:
        """Whether gathered full tensors may be kept between syncs: those on rank 0's CPU (``cpu``)
        and any on a CPU device; not on an accelerator, where a kept copy would sit in each rank's
        device memory beside the ``hf`` sampler's own full copy."""
        return cpu or self.device.type == "cpu"

    def gather_full(self, params: list[torch.Tensor], *, cpu: bool = False) -> list[torch.Tensor]:
        """The full tensors of sharded parameters (DTensors), gathered in one all-gather; every
        rank calls it with the same parameters in the same order.

        A parameter sharded on dim 0 (``Shard(0)``, FSDP2's default) holds on rank ``r`` rows
        ``[r·c, min((r+1)·c, n))`` with ``c = ceil(n / world_size)`` (``torch.chunk``): each rank
        pads its shards to ``c`` rows, flattens and concatenates them, and the full tensor is the
        first ``n`` rows of the ranks' blocks in rank order. Any other placement is gathered by
        ``full_tensor()`` on its own (after the shared all-gather, on every rank alike).
        ``cpu``: the full tensors on rank 0's CPU only (the other ranks get an empty list), like
        ``get_model_state_dict(cpu_offload=True)``; else on this rank's device, on every rank."""
        import torch.distributed as dist
        from torch.distributed.tensor import Shard

        world = self.reducer.world_size
        on_dim0 = [tuple(p.placements) == (Shard(0),) for p in params]
        pieces, sizes = [], []
        for p, flat in zip(params, on_dim0):
            if not flat:
                continue
            local = p.to_local().detach()
            rows = -(-p.shape[0] // world)
            if local.shape[0] != max(0, min(rows, p.shape[0] - self.reducer.rank * rows)) or local.shape[1:] != p.shape[1:]:
                raise RllabError(f"model.strategy = 'fsdp2': a shard of shape {tuple(local.shape)} of a {tuple(p.shape)} parameter is not torch.chunk's dim-0 shard")
            block = local.new_zeros((rows, *p.shape[1:]))
            block[: local.shape[0]] = local
            pieces.append(block.reshape(-1))
            sizes.append(block.numel())
        gathered = []
        if pieces:
            mine = torch.cat(pieces).to(self.device)
            blocks = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(blocks, mine, group=self.mesh.get_group())
            gathered = [torch.cat(parts) for parts in zip(*(b.split(sizes) for b in blocks))]
        out, it = [], iter(gathered)
        for p, flat in zip(params, on_dim0):  # full_tensor() is a collective: every rank calls it
            full = next(it).view(-1, *p.shape[1:])[: p.shape[0]].to(p.dtype) if flat else p.full_tensor().detach()
            out.append(full.cpu() if cpu else full)
        return [] if cpu and not self.reducer.is_main else out

    def model_states(self, *, policy: Any, optimizer: Any, critic: Any, critic_optimizer: Any) -> dict[str, Any]:
        """Sharded state dicts: the policy handle's :meth:`~rllab.parallel.placement.PolicyWeights.state_keys`
        of its module's, the critic's whole (None stays None), and their optimizers'."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        out: dict[str, Any] = {}
        for name, key, module, opt, keys in (("policy", "optimizer", policy.module, optimizer, policy.state_keys()),
                                             ("critic", "critic_optimizer", critic, critic_optimizer, None)):
            if module is None:
                out[name] = out[key] = None
                continue
            state = get_model_state_dict(module)
            out[name] = {k: state[k] for k in keys} if keys is not None else state
            out[key] = get_optimizer_state_dict(module, opt)
        return out

    def save(self, run_dir, step: int, state: dict):
        from rllab.parallel import dcp

        return dcp.save(run_dir, step, state, reducer=self.reducer)

    def load(self, path) -> dict:
        from rllab.parallel import dcp

        return dcp.load(path, reducer=self.reducer)

    def load_model_states(self, path, state: dict, *, policy: Any, optimizer: Any, critic: Any, critic_optimizer: Any) -> None:
        from rllab.parallel import dcp

        dcp.load_models(path, state, reducer=self.reducer, policy=policy, optimizer=optimizer, critic=critic, critic_optimizer=critic_optimizer)


def _plain_model(config: Any, device: torch.device) -> torch.nn.Module:
    """A plain transformers model of ``config`` (no adapters, no shards) on ``device``, in eval mode."""
    import copy

    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(copy.deepcopy(config)).to(device).eval()
