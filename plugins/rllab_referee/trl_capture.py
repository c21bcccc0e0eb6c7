"""TRL's ``GRPOTrainer`` on rllab's tiny model and task, with what ``rllab crosscheck trl`` compares.

:func:`run_trl` trains with a user's ``GRPOConfig`` (its algorithm knobs as given; output,
logging, device, dtype and data order overridden so that the run is local, float32, on the CPU
and reads the prompts in order) and records:

* every generation batch exactly as TRL trains on it: after its shuffle and split into
  ``steps_per_generation`` micro-batches (:class:`Generation`), each row with its reward and
  group (the rows of one prompt);
* per optimizer step: the loss TRL backpropagated (summed over its accumulated micro-batches),
  the gradient norm before clipping, the learning rate, and a copy of the weights after the step.

TRL is imported here only; the module imports without it.
"""

from __future__ import annotations

import contextlib
import io
import time
from typing import Any, Callable, Mapping, Sequence

import attrs
import torch

TRL_VERSION = "1.16.0"
INSTALL = f"pip install --no-deps trl=={TRL_VERSION}   (or: pip install 'rllab[trl]')"

# knobs the crosscheck sets itself: the run is local, float32 on the CPU, logged every step, in data order
FORCED = {
    "report_to": [], "logging_steps": 1, "save_strategy": "no", "push_to_hub": False, "disable_tqdm": True,
    "use_cpu": True, "bf16": False, "fp16": False, "shuffle_dataset": False, "dataloader_num_workers": 0,
    "log_completions": False, "gradient_checkpointing": False, "use_vllm": False,
}  # fmt: skip


def trl_missing() -> str | None:
    """None when TRL imports; else what to run to install it."""
    try:
        import trl  # noqa: F401
    except ImportError as e:
        return f"TRL is not installed ({e}); install it (it is installed on demand, without touching torch) with:\n  {INSTALL}"
    return None


@attrs.define
class Generation:
    """One generation batch as TRL trains on it: ``chunks`` are its micro-batches in training order."""

    chunks: list[dict[str, torch.Tensor]]


@attrs.define
class TrlRun:
    generations: list[Generation]
    losses: list[float]
    """Per optimizer step: the loss backpropagated (its micro-batches' losses summed)."""
    grad_norms: list[float]
    lrs: list[float]
    weights: list[dict[str, torch.Tensor]]
    """Per optimizer step: the weights after it."""
    rewards: list[float]
    """Per generation: the mean reward."""
    step_times: list[float]
    """Per optimizer step: its wall time (the first of a generation batch's includes its sampling)."""
    completions_per_step: int
    wall_s: float
    steps_per_generation: int = 1
    """Optimizer steps per generation batch."""

    @property
    def generation_times(self) -> list[float]:
        """Per generation batch: the wall time of its optimizer steps together (one rllab step's work)."""
        k = self.steps_per_generation
        return [sum(self.step_times[i:i + k]) for i in range(0, len(self.step_times) - k + 1, k)]


def layout(raw: Mapping[str, Any]) -> tuple[int, int]:
    """(TRL generation batches per rllab step, TRL optimizer steps per rllab step) on one process, from the
    config as ``GRPOConfig.__post_init__`` completes it (read without building one, so that a config TRL
    refuses reaches the importer's checks first). An rllab step is one generation batch, unless
    ``steps_per_generation × num_iterations`` < ``gradient_accumulation_steps``: then an optimizer step
    takes several generation batches, and one rllab step is those."""
    ga = int(raw.get("gradient_accumulation_steps") or 1)
    pdb = int(raw.get("per_device_train_batch_size") or 8)
    spg = raw.get("steps_per_generation")
    if spg is None:
        gbs = raw.get("generation_batch_size")
        spg = int(gbs) // pdb if gbs is not None else ga
    used = int(spg) * int(raw.get("num_iterations") or 1)
    if used >= ga:
        return 1, max(1, used // ga)
    return max(1, ga // used), 1


def run_trl(raw: Mapping[str, Any], *, model_dir: str, examples: Sequence[Any], reward: Callable[[Any, str], float],
            generations: int, seed: int, out: str, keep_weights: bool = True) -> TrlRun:
    """Train ``generations`` generation batches with TRL (see the module docstring; a multiple of
    :func:`layout`'s batches per rllab step).

    ``examples``: the prompts in the order TRL reads them (each ``num_generations`` times);
    ``reward(example, text)``: the task's reward of a decoded completion."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    k, per_step = layout(raw)
    # max_steps: the generations asked for; seed: the crosscheck's (the config's own unless it seeks another)
    knobs = {k: v for k, v in raw.items() if k not in FORCED and k not in ("output_dir", "max_steps", "seed")}
    try:
        config = GRPOConfig(output_dir=out, max_steps=generations // k * per_step, seed=seed, **knobs, **FORCED)
    except (TypeError, ValueError) as e:  # a check of TRL's own that the importer does not make (a logging knob, …)
        from rllab import ConfigError

        raise ConfigError(f"TRL's GRPOConfig refuses this config: {e}") from None
    rows = [{"prompt": ex.prompt, "row": i} for i, ex in enumerate(examples)]
    dataset = datasets.Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch_rewards: list[list[float]] = []

    def task_reward(prompts, completions, row, **_):
        scores = [float(reward(examples[r], c)) for r, c in zip(row, completions)]
        batch_rewards.append(scores)
        return scores

    record = _Recorder(keep_weights)

    class Capturing(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            # ride along through TRL's shuffle and split: each row's reward and group
            n = out["completion_ids"].shape[0]
            out["rllab_reward"] = torch.tensor(batch_rewards[-1], dtype=torch.float32)
            out["rllab_group"] = torch.arange(n) // self.num_generations + 1000 * len(batch_rewards)
            return out

        def _prepare_inputs(self, generation_batch):
            before = self._buffered_inputs
            out = super()._prepare_inputs(generation_batch)
            if self.model.training and self._buffered_inputs is not before:
                record.generations.append(Generation([{k: v.detach().clone() if torch.is_tensor(v) else v
                                                       for k, v in c.items()} for c in self._buffered_inputs]))
            return out

        def training_step(self, model, inputs, num_items_in_batch):
            loss = super().training_step(model, inputs, num_items_in_batch)
            record.micro_loss += float(loss)
            return loss

    trainer = Capturing(model=model, reward_funcs=task_reward, args=config, train_dataset=dataset,
                        processing_class=tokenizer, callbacks=[record.callback(TrainerCallback)])
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # TRL prints each step's log dict
        trainer.train()
    wall = time.perf_counter() - t0
    B = len(batch_rewards[0]) if batch_rewards else 0
    return TrlRun(generations=record.generations, losses=record.losses, grad_norms=record.grad_norms, lrs=record.lrs,
                  weights=record.weights, rewards=[sum(r) / len(r) for r in batch_rewards], step_times=record.times,
                  completions_per_step=B * k, wall_s=wall, steps_per_generation=per_step)


class _Recorder:
    def __init__(self, keep_weights: bool):
        self.keep_weights = keep_weights
        self.generations: list[Generation] = []
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.lrs: list[float] = []
        self.weights: list[dict[str, torch.Tensor]] = []
        self.times: list[float] = []
        self.micro_loss = 0.0
        self._t0 = 0.0

    def callback(self, base):
        rec = self

        class Callback(base):
            def on_step_begin(self, args, state, control, **kw):
                rec._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, model=None, **kw):
                rec.times.append(time.perf_counter() - rec._t0)
                rec.losses.append(rec.micro_loss)
                rec.micro_loss = 0.0
                if rec.keep_weights and model is not None:
                    rec.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "grad_norm" in logs:
                    rec.grad_norms.append(float(logs["grad_norm"]))
                    rec.lrs.append(float(logs.get("learning_rate", float("nan"))))

        return Callback()
