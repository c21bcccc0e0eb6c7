"""GRPO with TRL's ``GRPOTrainer`` on a prompt file, timed per step — the peer side of compare_grpo.py.

Runs inside the TRL environment made by ``setup_trl.sh`` and imports nothing from rllab::

    benchmarks/peers/.venv-trl/bin/python benchmarks/peers/trl_grpo.py \\
        --model ~/.cache/rllab/models/tiny-qwen2-... --prompts prompts.jsonl --steps 100 --out OUT

``--prompts`` is a JSONL file of ``{"prompt": ..., "answer": ...}`` rows, ``prompts_per_step`` rows
per step in step order (compare_grpo.py writes exactly the prompts rllab draws for the same seed).
The dataset is not shuffled, so step k trains on rows ``k·P … k·P + P − 1``, each sampled
``group_size`` times.

The reward is exact match: 1.0 when the completion (decoded up to ``<eos>``, special tokens
dropped, surrounding whitespace stripped) equals the answer, else 0.0 — the addition task's reward.

Settings mirror rllab's defaults: one generation and one optimizer step per training step
(``P·G`` completions, no gradient accumulation, ``num_iterations = 1``), β = 0 (no reference
model), clip ε = 0.2, token-mean loss over the step's batch (``loss_type = "dapo"``), group
reward scaling, AdamW with rllab's learning-rate schedule (:func:`lr_factor`), gradient clipping, float32 on the CPU,
no gradient checkpointing, no logging anywhere but the output folder.

Writes to ``--out``:

* ``metrics.jsonl`` — one row per step: ``step``, ``time/step``, ``time/rollout`` (tokenise,
  generate, decode), ``perf/completions_per_s`` (completions / ``time/rollout``),
  ``rollout/reward`` (mean reward of the step's completions), ``rollout/response_length`` (mean
  generated tokens, ``<eos>`` included), plus TRL's own logged values
  under ``trl/…``.
* ``model/`` — the trained model and tokenizer (a Hugging Face model directory).
* ``summary.json`` — settings, versions and wall times.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import time
from pathlib import Path


def exact_match(completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer else 0.0


def lr_factor(step: int, *, schedule: str, warmup_steps: int, steps: int) -> float:
    """rllab's learning-rate multiplier at optimizer step ``step`` (0-based).

    A linear warm-up ``min(1, (step + 1) / warmup_steps)`` multiplies the decay, which runs
    over all ``steps`` from step 0: constant 1, linear ``1 − step/steps``, or cosine
    ``½(1 + cos(π·step/steps))``. (transformers' own warm-up schedules start from 0 and decay
    only after the warm-up, so they are not used.)
    """
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    if schedule == "constant" or steps <= 0:
        return warm
    progress = min(1.0, step / max(1, steps))
    if schedule == "linear":
        return warm * (1.0 - progress)
    return warm * 0.5 * (1.0 + math.cos(math.pi * progress))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model directory (model and tokenizer)")
    p.add_argument("--prompts", required=True, help="JSONL of {prompt, answer}, prompts_per_step rows per step")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--lr-schedule", choices=("constant", "linear", "cosine"), default="cosine")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)

    t_start = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    need = args.steps * args.prompts_per_step
    if len(rows) < need:
        raise SystemExit(f"{args.prompts}: {len(rows)} prompts, need {need} ({args.steps} steps × {args.prompts_per_step})")
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows[:need]])

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    step_rewards: list[list[float]] = []
    step_lengths: list[float] = []

    def reward_exact(prompts, completions, answer, completion_ids, **kwargs) -> list[float]:
        scores = [exact_match(c, a) for c, a in zip(completions, answer)]
        step_rewards.append(scores)
        step_lengths.append(sum(len(ids) for ids in completion_ids) / len(completion_ids))
        return scores

    batch = args.prompts_per_step * args.group_size
    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",  # replaced by rllab's schedule in create_scheduler
        warmup_steps=0,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        beta=0.0,
        epsilon=args.clip,
        loss_type="dapo",
        scale_rewards="group",
        shuffle_dataset=False,
        seed=args.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        push_to_hub=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )

    class TimedGRPOTrainer(GRPOTrainer):
        """Records the wall time of each rollout (tokenise, generate, decode); rllab's lr schedule."""

        rollout_times: list[float] = []

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                factor = functools.partial(
                    lr_factor, schedule=args.lr_schedule, warmup_steps=args.warmup_steps, steps=args.steps
                )
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, factor)
            return self.lr_scheduler

        def _generate(self, prompts):
            t0 = time.perf_counter()
            result = super()._generate(prompts)
            self.rollout_times.append(time.perf_counter() - t0)
            return result

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.starts: list[float] = []
            self.times: list[float] = []
            self.logs: dict[int, dict] = {}

        def on_step_begin(self, args_, state, control, **kw):
            self.starts.append(time.perf_counter())

        def on_step_end(self, args_, state, control, **kw):
            self.times.append(time.perf_counter() - self.starts[-1])

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs:
                self.logs.setdefault(state.global_step - 1, {}).update(
                    {k: v for k, v in logs.items() if isinstance(v, (int, float))}
                )

    timer = StepTimer()
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=reward_exact,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    t_setup = time.perf_counter() - t_start
    t0 = time.perf_counter()
    trainer.train()
    t_train = time.perf_counter() - t0

    n_steps = len(timer.times)
    if not (n_steps == args.steps == len(step_rewards) == len(trainer.rollout_times)):
        raise SystemExit(
            f"expected {args.steps} steps with one rollout each; got {n_steps} steps, "
            f"{len(trainer.rollout_times)} rollouts, {len(step_rewards)} reward calls"
        )
    with open(out / "metrics.jsonl", "w") as f:
        for step in range(n_steps):
            scores = step_rewards[step]
            row = {
                "step": step,
                "time/step": timer.times[step],
                "time/rollout": trainer.rollout_times[step],
                "perf/completions_per_s": len(scores) / trainer.rollout_times[step],
                "rollout/reward": sum(scores) / len(scores),
                "rollout/response_length": step_lengths[step],
                "rollout/n": len(scores),
                "optim/lr": timer.logs.get(step, {}).get("learning_rate", float("nan")),
            }
            row.update({f"trl/{k}": v for k, v in timer.logs.get(step, {}).items()})
            f.write(json.dumps(row) + "\n")

    trainer.save_model(str(out / "model"))
    tokenizer.save_pretrained(str(out / "model"))
    summary = {
        "framework": "trl",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "threads": torch.get_num_threads(),
        "args": vars(args),
        "time/setup": t_setup,
        "time/train": t_train,
        "time/total": time.perf_counter() - t_start,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("versions", "time/train")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
