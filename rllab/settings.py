"""The ``[model]``, ``[rollout]`` and ``[train]`` settings (``rllab settings`` lists them).

Settings that belong to one algorithm are that algorithm's knobs (the ``[algorithm]`` section);
:data:`MOVED_TRAIN_SETTINGS` names those that used to live in ``[train]``.
"""

from __future__ import annotations

import math
import re

import attrs

from rllab.parallel.placement import STRATEGIES, names as strategy_names
from rllab.specs import knob


@attrs.frozen(kw_only=True)
class ModelConfig:
    """Which model to train."""

    path: str | None = knob(
        None,
        help="a local Hugging Face model directory (config.json, weights and tokenizer files); None builds the tiny default model",
        validator=lambda i, a, v: _not_blank(a.name, v),
    )
    sha256: str | None = knob(
        None,
        help="pins the starting model by content: the sha256 of its files (model.path, or the warm-started tiny model; "
        "'rllab provenance RUN' shows a run's; a prefix of at least 8 hex digits will do); a start that hashes otherwise is refused",
        validator=lambda i, a, v: _check_sha256(a.name, v),
    )
    tiny: dict = knob(factory=dict, help="overrides of the tiny model's architecture and tokenizer (rllab.models.tiny.TinyModelConfig; tokenizer = \"chat\" gives it a chat template)")
    warm_start: dict = knob(factory=dict, help="overrides of the supervised warm start (rllab.models.tiny.WarmStartConfig)")
    device: str = knob("auto", help="where the policy, reference and critic train: auto (CUDA when available), cpu, cuda, cuda:N", validator=lambda i, a, v: _check_device(a.name, v))
    reference_device: str | None = knob(None, help="where the reference model lives (e.g. cpu to save GPU memory); None: same as device", validator=lambda i, a, v: v is None or _check_device(a.name, v))
    dtype: str = knob(
        "auto",
        help="compute dtype of the forwards: auto (bfloat16 on CUDA, float32 on CPU); parameters and optimizer "
        "state stay float32 (master weights) and bfloat16/float16 forwards run under torch.autocast",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    gradient_checkpointing: bool = knob(False, help="recompute activations in backward (less memory, ~30% more compute)")
    logprob_chunk: int = knob(1024, help="tokens per chunk when computing log-probs and entropy", ge=1)
    lora: dict = knob(
        factory=dict,
        help="LoRA adapters through peft (extra 'lora'): {r = 8, alpha = 16.0, dropout = 0.0, target_modules = "
        "['all-linear']} (rllab.models.lora.LoraConfig); only the adapters train and are checkpointed, the reference is the "
        "base model with the adapters disabled, the rollout side gets merged weights; empty: full fine-tuning",
    )
    strategy: str = knob(
        "single",
        help="where the models live (rllab.parallel.placement): single (one device) or fsdp2 (FSDP2 data parallel, one "
        "process per device under torchrun)",
        choices=tuple(STRATEGIES),
    )
    world_size: int | None = knob(
        None, help="fsdp2: the number of processes the run must have (refused otherwise); None: what torchrun started",
        ge=1, validator=lambda i, a, v: _only_with(i, a.name, v, None, "data_parallel"),
    )
    cpu_offload: bool = knob(
        False, help="fsdp2 on CUDA: keep sharded parameters, gradients and optimizer state in CPU memory (CPUOffloadPolicy)",
        validator=lambda i, a, v: _only_with(i, a.name, v, False, "sharded"),
    )
    collective_timeout_s: float = knob(
        600.0,
        help="fsdp2: the longest a rank waits in one collective (an all-reduce, an FSDP all-gather, a barrier) for the "
        "other ranks before the run stops with an error naming the rank, the step and the call; the run stays "
        "resumable from its last checkpoint. Raise it when one rank's rollouts or evaluation can run this much "
        "longer than another's",
        gt=0, validator=lambda i, a, v: _only_with(i, a.name, v, 600.0, "data_parallel"),
    )


def _only_with(inst, name: str, value, default, trait: str) -> None:
    """A knob of the strategies with ``trait`` (:data:`rllab.parallel.placement.STRATEGIES`) refused elsewhere."""
    row = STRATEGIES.get(inst.strategy)
    if value != default and row is not None and not getattr(row, trait):
        fit = " or ".join(repr(n) for n in strategy_names(**{trait: True}))
        raise ValueError(f"{name} = {value!r} applies only with strategy = {fit} (strategy is {inst.strategy!r})")


def _check_device(name: str, value: str) -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
        raise ValueError(f"{name} = {value!r} is not allowed: must be auto, cpu, cuda or cuda:N")


def _check_sha256(name: str, value: str | None) -> None:
    if value is not None and not re.fullmatch(r"(sha256:)?[0-9a-fA-F]{8,64}", value.strip()):
        raise ValueError(f"{name} = {value!r} is not a sha256: give its 64 hex digits (or a prefix of at least 8), as 'rllab provenance RUN' prints it")


def _not_blank(name: str, value: str | None) -> None:
    if value is not None and not value.strip():
        raise ValueError(f"{name} = {value!r} is empty: give a model directory, or leave {name} out for the tiny model")


def _finite(inst, attribute, value) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{attribute.name} = {value!r} must be a finite number")


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """How completions are sampled for training."""

    prompts_per_step: int = knob(16, help="prompts drawn per step (P)", ge=1)
    group_size: int = knob(8, help="samples per prompt (G)", ge=1)
    max_new_tokens: int = knob(8, help="response length cap", ge=1)
    temperature: float = knob(1.0, help="sampling temperature", gt=0.0)
    top_p: float = knob(1.0, help="nucleus sampling mass", gt=0.0, le=1.0)
    top_k: int = knob(-1, help="top-k sampling (-1: off)", ge=-1)
    max_prompt_tokens: int | None = knob(
        None,
        help="drop prompts longer than this many tokens from training draws and the held-out examples, counted at load "
        "(printed, and in final.json as prompts/dropped_train, prompts/dropped_eval); None: a prompt that does not fit "
        "the model's context (a task's: with max_new_tokens) is refused at load (rllab.rollout.prompt_limits)",
        ge=1,
    )
    dynamic_sampling: bool = knob(False, help="drop groups whose scores are all equal (DAPO)")
    mask_truncated: bool = knob(
        False,
        help="overlong filtering (DAPO; TRL's mask_truncated_completions): a completion cut off by max_new_tokens, or an "
        "episode whose last turn was cut off or that outgrew its token budget, is kept in its group (its reward counts in "
        "the advantages) but none of its tokens is trained on (its response mask is cleared; rollout/truncated_frac logs "
        "the share)",
    )
    overlong_buffer: int = knob(0, help="DAPO overlong shaping: penalise the last N tokens before the cap (0: off)", ge=0)
    overlong_penalty: float = knob(1.0, help="DAPO overlong shaping: the penalty reached at the cap", ge=0.0)
    random_reward: str = knob(
        "off",
        help="the spurious-rewards control (Shao et al. 2025, arXiv 2506.10947; slime's --rm-type random): each training "
        "sample's reward becomes a Bernoulli draw, 1 with probability p, seeded per sample from (train.seed, step, prompt, "
        "sample) and blind to the answer; held-out evaluation and rollout/accuracy still score the task's reward "
        "(rollout/true_reward logs its mean). given: p = random_reward_p; matched: p = the mean task reward of the step's "
        "own samples (clipped to [0, 1]), for an environment its solved fraction; off. An environment's episode gets the "
        "draw alone, on its last model token, in place of every turn's reward",
        choices=("off", "given", "matched"),
    )
    random_reward_p: float = knob(
        0.5, help="random_reward = 'given': the probability of a reward of 1 (the paper's 0.5)", ge=0.0, le=1.0,
        validator=lambda i, a, v: _needs_fixed(i, a.name, v),
    )
    reward_errors: str = knob(
        "raise",
        help="what a reward that raises or is NaN/inf does: raise, skip the sample's group, or score 0 (skip and zero carry "
        "a run past occasional failures; a step where every sample fails stops the run)",
        choices=("raise", "skip", "zero"),
    )
    system_prompt: str | None = knob(
        None,
        help="a system message prepended to chat prompts that have none; with a string prompt, the string becomes "
        "the user message after it (both rendered with the tokenizer's chat template; a model without one refuses it)",
    )
    max_turns: int | None = knob(
        None,
        help="environments: the most model turns an episode takes; it ends with finish reason 'max_turns' after the "
        "last (None: the environment's own max_turns, default 1)",
        ge=1,
    )
    max_episode_tokens: int | None = knob(
        None,
        help="environments: budget of an episode's response-side tokens (model turns + observations); each turn samples "
        "at most min(max_new_tokens, what remains), and an observation that would not leave a token for the next turn "
        "ends the episode with 'overflow' (None: no budget)",
        ge=1,
    )
    turn_limit_reward: float = knob(
        0.0, help="environments: reward added to an episode that reaches max_turns without ending (on its last model token)",
        validator=_finite,
    )
    overflow_reward: float = knob(
        0.0, help="environments: reward added to an episode ended by max_episode_tokens (on its last model token)",
        validator=_finite,
    )
    max_staleness: int = knob(
        0,
        help="asynchronous rollouts (docs/async.md): sample step s's batch with the weights of step s - k while earlier "
        "steps train, so samples are up to k weight versions old (0: the synchronous loop)",
        ge=0,
    )
    stale: str = knob(
        "drop",
        help="max_staleness > 0: a sample more than max_staleness weight versions older than the trainer is dropped "
        "or trained on (either way counted as async/dropped or async/stale_trained)",
        choices=("drop", "train"),
        validator=lambda i, a, v: _needs_staleness(i, a.name, v),
    )
    over_sample: float = knob(
        0.0,
        help="partial rollouts (docs/async.md): draw ceil(P * (1 + over_sample)) prompts and stop sampling as soon as P "
        "groups are complete (verl's over_sample_rate); the unfinished groups go by rollout.partial (0: off)",
        ge=0.0, validator=lambda i, a, v: _not_async(i, a.name, v),
    )
    partial: str = knob(
        "drop",
        help="over_sample > 0: the groups left unfinished when sampling stops are dropped (drop), or kept and continued "
        "from their tokens so far with the next step's weights (continue), each token keeping the step that sampled it",
        choices=("drop", "continue"),
        validator=lambda i, a, v: _needs_over_sample(i, a.name, v),
    )
    mask_stale_tokens: bool = knob(
        False,
        help="partial = 'continue': train only on the tokens the current weights sampled; those a continued sample "
        "took from an earlier step stay context (slime's --mask-offpolicy-in-partial-rollout)",
        validator=lambda i, a, v: _needs_continue(i, a.name, v),
    )
    run_ahead: bool = knob(
        True,
        help="max_staleness > 0: false makes the producer thread sample step s's batch only after the weight sync that "
        "precedes step s (it never runs ahead): every sample is fresh and the run equals the synchronous one value for "
        "value (a reference for the asynchronous machinery; no overlap, so no speed-up)",
        validator=lambda i, a, v: _needs_staleness(i, a.name, v, off=True),
    )


def _needs_fixed(inst, name: str, value) -> None:
    if value != 0.5 and inst.random_reward != "given":
        raise ValueError(f"{name} = {value!r} applies only with random_reward = 'given' (random_reward is {inst.random_reward!r})")


def _needs_staleness(inst, name: str, value, off: object = "drop") -> None:
    if value != off and inst.max_staleness == 0:
        raise ValueError(f"{name} = {value!r} applies only with max_staleness > 0 (max_staleness is 0: every sample is fresh)")


def _not_async(inst, name: str, value) -> None:
    if value > 0 and inst.max_staleness > 0:
        raise ValueError(f"{name} = {value!r} cannot be combined with max_staleness = {inst.max_staleness} (a partial "
                         f"rollout stops a step's sampling early; an asynchronous one samples steps ahead): set one of them")


def _needs_over_sample(inst, name: str, value) -> None:
    if value != "drop" and inst.over_sample == 0:
        raise ValueError(f"{name} = {value!r} applies only with over_sample > 0 (over_sample is 0: every group is "
                         f"sampled to its end)")


def _needs_continue(inst, name: str, value) -> None:
    if value and inst.partial != "continue":
        raise ValueError(f"{name} = {value!r} applies only with partial = 'continue' (partial is {inst.partial!r}: no "
                         f"sample carries tokens of an earlier step)")


def _schedule_shape(inst, name: str, value, default) -> None:
    """A schedule setting refused where it would change nothing: no warm-up to shape, nothing to count."""
    if value == default:
        return
    if name == "lr_warmup" and inst.warmup_steps == 0:
        raise ValueError(f"{name} = {value!r} shapes the warm-up, but warmup_steps is 0: set warmup_steps, or leave {name}")
    if name == "lr_schedule_unit" and inst.lr_schedule == "constant" and inst.warmup_steps == 0:
        raise ValueError(f"{name} = {value!r}: a constant schedule without warm-up never moves the rate, so there is "
                         f"nothing to count; leave {name}, or set lr_schedule / warmup_steps")


def _horizon_in_unit(inst, name: str, value) -> None:
    if value > 0 and inst.lr_schedule == "constant":
        raise ValueError(f"{name} = {value}: a constant schedule has no decay to give a length; leave {name} at 0 or set "
                         f"lr_schedule = 'linear' or 'cosine'")
    if value == 0 and inst.lr_schedule_unit == "optimizer_step" and inst.lr_schedule != "constant":
        raise ValueError(f"{name} = 0 with lr_schedule_unit = 'optimizer_step' and lr_schedule = {inst.lr_schedule!r}: "
                         f"the decay's length in optimizer steps is not known before the run; set {name} to the run's "
                         f"optimizer steps (e.g. train.steps × epochs × minibatches for the rl algorithm)")


@attrs.frozen(kw_only=True)
class TrainConfig:
    """The optimisation loop (settings of the algorithm itself live in ``[algorithm]``)."""

    steps: int = knob(400, help="training steps", ge=0)
    seed: int = knob(0, help="seed for sampling, data order and initialisation")
    lr: float = knob(2e-4, help="policy learning rate", gt=0.0)
    critic_lr: float = knob(1e-3, help="critic learning rate", gt=0.0)
    weight_decay: float = knob(0.0, help="AdamW weight decay", ge=0.0)
    lr_schedule: str = knob("cosine", help="learning-rate schedule", choices=("constant", "linear", "cosine"))
    warmup_steps: int = knob(10, help="linear warm-up steps (in lr_schedule_unit)", ge=0)
    lr_warmup: str = knob(
        "scaled",
        help="the warm-up's shape: scaled, min(1, (step + 1)/warmup_steps) multiplies a decay that runs from step 0; "
        "then_decay, step/warmup_steps during the warm-up, then the decay runs from warmup_steps to the end "
        "(transformers' and verl's schedules)",
        choices=("scaled", "then_decay"),
        validator=lambda i, a, v: _schedule_shape(i, a.name, v, "scaled"),
    )
    lr_schedule_unit: str = knob(
        "step",
        help="what the learning-rate schedule counts: step, training steps (the decay ends at train.steps); "
        "optimizer_step, every optimizer step, as transformers' Trainer (warmup_steps and lr_schedule_steps count "
        "optimizer steps, so the optimizer steps of one training step get rates of their own)",
        choices=("step", "optimizer_step"),
        validator=lambda i, a, v: _schedule_shape(i, a.name, v, "step"),
    )
    lr_schedule_steps: int = knob(
        0,
        help="the length of the linear or cosine decay, in lr_schedule_unit; 0: train.steps (unit step only: with "
        "optimizer_step give the run's optimizer steps, e.g. train.steps × epochs × minibatches for the rl algorithm)",
        ge=0,
        validator=lambda i, a, v: _horizon_in_unit(i, a.name, v),
    )
    max_grad_norm: float = knob(1.0, help="gradient clipping norm (0: off; the norm is still measured and checked)", ge=0.0)
    nonfinite: str = knob(
        "raise",
        help="a NaN/inf loss or gradient: raise (stop the run, naming the component and step; no checkpoint is written) "
        "or skip (drop that update, count it as train/nonfinite, go on)",
        choices=("raise", "skip"),
    )
    eval_every: int = knob(50, help="evaluate every N steps (0: only at start and end)", ge=0)
    eval_size: int = knob(200, help="held-out examples evaluated", ge=1)
    eval_samples: int = knob(
        0,
        help="also sample n completions per held-out example at the rollout temperature and report eval/mean@n "
        "(pass@1 averaged over n) and eval/pass@k (unbiased, k = 2, 4, … and n); 0: greedy accuracy only",
        ge=0,
    )
    checkpoint_every: int = knob(50, help="checkpoint every N steps (0: only at the end)", ge=0)
    keep_freed_memory: bool = knob(
        True,
        help="keep freed memory for reuse (glibc malloc thresholds raised at start, process-wide): each step's "
        "large tensors land on pages already mapped instead of faulting in fresh ones; false leaves malloc as it is",
    )


MOVED_TRAIN_SETTINGS = {
    "algorithm": "the [algorithm] section: algorithm = \"dpo\" (or [algorithm] name = \"dpo\")",
    "epochs": "[algorithm] epochs (a knob of the rl algorithm)",
    "minibatches": "[algorithm] minibatches (a knob of the rl algorithm)",
    "micro_batch_size": "[algorithm] micro_batch_size",
    "entropy_coef": "[algorithm] entropy_coef (a knob of the rl algorithm)",
    "vf_coef": "[algorithm] vf_coef (a knob of the rl algorithm)",
    "kl_in": "[algorithm] kl_in (a knob of the rl algorithm)",
    "dpo_pairs": "[algorithm] pairs (a knob of the dpo algorithm)",
    "dpo_batch_size": "[algorithm] batch_size (a knob of the dpo algorithm)",
    "pairs_file": "[algorithm] pairs_file (a knob of the dpo algorithm)",
    "rpo_alpha": "[algorithm] rpo_alpha (a knob of the dpo and online_dpo algorithms)",
}
"""[train] settings that became knobs of an algorithm; naming one says where it went."""
