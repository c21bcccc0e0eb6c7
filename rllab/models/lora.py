"""LoRA through ``peft``: ``[model] lora = {r, alpha, dropout, target_modules}``.

With ``model.lora`` set, the policy's targeted linear layers get low-rank adapters
(``W x + (alpha / r)·B A x``, ``A`` (r, in), ``B`` (out, r), ``B = 0`` at the start) and only the
adapters train; the base weights are frozen and never change. :class:`LoraPolicy` owns what that
changes in a run: it is the trainer's policy handle (:class:`rllab.training.parts.PolicyHandle`; without
LoRA, :class:`rllab.training.parts.FullPolicy` answers the same questions), so the trainer has no LoRA
branch and the placement (:mod:`rllab.parallel.placement`) knows nothing of adapters:

- **the policy** stays the transformers model (its linear layers replaced by peft's LoRA layers
  in place), so every forward path of :mod:`rllab.models.forward` runs unchanged; the optimizer gets only
  the adapter parameters (:func:`trainable_parameters`).
- **the reference** (:meth:`LoraPolicy.reference`) is the base model with the adapters disabled —
  what ``with peft_model.disable_adapter():`` computes — as a module of its own that holds the
  *same* base tensors (nothing copied but the module objects), with the LoRA layers swapped back
  for their base layers and in eval mode. No second copy of the weights exists. A sharded policy
  (``model.strategy = "fsdp2"``) cannot be copied module by module: its reference is
  :class:`AdaptersOff`, the policy's own forward run in eval mode under ``disable_adapter()``.
- **the rollout side** (:meth:`LoraPolicy.merged`) gets a plain transformers model with
  ``W + (alpha / r)·B A`` in every targeted weight: it shares the untargeted tensors with the
  policy and holds its own copy of the targeted ones only, refreshed at every weight sync. The
  ``hf`` backend copies or shares it like any policy; the ``sglang`` backend saves it
  (``save_pretrained``) or sends its tensors. A sharded policy's full state dict (gathered by
  :mod:`rllab.parallel.placement`) is merged by :meth:`LoraPolicy.merge_state_dict` instead.
- **the critic** (:meth:`LoraPolicy.critic`, PPO/GAE) trains all of its parameters, as without
  LoRA, initialised from the policy's merged weights.
- **checkpoints** (:meth:`LoraPolicy.state_dict`) hold the adapter weights only (and the optimizer
  holds only their state); the base model is the run's model directory, read again on resume.
  Sharded: the adapters' shards (:meth:`LoraPolicy.adapter_names` picks them out of the policy's
  sharded state dict) through ``torch.distributed.checkpoint``.
- **the final adapter** (:meth:`LoraPolicy.save_adapter`): ``RUN_DIR/adapter``, peft's
  ``save_pretrained`` format (``adapter_config.json`` naming the base model directory,
  ``adapter_model.safetensors``).

Shapes: a targeted weight ``W`` is (out, in); ``A`` (r, in); ``B`` (out, r).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import weakref
from pathlib import Path
from typing import Any, Mapping

import attrs
import torch
from torch import nn

from rllab.models.forward import is_sharded
from rllab.errors import ConfigError, MissingExtraError, RllabError
from rllab.models.hfcompat import peft_deprecations_quiet
from rllab.specs import ComponentSpec, build_config, knob
from rllab.models.tinyconfig import TinyModelConfig

_NO_PEFT = "[model] lora needs peft, which is not installed: pip install 'rllab[lora]' (or pip install 'peft>=0.13')"

ALL_LINEAR = "all-linear"
"""The ``target_modules`` name that targets every linear layer except the output head."""


def _check_targets(inst, attribute, value) -> None:
    if not value or any(not name or not name.strip() for name in value):
        raise ValueError(f"{attribute.name} = {list(value)!r} is not allowed: must be a non-empty list of module names")


@attrs.frozen(kw_only=True)
class LoraConfig:
    """The ``[model] lora`` table: low-rank adapters on the policy (peft's LoRA)."""

    r: int = knob(8, help="rank of each adapter (A is r × in, B is out × r)", ge=1)
    alpha: float = knob(16.0, help="scale numerator: the update is (alpha / r)·B A", gt=0.0)
    dropout: float = knob(0.0, help="dropout on the adapters' input while training", ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = knob(
        (ALL_LINEAR,),
        help="linear layers that get adapters, by name suffix (q_proj matches model.layers.0.self_attn.q_proj); "
        "'all-linear': every linear layer but the output head",
        validator=_check_targets,
    )


def lora_config(model: Any) -> LoraConfig | None:
    """The run's :class:`LoraConfig` from a ``ModelConfig`` (None: ``model.lora`` empty, LoRA off)."""
    if not model.lora:
        return None
    pseudo = ComponentSpec(kind="section", name="model.lora", fn=lambda: None, config=LoraConfig, provider="rllab")
    return build_config(pseudo, model.lora)


def check_settings(model: Any, *, text: str = "", where: str = "<config>") -> None:
    """Load-time checks of ``model.lora``, before any model is built: its knobs, peft installed,
    ``target_modules`` against the linear layers of the model the config names (built on the
    meta device from ``[model] tiny`` or the model directory's ``config.json``: no weights are
    read), and the settings it cannot honour."""
    from rllab.records.tomlio import line_of

    targets = (model.lora or {}).get("target_modules")
    if isinstance(targets, str):  # a string would be read as a list of its characters
        raise ConfigError(
            f"{where}: [model] lora.target_modules = {targets!r}{line_of(text, 'model', 'lora')} is a string; give a list "
            f"of module names, e.g. target_modules = [{targets!r}]", key="lora",
        )
    try:
        cfg = lora_config(model)
    except ConfigError as e:
        msg = str(e).replace("section 'model.lora' (plugin rllab)", "[model] lora")
        raise ConfigError(f"{where}: {msg}{line_of(text, 'model', 'lora')}", key="lora") from None
    if cfg is not None and importlib.util.find_spec("peft") is None:
        raise ConfigError(f"{where}: {_NO_PEFT}{line_of(text, 'model', 'lora')}", key="lora")
    names = _skeleton_names(model.path, tuple(sorted(model.tiny.items()))) if cfg is not None else None
    if names is not None:
        try:
            _resolve(*names, cfg)
        except RllabError as e:
            raise ConfigError(f"{where}: {e}{line_of(text, 'model', 'lora')}", key="lora") from None
    if cfg is not None and model.reference_device is not None:
        raise ConfigError(
            f"{where}: [model] reference_device = {model.reference_device!r} cannot be honoured with [model] lora: the "
            f"reference is the policy's own base weights with the adapters disabled (no second copy); remove reference_device",
            key="reference_device",
        )


def require_peft():
    """The ``peft`` module, or an error naming the extra that installs it."""
    try:
        import peft
    except ImportError:
        raise MissingExtraError(_NO_PEFT) from None
    return peft


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that train (``requires_grad``): all of them, or the adapters under LoRA."""
    return [p for p in model.parameters() if p.requires_grad]


def layer_names(model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(linear, head)``: the names of ``model``'s linear layers other than the output head, and
    the output head's name(s)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_names = tuple(n for n, m in model.named_modules() if head is not None and m is head)
    linear = tuple(n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in head_names)
    return linear, head_names


def resolve_targets(model: nn.Module, cfg: LoraConfig) -> list[str]:
    """The full names of the linear layers ``cfg.target_modules`` names (a name matches a module
    whose name equals it or ends with ``.name``). Refused: a name that matches no linear layer
    (the error lists the model's), and the output head (the log-prob kernels read its weight)."""
    return _resolve(*layer_names(model), cfg)


def _resolve(linear: tuple[str, ...], head_names: tuple[str, ...], cfg: LoraConfig) -> list[str]:
    chosen: list[str] = []
    for target in cfg.target_modules:
        if target == ALL_LINEAR:
            hits = list(linear)
        else:
            hits = [n for n in linear if n == target or n.endswith("." + target)]
            if not hits:
                suffixes = sorted({n.rsplit(".", 1)[-1] for n in linear})
                if any(n == target or n.endswith("." + target) for n in head_names):
                    why = "is the output head, which cannot take an adapter (the log-prob kernels read its weight directly)"
                else:
                    why = "matches no linear layer of the model"
                raise RllabError(
                    f"[model] lora.target_modules: {target!r} {why}; the model's linear layers are "
                    f"{', '.join(suffixes)} (or {ALL_LINEAR!r} for all of them)"
                )
        chosen.extend(h for h in hits if h not in chosen)
    if not chosen:
        raise RllabError("[model] lora.target_modules matches no linear layer of the model")
    return chosen


@functools.lru_cache(maxsize=8)
def _skeleton_names(path: str | None, tiny: tuple) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """:func:`layer_names` of the model a config names, built on the meta device (no weights, no
    warm start); None when it cannot be built here (the trainer checks the loaded model then)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

        if path is None:
            t = TinyModelConfig(**dict(tiny))
            hf = Qwen2Config(vocab_size=16, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                             num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads,
                             tie_word_embeddings=t.tie_word_embeddings)
        else:
            hf = AutoConfig.from_pretrained(Path(path).expanduser())
        with torch.device("meta"):
            return layer_names(AutoModelForCausalLM.from_config(hf))
    except Exception:  # noqa: BLE001 - a model that cannot be built here is checked when it loads
        return None


def _without_adapters(model: nn.Module, memo: dict) -> nn.Module:
    """A deep copy of ``model`` (tensors in ``memo`` shared, not copied) whose LoRA layers are
    replaced by their base layers: a plain transformers model."""
    from peft.tuners.lora import LoraLayer

    twin = copy.deepcopy(model, memo)
    for name, module in list(twin.named_modules()):
        if isinstance(module, LoraLayer):
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, child, module.get_base_layer())
    return twin


def _lora_layers(model: nn.Module) -> list[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


@attrs.define(kw_only=True, eq=False)
class LoraPolicy:
    """The adapters of a run's policy, and the views of it the run needs (module docstring)."""

    peft_model: Any
    """The ``peft.PeftModel`` wrapping :attr:`policy` (for ``disable_adapter``, ``save_pretrained``)."""
    policy: nn.Module
    """The transformers model with the LoRA layers in place (the object the trainer trains)."""
    config: LoraConfig
    targets: tuple[str, ...]
    _merged: nn.Module | None = None
    _pairs: list = attrs.field(factory=list)
    _bases: weakref.WeakKeyDictionary = attrs.field(factory=weakref.WeakKeyDictionary)
    """Per placement: ``(cpu, the frozen base tensors of the sharded policy's full state dict)``,
    kept from its first gather through that route where the placement says keeping them is cheap
    (:meth:`sampler_state`)."""

    @classmethod
    def attach(cls, model: nn.Module, config: LoraConfig) -> "LoraPolicy":
        """Add adapters to ``model`` in place (its base parameters are frozen)."""
        peft = require_peft()
        targets = resolve_targets(model, config)
        peft_cfg = peft.LoraConfig(
            r=config.r, lora_alpha=config.alpha, lora_dropout=config.dropout, target_modules=targets,
            bias="none", task_type="CAUSAL_LM",
        )
        with peft_deprecations_quiet():  # peft reads transformers' deprecated is_gradient_checkpointing
            peft_model = peft.get_peft_model(model, peft_cfg)
        return cls(peft_model=peft_model, policy=peft_model.get_base_model(), config=config, targets=tuple(targets))

    def counts(self) -> dict[str, float]:
        """``model/params`` (every parameter, adapters included) and ``model/trainable_params``."""
        total = sum(p.numel() for p in self.policy.parameters())
        trainable = sum(p.numel() for p in trainable_parameters(self.policy))
        return {"model/params": float(total), "model/trainable_params": float(trainable)}

    # -- the policy handle (rllab.training.parts.PolicyHandle)

    @property
    def module(self) -> nn.Module:
        """The module that trains: :attr:`policy`."""
        return self.policy

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The adapters (what the optimizer holds)."""
        return trainable_parameters(self.policy)

    def summary(self) -> dict[str, int]:
        """``final.json``'s ``lora/params`` and ``lora/trainable_params``."""
        return {k.replace("model/", "lora/"): int(v) for k, v in self.counts().items()}

    def build_reference(self, placement: Any, load: Any, device: torch.device) -> nn.Module:
        """:meth:`reference`: the base is the policy's own (nothing is loaded or placed)."""
        return self.reference()

    def state_keys(self) -> list[str]:
        """A checkpoint holds the adapters only (:meth:`adapter_names`)."""
        return self.adapter_names()

    def sampler_module(self) -> nn.Module:
        """:meth:`merged`."""
        return self.merged()

    def sampler_state(self, placement: Any, *, cpu: bool) -> dict[str, torch.Tensor]:
        """The merged full state dict of a sharded policy (:meth:`merge_state_dict`), gathered
        through ``placement`` (``cpu``: on rank 0's CPU only, ``{}`` on the other ranks).

        The first sync through a placement and route gathers the full state dict and keeps its
        frozen base tensors where :meth:`~rllab.parallel.placement.Placement.keeps_full_copy` says that is
        cheap; later ones gather the adapters only (one all-gather) and merge them into the kept
        base: the same tensors a full gather gives (the base never trains, and a checkpoint loads
        the adapters only). A resumed run is a new process: its first sync gathers in full."""
        kept = self._bases.get(placement)
        if kept is not None and kept[0] == cpu:
            adapters = self._gather_adapters(placement, cpu=cpu)
            full = {**kept[1], **adapters} if not cpu or placement.speaks else {}
        else:
            full = placement.full_state_dict(self.policy, cpu=cpu)
            if placement.keeps_full_copy(cpu):
                adapters = set(self.adapter_names())
                self._bases[placement] = (cpu, {k: v for k, v in full.items() if k not in adapters})
        return self.merge_state_dict(full) if full else {}

    def _gather_adapters(self, placement: Any, *, cpu: bool) -> dict[str, torch.Tensor]:
        """The adapters' full tensors by :meth:`adapter_names` (``cpu``: on rank 0's CPU only, the
        other ranks get ``{}``); every rank calls it."""
        names = self.adapter_names()
        params = dict(self.policy.named_parameters())
        return dict(zip(names, placement.gather_full([params[n] for n in names], cpu=cpu)))

    def save_final(self, run_dir: Path, placement: Any, *, tokenizer: Any = None) -> None:
        """The final adapters at ``RUN_DIR/adapter`` (:meth:`save_adapter`); sharded: gathered in
        full, written by rank 0; every rank calls it."""
        path = Path(run_dir) / "adapter"
        if not placement.sharded:
            self.save_adapter(path)
            return
        state = self._gather_adapters(placement, cpu=True)
        if placement.speaks:
            self.save_adapter(path, state=state)
        placement.reducer.barrier()

    # -- views

    def reference(self) -> nn.Module:
        """The base model (adapters disabled) as a frozen module over the policy's own tensors
        (:class:`AdaptersOff` for a sharded policy)."""
        if is_sharded(self.policy):
            return AdaptersOff(self).eval()  # not requires_grad_(False): its parameters are the policy's
        memo = {id(p): p for p in self.policy.parameters()}
        return _without_adapters(self.policy, memo).eval().requires_grad_(False)

    def merged(self) -> nn.Module:
        """A plain model with the adapters merged (``W + (alpha/r)·B A``), refreshed now.

        Built on the first call: the untargeted tensors are the policy's own, each targeted
        weight a tensor of its own that every call overwrites with the current merge.
        """
        if self._merged is None:
            memo: dict = {}
            pairs = []
            for _, layer in _lora_layers(self.policy):
                weight = layer.get_base_layer().weight
                own = nn.Parameter(torch.empty_like(weight), requires_grad=False)
                memo[id(weight)] = own
                pairs.append((layer, own))
            memo.update({id(p): p for p in self.policy.parameters() if id(p) not in memo})
            self._merged = _without_adapters(self.policy, memo).eval()
            self._pairs = pairs
        with torch.no_grad():
            for layer, own in self._pairs:
                _merge_into(layer, own)
        return self._merged

    def critic(self):
        """A critic (all of its parameters train) initialised from the policy's merged weights."""
        from rllab.models.forward import CriticModel

        plain = _without_adapters(self.policy, {})
        with torch.no_grad():
            for name, layer in _lora_layers(self.policy):
                _merge_into(layer, plain.get_submodule(name).weight)
        plain.requires_grad_(True)
        return CriticModel(plain.base_model, plain.config.hidden_size)

    # -- state

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter weights by parameter name (what a checkpoint holds of the policy)."""
        return {n: p.detach().clone() for n, p in self.policy.named_parameters() if p.requires_grad}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], *, where: str = "the checkpoint") -> None:
        """Copy adapter weights saved by :meth:`state_dict` back in, exactly; names must match."""
        own = {n: p for n, p in self.policy.named_parameters() if p.requires_grad}
        if set(state) != set(own):
            missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            raise RllabError(
                f"{where} does not hold this run's LoRA adapters (missing {missing[:3]}, unexpected {extra[:3]}); "
                f"was it written with the same [model] lora and model?"
            )
        wrong = [n for n, p in own.items() if tuple(state[n].shape) != tuple(p.shape)]
        if wrong:
            n = wrong[0]
            raise RllabError(
                f"{where} does not hold this run's LoRA adapters: {n} is {tuple(state[n].shape)} there and "
                f"{tuple(own[n].shape)} here (another [model] lora.r?)"
            )
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(state[n])

    def adapter_names(self) -> list[str]:
        """The adapter parameters' names (``model.layers.0.self_attn.q_proj.lora_A.default.weight``):
        the keys of :meth:`state_dict`, and of the policy's state dict that a checkpoint keeps."""
        return [n for n, p in self.policy.named_parameters() if p.requires_grad]

    def merge_state_dict(self, full: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A plain model's state dict from the policy's full one (``{name}.base_layer.weight``,
        ``{name}.lora_A.<adapter>.weight``, … of every LoRA layer): each targeted layer's weight
        is ``W + Σ_active scaling·B A`` under its base name, its bias the base bias; the other
        tensors pass through. ``full`` holds full tensors (gathered, not shards)."""
        out: dict[str, torch.Tensor] = {}
        layers = dict(_lora_layers(self.policy))
        skip = {f"{n}.{part}" for n in layers for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")}
        for key, value in full.items():
            if not any(key.startswith(p + ".") for p in skip):
                out[key.replace(".base_layer.", ".")] = value
        with torch.no_grad():
            for name, layer in layers.items():
                merged = full[f"{name}.base_layer.weight"].clone()
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        A, B = full[f"{name}.lora_A.{adapter}.weight"], full[f"{name}.lora_B.{adapter}.weight"]
                        merged += (layer.scaling[adapter] * (B.to(merged.dtype) @ A.to(merged.dtype)))
                out[f"{name}.weight"] = merged
        return out

    def save_adapter(self, path: Path, state: Mapping[str, torch.Tensor] | None = None) -> Path:
        """The adapters in peft's format (``PeftModel.from_pretrained(base, path)`` loads them).

        ``state``: the adapter weights by :meth:`adapter_names` (full tensors gathered from a
        sharded policy); None: the policy's own."""
        kwargs = {} if state is None else {"state_dict": {f"base_model.model.{k}": v for k, v in state.items()}}
        self.peft_model.save_pretrained(str(path), **kwargs)
        return Path(path)


class AdaptersOff(nn.Module):
    """The reference of a sharded LoRA policy: its base model, computed by the policy's own
    forward in eval mode with the adapters disabled (``peft_model.disable_adapter()``), so the
    FSDP2 shards are gathered and freed as in any forward. Holds no parameters of its own;
    :meth:`parameters` are the policy's (where they live)."""

    def __init__(self, lora: LoraPolicy):
        super().__init__()
        object.__setattr__(self, "_lora", lora)  # not a submodule: train()/eval() here never reach the policy
        self.config = lora.policy.config

    def parameters(self, recurse: bool = True):
        return self._lora.policy.parameters(recurse)

    def forward(self, *args: Any, logits_to_keep: int = 0, **kwargs: Any):
        policy = self._lora.policy
        was_training = policy.training
        policy.eval()
        try:
            with self._lora.peft_model.disable_adapter():
                return policy(*args, logits_to_keep=logits_to_keep, **kwargs)
        finally:
            policy.train(was_training)


def _merge_into(layer, out: torch.Tensor) -> None:
    """``out ← W + Σ_active (alpha/r)·B A`` for one LoRA layer (its base weight ``W`` is left as it is)."""
    out.copy_(layer.get_base_layer().weight)
    for name in layer.active_adapters:
        if name in layer.lora_A:
            out += layer.get_delta_weight(name).to(out.dtype)
