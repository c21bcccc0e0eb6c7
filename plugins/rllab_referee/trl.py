"""TRL ``GRPOConfig`` → rllab: every field mapped, ignored with its reason, or refused.

Semantics read off TRL 1.16.0 ``GRPOTrainer`` (``_compute_loss``, ``_generate_and_score_completions``)
and ``GRPOConfig.__post_init__``; the field list and defaults are :mod:`rllab_referee.trl_fields`.
The mapping in words is docs/frameworks.md. In short:

* batch: one rllab step is one TRL generation batch: ``generation_batch_size`` completions
  (``per_device_train_batch_size × processes × steps_per_generation`` unless given) of
  ``num_generations`` each, so ``rollout.prompts_per_step = generation_batch_size / num_generations``;
  ``steps_per_generation / gradient_accumulation_steps`` optimizer steps per generation are
  ``algorithm.minibatches``; ``num_iterations`` is ``algorithm.epochs``;
  ``per_device_train_batch_size`` is ``algorithm.micro_batch_size``;
* ``loss_type`` picks the policy loss and the aggregation, ``importance_sampling_level="sequence"``
  the sequence-ratio loss (``gspo``), ``delta`` the dual clip (``ppo_dual_clip`` with
  ``clip_c = delta``: TRL's ``min(r, δ)`` before the PPO minimum is the dual clip's cap when
  δ > 1 + ε_high); TRL's ratios are unclamped (``log_ratio_clamp = None``);
* advantages: ``grpo`` with TRL's ε = 1e-4 and ``scale = scale_rewards``;
* ``beta`` > 0: the KL as a loss (``kl_in = "loss"``), TRL's unclamped k3, multiplied by the
  importance ratio when ``use_bias_correction_kl``;
* vLLM's importance-sampling correction (only with ``use_vllm``): ``[correction]`` of the same mode.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Mapping

from rllab_referee.result import Translation
from rllab_referee.trl_fields import (ADAMW, FIELDS, IGNORED, LORA_KEYS, MODEL_LOADING_KWARGS, ONLY_WITH, REFUSED_UNLESS_DEFAULT,
                                      SCRIPT_KEYS, TRL_VERSION)

SOURCE = f"TRL GRPOConfig ({TRL_VERSION})"
TRL_EPSILON = 1e-4
"""The constant TRL adds to the std of the rewards (not a config field)."""




def _lora(t: Translation, raw: Mapping[str, Any]) -> None:
    """``use_peft`` and its ``lora_*`` keys → ``model.lora``; the PEFT variants rllab lacks are refused."""
    given = [k for k in raw if k in LORA_KEYS]
    c = {**LORA_KEYS, **{k: raw[k] for k in given}}
    for key, why in (("lora_target_parameters", "rllab's LoRA adapts modules, not parameters"),
                     ("lora_modules_to_save", "rllab trains only the adapters"),
                     ("use_rslora", "rllab's LoRA scales by alpha / r"), ("use_dora", "rllab's LoRA is plain LoRA"),
                     ("load_in_8bit", "rllab does not quantise the base model"),
                     ("load_in_4bit", "rllab does not quantise the base model")):  # fmt: skip
        if key in raw and c[key] not in (None, False, []):
            t.refuse(key, why)
    for key in ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"):
        if key in raw:
            t.ignore(key, "read only with load_in_4bit = true")
    if not c["use_peft"]:
        for key in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
            if key in raw:
                t.ignore(key, "read only with use_peft = true")
        if "use_peft" in raw:
            t.ignore("use_peft", "false: full fine-tuning, rllab's default")
        return
    lora = {"r": c["lora_r"], "alpha": float(c["lora_alpha"]), "dropout": float(c["lora_dropout"])}
    if c["lora_target_modules"] is not None:
        targets = c["lora_target_modules"]
        lora["target_modules"] = [targets] if isinstance(targets, str) else list(targets)
    else:
        t.differ("lora_target_modules", "null: peft adapts the architecture's default modules (q_proj, v_proj for "
                 "Qwen2 and Llama); rllab adapts all linear layers — set lora_target_modules to follow TRL exactly")
    t.set("model", "lora", lora, "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


LOSS_AGGREGATION = {
    "grpo": ("seq-mean-token-mean", {"count_empty_rows": True}),
    "sapo": ("seq-mean-token-mean", {"count_empty_rows": True}),
    "bnpo": ("token-mean", {}),
    "dr_grpo": ("seq-mean-token-sum-norm", {"count_empty_rows": True}),
    "dapo": ("token-mean", {}),
    "cispo": ("token-mean", {}),
    "vespo": ("token-mean", {}),
    "luspo": ("seq-mean-token-sum", {"count_empty_rows": True}),
}
"""TRL's ``loss_type`` → rllab's aggregation and its knobs (``_compute_loss``'s normalisers)."""


NUMBER_OR_NONE = ("generation_batch_size", "steps_per_generation", "epsilon_high", "delta", "max_completion_length",
                  "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap",
                  "off_policy_mask_threshold", "num_generations", "max_tool_calling_iterations", "min_p",
                  "max_completion_length")  # fmt: skip
"""Fields whose default is None and whose value is a number."""


COUNTS = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
          "steps_per_generation", "num_iterations", "max_completion_length")
"""Fields that count something: whole numbers ≥ 1 (or null where the default is)."""


def _type_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be ``key``'s (None if it can)."""
    default = FIELDS[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "scale_rewards" and isinstance(value, bool):
        return None
    if key in COUNTS and value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return f"expected a whole number ≥ 1, got {value!r}"
    if key in NUMBER_OR_NONE:
        return None if value is None or number else f"expected a number or null, got {value!r}"
    if key == "reward_weights" and not (value is None or isinstance(value, list) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)):
        return f"expected a list of numbers or null, got {value!r}"
    if isinstance(default, bool) and not isinstance(value, bool):
        return f"expected true or false, got {value!r}"
    if isinstance(default, (int, float)) and not isinstance(default, bool) and not number:
        return f"expected a number, got {value!r}"
    if isinstance(default, str) and not isinstance(value, str) and key not in ("lr_scheduler_type", "optim", "report_to", "debug"):
        return f"expected a string, got {value!r}"
    return None


def _number(key: str, value: Any) -> Any:
    """A numeric field's string (``learning_rate: 1e-6``, a string to PyYAML) as TRL's parser reads it."""
    default = FIELDS.get(key, LORA_KEYS.get(key))
    numeric = key in NUMBER_OR_NONE or isinstance(default, (int, float)) and not isinstance(default, bool)
    if not (numeric and isinstance(value, str)):
        return value
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if isinstance(default, int) and number.is_integer() else number


def translate(raw: Mapping[str, Any], *, processes: int = 1) -> Translation:
    """A TRL ``GRPOConfig`` (as the dict of a YAML/JSON file) → a :class:`Translation`.

    ``processes``: TRL's number of training processes (``accelerate launch --num_processes``),
    which sizes the generation batch and is not in the config."""
    raw = {k: _number(k, v) for k, v in raw.items()}
    t = Translation(SOURCE, given=dict(raw), defaults={**FIELDS, **LORA_KEYS})
    for key in raw:
        if key in SCRIPT_KEYS:
            t.ignore(key, SCRIPT_KEYS[key])
        elif key == "model_name_or_path":
            local = Path(str(raw[key])).expanduser().is_dir()
            t.set("model", "path", str(raw[key]), key, how="" if local else "not a local directory here: rllab loads a "
                  "downloaded model directory (huggingface-cli download NAME --local-dir DIR), then set model.path to it")
        elif key in ("actor_rollout_ref", "algorithm", "data", "trainer", "critic", "reward_model", "custom_reward_function") \
                and isinstance(raw[key], Mapping):
            t.refuse(key, "a section of a verl config: import it with `rllab import verl`")
        elif key not in FIELDS and key not in LORA_KEYS:
            near = difflib.get_close_matches(key, list(FIELDS), n=1)
            t.refuse(key, f"not a field of TRL {TRL_VERSION}'s GRPOConfig" + (f" (did you mean {near[0]!r}?)" if near else ""))
    bad = {k: _type_problem(k, v) for k, v in raw.items() if k in FIELDS}
    for key, problem in bad.items():
        if problem:
            t.refuse(key, problem)
    c = {**FIELDS, **{k: v for k, v in raw.items() if k in FIELDS and not bad[k]}}
    c["processes"] = processes
    c["scale_rewards"] = {True: "group", False: "none"}.get(c["scale_rewards"], c["scale_rewards"])
    for key, why in IGNORED.items():
        if key in raw:
            t.ignore(key, why)
    for key, why in REFUSED_UNLESS_DEFAULT.items():
        if key in raw and raw[key] != FIELDS[key] and raw[key] not in (None, {}, "", []):
            t.refuse(key, why)
        elif key in raw:
            t.ignore(key, "at its default")
    for key, switch in ONLY_WITH.items():
        if key in raw and not c[switch]:
            t.ignore(key, f"read only with {switch} = true")
    t.set("", "name", "trl-grpo", how=f"imported from {SOURCE}")
    t.set("algorithm", "name", "rl", how="GRPOTrainer")
    minibatches = _batch(t, c, processes)
    _optimizer(t, c, raw, minibatches)
    _sampling(t, c)
    _advantage(t, c)
    _loss(t, c, raw)
    _kl_and_entropy(t, c, raw)
    _correction(t, c, raw)
    _lora(t, raw)
    defaults = {**FIELDS, **LORA_KEYS}
    for key in raw:  # a knob written out at its default was read as that default
        if key in defaults and key not in t.accounted() and raw[key] == defaults[key]:
            t.mapped_from.add(key)
    if t.refused:  # a refused knob can stop the knobs that depend on it from being read
        for key in raw:
            if key not in t.accounted():
                t.ignore(key, "not examined: the config is refused for the knobs above")
    return t


def _batch(t: Translation, c: dict, processes: int) -> int:
    """Prompts per step, group size, minibatches, epochs and micro-batches; returns the minibatches."""
    pdb, ga, g = c["per_device_train_batch_size"], c["gradient_accumulation_steps"], c["num_generations"]
    gbs, spg = c["generation_batch_size"], c["steps_per_generation"]
    knobs = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
             "generation_batch_size", "steps_per_generation")  # fmt: skip
    if gbs is not None and spg is not None:
        t.refuse("generation_batch_size", "TRL refuses generation_batch_size and steps_per_generation together")
        gbs = None
    rows = pdb * processes
    if gbs is None:
        spg = spg if spg is not None else ga
        gbs = rows * spg
        how = f"{pdb} per device × {processes} process(es) × steps_per_generation {spg}"
    elif gbs % rows:
        t.refuse("generation_batch_size", f"TRL needs it divisible by the global batch size {rows}")
        return 1
    else:
        spg = gbs // rows
        how = f"generation_batch_size {gbs}"
    if not g or g < 2 or gbs % g:
        t.refuse("num_generations", f"TRL needs at least 2 and a divisor of the generation batch ({gbs} completions)")
        return 1
    given = [k for k in knobs if k in t.given] or ["per_device_train_batch_size"]
    if spg < ga:
        return _batch_across_generations(t, c, given, rows=rows, spg=spg, ga=ga, g=g)
    if spg % ga:
        t.refuse("steps_per_generation", f"{spg} micro-batches per generation is not a whole number of optimizer steps "
                 f"of gradient_accumulation_steps = {ga}: an optimizer step would span two rollout batches")
        return 1
    t.set("rollout", "prompts_per_step", gbs // g, *given, how=f"({how}) completions / num_generations {g}")
    t.set("rollout", "group_size", g, "num_generations")
    t.set("algorithm", "minibatches", spg // ga, *given, how=f"steps_per_generation {spg} / gradient_accumulation_steps {ga}: optimizer steps per generation")
    t.set("algorithm", "micro_batch_size", pdb, "per_device_train_batch_size", how="rows per forward/backward")
    t.set("algorithm", "epochs", c["num_iterations"], "num_iterations")
    if spg // ga > 1:
        t.set("algorithm", "minibatch_order", "once", "steps_per_generation", "num_iterations",
              how="TRL shuffles a generation batch once and goes over the same split in every iteration")
    return spg // ga


def _batch_across_generations(t: Translation, c: dict, given: list, *, rows: int, spg: int, ga: int, g: int) -> int:
    """``steps_per_generation`` < ``gradient_accumulation_steps``: TRL's optimizer step accumulates over
    ``ga`` micro-batches, taking slice ``i % spg`` of the generation batch and sampling a new one every
    ``spg × num_iterations`` micro-batches. Within an optimizer step the weights do not move, so either
    each optimizer step goes over one generation batch (``ga / spg`` times, which weighs it as once) and
    ``spg × num_iterations / ga`` of them use it (epochs), or one optimizer step takes ``k = ga / (spg ×
    num_iterations)`` generation batches sampled by the same weights: one rllab step of them all. Returns
    the minibatches (1)."""
    iters = c["num_iterations"]
    used = spg * iters
    where = (f"steps_per_generation {spg} × num_iterations {iters} micro-batches per generation, "
             f"gradient_accumulation_steps {ga} per optimizer step")
    if ga % spg or (used % ga and ga % used):
        t.refuse("steps_per_generation", f"{where}: the optimizer steps do not cover whole generation batches (TRL's "
                 "accumulation would mix one batch's slices with the next one's)")
        return 1
    k = ga // used if ga % used == 0 else 1
    epochs = used // ga if used % ga == 0 else 1
    t.set("rollout", "prompts_per_step", rows * spg * k // g, *given,
          how=f"{where}: {k} generation batch(es) of {rows * spg} completions per optimizer step, / num_generations {g}")
    t.set("rollout", "group_size", g, "num_generations")
    t.set("algorithm", "minibatches", 1, *given, how=f"{where}: each optimizer step covers the whole rollout step")
    t.set("algorithm", "micro_batch_size", c["per_device_train_batch_size"], "per_device_train_batch_size",
          how="rows per forward/backward")
    t.set("algorithm", "epochs", epochs, "num_iterations", "steps_per_generation", "gradient_accumulation_steps",
          how=f"{where}: {epochs} optimizer step(s) per generation batch" if epochs > 1 else
          "TRL's repeated slices within one optimizer step weigh each row once")
    if k > 1:
        if c["loss_type"] in ("dapo", "cispo", "vespo"):
            t.differ("gradient_accumulation_steps", f"an optimizer step spans {k} generation batches: TRL's loss_type = "
                     f"{c['loss_type']!r} divides each one's token sum by its own token count (× {k}), rllab divides the "
                     "step's token sum by the step's token count; they agree when the batches have equal token counts")
        if c["scale_rewards"] == "batch" or c["multi_objective_aggregation"] == "normalize_then_sum":
            t.differ("scale_rewards", f"an optimizer step spans {k} generation batches: TRL takes the batch statistics "
                     f"over each generation batch of {rows * spg} completions, rllab over the step's {rows * spg * k}")
    return 1


def _optimizer(t: Translation, c: dict, raw: Mapping, minibatches: int) -> None:
    optim = str(c["optim"])
    if optim not in ADAMW:
        t.refuse("optim", f"rllab trains with torch's AdamW (optim = one of {', '.join(ADAMW)}); {optim!r} is another "
                 "optimizer or another AdamW numerics")
    t.set("train", "lr", c["learning_rate"], "learning_rate", "optim",
          how="rllab's optimizer is torch.optim.AdamW, the update of transformers' adamw_torch* optimizers")
    t.set("train", "max_grad_norm", c["max_grad_norm"], "max_grad_norm")
    t.set("train", "weight_decay", c["weight_decay"], "weight_decay")
    if c["weight_decay"]:
        t.differ("weight_decay", "transformers' Trainer exempts biases and normalisation weights from weight decay; "
                 "rllab's AdamW decays every parameter")
    kwargs = raw.get("model_init_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        t.refuse("model_init_kwargs", f"expected a mapping of from_pretrained arguments, got {kwargs!r}")
    elif kwargs:
        other = sorted(k for k in kwargs if k not in MODEL_LOADING_KWARGS)
        if other:
            t.refuse("model_init_kwargs", f"{', '.join(other)}: not a loading argument ({', '.join(MODEL_LOADING_KWARGS)}); "
                     "other from_pretrained arguments can change the model (its config), which rllab takes from [model]")
        else:
            t.ignore("model_init_kwargs", "model loading only (precision, attention kernel, placement, files)")
    elif "model_init_kwargs" in raw:
        t.ignore("model_init_kwargs", "null: nothing passed to from_pretrained")
    t.set("train", "seed", c["seed"], "seed")
    per_step = minibatches * c["num_iterations"]
    steps = None
    if c["max_steps"] and c["max_steps"] > 0:
        steps = math.ceil(c["max_steps"] / per_step)
        t.set("train", "steps", steps, "max_steps", how=f"optimizer steps / {per_step} per rollout step" if per_step > 1 else "")
        if c["max_steps"] % per_step:
            t.differ("max_steps", f"{c['max_steps']} optimizer steps is not a whole number of rollout steps of {per_step}; rllab runs {steps}")
    schedules = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
    kind = str(c["lr_scheduler_type"])
    if kind not in schedules:
        t.refuse("lr_scheduler_type", f"rllab's schedules are {sorted(set(schedules))} (with warm-up); {kind!r} is not one")
    else:
        t.set("train", "lr_schedule", schedules[kind], "lr_scheduler_type")
    warm = c["warmup_steps"]
    if 0 < warm < 1:
        if not c["max_steps"] or c["max_steps"] <= 0:
            t.refuse("warmup_steps", "a warm-up ratio needs max_steps to become a number of steps")
            return
        warm = math.ceil(warm * c["max_steps"])
    if kind == "constant" and warm:  # transformers' get_constant_schedule takes no warm-up
        t.set("train", "warmup_steps", 0, "warmup_steps", "lr_scheduler_type",
              how="transformers' 'constant' schedule ignores the warm-up ('constant_with_warmup' has one)")
        warm = 0
    else:
        t.set("train", "warmup_steps", math.ceil(warm), "warmup_steps", how="optimizer steps")
    if warm:
        t.set("train", "lr_warmup", "then_decay", "lr_scheduler_type",
              how="transformers' rate rises as step/warmup_steps, then decays over the rest")
    if schedules.get(kind) == "constant" and not warm:
        return  # the rate never moves: nothing to count
    # transformers' schedule moves every optimizer step: so does the imported one
    t.set("train", "lr_schedule_unit", "optimizer_step", "lr_scheduler_type",
          how="transformers' Trainer steps its schedule after every optimizer step")
    if schedules.get(kind) == "constant":
        return  # a warm-up, then constant: no decay to give a length
    if steps is not None:
        t.set("train", "lr_schedule_steps", c["max_steps"], "max_steps", how="the decay's length in optimizer steps")
    else:
        from rllab.config import TrainConfig

        default = TrainConfig().steps
        t.set("train", "lr_schedule_steps", default * per_step,
              how=f"max_steps not given (TRL runs num_train_epochs over its data set): rllab's train.steps ({default}) × "
                  f"{per_step} optimizer steps per rollout step; set it again when you change train.steps")


def _sampling(t: Translation, c: dict) -> None:
    if c["mask_truncated_completions"]:
        t.set("rollout", "mask_truncated", True, "mask_truncated_completions",
              how="a completion cut off at max_completion_length stays in its group but out of the loss")
    t.set("rollout", "temperature", c["temperature"], "temperature")
    t.set("rollout", "top_p", c["top_p"], "top_p")
    t.set("rollout", "top_k", c["top_k"] if c["top_k"] and c["top_k"] > 0 else -1, "top_k", how="0 is off in TRL, -1 in rllab")
    if c["max_completion_length"] is None:
        t.refuse("max_completion_length", "rllab needs a cap on the completion length (rollout.max_new_tokens)")
    else:
        t.set("rollout", "max_new_tokens", c["max_completion_length"], "max_completion_length")


def _advantage(t: Translation, c: dict) -> None:
    how = f"TRL adds {TRL_EPSILON} to the std (a constant, not a field)"
    if c["multi_objective_aggregation"] == "normalize_then_sum":
        t.set("advantage", "name", "normalize_then_sum", "multi_objective_aggregation")
        t.set("advantage", "epsilon", TRL_EPSILON, how=how)
        if c["reward_weights"] is not None:
            t.set("advantage", "reward_weights", list(c["reward_weights"]), "reward_weights")
        if c["scale_rewards"] != "group" and "scale_rewards" in t.given:
            t.ignore("scale_rewards", "not read by multi_objective_aggregation = 'normalize_then_sum' (it standardises over the batch)")
        return
    if c["multi_objective_aggregation"] != "sum_then_normalize":
        t.refuse("multi_objective_aggregation", "TRL knows 'sum_then_normalize' and 'normalize_then_sum'")
        return
    if c["reward_weights"] is not None:
        t.refuse("reward_weights", "rllab's task gives one reward per completion; weigh its parts in the task, or use "
                 "multi_objective_aggregation = 'normalize_then_sum' with a task that has reward components")
    t.set("advantage", "name", "grpo", "multi_objective_aggregation")
    t.set("advantage", "epsilon", TRL_EPSILON, how=how)
    if c["scale_rewards"] not in ("group", "batch", "none"):
        t.refuse("scale_rewards", "TRL knows 'group', 'batch', 'none' (or true/false)")
    else:
        t.set("advantage", "scale", c["scale_rewards"], "scale_rewards")
    t.set("advantage", "singleton", "zero", how="TRL: a group of one has advantage 0")


def _loss(t: Translation, c: dict, raw: Mapping) -> None:
    lt, level = c["loss_type"], c["importance_sampling_level"]
    if lt not in LOSS_AGGREGATION:
        t.refuse("loss_type", f"TRL {TRL_VERSION} knows {sorted(LOSS_AGGREGATION)}")
        return
    if level not in ("token", "sequence"):
        t.refuse("importance_sampling_level", "TRL knows 'token' and 'sequence'")
        return
    eps_low = c["epsilon"]
    eps_high = c["epsilon_high"] if c["epsilon_high"] is not None else c["epsilon"]
    high_knobs = ["epsilon_high"] if c["epsilon_high"] is not None else ["epsilon"]
    opsm = c["off_policy_mask_threshold"]
    unused = [k for k in ("epsilon", "epsilon_high", "delta", "sapo_temperature_pos", "sapo_temperature_neg",
                          "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg") if k in raw]  # fmt: skip
    if level == "sequence" and lt in ("bnpo", "dr_grpo", "dapo", "cispo"):
        t.warn("importance_sampling_level", f"(as TRL warns) with 'sequence', loss_type = {lt!r} sums per-token terms, "
               "weighing each sequence by its length; the GSPO paper's setup is loss_type = 'grpo'")
    if lt == "luspo" and level != "sequence":
        t.warn("loss_type", "(as TRL warns) 'luspo' mirrors its paper with importance_sampling_level = 'sequence'")
    if lt in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        used = {"epsilon", "epsilon_high", "delta"}
        if level == "sequence":
            if c["delta"] is not None:
                t.refuse("delta", "rllab's sequence-ratio loss (gspo) has no dual clip")
            t.set("policy_loss", "name", "gspo", "loss_type", "importance_sampling_level")
            t.set("policy_loss", "log_ratio_max", math.inf, how="TRL does not clamp the sequence ratio")
        elif c["delta"] is not None:
            if not c["delta"] > 1 + eps_high:
                t.refuse("delta", f"TRL's min(r, delta) is the dual clip only for delta > 1 + epsilon_high = {1 + eps_high}")
            if opsm is not None:
                t.refuse("off_policy_mask_threshold", "rllab's dual-clip loss (TRL's delta) has no off-policy mask")
            t.set("policy_loss", "name", "ppo_dual_clip", "loss_type", "delta", how="TRL's min(r, delta) inside the PPO minimum")
            t.set("policy_loss", "clip_c", c["delta"], "delta")
        else:
            t.set("policy_loss", "name", "ppo_clip", "loss_type")
        t.set("policy_loss", "clip_low", eps_low, "epsilon")
        t.set("policy_loss", "clip_high", eps_high, *high_knobs)
    elif lt == "cispo":
        used = {"epsilon_high"}
        if level == "sequence":
            t.refuse("importance_sampling_level", "rllab's cispo weighs each token by its own ratio")
        t.set("policy_loss", "name", "cispo", "loss_type")
        t.set("policy_loss", "clip_high", eps_high, *high_knobs, how="TRL caps the ratio at epsilon_high itself")
        t.set("policy_loss", "clip_form", "absolute", how="TRL's clamp(r, max=epsilon_high)")
    elif lt == "sapo":
        used = {"sapo_temperature_pos", "sapo_temperature_neg"}
        if level == "sequence":
            t.refuse("importance_sampling_level", "rllab's sapo gates each token by its own ratio")
        t.set("policy_loss", "name", "sapo", "loss_type")
        t.set("policy_loss", "tau_pos", c["sapo_temperature_pos"], "sapo_temperature_pos")
        t.set("policy_loss", "tau_neg", c["sapo_temperature_neg"], "sapo_temperature_neg")
    else:  # vespo
        used = {"vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"}
        if level == "sequence":
            t.refuse("importance_sampling_level", "TRL's vespo computes its sequence weights itself; it takes 'token'")
        t.set("policy_loss", "name", "vespo", "loss_type")
        for k in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
            t.set("policy_loss", k, c[f"vespo_{k}"], f"vespo_{k}")
    for k in unused:
        if k not in used:
            t.ignore(k, f"not read by loss_type = {lt!r}")
    if t.values.get(("policy_loss", "name"), ("",))[0] in ("ppo_clip", "ppo_dual_clip", "cispo", "sapo"):
        t.set("policy_loss", "log_ratio_clamp", math.inf, how="TRL does not clamp the log-ratio")
    if opsm is not None and "off_policy_mask_threshold" not in t.refused:
        t.set("policy_loss", "off_policy_mask_threshold", opsm, "off_policy_mask_threshold")
    name, knobs = LOSS_AGGREGATION[lt]
    t.set("aggregation", "name", name, "loss_type")
    for k, v in knobs.items():
        t.set("aggregation", k, v, how="TRL divides by every row of the micro-batch")
    if lt == "dr_grpo" and c["max_completion_length"] is not None:
        t.set("aggregation", "horizon", c["max_completion_length"], "max_completion_length", how="Dr.GRPO's constant")
    if lt in ("dapo", "cispo", "vespo"):
        t.set("algorithm", "token_count", "batch_mean", "loss_type",
              how="TRL divides each optimizer step's token sum by the generation batch's token count / its optimizer steps")
    if lt == "bnpo":
        t.set("algorithm", "token_count", "micro_batch", "loss_type",
              how="TRL's bnpo averages the micro-batches' (and processes') own token means")


def _kl_and_entropy(t: Translation, c: dict, raw: Mapping) -> None:
    if c["beta"]:
        t.set("algorithm", "kl_in", "loss", "beta", how="TRL adds β·KL to the per-token loss")
        t.set("kl", "name", "k3", "beta", how="TRL's exp(ref − logp) − (ref − logp) − 1")
        t.set("kl", "clamp", False, how="TRL does not clamp it")
        t.set("kl_controller", "name", "fixed", "beta")
        t.set("kl_controller", "kl_coef", c["beta"], "beta")
        ratio = c["importance_sampling_level"] if c["use_bias_correction_kl"] else "none"
        t.set("algorithm", "kl_importance_ratio", ratio, "use_bias_correction_kl", "importance_sampling_level")
    else:
        t.set("algorithm", "kl_in", "none", "beta")
        if "use_bias_correction_kl" in raw:
            t.ignore("use_bias_correction_kl", "beta = 0: there is no KL term")
    if c["entropy_coef"]:
        t.set("algorithm", "entropy_coef", c["entropy_coef"], "entropy_coef")
        t.set("algorithm", "entropy_mean", "micro_batch", "entropy_coef",
              how="TRL's entropy bonus is each micro-batch's token mean whatever the loss_type, averaged over accumulation")


def _correction(t: Translation, c: dict, raw: Mapping) -> None:
    if not (c["use_vllm"] and c["vllm_importance_sampling_correction"]):
        knobs = ("use_vllm", "vllm_importance_sampling_correction") if c["use_vllm"] else ("use_vllm",)
        t.set("correction", "name", "none", *knobs, how="no importance-sampling correction (TRL applies it with vLLM only)")
        for key in ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min",
                    "vllm_importance_sampling_cap"):
            if key in raw and c["use_vllm"]:
                t.ignore(key, "read only with vllm_importance_sampling_correction = true")
        return
    mode = c["vllm_importance_sampling_mode"]
    if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        t.refuse("vllm_importance_sampling_mode", "TRL knows token_truncate, token_mask, sequence_truncate, sequence_mask")
        return
    cap = c["vllm_importance_sampling_cap"] if c["vllm_importance_sampling_cap"] is not None else c["vllm_importance_sampling_clip_max"]
    cap_knob = "vllm_importance_sampling_cap" if c["vllm_importance_sampling_cap"] is not None else "vllm_importance_sampling_clip_max"
    t.set("correction", "name", mode, "vllm_importance_sampling_mode", "use_vllm", "vllm_importance_sampling_correction")
    t.set("correction", "c_max", cap if cap is not None else math.inf, cap_knob)
    if c["vllm_importance_sampling_clip_min"] is not None:
        t.set("correction", "c_min", c["vllm_importance_sampling_clip_min"], "vllm_importance_sampling_clip_min")
