"""Where the models live and how their parameters are sharded: one strategy object per run.

``[model] strategy`` picks it; the trainer asks it to build the policy, reference and critic, to
clip gradients, to hand weights to the rollout backend and to save and load checkpoints, and
never branches on which one it has:

================ ==========================================================================
``single``       one process, one device: today's behaviour (models moved to ``model.device``,
                 ``clip_grad_norm_`` over plain gradients, ``state.pt`` checkpoints)
``fsdp2``        one process per device under ``torchrun``: PyTorch's FSDP2
                 (``torch.distributed.fsdp.fully_shard``) on every decoder layer and at the root,
                 data parallel over whole prompt groups (:mod:`rllab.distributed`), sharded
                 checkpoints through ``torch.distributed.checkpoint`` (:mod:`rllab.dcp`)
================ ==========================================================================

``fsdp2`` details:

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
  own forward instead (:func:`rllab.models.supports_hidden_path`).
* Weights to the rollout side (:meth:`FSDP2.sync_weights`): the ``hf`` backend on each rank
  samples that rank's prompts from a full copy of the weights, gathered after every update. A
  backend whose servers every rank shares (one with a ``follow_weights`` method: ``sglang``)
  gets them from rank 0 alone: the full state dict is gathered into rank 0's CPU memory, loaded
  into a plain CPU copy of the model and pushed (``sglang``: saved as a model directory the
  servers load); the other ranks wait for the push, then ``follow_weights()`` counts the new
  weight version without sending anything.
* LoRA (:mod:`rllab.lora`): the adapters are added to the model before it is sharded (peft's LoRA
  layers live inside the decoder layers, so each layer's unit shards its base weights and
  adapters together); only the adapters train and reach the checkpoint; the reference is
  :class:`rllab.lora.AdaptersOff`; the rollout side gets the gathered weights with the adapters
  merged (:meth:`rllab.lora.LoraPolicy.merge_state_dict`); a critic starts from the model's
  weights on disk, like every sharded critic. The base weights never change, so the first sync
  gathers the full state dict and keeps its base tensors where they landed (rank 0's CPU memory
  for shared servers; each rank's memory for ``hf`` on CPU — not on an accelerator, where the
  kept copy would double each rank's device memory: there every sync gathers in full,
  :meth:`FSDP2.keeps_lora_base`); every later sync gathers only the adapters
  (one all-gather, :meth:`FSDP2.gather_full`) and merges them into that cached base. A resumed
  run is a new process with an empty cache: its first sync gathers in full (the checkpoint it
  loads holds the adapters only, so the base it caches is the run's).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rllab import checkpoint, distributed
from rllab.distributed import Reducer, is_sharded  # noqa: F401  (is_sharded: re-exported)
from rllab.errors import RllabError
from rllab.lora import LoraPolicy
from rllab.members import member


def _same(model: torch.nn.Module) -> torch.nn.Module:
    return model


class Single:
    """One process, one device (see the module docstring)."""

    name = "single"

    def __init__(self, *, device: torch.device):
        self.device = device
        self.reducer = distributed.SINGLE

    def build_policy(self, load: Callable[[], torch.nn.Module], prepare: Callable[[torch.nn.Module], torch.nn.Module] = _same) -> torch.nn.Module:
        """``load()`` gives the float32 model on CPU; returns it placed for training, after
        ``prepare`` (gradient checkpointing, LoRA adapters) changed it in place."""
        return prepare(load().to(self.device))

    def build_reference(self, load: Callable[[], torch.nn.Module], device: torch.device) -> torch.nn.Module:
        return load().to(device).eval().requires_grad_(False)

    def build_critic(self, policy: torch.nn.Module, load: Callable[[], torch.nn.Module], lora: LoraPolicy | None = None) -> torch.nn.Module:
        """A critic whose backbone is a copy of the policy's current one (LoRA: its merged weights)."""
        from rllab.models import CriticModel

        return (lora.critic() if lora is not None else CriticModel.from_causal_lm(policy)).to(self.device)

    def clip_grad_norm(self, params: list[torch.Tensor], limit: float) -> float:
        """The L2 norm of the gradients before clipping them to ``limit`` (``math.inf``: no clip)."""
        return float(torch.nn.utils.clip_grad_norm_(params, limit))

    def sync_weights(self, backend: Any, policy: torch.nn.Module, lora: LoraPolicy | None = None) -> Any:
        """``backend.update_weights`` with the policy itself (LoRA: the adapters merged in); its metrics."""
        return backend.update_weights(lora.merged() if lora is not None else policy)

    def save_adapter(self, lora: LoraPolicy, path) -> None:
        """The final LoRA adapters in peft's format at ``path``."""
        lora.save_adapter(path)

    def model_states(self, **models: Any) -> dict[str, Any]:
        """``{name: state_dict}`` of the models and optimizers given (None stays None)."""
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

    def load_model_states(self, path, state: dict, *, policy, optimizer, critic, critic_optimizer) -> None:
        """Load the models' and optimizers' states of a checkpoint read by :meth:`load`."""
        policy.load_state_dict(state["policy"])
        optimizer.load_state_dict(state["optimizer"])
        if state["critic"] is not None:
            if critic is None:
                raise RllabError(f"checkpoint {path} has a critic but this run's algorithm does not use one")
            critic.load_state_dict(state["critic"])
            critic_optimizer.load_state_dict(state["critic_optimizer"])

    def quiet(self, hook: Any) -> Any:
        """The event hooks this rank announces to (all of them in one process)."""
        return hook


class _Silent:
    """Event hooks of a rank other than 0: every event is dropped."""

    def __getattr__(self, name: str):
        return lambda **kwargs: []


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
        # LoRA: the frozen base tensors of the full state dict, gathered at the first sync (where that
        # sync's full tensors land), and (the policy, shared route?) they were gathered for
        self._lora_base: dict[str, torch.Tensor] | None = None
        self._lora_base_of: tuple[Any, bool] | None = None

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

    def build_critic(self, policy: torch.nn.Module, load: Callable[[], torch.nn.Module], lora: LoraPolicy | None = None) -> torch.nn.Module:
        """A critic from the model's weights on disk (the policy's are sharded; LoRA or not), sharded
        like it; its ``values`` calls the backbone and the value head, each a unit of its own."""
        from rllab.models import CriticModel

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

    def sync_weights(self, backend: Any, policy: torch.nn.Module, lora: LoraPolicy | None = None) -> Any:
        """Full (gathered) weights to the backend, LoRA adapters merged in; its metrics (rank 0's).

        Every rank calls it. A backend of its own on each rank (``hf``) gets a plain module the
        first time, a state dict after. A backend with ``follow_weights`` (shared servers) gets a
        plain CPU module from rank 0 only, and the other ranks follow once it is pushed.

        LoRA: the first sync of ``policy`` through this route gathers the full state dict and
        caches its frozen base tensors; later ones gather the adapters only and merge them into
        the cache: the same tensors a full gather would give (the base never changes: it does
        not train, and a checkpoint loads the adapters only). The untargeted tensors handed over
        are the cached ones themselves: a backend copies them (``load_state_dict``), never writes
        into them."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        shared = callable(member(backend, "rollout_backend", "follow_weights"))
        cached = self._lora_base_of is not None and self._lora_base_of[0] is policy and self._lora_base_of[1] == shared
        if lora is not None and cached:
            # the base is frozen: only the adapters are gathered, then merged into the cached base
            adapters = self._gather_adapters(policy, lora, cpu=shared)
            full = {**self._lora_base, **adapters} if not shared or self.reducer.is_main else {}
        else:
            # shared servers: the full tensors land in rank 0's CPU memory only (the other ranks get {})
            full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=shared))
            if lora is not None and self.keeps_lora_base(shared):
                adapters = set(lora.adapter_names())
                self._lora_base = {k: v for k, v in full.items() if k not in adapters}
                self._lora_base_of = (policy, shared)
        if shared:
            metrics = None
            if self.reducer.is_main:
                state = lora.merge_state_dict(full) if lora is not None else full
                del full
                if self._server_copy is None:
                    self._server_copy = _plain_model(policy.config, torch.device("cpu"))
                self._server_copy.load_state_dict(state, assign=True)  # the gathered tensors themselves, no copy
                self._server_copy.tie_weights()
                metrics = backend.update_weights(self._server_copy)
            self.reducer.barrier()  # no rank samples before the servers hold the new weights
            if not self.reducer.is_main:
                backend.follow_weights()
            return metrics
        if lora is not None:
            full = lora.merge_state_dict(full)
        if self._sampler_ready:
            return backend.update_weights(full)
        self._sampler_ready = True
        plain = _plain_model(policy.config, self.device)
        plain.load_state_dict(full)
        return backend.update_weights(plain)

    def keeps_lora_base(self, shared: bool) -> bool:
        """Whether a LoRA sync keeps the gathered base for the next syncs: for shared servers (in
        rank 0's CPU memory) and on CPU; not for a per-rank ``hf`` sampler on an accelerator,
        where the kept copy would sit in each rank's device memory beside the sampler's own full
        copy (every sync gathers in full there instead)."""
        return shared or self.device.type == "cpu"

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

    def _gather_adapters(self, policy: torch.nn.Module, lora: LoraPolicy, *, cpu: bool) -> dict[str, torch.Tensor]:
        """The full tensors of ``policy``'s adapters by :meth:`~rllab.lora.LoraPolicy.adapter_names`
        (``cpu``: on rank 0's CPU only, the other ranks get ``{}``); every rank calls it."""
        names = lora.adapter_names()
        params = dict(policy.named_parameters())
        return dict(zip(names, self.gather_full([params[n] for n in names], cpu=cpu)))

    def save_adapter(self, lora: LoraPolicy, path) -> None:
        """Rank 0 writes the adapters (gathered in full) in peft's format at ``path``; every rank calls it."""
        state = self._gather_adapters(lora.policy, lora, cpu=True)
        if self.reducer.is_main:
            lora.save_adapter(path, state=state)
        self.reducer.barrier()

    def model_states(self, **models: Any) -> dict[str, Any]:
        """Sharded state dicts; a :class:`~rllab.lora.LoraPolicy` policy gives its adapters' only."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        out: dict[str, Any] = {}
        for name, model, optimizer in (("policy", models["policy"], models["optimizer"]), ("critic", models["critic"], models["critic_optimizer"])):
            key = f"{name}_optimizer" if name == "critic" else "optimizer"
            if model is None:
                out[name] = out[key] = None
                continue
            module = model.policy if isinstance(model, LoraPolicy) else model
            state = get_model_state_dict(module)
            out[name] = {k: state[k] for k in model.adapter_names()} if isinstance(model, LoraPolicy) else state
            out[key] = get_optimizer_state_dict(module, optimizer)
        return out

    def save(self, run_dir, step: int, state: dict):
        from rllab import dcp

        return dcp.save(run_dir, step, state, reducer=self.reducer)

    def load(self, path) -> dict:
        from rllab import dcp

        return dcp.load(path, reducer=self.reducer)

    def load_model_states(self, path, state: dict, *, policy, optimizer, critic, critic_optimizer) -> None:
        from rllab import dcp

        dcp.load_models(path, state, reducer=self.reducer, policy=policy, optimizer=optimizer, critic=critic, critic_optimizer=critic_optimizer)

    def quiet(self, hook: Any) -> Any:
        return hook if self.reducer.is_main else _Silent()


def _plain_model(config: Any, device: torch.device) -> torch.nn.Module:
    """A plain transformers model of ``config`` (no adapters, no shards) on ``device``, in eval mode."""
    import copy

    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(copy.deepcopy(config)).to(device).eval()


def for_config(model_cfg: Any, *, device: torch.device, compute_dtype: torch.dtype | None) -> Single | FSDP2:
    """The strategy ``model_cfg.strategy`` names, on ``device`` (``fsdp2``: this rank's device)."""
    if model_cfg.strategy == "single":
        return Single(device=device)
    reducer = distributed.init_from_env(device_type=device.type, expected=model_cfg.world_size)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return FSDP2(device=device, reducer=reducer, compute_dtype=compute_dtype, cpu_offload=model_cfg.cpu_offload)


def start(model_cfg: Any, *, device_type: str) -> Reducer:
    """The run's reducer, joining the process group first for ``fsdp2`` (the entry points agree on
    a run directory through it before a trainer exists)."""
    if model_cfg.strategy == "single":
        return distributed.SINGLE
    return distributed.init_from_env(device_type=device_type, expected=model_cfg.world_size)


def check_data_parallel(cfg: Any, lab: Any, world_size: int) -> None:
    """Refuse settings that would give ranks different numbers of rows or couple rows across ranks
    beyond what :mod:`rllab.distributed` reduces (each named with the world size), and backends
    that cannot take gathered weights."""
    if cfg.model.strategy == "single":
        return
    where = f"model.strategy = 'fsdp2' on {world_size} rank(s)"
    backend = cfg.component("backend")
    spec = lab.spec("rollout_backend", backend.name)
    why = spec.trait("sharded_policy", backend.config)
    if why is not None:
        raise RllabError(f"{where}: backend {backend.name!r} (plugin {spec.provider}) cannot take a sharded policy's weights: {why}")
    if world_size == 1:
        return
    r, t = cfg.rollout, cfg.train
    if r.prompts_per_step % world_size:
        raise RllabError(f"{where}: rollout.prompts_per_step = {r.prompts_per_step} must be a multiple of the world size {world_size} (each rank owns whole groups)")
    if r.dynamic_sampling:
        raise RllabError(f"{where}: rollout.dynamic_sampling = true would give ranks different numbers of rows; set it to false")
    if r.reward_errors == "skip":
        raise RllabError(f"{where}: rollout.reward_errors = 'skip' would give ranks different numbers of rows; use 'raise' or 'zero'")
    if t.nonfinite == "skip":
        raise RllabError(f"{where}: train.nonfinite = 'skip' is decided per rank; use 'raise' (a failure on one rank stops every rank)")
    adv = cfg.component("advantage")
    spec = lab.spec("advantage_estimator", adv.name)
    coupled = spec.trait("batch_step", adv.config)
    if coupled not in (None, "whiten"):
        raise RllabError(
            f"{where}: advantage {adv.name!r} (plugin {spec.provider}) couples rows across the batch ({coupled}), "
            "which is not all-reduced; choose an estimator without a batch step or with whitening"
        )
    algorithm = cfg.component("algorithm")
    if not lab.spec("algorithm", algorithm.name).trait("data_parallel", algorithm.config):
        fit = [n for n in lab.names("algorithm") if lab.spec("algorithm", n).traits.get("data_parallel")]
        raise RllabError(f"{where}: algorithm {algorithm.name!r} has no data-parallel normalisers (it does not declare the trait "
                         f"data_parallel); use an algorithm that does ({', '.join(map(repr, fit)) or 'none installed'}) or strategy 'single'")

