"""``rllab import trl``: TRL GRPOConfig fields mapped, ignored or refused, by hand-checked values."""

import math

import pytest

from rllab.errors import ConfigError
from rllab_referee import trl
from rllab_referee.trl_fields import FIELDS, GRPO_FIELDS

ALGORITHM_KNOBS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
    "steps_per_generation", "num_iterations", "loss_type", "epsilon", "epsilon_high", "delta", "beta",
    "use_bias_correction_kl", "importance_sampling_level", "scale_rewards", "mask_truncated_completions",
    "top_entropy_quantile", "vllm_importance_sampling_correction", "temperature", "top_p", "top_k",
    "max_completion_length", "learning_rate", "max_grad_norm", "seed",
)  # fmt: skip


def values(t) -> dict:
    return {k: v for k, (v, _) in t.values.items()}


def imported(**raw):
    t = trl.translate(raw)
    t.finish()
    return values(t)


def _other(name, default):
    """A value of ``name`` that is not its default (of the same kind where there is one)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 3 if default >= 0 else 5
    if isinstance(default, float):
        return default * 2 + 0.5
    if isinstance(default, str):
        return default + "_other"
    if isinstance(default, (list, dict)):
        return [1.0] if isinstance(default, list) else {"x": 1}
    return 0.75 if "threshold" in name or name in ("delta", "min_p", "vllm_importance_sampling_clip_min") else 7


def test_a_config_with_every_field_changed_names_every_field():
    """No field is dropped silently: each non-default field is mapped, ignored, differs or refused, by an
    explicit rule (none falls to the catch-all), and the error names every refused one."""
    raw = {name: _other(name, default) for name, default in FIELDS.items()}
    raw.update(  # other valid choices, so that every rule is reached
        per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4, generation_batch_size=16,
        steps_per_generation=4, loss_type="sapo", importance_sampling_level="sequence", scale_rewards="batch",
        multi_objective_aggregation="normalize_then_sum", lr_scheduler_type="cosine", max_steps=40,
        vllm_importance_sampling_mode="token_mask", optim="adamw_torch", warmup_steps=4, reward_weights=[1.0, 2.0],
    )
    assert all(raw[k] != FIELDS[k] for k in raw)
    t = trl.translate(raw)
    assert set(raw) <= t.accounted()
    with pytest.raises(ConfigError) as e:
        t.finish()
    assert not [k for k, why in t.refused.items() if why.startswith("no rule maps")]
    for knob in t.refused:
        assert f"  {knob} = " in str(e.value)
    for knob in ALGORITHM_KNOBS:  # an algorithm knob is ignored only where another knob makes it unread
        assert knob not in t.ignored or t.ignored[knob].startswith(("not read by", "read only with")), (knob, t.ignored[knob])
    assert t.ignored["epsilon"] == "not read by loss_type = 'sapo'"
    for knob in ("top_entropy_quantile", "importance_sampling_level", "min_p", "adam_beta1",
                 "sync_ref_model", "disable_dropout", "generation_batch_size"):
        assert knob in t.refused


def test_every_field_has_a_rule():
    ruled = set(trl.IGNORED) | set(trl.REFUSED_UNLESS_DEFAULT) | set(trl.ONLY_WITH)
    read = {"per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
            "steps_per_generation", "num_iterations", "learning_rate", "max_grad_norm", "weight_decay", "seed",
            "max_steps", "lr_scheduler_type", "warmup_steps", "temperature", "top_p", "top_k", "max_completion_length",
            "multi_objective_aggregation", "reward_weights", "scale_rewards", "loss_type", "importance_sampling_level",
            "epsilon", "epsilon_high", "delta", "off_policy_mask_threshold", "sapo_temperature_pos",
            "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "beta",
            "use_bias_correction_kl", "entropy_coef", "use_vllm", "optim", "model_init_kwargs",
            "mask_truncated_completions"}  # fmt: skip
    assert set(FIELDS) == ruled | read, sorted(set(FIELDS) ^ (ruled | read))


def test_the_field_table_is_trl_1_16s():
    trl_config = pytest.importorskip("trl").GRPOConfig
    import dataclasses

    import trl as trl_package

    if trl_package.__version__ != "1.16.0":
        pytest.skip(f"the table is TRL 1.16.0's; {trl_package.__version__} installed")
    fields = {f.name: f.default for f in dataclasses.fields(trl_config)}
    assert set(GRPO_FIELDS) <= set(fields)
    assert {k: fields[k] for k in GRPO_FIELDS} == GRPO_FIELDS


def test_batch_arithmetic():
    """4 rows per device × 2 processes × 4 micro-batches = 32 completions = 8 prompts × 4; 4 / 2
    accumulation steps = 2 optimizer steps; 12 optimizer steps at 2 × 2 per rollout step = 3 steps."""
    t = trl.translate(dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
                           num_generations=4, num_iterations=2, max_steps=12, lr_scheduler_type="constant"), processes=2)
    t.finish()
    v = values(t)
    assert (v["rollout", "prompts_per_step"], v["rollout", "group_size"]) == (8, 4)
    assert (v["algorithm", "minibatches"], v["algorithm", "epochs"], v["algorithm", "micro_batch_size"]) == (2, 2, 4)
    assert v["train", "steps"] == 3
    v = imported(per_device_train_batch_size=6, generation_batch_size=24, num_generations=3)
    assert (v["rollout", "prompts_per_step"], v["algorithm", "minibatches"]) == (8, 4)


@pytest.mark.parametrize(
    "raw, why",
    [
        (dict(generation_batch_size=16, steps_per_generation=2), "together"),
        (dict(generation_batch_size=12), "divisible by the global batch size 8"),
        (dict(num_generations=3), "divisor"),
        (dict(gradient_accumulation_steps=2, steps_per_generation=3), "span two rollout batches"),
        (dict(delta=1.1, epsilon_high=0.28), "delta > 1 + epsilon_high"),
        (dict(delta=2.0, importance_sampling_level="sequence"), "no dual clip"),
        (dict(loss_type="cispo", importance_sampling_level="sequence"), "its own ratio"),
        (dict(loss_type="grpp"), "knows"),
        (dict(learnig_rate=1e-5), "did you mean 'learning_rate'"),
        (dict(top_entropy_quantile=0.2), "high-entropy"),
        (dict(reward_weights=[1.0, 2.0]), "one reward"),
        (dict(warmup_steps=0.1), "needs max_steps"),
        (dict(lr_scheduler_type="cosine_with_restarts"), "schedules"),
        (dict(max_completion_length=None), "cap"),
        (dict(per_device_train_batch_size=0), "whole number ≥ 1, got 0"),
        (dict(gradient_accumulation_steps=2.5), "whole number ≥ 1, got 2.5"),
    ],
)
def test_refusals_name_the_knob_and_why(raw, why):
    with pytest.raises(ConfigError) as e:
        imported(**raw)
    assert why in str(e.value)
    assert f"  {next(iter(t for t in trl.translate(raw).refused))} = " in str(e.value)


LOSSES = [
    ("grpo", "ppo_clip", "seq-mean-token-mean", {"count_empty_rows": True}),
    ("bnpo", "ppo_clip", "token-mean", {}),
    ("dr_grpo", "ppo_clip", "seq-mean-token-sum-norm", {"count_empty_rows": True, "horizon": 64}),
    ("dapo", "ppo_clip", "token-mean", {}),
    ("luspo", "ppo_clip", "seq-mean-token-sum", {"count_empty_rows": True}),
    ("cispo", "cispo", "token-mean", {}),
    ("sapo", "sapo", "seq-mean-token-mean", {"count_empty_rows": True}),
    ("vespo", "vespo", "token-mean", {}),
]


@pytest.mark.parametrize("loss_type, loss, aggregation, knobs", LOSSES)
def test_loss_types(loss_type, loss, aggregation, knobs):
    v = imported(loss_type=loss_type, max_completion_length=64)
    assert v["policy_loss", "name"] == loss
    assert v["aggregation", "name"] == aggregation
    assert {k[1]: x for k, x in v.items() if k[0] == "aggregation" and k[1] != "name"} == knobs


def test_clips_ratios_and_delta():
    v = imported(epsilon=0.1, epsilon_high=0.3)
    assert (v["policy_loss", "clip_low"], v["policy_loss", "clip_high"], v["policy_loss", "log_ratio_clamp"]) == (0.1, 0.3, math.inf)
    v = imported(delta=1.5)  # min(r, δ) inside the PPO minimum is the dual clip at c = δ
    assert (v["policy_loss", "name"], v["policy_loss", "clip_c"], v["policy_loss", "clip_high"]) == ("ppo_dual_clip", 1.5, 0.2)
    v = imported(loss_type="cispo", epsilon_high=5.0)
    assert (v["policy_loss", "clip_high"], v["policy_loss", "clip_form"]) == (5.0, "absolute")
    v = imported(importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4)
    assert (v["policy_loss", "name"], v["policy_loss", "log_ratio_max"]) == ("gspo", math.inf)
    v = imported(loss_type="sapo", sapo_temperature_pos=0.5, sapo_temperature_neg=2.0)
    assert (v["policy_loss", "tau_pos"], v["policy_loss", "tau_neg"]) == (0.5, 2.0)
    v = imported(off_policy_mask_threshold=0.5)
    assert v["policy_loss", "off_policy_mask_threshold"] == 0.5


def test_kl_advantage_sampling_and_correction():
    v = imported(beta=0.04, importance_sampling_level="sequence")
    assert (v["algorithm", "kl_in"], v["kl", "name"], v["kl", "clamp"], v["kl_controller", "kl_coef"]) == ("loss", "k3", False, 0.04)
    assert v["algorithm", "kl_importance_ratio"] == "sequence"
    assert imported(beta=0.04, use_bias_correction_kl=False)["algorithm", "kl_importance_ratio"] == "none"
    assert imported()["algorithm", "kl_in"] == "none"
    v = imported(scale_rewards=False, top_k=0, temperature=0.7)
    assert (v["advantage", "scale"], v["advantage", "epsilon"], v["rollout", "top_k"], v["rollout", "temperature"]) == ("none", 1e-4, -1, 0.7)
    assert imported(scale_rewards=True)["advantage", "scale"] == "group"
    assert imported()["correction", "name"] == "none"
    v = imported(use_vllm=True)  # TRL's default correction: sequence_mask at 3.0
    assert (v["correction", "name"], v["correction", "c_max"]) == ("sequence_mask", 3.0)
    v = imported(use_vllm=True, vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=0.5)
    assert (v["correction", "name"], v["correction", "c_min"]) == ("token_truncate", 0.5)
    t = trl.translate({"vllm_importance_sampling_mode": "token_mask"})
    assert "use_vllm" in t.ignored["vllm_importance_sampling_mode"]


def test_differences_are_listed_and_strict_refuses_them():
    ragged = dict(steps_per_generation=4, max_steps=10)  # 10 optimizer steps: not a whole number of rollout steps of 4
    t = trl.translate(ragged)
    t.finish()
    assert "max_steps" in t.differs and "max_steps" in t.summary()
    with pytest.raises(ConfigError, match=r"\(--strict\)"):
        trl.translate(ragged).finish(strict=True)
    t = trl.translate(dict(loss_type="bnpo", gradient_accumulation_steps=2))  # a mean of the micro-batches' token means
    t.finish()
    assert not t.differs and t.values["algorithm", "token_count"][0] == "micro_batch"
    t = trl.translate(dict(warmup_steps=5, max_steps=50))  # transformers' warm-up shape: mapped, not a difference
    t.finish()
    assert not t.differs and (t.values["train", "warmup_steps"][0], t.values["train", "lr_warmup"][0]) == (5, "then_decay")
    t = trl.translate(dict(warmup_steps=5, lr_scheduler_type="constant"))  # transformers' constant schedule has no warm-up
    t.finish()
    assert t.values["train", "warmup_steps"][0] == 0 and "ignores the warm-up" in t.values["train", "warmup_steps"][1]
    t = trl.translate(dict(loss_type="dapo", steps_per_generation=4))
    t.finish()
    assert "loss_type" not in t.differs and "generation batch" in t.values["algorithm", "token_count"][1]


def test_trl_cli_yaml_keys_peft_and_the_wrong_framework():
    """A `trl grpo --config` YAML: the model path and LoRA are mapped, the data set and rewards are the
    task's (ignored, saying so), PEFT variants rllab lacks are refused, and a verl file is told apart."""
    t = trl.translate(dict(model_name_or_path="Org/Model", dataset_name="trl-lib/tldr", reward_funcs=["accuracy"],
                           use_peft=True, lora_r=8, lora_alpha=16, lora_target_modules=["q_proj", "v_proj"]))
    t.finish()
    v = values(t)
    assert v["model", "lora"] == {"r": 8, "alpha": 16.0, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    assert v["model", "path"] == "Org/Model" and "huggingface-cli download" in t.values["model", "path"][1]
    assert "[task]" in t.ignored["dataset_name"] and "[task]" in t.ignored["reward_funcs"]
    t = trl.translate(dict(use_peft=True))
    t.finish()
    assert "lora_target_modules" in t.differs and "target_modules" not in values(t)["model", "lora"]
    assert "lora_r" in trl.translate(dict(lora_r=4)).ignored
    with pytest.raises(ConfigError, match="use_dora"):
        imported(use_peft=True, use_dora=True)
    with pytest.raises(ConfigError, match="rllab import verl"):
        imported(actor_rollout_ref={"rollout": {"n": 4}})


# --------------------------------------------------------------------------- the mapped components against TRL's formulas
# TRL 1.16.0 GRPOTrainer._compute_loss, written out for one micro-batch (one process, no accumulation).


def _trl_loss(logp, old, adv, mask, *, level, loss_type, eps_low, eps_high, delta=None):
    import torch

    m = mask.to(logp.dtype)
    log_ratio = logp - old
    if level == "sequence":
        log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    a = adv[:, :1]
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    if loss_type == "grpo":
        return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    return (per_token * m).sum() / m.sum().clamp(min=1.0)  # dapo, one step per generation


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
@pytest.mark.parametrize("level, delta", [("token", None), ("token", 1.6), ("sequence", None)])
def test_the_imported_loss_is_trls(loss_type, level, delta):
    """The policy loss and aggregation the importer writes give TRL's loss and gradient (float64),
    ratios far outside the clip range included."""
    import torch

    import rllab

    raw = dict(loss_type=loss_type, importance_sampling_level=level, epsilon=0.2, epsilon_high=0.28, delta=delta)
    v = imported(**raw)
    lab = rllab.Lab()
    loss_knobs = {k[1]: x for k, x in v.items() if k[0] == "policy_loss" and k[1] != "name"}
    agg_knobs = {k[1]: x for k, x in v.items() if k[0] == "aggregation" and k[1] != "name"}
    loss = lab.get("policy_loss", v["policy_loss", "name"], **loss_knobs)
    agg = lab.get("loss_aggregation", v["aggregation", "name"], **agg_knobs)
    g = torch.Generator().manual_seed(3)
    B, T = 6, 7
    mask = torch.arange(T)[None, :] < torch.tensor([7, 5, 3, 1, 6, 4])[:, None]
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * (0.8 if level == "token" else 0.3)).requires_grad_(True)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T)
    ours, _ = loss(log_prob=logp, old_log_prob=old, advantages=torch.where(mask, adv, 0.0), mask=mask,
                   aggregate=lambda m, k: agg(loss_mat=m, mask=k))
    (grad,) = torch.autograd.grad(ours, logp)
    theirs = _trl_loss(logp, old, adv, mask, level=level, loss_type=loss_type, eps_low=0.2, eps_high=0.28, delta=delta)
    (their_grad,) = torch.autograd.grad(theirs, logp)
    assert torch.allclose(ours, theirs, rtol=1e-10, atol=1e-12), (float(ours), float(theirs))
    assert torch.allclose(grad, their_grad, rtol=1e-9, atol=1e-12)


def test_every_field_written_out_at_its_default_is_the_default_config():
    """A YAML that spells out every GRPOConfig default imports to the same settings as an empty one."""
    t = trl.translate(dict(FIELDS))
    t.finish()
    assert values(t) == imported()
    assert not t.differs


def test_numbers_written_as_strings_read_as_trl_reads_them():
    """PyYAML reads `learning_rate: 1e-6` as a string; TRL's parser converts it by the field's type."""
    v = imported(learning_rate="1e-6", per_device_train_batch_size="4", num_generations=4)
    assert (v["train", "lr"], v["algorithm", "micro_batch_size"]) == (1e-6, 4)
    with pytest.raises(ConfigError, match="expected a number"):
        imported(learning_rate="fast")


# Fields that may be ignored because they only move hardware, precision, logging/saving/evaluation or data
# loading — kept here, apart from the importer's table, so that a field newly ignored there fails this test
# until it is judged to be one of these.
HARDWARE = {
    "activation_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing", "gradient_checkpointing_kwargs",
    "torch_compile", "torch_compile_backend", "torch_compile_mode", "use_liger_kernel", "liger_kernel_config", "use_cache",
    "torch_empty_cache_steps", "use_cpu", "accelerator_config", "parallelism_config", "ddp_find_unused_parameters",
    "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend", "ddp_timeout", "fsdp", "fsdp_config",
    "deepspeed", "local_rank", "full_determinism", "average_tokens_across_devices", "ds3_gather_for_generation",
    "pad_to_multiple_of", "cache_implementation", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode",
    "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
    "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
    "use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged",
    "trust_remote_code", "model_init_kwargs", "bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "tf32", "cast_lm_head_to_fp32",
}  # fmt: skip
LOGGING = {
    "output_dir", "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node", "logging_nan_inf_filter",
    "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm", "report_to", "run_name", "project",
    "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "eval_strategy", "eval_steps", "eval_delay",
    "per_device_eval_batch_size", "prediction_loss_only", "eval_on_start", "eval_do_concat_batches", "eval_use_gather_object",
    "eval_accumulation_steps", "include_for_metrics", "batch_eval_metrics", "save_only_model", "save_strategy", "save_steps",
    "save_on_each_node", "save_total_limit", "enable_jit_checkpoint", "push_to_hub", "hub_token", "hub_private_repo",
    "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision", "load_best_model_at_end", "metric_for_best_model",
    "greater_is_better", "do_train", "do_eval", "do_predict", "skip_memory_metrics", "debug", "num_generations_eval",
    "log_completions", "log_multimodal", "num_completions_to_print", "log_unique_prompts", "log_completions_hub_repo",
    "resume_from_checkpoint", "ignore_data_skip", "restore_callback_states_from_checkpoint",
}  # fmt: skip
DATA_LOADING = {
    "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns",
    "label_names", "train_sampling_strategy", "length_column_name", "shuffle_dataset", "data_seed",
    "num_train_epochs",  # passes over the data set: the run's length is max_steps
    "label_smoothing_factor",  # read by the Trainer's compute_loss only, which GRPOTrainer replaces
}  # fmt: skip
ALLOWED_IGNORED = HARDWARE | LOGGING | DATA_LOADING
NOT_A_DEFAULT = {  # valid values other than the default, where the generic one is not
    "optim": "sgd", "lr_scheduler_type": "cosine", "loss_type": "grpo", "importance_sampling_level": "sequence",
    "scale_rewards": "batch", "multi_objective_aggregation": "normalize_then_sum", "vllm_importance_sampling_mode": "token_mask",
    "report_to": "wandb", "model_init_kwargs": {"dtype": "bfloat16"}, "generation_batch_size": 16, "steps_per_generation": 2,
    "num_generations": 4, "per_device_train_batch_size": 16, "max_steps": 12, "warmup_steps": 2, "reward_weights": [1.0, 2.0],
}  # fmt: skip


def _grpo_config_fields() -> dict:
    """GRPOConfig's fields and defaults: from TRL when it is installed, else the importer's own table."""
    try:
        import dataclasses

        from trl import GRPOConfig
    except ImportError:
        return dict(FIELDS)
    return {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in FIELDS or not f.name.startswith("_")}


@pytest.mark.parametrize("field", sorted(_grpo_config_fields()))
def test_an_ignored_field_never_changes_the_algorithm(field):
    """Each field alone at a value other than its default is mapped, differs, is refused, or is ignored
    only if it is hardware, logging or data loading (or read only under a switch that is off)."""
    default = _grpo_config_fields()[field]
    value = NOT_A_DEFAULT.get(field, _other(field, default))
    assert value != default
    t = trl.translate({field: value})
    fate = ("refused" if field in t.refused else "differs" if field in t.differs else "ignored" if field in t.ignored
            else "mapped" if field in t.mapped_from else None)
    assert fate is not None, f"{field} = {value!r} has no fate"
    if fate == "ignored":
        why = t.ignored[field]
        # or unread: another knob (at its default) switches it off
        assert field in ALLOWED_IGNORED or why.startswith(("read only with", "not read by", "beta = 0")), (field, why)


@pytest.mark.parametrize("optim, ok", [("adamw_torch_fused", True), ("adamw_torch", True), ("sgd", False), ("adafactor", False),
                                       ("adamw_bnb_8bit", False), ("lion_32bit", False)])
def test_the_optimizer_is_mapped_or_refused_by_name(optim, ok):
    if ok:
        v = imported(optim=optim, learning_rate=2e-6)
        assert v["train", "lr"] == 2e-6
        t = trl.translate({"optim": optim})
        assert f"optim = {optim!r}".replace("'", '"') in t.toml() and "torch.optim.AdamW" in t.toml()
    else:
        with pytest.raises(ConfigError, match=rf"optim = \S*{optim}\S*: rllab trains with torch's AdamW"):
            imported(optim=optim)
    for knob, value in (("adam_beta1", 0.8), ("adam_beta2", 0.99), ("adam_epsilon", 1e-6), ("optim_args", "x=1")):
        with pytest.raises(ConfigError, match=knob):
            imported(**{knob: value})


def test_weight_decay_differs_where_the_trainer_exempts_norms_and_biases():
    t = trl.translate({"weight_decay": 0.1})
    t.finish()
    assert values(t)["train", "weight_decay"] == 0.1 and "exempts biases and normalisation weights" in t.differs["weight_decay"]
    with pytest.raises(ConfigError, match="weight_decay"):
        trl.translate({"weight_decay": 0.1}).finish(strict=True)
    assert "weight_decay" not in trl.translate({"weight_decay": 0.0}).differs


def test_model_init_kwargs_other_than_loading_are_refused():
    assert trl.translate({"model_init_kwargs": {"dtype": "bfloat16", "attn_implementation": "sdpa"}}).ignored["model_init_kwargs"]
    with pytest.raises(ConfigError, match="model_init_kwargs.*attention_dropout: not a loading argument"):
        imported(model_init_kwargs={"dtype": "bfloat16", "attention_dropout": 0.1})


def test_fewer_steps_per_generation_than_accumulation_steps():
    """TRL's Lite PPO example (cut down): 4 rows × 2 slices per generation batch, 8 accumulated micro-batches
    per optimizer step: one optimizer step takes 8 / 2 = 4 generation batches of 8 completions, i.e. one
    rllab step of 4 × 8 / num_generations 4 = 8 prompts, one minibatch, one epoch."""
    lite = dict(scale_rewards="batch", loss_type="dapo", num_generations=4, per_device_train_batch_size=4,
                gradient_accumulation_steps=8, steps_per_generation=2, max_steps=6)
    t = trl.translate(lite)
    t.finish()
    v = values(t)
    assert (v["rollout", "prompts_per_step"], v["algorithm", "minibatches"], v["algorithm", "epochs"]) == (8, 1, 1)
    assert v["train", "steps"] == 6 and v["train", "lr_schedule_steps"] == 6  # one optimizer step per rllab step
    # exact for loss types that average rows or micro-batches; dapo's per-batch normaliser and batch std differ
    assert "divides each one's token sum by its own token count (× 4)" in t.differs["gradient_accumulation_steps"]
    assert "over each generation batch of 8 completions, rllab over the step's 32" in t.differs["scale_rewards"]
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        t.finish(strict=True)
    t = trl.translate({**lite, "loss_type": "grpo", "scale_rewards": "group"})
    t.finish()
    assert not t.differs
    # num_iterations 4: a generation batch of 2 slices lasts 2 × 4 = 8 micro-batches, 2 optimizer steps of 4
    v = imported(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=4, steps_per_generation=2,
                 num_iterations=4, loss_type="grpo")
    assert (v["rollout", "prompts_per_step"], v["algorithm", "minibatches"], v["algorithm", "epochs"]) == (2, 1, 2)
    # num_iterations 2, accumulation 8: each optimizer step takes 8 / (2 × 2) = 2 generation batches
    v = imported(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=8, steps_per_generation=2,
                 num_iterations=2, loss_type="grpo")
    assert (v["rollout", "prompts_per_step"], v["algorithm", "epochs"]) == (4, 1)
    for bad in (dict(gradient_accumulation_steps=4, steps_per_generation=3), dict(gradient_accumulation_steps=8, steps_per_generation=2,
                                                                                 num_iterations=3)):
        with pytest.raises(ConfigError, match="steps_per_generation.*do not cover whole generation batches"):
            imported(num_generations=4, per_device_train_batch_size=4, **bad)


def test_mask_truncated_completions_is_rollout_mask_truncated():
    assert imported(mask_truncated_completions=True)["rollout", "mask_truncated"] is True
    assert ("rollout", "mask_truncated") not in imported(mask_truncated_completions=False)
    assert "mask_truncated_completions = true" in trl.translate({"mask_truncated_completions": True}).toml()


def test_the_warnings_trl_gives_are_listed():
    t = trl.translate({"importance_sampling_level": "sequence", "loss_type": "dapo"})
    assert "weighing each sequence by its length" in t.warnings["importance_sampling_level"]
    assert "warnings:" in t.summary()
    assert "'luspo' mirrors its paper" in trl.translate({"loss_type": "luspo"}).warnings["loss_type"]
    assert not trl.translate({"importance_sampling_level": "sequence", "loss_type": "grpo"}).warnings
