"""verl ``ppo_trainer`` config (YAML + Hydra-style dotted overrides) → rllab.

A nested YAML is flattened to dotted keys (``actor_rollout_ref.actor.clip_ratio_high``); the
overrides (``key=value``, ``+key=value``) are applied on top, their values read as YAML. A key
left out takes verl's default (:data:`DEFAULTS`, verl 0.9.1's ``ppo_trainer`` config, and the DAPO
reward manager's ``reward_kwargs``). ``${a.b}`` and ``${oc.select:a.b,default}`` values are resolved
(against the config, then verl's defaults). A recipe's Hydra header (``defaults: [ppo_trainer,
_self_]``, ``hydra.searchpath``) composes it with verl's ``ppo_trainer`` defaults.

Keys under :data:`IGNORED_PATTERNS` only move hardware, logging, data loading, checkpoints or
evaluation; the keys this module reads are mapped; every other key of verl 0.9.1's full config
(:mod:`rllab_referee.verl_fields`) is accepted at its default only; anything else is refused by name.
Renamed keys (``reward_model.reward_kwargs.*``, which verl copies to ``reward.reward_kwargs.*``; the
recipe's earlier ``reward_model.overlong_buffer.*``) are read under the new name and named, in
comments and errors, as the input spelled them. The
mapping in words is docs/frameworks.md.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Mapping

from rllab import ConfigError
from rllab.records.provenance import flatten
from rllab_referee.result import Translation
from rllab_referee.verl_fields import GENERATED, VERL_VERSION

SOURCE = f"verl ppo_trainer ({VERL_VERSION})"
A, R, ALG, RC = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "algorithm.", "algorithm.rollout_correction."
RK = "reward.reward_kwargs."
"""The DAPO reward manager's arguments (verl 0.9.1 copies ``reward_model.reward_kwargs`` here)."""
OB = RK + "overlong_buffer_cfg."

RENAMED = {
    RC + "rollout_rs_threshold_lower": "not read by verl 0.9.1 (removed: the lower bound is the 'lower_upper' form of "
                                       "rollout_rs_threshold), so it changes nothing there either",
    RC + "rollout_token_veto_threshold": "not read by verl 0.9.1 (removed), so it changes nothing there either",
}
"""Keys of earlier verl versions that 0.9.1 no longer reads, with what became of them."""

DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024, "data.gen_batch_size": None, "data.max_prompt_length": 512,
    "data.max_response_length": 512, "data.truncation": "error", "data.filter_overlong_prompts": False,
    R + "n": 1, R + "temperature": 1.0, R + "top_p": 1.0, R + "top_k": -1, R + "do_sample": True,
    R + "response_length": None, R + "ignore_eos": False,
    A + "ppo_mini_batch_size": 256, A + "ppo_micro_batch_size_per_gpu": None, A + "ppo_micro_batch_size": None,
    A + "ppo_epochs": 1, A + "shuffle": False, A + "clip_ratio": 0.2, A + "clip_ratio_low": 0.2, A + "clip_ratio_high": 0.2,
    A + "clip_ratio_c": 3.0, A + "loss_agg_mode": "token-mean", A + "entropy_coeff": 0.0,
    A + "use_kl_loss": False, A + "kl_loss_coef": 0.001, A + "kl_loss_type": "low_var_kl",
    A + "policy_loss.loss_mode": "vanilla", A + "policy_loss.clip_cov_ratio": 0.0002, A + "policy_loss.clip_cov_lb": 1.0,
    A + "policy_loss.clip_cov_ub": 5.0, A + "policy_loss.kl_cov_ratio": 0.0002, A + "policy_loss.ppo_kl_coef": 0.1,
    A + "grad_clip": 1.0, A + "optim.clip_grad": 1.0, A + "optim.optimizer": "AdamW", A + "optim.optimizer_impl": "torch.optim",
    A + "loss_scale_factor": None,
    A + "optim.lr": 1e-6, A + "optim.weight_decay": 0.01, A + "optim.lr_warmup_steps": -1,
    A + "optim.lr_warmup_steps_ratio": 0.0, A + "optim.warmup_style": None, A + "optim.lr_scheduler_type": "constant",
    A + "optim.min_lr_ratio": 0.0, A + "optim.num_cycles": 0.5, A + "optim.betas": [0.9, 0.999],
    A + "optim.total_training_steps": -1,
    ALG + "adv_estimator": "gae", ALG + "gamma": 1.0, ALG + "lam": 1.0, ALG + "norm_adv_by_std_in_grpo": True,
    ALG + "use_kl_in_reward": False, ALG + "kl_penalty": "kl", ALG + "kl_ctrl.type": "fixed", ALG + "kl_ctrl.kl_coef": 0.001,
    ALG + "kl_ctrl.horizon": 10000, ALG + "kl_ctrl.target_kl": 0.1, ALG + "use_pf_ppo": False,
    ALG + "filter_groups.enable": False, ALG + "filter_groups.metric": "reward", ALG + "filter_groups.max_num_gen_batches": 0,
    RC + "rollout_is": None, RC + "rollout_is_threshold": 2.0, RC + "rollout_is_batch_normalize": False,
    RC + "rollout_rs": None, RC + "rollout_rs_threshold": None, RC + "bypass_mode": False,
    "critic.optim.lr": 1e-5, "critic.cliprange_value": 0.5,
    "trainer.total_training_steps": None, "trainer.total_epochs": 30, "trainer.critic_warmup": 0,
    "actor_rollout_ref.model.path": None, "actor_rollout_ref.model.lora_rank": 0, "actor_rollout_ref.model.lora_alpha": 16,
    "actor_rollout_ref.model.target_modules": "all-linear",
    "custom_reward_function.overlong_buffer.enable": False, "custom_reward_function.overlong_buffer.len": 0,
    "custom_reward_function.overlong_buffer.penalty_factor": 1.0, "custom_reward_function.overlong_buffer.log": False,
    OB + "enable": False, OB + "len": 0, OB + "penalty_factor": 1.0, OB + "log": False, RK + "max_resp_len": None,
    "reward_model.enable": None,
}  # fmt: skip
"""verl's defaults for every key this module reads."""

_HW = "hardware, memory or speed only"
IGNORED_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(^|\.)_target_$", "a Hydra class path"),
    (r"(^|\.)(fsdp_config|megatron|profiler|checkpoint|engine_kwargs|agent|trace|fused_kernel_options|custom_async_server)\.", _HW),
    (r"(^|\.)(strategy|use_dynamic_bsz|ppo_max_token_len_per_gpu|log_prob_\w+|forward_\w+|ulysses_sequence_parallel_size|"
     r"use_remove_padding|use_fused_kernels|use_torch_compile|entropy_from_logits_with_chunking|entropy_checkpointing|"
     r"enable_gradient_checkpointing|enable_activation_offload|use_liger|use_shm|external_lib|trust_remote_code|"
     r"gpu_memory_utilization|tensor_model_parallel_size|dtype|enforce_eager|cudagraph_capture_sizes|free_cache_engine|"
     r"max_num_batched_tokens|max_model_len|max_num_seqs|disable_log_stats|enable_chunked_prefill|load_format|"
     r"layered_summon|multi_stage_wake_up|update_weights_bucket_megabytes|skip_rollout|skip_dump_dir|mode|name|"
     r"calculate_log_probs|prompt_length|nccl_timeout|hybrid_engine|shuffle|micro_batch_size|micro_batch_size_per_gpu|"
     r"custom_chat_template|exclude_modules)$", _HW),
    (r"^actor_rollout_ref\.ref\.", "the reference model's placement (hardware, memory or speed only)"),
    (r"^actor_rollout_ref\.rollout\.val_kwargs\.", "evaluation"),
    (r"^actor_rollout_ref\.model\.override_config\.", "model architecture overrides (dropout, …): rllab's model is [model]"),
    (r"^(global_profiler|ray_kwargs|ray_init)\.", _HW),
    (r"^trainer\.(project_name|experiment_name|logger|log_val_generations|rollout_data_dir|validation_data_dir|nnodes|"
     r"n_gpus_per_node|save_freq|esi_redundant_time|resume_mode|resume_from_path|val_before_train|val_only|test_freq|"
     r"default_hdfs_dir|del_local_ckpt_after_load|default_local_dir|max_actor_ckpt_to_keep|"
     r"max_critic_ckpt_to_keep|ray_wait_register_center_timeout|device|use_legacy_worker_impl|balance_batch)$",
     "logging, checkpoints, evaluation or the cluster"),
    (r"^data\.(tokenizer|use_shm|train_files|val_files|prompt_key|reward_fn_key|val_batch_size|return_raw_input_ids|"
     r"return_raw_chat|return_full_prompt|shuffle|dataloader_num_workers|validation_shuffle|filter_overlong_prompts_workers|"
     r"image_key|video_key|trust_remote_code|custom_cls\.\w+|return_multi_modal_inputs|sampler\.\w+|datagen\.\w+|"
     r"apply_chat_template_kwargs|seed)$", "data loading: rllab's prompts come from [task]"),
    (r"^(reward_model\.(?!enable$)|custom_reward_function\.(path|name)$)", "the reward is rllab's [task] (choose it in the TOML)"),
    (r"^reward\.(?!reward_kwargs\.(overlong_buffer_cfg\.\w+|max_resp_len)$)", "the reward is rllab's [task] (choose it in the TOML)"),
    (r"^critic\.(?!optim\.lr$|cliprange_value$)", "the critic's placement and batching follow the actor's in rllab"),
    (r"^algorithm\.pf_ppo\.", "read only with algorithm.use_pf_ppo"),
    (r"^actor_rollout_ref\.actor\.optim\.total_training_steps$", "filled in by verl's trainer from the run's length"),
    (r"^trainer\.total_epochs$", "passes over a data set the config does not hold; the run's length is trainer.total_training_steps"),
)  # fmt: skip
"""(regex on the dotted key, reason) for keys that do not change the algorithm."""

ONLY_WITH = {
    A + "kl_loss_": A + "use_kl_loss = true", ALG + "kl_ctrl.": ALG + "use_kl_in_reward = true",
    ALG + "kl_penalty": ALG + "use_kl_in_reward = true", ALG + "filter_groups.": ALG + "filter_groups.enable = true",
    "custom_reward_function.overlong_buffer.": "custom_reward_function.overlong_buffer.enable = true",
    OB: OB + "enable = true", RK + "max_resp_len": OB + "enable = true",
    A + "loss_scale_factor": A + "loss_agg_mode = 'seq-mean-token-sum-norm'",
    A + "policy_loss.clip_cov": A + "policy_loss.loss_mode = 'clip_cov'",
    A + "policy_loss.kl_cov": A + "policy_loss.loss_mode = 'kl_cov'", A + "policy_loss.ppo_kl": A + "policy_loss.loss_mode = 'kl_cov'",
    "critic.": ALG + "adv_estimator = 'gae'", ALG + "gamma": ALG + "adv_estimator = 'gae' or 'reinforce_plus_plus'",
    ALG + "lam": ALG + "adv_estimator = 'gae'", ALG + "norm_adv_by_std_in_grpo": ALG + "adv_estimator = 'grpo'",
    RC: RC + "rollout_is or rollout_rs", "actor_rollout_ref.model.lora_": "actor_rollout_ref.model.lora_rank > 0",
    "actor_rollout_ref.model.target_modules": "actor_rollout_ref.model.lora_rank > 0",
    A + "clip_ratio": "a clipped loss_mode", "trainer.total_epochs": "trainer.total_training_steps = null (and it counts passes over a data set the config does not hold)",
    A + "optim.min_lr_ratio": A + "optim.warmup_style = 'cosine'", A + "optim.num_cycles": A + "optim.warmup_style = 'cosine'",
    A + "optim.lr_warmup_steps_ratio": A + "optim.lr_warmup_steps = -1",
}  # fmt: skip
"""Keys read only when a switch is on: the switch named when they are ignored."""

ESTIMATORS = {
    "gae": "gae", "grpo": "grpo", "grpo_vectorized": "grpo", "rloo": "rloo", "rloo_vectorized": "rloo",
    "reinforce_plus_plus": "reinforce_plus_plus", "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline",
    "remax": "remax", "opo": "opo", "gpg": "gpg", "grpo_passk": "grpo_passk",
    "optimal_token_baseline": "optimal_token_baseline", "tir_optimal_token_baseline": "tir_optimal_token_baseline",
}  # fmt: skip
MASK_SCORES = {"grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg", "grpo_passk"}
"""Estimators with rllab's ``mask_scores`` knob (False is verl: scores summed over every position)."""
LOSS_MODES = {"vanilla": "ppo_dual_clip", "gspo": "gspo", "cispo": "cispo", "clip_cov": "clip_cov", "kl_cov": "kl_cov",
              "geo_mean": "geo_mean", "reinforce": "vanilla_pg", "dppo_tv": "dppo_tv", "dppo_kl": "dppo_kl"}  # fmt: skip
AGGREGATIONS = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")


def apply_overrides(flat: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """verl's command-line overrides (``a.b=v``, ``+a.b=v``, ``++a.b=v``), values read as YAML."""
    import yaml

    out = dict(flat)
    for item in overrides:
        if "=" not in item or item.startswith("~"):
            raise ConfigError(f"verl override {item!r}: expected key=value (deleting keys with ~ is not supported)")
        key, text = item.split("=", 1)
        key = key.lstrip("+").strip()
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        if not key:
            raise ConfigError(f"verl override {item!r}: the key is empty")
        for old in [k for k in out if k.startswith(key + ".")]:
            del out[old]
        out.update(flatten(value, key + ".") if isinstance(value, Mapping) and value else {key: value})
    return out


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _number(value: Any) -> Any:
    """``"1e-6"`` as OmegaConf reads it (a float); PyYAML's YAML 1.1 keeps it a string."""
    return float(value) if isinstance(value, str) and _FLOAT.match(value.strip()) else value


_INTERP = re.compile(r"^\$\{(?:oc\.select:)?([\w.]+)(?:,(.*))?\}$")


def _resolve(flat: dict[str, Any]) -> dict[str, Any]:
    """``${a.b}`` / ``${oc.select:a.b,default}`` values replaced by what they point at (or their default)."""
    import yaml

    out = dict(flat)
    for _ in range(5):  # chains of interpolations
        for k, v in out.items():
            m = _INTERP.match(v) if isinstance(v, str) else None
            if m:
                target, default = m.group(1), m.group(2)
                if target in out and not (isinstance(out[target], str) and _INTERP.match(out[target])):
                    out[k] = out[target]
                elif target in DEFAULTS:
                    out[k] = DEFAULTS[target]
                elif target in GENERATED and not (isinstance(GENERATED[target], str) and _INTERP.match(GENERATED[target])):
                    out[k] = GENERATED[target]
                elif default is not None:
                    out[k] = yaml.safe_load(default)
    return out


def _type_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be ``key``'s (None if it can); keys whose default is null take anything."""
    default = DEFAULTS[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if default is None or key.endswith("threshold"):  # verl's thresholds are numbers or "lower_upper" strings
        return None
    if value is None and key in (A + "clip_ratio_low", A + "clip_ratio_high", A + "optim.lr_warmup_steps", ALG + "filter_groups.metric"):
        return None  # null: fall back on clip_ratio / the warm-up ratio, as verl does
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if isinstance(default, int) and not isinstance(default, bool) and key.endswith(("batch_size", ".n", "epochs", "steps", ".len")):
        return None if isinstance(value, int) and not isinstance(value, bool) else f"expected a whole number, got {value!r}"
    if isinstance(default, (int, float)):
        return None if number else f"expected a number, got {value!r}"
    if isinstance(default, str) and not isinstance(value, str):
        return f"expected a string, got {value!r}"
    return None


def _canonical(key: str) -> str:
    """The name this module reads ``key`` under: the DAPO recipe's earlier ``reward_model.overlong_buffer.*``
    and the ``reward_model.reward_kwargs.*`` verl 0.9.1 copies to ``reward.reward_kwargs.*``."""
    for old, new in (("reward_model.overlong_buffer.", "custom_reward_function.overlong_buffer."),
                     ("reward_model.reward_kwargs.", RK)):
        if key.startswith(old):
            return new + key[len(old):]
    return key


def _header(tree: Mapping[str, Any]) -> tuple[dict, dict]:
    """A recipe's Hydra header (``defaults``, ``hydra.*``) taken off ``tree``: (the rest, the header's keys)."""
    rest = {k: v for k, v in tree.items() if k not in ("defaults", "hydra")}
    header = {}
    if "defaults" in tree:
        header["defaults"] = tree["defaults"]
    if isinstance(tree.get("hydra"), Mapping):
        header.update(flatten(tree["hydra"], "hydra."))
    elif "hydra" in tree:
        header["hydra"] = tree["hydra"]
    return rest, header


def _generated_defaults() -> dict[str, Any]:
    """verl 0.9.1's full default config (:data:`GENERATED`), its interpolations resolved."""
    global _GENERATED_RESOLVED
    if _GENERATED_RESOLVED is None:
        _GENERATED_RESOLVED = {k: _number(v) for k, v in _resolve(dict(GENERATED)).items()}
    return _GENERATED_RESOLVED


_GENERATED_RESOLVED: dict[str, Any] | None = None


def _read(tree: Mapping[str, Any], overrides) -> tuple[dict, dict, dict, dict, list]:
    """(the Hydra header, the keys as spelled, the keys as read, read name → spelled name, the
    ``reward.reward_kwargs.*`` keys that ``reward_model.reward_kwargs`` replaces)."""
    body, header = _header(tree)
    spelled = {k: _number(v) for k, v in _resolve(apply_overrides(flatten(body), list(overrides))).items()}
    migrated = any(k.startswith("reward_model.reward_kwargs.") for k in spelled)
    given: dict[str, Any] = {}
    spelling: dict[str, str] = {}
    replaced = []
    for key, value in spelled.items():
        if migrated and key.startswith(RK):
            replaced.append(key)  # verl copies reward_model.reward_kwargs over the whole of reward.reward_kwargs
            continue
        canon = _canonical(key)
        if canon != key:
            spelling[canon] = key
        given[canon] = value
    return header, spelled, given, spelling, replaced


def settings(tree: Mapping[str, Any], overrides: list[str] = ()) -> dict[str, Any]:
    """The verl settings the importer reads (:data:`DEFAULTS` keys), as ``tree`` and ``overrides`` set them."""
    _, _, given, _, _ = _read(tree, overrides)
    return {**DEFAULTS, **{k: v for k, v in given.items() if k in DEFAULTS}}


def translate(tree: Mapping[str, Any], overrides: list[str] = ()) -> Translation:
    """A verl ``ppo_trainer`` config (nested dict; a recipe with a Hydra ``defaults`` header is resolved
    against verl's ``ppo_trainer`` defaults) plus dotted overrides → a :class:`Translation`."""
    header, spelled, given, spelling, replaced = _read(tree, overrides)
    t = Translation(SOURCE, given={**header, **spelled}, defaults=DEFAULTS, spelling=spelling)
    _check_header(t, header)
    for key in replaced:  # (by its own name: reward.reward_kwargs.* is the name the migrated keys are read under)
        t.ignored[key] = "not read: verl 0.9.1 copies reward_model.reward_kwargs over reward.reward_kwargs"
    bad = {k: _type_problem(k, v) for k, v in given.items() if k in DEFAULTS}
    for key, problem in bad.items():
        if problem:
            t.refuse(key, problem)
    c = {**DEFAULTS, **{k: v for k, v in given.items() if not bad.get(k)}}
    generated = _generated_defaults()
    for key in given:
        if key in DEFAULTS:
            continue
        why = next((why for pattern, why in IGNORED_PATTERNS if re.search(pattern, key)), None)
        if key in RENAMED:
            t.ignore(key, RENAMED[key])
        elif why is not None:
            t.ignore(key, why)
        elif key in generated:
            if given[key] == generated[key]:
                t.ignore(key, f"at verl {VERL_VERSION}'s default (the importer maps no other value)")
            else:
                t.refuse(key, f"a verl {VERL_VERSION} key the importer does not map; only its default "
                         f"({generated[key]!r}) is accepted")
        elif "." not in key:
            t.refuse(key, "not a section of a verl config (a TRL GRPOConfig? import it with `rllab import trl`)")
        else:
            near = difflib.get_close_matches(key, list(generated), n=1, cutoff=0.8)
            t.refuse(key, f"not a key of verl {VERL_VERSION}'s ppo_trainer config" + (f" (did you mean {near[0]!r}?)" if near else ""))
    t.set("", "name", "verl-ppo", how=f"imported from {SOURCE}")
    t.set("algorithm", "name", "rl", how="verl's RayPPOTrainer")
    _batch(t, c)
    _sampling(t, c)
    _optimizer(t, c)
    _advantage(t, c)
    _loss(t, c)
    _kl(t, c)
    _correction(t, c)
    _shaping(t, c)
    for key in given:
        if key in DEFAULTS and t._name(key) not in t.accounted() and given[key] == DEFAULTS[key]:
            t.mapped_from.add(t._name(key))  # a key written out at its default was read as that default
        elif key in DEFAULTS and t._name(key) not in t.accounted():
            switch = next((s for prefix, s in ONLY_WITH.items() if key.startswith(prefix)), "another setting")
            t.ignore(key, f"read only with {switch}")
    return t


def _check_header(t: Translation, header: dict) -> None:
    """A recipe's Hydra header: its ``defaults`` may compose verl's ``ppo_trainer`` (and ``_self_``) only."""
    for key, value in header.items():
        if key != "defaults":
            t.ignore(key, "Hydra's search path for the recipe's defaults")
            continue
        entries = value if isinstance(value, list) else [value]
        other = [e for e in entries if e not in ("ppo_trainer", "_self_")]
        if other:
            t.refuse("defaults", f"{other[0]!r}: the importer resolves a recipe against verl's ppo_trainer defaults only")
        else:
            t.ignore("defaults", f"Hydra's composition: the keys left out take verl {VERL_VERSION}'s ppo_trainer defaults")


def _batch(t: Translation, c: dict) -> None:
    bs, mini, n = c["data.train_batch_size"], c[A + "ppo_mini_batch_size"], c[R + "n"]
    if not isinstance(bs, int) or not isinstance(mini, int) or mini < 1 or bs % mini:
        t.refuse(A + "ppo_mini_batch_size", f"verl needs data.train_batch_size ({bs}) to be a multiple of it")
        return
    t.set("rollout", "prompts_per_step", bs, "data.train_batch_size")
    t.set("rollout", "group_size", n, R + "n")
    t.set("algorithm", "minibatches", bs // mini, "data.train_batch_size", A + "ppo_mini_batch_size", how="prompts per step / per minibatch")
    t.set("algorithm", "epochs", c[A + "ppo_epochs"], A + "ppo_epochs")
    if bs // mini > 1:
        t.set("algorithm", "minibatch_order", "reshuffle" if c[A + "shuffle"] else "in_order", A + "shuffle",
              how="verl's minibatches: contiguous in row order (after trainer.balance_batch), or reshuffled each epoch")
    if c[A + "ppo_micro_batch_size_per_gpu"]:
        t.set("algorithm", "micro_batch_size", c[A + "ppo_micro_batch_size_per_gpu"], A + "ppo_micro_batch_size_per_gpu")
    if c[A + "ppo_micro_batch_size"] is not None:
        t.ignore(A + "ppo_micro_batch_size", "the global micro-batch size (deprecated in verl) only splits the computation")
    if c["trainer.total_training_steps"]:
        t.set("train", "steps", c["trainer.total_training_steps"], "trainer.total_training_steps")
    gen = c["data.gen_batch_size"]
    if gen is not None and gen != bs:
        t.differ("data.gen_batch_size", f"verl samples {gen} prompts and keeps {bs} after filtering groups; rllab samples "
                 "data.train_batch_size prompts and trains on the groups that survive")


def _sampling(t: Translation, c: dict) -> None:
    if not c[R + "do_sample"]:
        t.refuse(R + "do_sample", "rllab trains on sampled completions")
    if c[R + "ignore_eos"]:
        t.refuse(R + "ignore_eos", "rllab's samplers stop at the end-of-sequence token")
    t.set("rollout", "temperature", c[R + "temperature"], R + "temperature")
    t.set("rollout", "top_p", float(c[R + "top_p"]), R + "top_p")
    top_k = c[R + "top_k"]
    t.set("rollout", "top_k", top_k if top_k and top_k > 0 else -1, R + "top_k", how="0 (HF) and -1 (vLLM) are off")
    length_key = R + "response_length" if c[R + "response_length"] is not None else "data.max_response_length"
    t.set("rollout", "max_new_tokens", c[length_key], length_key)
    t.set("rollout", "max_prompt_tokens", c["data.max_prompt_length"], "data.max_prompt_length", "data.truncation",
          how="longer prompts are dropped from the draws")
    if c["data.truncation"] != "error" and not c["data.filter_overlong_prompts"]:
        t.differ("data.truncation", f"verl truncates long prompts ({c['data.truncation']!r}); rllab drops them")
    elif "data.filter_overlong_prompts" in t.given:
        t.ignore("data.filter_overlong_prompts", "rllab drops prompts over rollout.max_prompt_tokens, as verl's filter")


def _optimizer(t: Translation, c: dict) -> None:
    t.set("train", "lr", c[A + "optim.lr"], A + "optim.lr")
    t.set("train", "weight_decay", c[A + "optim.weight_decay"], A + "optim.weight_decay")
    # verl 0.9.1's engine workers clip at optim.clip_grad, its legacy actor at actor.grad_clip (both 1.0)
    clips = [k for k in (A + "optim.clip_grad", A + "grad_clip") if k in t.given or t._name(k) in t.given]
    if len(clips) == 2 and c[clips[0]] != c[clips[1]]:
        t.refuse(A + "grad_clip", f"{c[clips[1]]} here, {c[clips[0]]} in optim.clip_grad: verl's engine workers read "
                 "optim.clip_grad and its legacy actor grad_clip; set them alike")
    clip_key = clips[0] if clips else A + "optim.clip_grad"
    t.set("train", "max_grad_norm", c[clip_key], *(clips or [clip_key]))
    if str(c[A + "optim.optimizer"]).lower() != "adamw":
        t.refuse(A + "optim.optimizer", "rllab trains with AdamW")
    if c[A + "optim.optimizer_impl"] != "torch.optim":
        t.refuse(A + "optim.optimizer_impl", "rllab's AdamW is torch.optim.AdamW")
    t.set("train", "lr", c[A + "optim.lr"], A + "optim.lr", A + "optim.optimizer", A + "optim.optimizer_impl",
          how="rllab's optimizer is torch.optim.AdamW")
    if list(c[A + "optim.betas"]) != [0.9, 0.999]:
        t.refuse(A + "optim.betas", "rllab's AdamW uses torch's betas (0.9, 0.999)")
    # verl 0.9.1: the deprecated warmup_style, when set, replaces lr_scheduler_type
    style_key = A + "optim.warmup_style" if c[A + "optim.warmup_style"] is not None else A + "optim.lr_scheduler_type"
    style = c[style_key]
    if style not in ("constant", "cosine"):
        t.refuse(style_key, "verl's schedules are 'constant' and 'cosine'")
    else:
        t.set("train", "lr_schedule", style, style_key)
    if style == "cosine" and (c[A + "optim.min_lr_ratio"] or c[A + "optim.num_cycles"] != 0.5):
        t.refuse(A + "optim.min_lr_ratio" if c[A + "optim.min_lr_ratio"] else A + "optim.num_cycles",
                 "rllab's cosine decays to 0 over half a period")
    warm = c[A + "optim.lr_warmup_steps"]
    if warm is None or warm < 0:
        ratio, steps = c[A + "optim.lr_warmup_steps_ratio"], c["trainer.total_training_steps"]
        if ratio and not steps:
            t.refuse(A + "optim.lr_warmup_steps_ratio", "a warm-up ratio needs trainer.total_training_steps")
            return
        warm = int(ratio * steps) if ratio else 0
        t.set("train", "warmup_steps", warm, A + "optim.lr_warmup_steps_ratio", "trainer.total_training_steps")
    else:
        t.set("train", "warmup_steps", warm, A + "optim.lr_warmup_steps")
    if warm:
        t.set("train", "lr_warmup", "then_decay", style_key, how="verl's rate rises as step/warmup_steps, then decays over the rest")


def _pick(t: Translation, key: str, section: str, name: str | None, refusal: str) -> str | None:
    """``[section] name = name``, read from verl's ``key``; ``name`` None (verl's value has no
    counterpart): ``key`` refused with ``refusal``, and None."""
    if name is None:
        t.refuse(key, refusal)
        return None
    t.set(section, "name", name, key)
    return name


def _advantage(t: Translation, c: dict) -> None:
    est = c[ALG + "adv_estimator"]
    name = _pick(t, ALG + "adv_estimator", "advantage", ESTIMATORS.get(est), f"rllab has no counterpart; mapped: {sorted(ESTIMATORS)}")
    if name is None:
        return
    if name in MASK_SCORES:
        t.set("advantage", "mask_scores", False, how="verl sums a row's rewards over every position")
    if est == "rloo_vectorized":
        t.set("advantage", "singleton", "zero", ALG + "adv_estimator", how="rloo_vectorized gives a group of one 0")
    if name == "grpo":
        t.set("advantage", "norm_by_std", c[ALG + "norm_adv_by_std_in_grpo"], ALG + "norm_adv_by_std_in_grpo")
    if name == "gae":
        t.set("advantage", "gamma", float(c[ALG + "gamma"]), ALG + "gamma")
        t.set("advantage", "lam", float(c[ALG + "lam"]), ALG + "lam")
        t.set("train", "critic_lr", c["critic.optim.lr"], "critic.optim.lr")
        t.set("value_loss", "name", "clipped", ALG + "adv_estimator")
        t.set("value_loss", "value_clip", c["critic.cliprange_value"], "critic.cliprange_value")
        t.set("algorithm", "vf_coef", 1.0, how="verl's critic loss is unscaled")
    if name in ("reinforce_plus_plus",):
        t.set("advantage", "gamma", float(c[ALG + "gamma"]), ALG + "gamma")
    if c["trainer.critic_warmup"]:
        t.refuse("trainer.critic_warmup", "rllab updates the policy from the first step (no critic-only warm-up steps)")
    if c[ALG + "use_pf_ppo"]:
        t.refuse(ALG + "use_pf_ppo", "rllab has no policy-filtration reweighting")


def _loss(t: Translation, c: dict) -> None:
    name = _pick(t, A + "policy_loss.loss_mode", "policy_loss", LOSS_MODES.get(c[A + "policy_loss.loss_mode"]),
                 f"not mapped by the importer; mapped: {sorted(LOSS_MODES)}")
    if name is None:
        return
    low_key = A + "clip_ratio_low" if c[A + "clip_ratio_low"] is not None else A + "clip_ratio"
    high_key = A + "clip_ratio_high" if c[A + "clip_ratio_high"] is not None else A + "clip_ratio"
    if name in ("ppo_dual_clip", "gspo", "clip_cov", "geo_mean", "dppo_tv", "dppo_kl", "cispo"):
        t.set("policy_loss", "clip_high", c[high_key], high_key)
        t.set("policy_loss", "clip_low", c[low_key], low_key)
    if A + "clip_ratio" in t.given and low_key != A + "clip_ratio" and high_key != A + "clip_ratio":
        t.ignore(A + "clip_ratio", "not read: clip_ratio_low and clip_ratio_high (0.2 by default in verl) take precedence")
    if name in ("ppo_dual_clip", "dppo_tv", "dppo_kl"):
        t.set("policy_loss", "clip_c", float(c[A + "clip_ratio_c"]), A + "clip_ratio_c")
    if name == "cispo":
        t.set("policy_loss", "clip_form", "relative", how="verl's clip(r, 1 − low, 1 + high)")
    if name == "clip_cov":
        for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"):
            t.set("policy_loss", k, c[A + "policy_loss." + k], A + "policy_loss." + k)
    if name == "kl_cov":
        for k in ("kl_cov_ratio", "ppo_kl_coef"):
            t.set("policy_loss", k, c[A + "policy_loss." + k], A + "policy_loss." + k)
    if name == "geo_mean":
        t.set("policy_loss", "count_empty_rows", True, how="verl's mean over all rows")
    agg = _pick(t, A + "loss_agg_mode", "aggregation", c[A + "loss_agg_mode"] if c[A + "loss_agg_mode"] in AGGREGATIONS else None,
                f"verl's modes are {list(AGGREGATIONS)}")
    if agg is None:
        return
    if agg == "seq-mean-token-sum-norm" and c[A + "loss_scale_factor"] is not None:
        t.set("aggregation", "horizon", c[A + "loss_scale_factor"], A + "loss_scale_factor", how="verl's constant divisor")
    elif agg == "seq-mean-token-sum-norm":
        t.set("aggregation", "horizon", c["data.max_response_length"], "data.max_response_length",
              how="verl divides by the response width, padded to the response length")
    t.set("algorithm", "entropy_coef", float(c[A + "entropy_coeff"]), A + "entropy_coeff")


def _kl(t: Translation, c: dict) -> None:
    in_reward, in_loss = c[ALG + "use_kl_in_reward"], c[A + "use_kl_loss"]
    if in_reward and in_loss:
        t.refuse(A + "use_kl_loss", "rllab applies the KL in one place: the reward (use_kl_in_reward) or the loss")
        return
    if not (in_reward or in_loss):
        t.set("algorithm", "kl_in", "none", ALG + "use_kl_in_reward", A + "use_kl_loss")
        return
    kind_key = ALG + "kl_penalty" if in_reward else A + "kl_loss_type"
    kind = str(c[kind_key])
    if _pick(t, kind_key, "kl", kind if kind.rstrip("+") in KL_TYPES else None, f"verl's estimators are {list(KL_TYPES)} (and their '+' forms)") is None:
        return
    if in_reward:
        t.set("algorithm", "kl_in", "reward", ALG + "use_kl_in_reward")
        t.set("algorithm", "kl_measure", "penalty_row_mean", how="the KL verl's controller adapts to")
        ctrl = c[ALG + "kl_ctrl.type"]
        if ctrl not in ("fixed", "adaptive"):
            t.refuse(ALG + "kl_ctrl.type", "verl's controllers are 'fixed' and 'adaptive'")
            return
        t.set("kl_controller", "name", ctrl, ALG + "kl_ctrl.type")
        t.set("kl_controller", "kl_coef", float(c[ALG + "kl_ctrl.kl_coef"]), ALG + "kl_ctrl.kl_coef")
        if ctrl == "adaptive":
            t.set("kl_controller", "target_kl", float(c[ALG + "kl_ctrl.target_kl"]), ALG + "kl_ctrl.target_kl")
            t.set("kl_controller", "horizon", float(c[ALG + "kl_ctrl.horizon"]), ALG + "kl_ctrl.horizon")
    else:
        t.set("algorithm", "kl_in", "loss", A + "use_kl_loss")
        t.set("kl_controller", "name", "fixed", A + "use_kl_loss")
        t.set("kl_controller", "kl_coef", float(c[A + "kl_loss_coef"]), A + "kl_loss_coef")


def _thresholds(text: Any) -> tuple[list[float], list[float]]:
    """verl's ``rollout_rs_threshold`` (``"0.5_2.0,0.1"`` or a number) → (uppers, lowers)."""
    uppers, lowers = [], []
    for part in str(text).split(","):
        bits = part.strip().split("_")
        uppers.append(float(bits[-1]))
        if len(bits) == 2:
            lowers.append(float(bits[0]))
    return uppers, lowers


def _correction(t: Translation, c: dict) -> None:
    if c[RC + "bypass_mode"]:
        t.refuse(RC + "bypass_mode", "not mapped by the importer: set policy_loss = 'bypass_mode' with its knobs by hand")
        return
    level, rs = c[RC + "rollout_is"], c[RC + "rollout_rs"]
    if level not in (None, "token", "sequence"):
        t.refuse(RC + "rollout_is", "verl's levels are null, 'token', 'sequence'")
        return
    thr = c[RC + "rollout_is_threshold"]
    try:
        c_upper, c_lower = _thresholds(thr)
    except ValueError:
        t.refuse(RC + "rollout_is_threshold", "expected a number or 'lower_upper'")
        return
    masked = bool(c_lower)
    if rs:
        t.set("correction", "name", "rejection", RC + "rollout_rs")
        t.set("correction", "criterion", str(rs), RC + "rollout_rs")
        try:
            uppers, lowers = _thresholds(c[RC + "rollout_rs_threshold"] if c[RC + "rollout_rs_threshold"] is not None else thr)
        except ValueError:
            t.refuse(RC + "rollout_rs_threshold", "expected a number, 'lower_upper', or a comma-separated list of them")
            return
        t.set("correction", "upper", uppers[0] if len(uppers) == 1 else uppers, RC + "rollout_rs_threshold")
        if lowers:
            t.set("correction", "lower", lowers[0] if len(lowers) == 1 else lowers, RC + "rollout_rs_threshold")
        if level:
            t.set("correction", "is_level", level, RC + "rollout_is")
            t.set("correction", "c_max", c_upper[0], RC + "rollout_is_threshold")
            if masked:
                t.set("correction", "c_min", c_lower[0], RC + "rollout_is_threshold")
    elif level:
        name = f"{level}_{'mask' if masked else 'truncate'}"
        t.set("correction", "name", name, RC + "rollout_is", RC + "rollout_is_threshold")
        t.set("correction", "c_max", c_upper[0], RC + "rollout_is_threshold")
        if masked:
            t.set("correction", "c_min", c_lower[0], RC + "rollout_is_threshold")
    else:
        t.set("correction", "name", "none", RC + "rollout_is", RC + "rollout_rs")
        return
    t.set("correction", "batch_normalize", bool(c[RC + "rollout_is_batch_normalize"]), RC + "rollout_is_batch_normalize")


def _shaping(t: Translation, c: dict) -> None:
    if c[ALG + "filter_groups.enable"]:
        t.set("rollout", "dynamic_sampling", True, ALG + "filter_groups.enable", ALG + "filter_groups.metric",
              ALG + "filter_groups.max_num_gen_batches", how="drop groups whose scores are all equal")
        t.differ(ALG + "filter_groups.enable", "verl samples more batches (up to filter_groups.max_num_gen_batches) until "
                 "data.train_batch_size groups survive; rllab trains on the groups that survive one draw")
    ob = "custom_reward_function.overlong_buffer."
    kw = bool(c[OB + "enable"])
    if kw and c[ob + "enable"]:
        t.refuse(ob + "enable", f"the overlong penalty is given twice: verl 0.9.1's DAPO reward manager reads {OB}*")
    if kw:
        cap = c[R + "response_length"] if c[R + "response_length"] is not None else c["data.max_response_length"]
        if c[RK + "max_resp_len"] is None:
            t.refuse(OB + "enable", "verl's DAPO reward manager needs reward_kwargs.max_resp_len with the overlong buffer")
        elif c[RK + "max_resp_len"] != cap:
            t.refuse(RK + "max_resp_len", f"the penalty starts at max_resp_len − len; rllab's at the sampling cap ({cap}): "
                     "set max_resp_len to the response length")
        t.set("rollout", "overlong_buffer", int(c[OB + "len"]), OB + "enable", OB + "len", RK + "max_resp_len",
              how="−(length − (max_resp_len − len)) / len × penalty_factor, at most 0")
        t.set("rollout", "overlong_penalty", float(c[OB + "penalty_factor"]), OB + "penalty_factor")
        if OB + "log" in t.given or t._name(OB + "log") in t.given:
            t.ignore(OB + "log", "logging")
    elif c[ob + "enable"]:
        t.set("rollout", "overlong_buffer", int(c[ob + "len"]), ob + "enable", ob + "len")
        t.set("rollout", "overlong_penalty", float(c[ob + "penalty_factor"]), ob + "penalty_factor")
        if ob + "log" in t.given or t._name(ob + "log") in t.given:
            t.ignore(ob + "log", "logging")
    if c[ALG + "filter_groups.enable"]:
        _filter_metric(t, c, overlong=kw or bool(c[ob + "enable"]))
    if c["reward_model.enable"]:
        t.refuse("reward_model.enable", "a reward model is not mapped: the reward is rllab's [task]")
    lora = c["actor_rollout_ref.model.lora_rank"]
    if lora:
        t.set("model", "lora", {"r": int(lora), "alpha": float(c["actor_rollout_ref.model.lora_alpha"]),
                                "target_modules": _modules(c["actor_rollout_ref.model.target_modules"])},
              "actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora_alpha", "actor_rollout_ref.model.target_modules")
    if c["actor_rollout_ref.model.path"]:
        t.set("model", "path", str(c["actor_rollout_ref.model.path"]), "actor_rollout_ref.model.path")


def _filter_metric(t: Translation, c: dict, *, overlong: bool) -> None:
    """``algorithm.filter_groups.metric``: rllab keeps the groups whose scores (reward + the overlong penalty) differ."""
    metric, key = c[ALG + "filter_groups.metric"], ALG + "filter_groups.metric"
    if metric is None:
        t.refuse(key, "verl 0.9.1 refuses group filtering without a metric")
    elif metric in ("reward", "seq_reward"):
        return  # verl's reward before any KL penalty, its token-level scores summed: with the overlong penalty, rllab's score
    elif metric == "seq_final_reward":
        if c[ALG + "use_kl_in_reward"]:
            t.differ(key, "verl filters on the reward after the KL penalty; rllab on the reward before it")
    elif metric in ("acc", "score"):
        if overlong:
            t.differ(key, f"verl filters on {metric!r}, the reward function's score before the overlong penalty "
                     "('acc': the accuracy it reports, else that score); rllab on the score with the penalty")
        elif metric == "acc":
            t.differ(key, "verl filters on the accuracy the reward function reports (its score when it returns a number); "
                     "rllab on the task's reward")
    else:
        t.refuse(key, "a field the reward function reports: rllab filters on the score of each completion (verl's "
                 "'reward'; 'acc', 'score' and 'seq_final_reward' listed as differing where they do)")


def _modules(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


__all__ = ["DEFAULTS", "IGNORED_PATTERNS", "apply_overrides", "flatten", "settings", "translate"]
