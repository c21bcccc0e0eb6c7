"""The training loops, written against the registries only.

One RL step (DESIGN.md)::

    prompts ─► backend.generate(n=G) ─► task.reward ─► (overlong shaping, dynamic sampling)
            ─► old / ref / value forwards (no grad) ─► KL in the reward (optional)
            ─► advantage estimator ─► epochs × minibatches × micro-batches:
                   policy loss (+ importance weights) + β·KL loss − c_H·entropy (+ value loss)
            ─► clip, step ─► backend.update_weights ─► metrics, events, checkpoint

Every minibatch is normalised by its *global* token and sequence counts, passed to the
aggregation, so splitting a minibatch into micro-batches for gradient accumulation never changes
the loss or the gradient.

The preference loops (``train.algorithm = "dpo"`` / ``"online_dpo"``) share the model, backend,
checkpointing and logging; offline DPO reads pairs from a JSONL file or builds them from the task
(best of G policy samples against the worst); online DPO samples a group per prompt every step
and pairs the best with the worst, skipping groups whose scores are all equal.

Determinism: every step's data, sampling seed and minibatch order derive from ``(seed, step)``,
and checkpoints hold model, optimizer, scheduler, controller and RNG states, so a resumed run
reproduces the metrics of an uninterrupted one on CPU.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import shutil
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import torch

from rllab import ops
from rllab.config import ExperimentConfig, apply_schedule, dump_toml, load_config
from rllab.lab import Component, Lab, RllabError
from rllab.models import CriticModel, grouped_response_logprobs, response_logprobs
from rllab.types import Completion, Example, RolloutBatch, SamplingParams

CHECKPOINTS = "checkpoints"
CONFIG_FILE = "config.toml"


class RewardError(RllabError):
    """A reward function raised or returned a non-finite value."""


def _seed_for(seed: int, step: int, salt: int) -> int:
    return (seed * 1_000_003 + step * 7919 + salt * 104_729) % (2**31 - 1)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --------------------------------------------------------------------------- trainer


class Trainer:
    """Owns the models, optimizers, components and run directory of one experiment.

    Use :func:`run_experiment` / :func:`resume_run`, or drive it from Python::

        trainer = Trainer(cfg, lab=lab, run_dir=path)
        for step in range(10):
            trainer.train_step()
        trainer.swap("policy_loss", "cispo")          # any component, between steps
    """

    def __init__(self, cfg: ExperimentConfig, *, lab: Lab | None = None, run_dir: Path | None = None, progress: bool = True):
        self.lab = lab or Lab()
        self.cfg = cfg
        self.progress = progress
        self.step = 0
        self.run_dir = Path(run_dir) if run_dir else Path(cfg.output_dir) / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        self._build_components()
        self._build_models()
        self._build_optimizers()
        self.loggers = [self.lab.get("logger", name)(run_dir=self.run_dir) for name in cfg.loggers]
        self.history: list[dict] = []
        self._pairs: list[tuple[Example, str, str]] | None = None

    # ------------------------------------------------------------------ setup

    def _get(self, section: str) -> Component:
        ref = self.cfg.component(section)
        return self.lab.get(_SECTION_KIND[section], ref.name, **ref.knobs)

    def _build_components(self) -> None:
        c = self.cfg
        self.task = self._get("task")()
        self.advantage = self._get("advantage")
        self.policy_loss = self._get("policy_loss")
        self.correction = self._get("correction")
        self.aggregation = self._get("aggregation")
        self.kl = self._get("kl")
        self.value_loss = self._get("value_loss")
        self.preference_loss = self._get("preference_loss")
        if not hasattr(self, "kl_controller") or self.kl_controller_spec != c.component("kl_controller"):
            self.kl_controller = self._get("kl_controller")()
            self.kl_controller_spec = c.component("kl_controller")

    @property
    def needs_critic(self) -> bool:
        return self.cfg.train.algorithm == "rl" and "values" in self.advantage.spec.requires

    @property
    def needs_reference(self) -> bool:
        if self.cfg.train.algorithm in ("dpo", "online_dpo"):
            return True
        return self.cfg.train.kl_in != "none" and float(self.kl_controller.value) > 0

    def _model_dir(self) -> Path:
        mc = self.cfg.model
        if mc.path:
            path = Path(mc.path).expanduser()
            if not (path / "config.json").is_file():
                raise RllabError(f"model.path {str(path)!r} is not a Hugging Face model directory (no config.json)")
            return path
        from rllab import tinymodel

        task_ref = self.cfg.component("task")
        return tinymodel.get_or_build(
            tinymodel.TinyModelConfig(**mc.tiny),
            self.task,
            task_ref.to_dict(),
            tinymodel.WarmStartConfig(**mc.warm_start),
            progress=self.progress,
        )

    def _build_models(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # rllab shows its own progress

        self.model_dir = self._model_dir()
        dtype = getattr(torch, self.cfg.model.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.policy = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype)
        self.policy.train()
        self.reference = None
        if self.needs_reference:
            self.reference = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype).eval()
            self.reference.requires_grad_(False)
        self.critic = CriticModel.from_causal_lm(self.policy) if self.needs_critic else None
        backend_ref = self.cfg.component("backend")
        self.backend = self.lab.get("rollout_backend", backend_ref.name, **backend_ref.knobs)()
        self._sync_weights()

    def _build_optimizers(self) -> None:
        t = self.cfg.train
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=t.lr, weight_decay=t.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, partial(_lr_factor, t))
        self.critic_optimizer = None
        if self.critic is not None:
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=t.critic_lr, weight_decay=t.weight_decay)

    def _sync_weights(self) -> None:
        self.backend.update_weights(self.policy)

    # ------------------------------------------------------------------ swapping

    def swap(self, section: str, name: str | None = None, **knobs: Any) -> None:
        """Replace a component (or its knobs) between steps, e.g. ``swap("policy_loss", "cispo")``."""
        if section not in _SECTION_KIND:
            raise RllabError(f"cannot swap {section!r}; swappable: {', '.join(_SECTION_KIND)}")
        ref = self.cfg.component(section)
        data = self.cfg.to_dict()
        data[section] = {"name": name or ref.name, **(knobs if name and name != ref.name else {**ref.knobs, **knobs})}
        from rllab.config import validate

        self._reconfigure(attrs.evolve(validate(data, lab=self.lab, where="swap"), schedule=self.cfg.schedule))

    def _reconfigure(self, new: ExperimentConfig) -> None:
        old = self.cfg
        for frozen in ("model", "task", "backend"):
            if (new.to_dict().get(frozen) != old.to_dict().get(frozen)):
                raise RllabError(f"[{frozen}] cannot change during a run")
        if new.train.algorithm != old.train.algorithm:
            raise RllabError("train.algorithm cannot change during a run")
        self.cfg = new
        task = self.task
        self._build_components()
        self.task = task
        if self.needs_critic and self.critic is None:
            self.critic = CriticModel.from_causal_lm(self.policy)
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=new.train.critic_lr, weight_decay=new.train.weight_decay)
        if self.needs_reference and self.reference is None:
            from transformers import AutoModelForCausalLM

            self.reference = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=getattr(torch, new.model.dtype)).eval()
            self.reference.requires_grad_(False)
        for group in self.optimizer.param_groups:
            group["weight_decay"] = new.train.weight_decay
        self.scheduler.lr_lambdas = [partial(_lr_factor, new.train)]

    def _apply_schedule(self) -> list[str]:
        changed = []
        for entry in self.cfg.schedule:
            if entry.step == self.step:
                self._reconfigure(apply_schedule(self.cfg, entry, lab=self.lab))
                changed.append(", ".join(f"{k}={v}" for k, v in entry.set.items()))
        return changed

    # ------------------------------------------------------------------ rollouts

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt).input_ids)

    def decode(self, c: Completion) -> str:
        ids = list(c.token_ids)
        eos = self.tokenizer.eos_token_id
        if eos in ids:
            ids = ids[: ids.index(eos)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def sampling_params(self, step: int, *, n: int, greedy: bool = False) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(
            n=n,
            max_new_tokens=r.max_new_tokens,
            temperature=0.0 if greedy else r.temperature,
            top_p=1.0 if greedy else r.top_p,
            top_k=-1 if greedy else r.top_k,
            stop_token_ids=(self.tokenizer.eos_token_id,),
            seed=_seed_for(self.cfg.train.seed, step, 1),
        )

    def score(self, examples: list[Example], completions: list[Completion]) -> tuple[list[float], list[bool], int]:
        """Rewards for each completion; returns (scores, keep, n_errors) under ``rollout.reward_errors``."""
        policy = self.cfg.rollout.reward_errors
        scores, keep, errors = [], [], 0
        for c in completions:
            ex = examples[c.prompt_index]
            text = self.decode(c)
            try:
                r = self.task.reward(ex, text)
                r = float(r)
                if not math.isfinite(r):
                    raise ValueError(f"returned {r}")
            except Exception as e:
                if policy == "raise":
                    raise RewardError(
                        f"reward of task {self.cfg.component('task').name!r} failed on prompt {ex.prompt!r} "
                        f"with completion {text!r}: {type(e).__name__}: {e}. Set rollout.reward_errors = "
                        f'"skip" or "zero" to continue past such samples.'
                    ) from None
                errors += 1
                r = 0.0
                keep.append(policy == "zero")
                scores.append(r)
                continue
            scores.append(r)
            keep.append(True)
        return scores, keep, errors

    def _overlong(self, completions: list[Completion]) -> torch.Tensor:
        """DAPO's soft overlong punishment: linear from 0 to −penalty over the last ``buffer`` tokens."""
        r = self.cfg.rollout
        lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)
        if r.overlong_buffer <= 0:
            return torch.zeros_like(lengths)
        expected = r.max_new_tokens - r.overlong_buffer
        return -((lengths - expected).clamp(min=0) / r.overlong_buffer) * r.overlong_penalty

    def rollout(self, step: int) -> tuple[RolloutBatch | None, dict]:
        """Generate, score and filter one step's samples."""
        cfg = self.cfg
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(_seed_for(cfg.train.seed, step, 0))
        examples = self.task.train_examples(cfg.rollout.prompts_per_step, gen)
        prompts = [self.encode(e.prompt) for e in examples]
        completions = self.backend.generate(prompts, self.sampling_params(step, n=cfg.rollout.group_size))
        t1 = time.perf_counter()
        raw, keep, errors = self.score(examples, completions)
        t2 = time.perf_counter()
        raw_t = torch.tensor(raw, dtype=torch.float32)
        scores = raw_t + self._overlong(completions)
        index = torch.tensor([c.prompt_index for c in completions])
        keep_t = torch.tensor(keep)
        if errors and cfg.rollout.reward_errors == "skip":  # drop the whole group of a failed sample
            bad_groups = index[~keep_t].unique()
            keep_t &= ~torch.isin(index, bad_groups)
        lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)
        count, mean, std = ops.group_stats(scores, index)
        solved = (raw_t >= 1.0).float()
        metrics = {
            "rollout/reward": raw_t.mean().item(),
            "rollout/score": scores.mean().item(),
            "rollout/accuracy": solved.mean().item(),
            "rollout/response_length": lengths.mean().item(),
            "rollout/empty_frac": (lengths == 0).float().mean().item(),
            "rollout/stop_frac": sum(c.finish_reason == "stop" for c in completions) / len(completions),
            "rollout/reward_errors": float(errors),
            "rollout/groups_all_equal": float(((std == 0) & (count > 1)).float().sum().item() / max(1, cfg.rollout.group_size)),
            "time/rollout": t1 - t0,
            "time/reward": t2 - t1,
            "perf/completions_per_s": len(completions) / max(t1 - t0, 1e-9),
        }
        if cfg.rollout.dynamic_sampling:
            keep_t &= ~((std == 0) & (count > 1))
        metrics["rollout/kept_frac"] = keep_t.float().mean().item()
        kept = [c for c, k in zip(completions, keep_t.tolist()) if k]
        if not kept:
            return None, metrics
        batch = RolloutBatch.from_completions(kept, scores[keep_t].tolist(), pad_token_id=self.tokenizer.pad_token_id)
        return batch, metrics

    def _skip_scheduler_step(self) -> None:
        """Advance the LR schedule on a step with no update (the schedule counts steps)."""
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()

    # ------------------------------------------------------------------ forwards

    def _logprobs(self, model, batch: RolloutBatch, rows=None, with_entropy=False):
        ids = batch.input_ids if rows is None else batch.input_ids[rows]
        attn = batch.attention_mask if rows is None else batch.attention_mask[rows]
        # rows sampled from one prompt share its forward (see rllab.models.grouped_response_logprobs)
        return grouped_response_logprobs(
            model,
            ids,
            attn,
            batch.response_length,
            with_entropy=with_entropy,
            chunk_size=self.cfg.model.logprob_chunk,
            temperature=self.cfg.rollout.temperature,
        )

    # ------------------------------------------------------------------ RL step

    @property
    def on_policy(self) -> bool:
        """True when each step makes one update from its own rollouts (1 epoch, 1 minibatch) and
        nothing needs the old log-probs before the update: then the update's own forward, detached,
        *is* the old log-prob, and the separate no-grad forward is skipped."""
        t = self.cfg.train
        return t.epochs == 1 and t.minibatches == 1 and not (t.kl_in == "reward" and self.reference is not None)

    def train_step(self) -> dict:
        """One step of whichever algorithm the config selects; returns its metrics."""
        t_start = time.perf_counter()
        changed = self._apply_schedule()
        if self.cfg.train.algorithm == "rl":
            metrics = self._rl_step()
        else:
            metrics = self._preference_step()
        metrics["time/step"] = time.perf_counter() - t_start
        metrics["perf/peak_rss_mb"] = _peak_rss_mb()
        metrics["optim/lr"] = self.scheduler.get_last_lr()[0]
        if changed:
            metrics["schedule/changed"] = 1.0
        self.step += 1
        self._emit(metrics)
        return metrics

    def _rl_step(self) -> dict:
        cfg = self.cfg
        step = self.step
        batch, metrics = self.rollout(step)
        if batch is None:
            metrics["train/skipped"] = 1.0
            self._skip_scheduler_step()
            return metrics
        self.lab.hook.on_rollout_end(step=step, batch=batch, metrics=dict(metrics))
        mask = batch.response_mask
        t0 = time.perf_counter()
        with torch.no_grad():
            old_log_prob = None if self.on_policy else self._logprobs(self.policy, batch)
            ref_log_prob = self._logprobs(self.reference, batch) if self.reference is not None else None
            values = None
            if self.critic is not None:
                values = self.critic.values(batch.input_ids, batch.attention_mask, batch.response_length)
        t1 = time.perf_counter()
        token_rewards = batch.token_rewards
        beta = float(self.kl_controller.value)
        if cfg.train.kl_in == "reward" and ref_log_prob is not None:
            kl_tok = self.kl(log_prob=old_log_prob, ref_log_prob=ref_log_prob)
            token_rewards = token_rewards - beta * torch.where(mask, kl_tok, torch.zeros_like(kl_tok))
            metrics["kl/reward_kl"] = ops.masked_mean(kl_tok, mask).item()
        advantages, returns = self.advantage(token_rewards=token_rewards, mask=mask, index=batch.index, values=values)
        weights = None
        if old_log_prob is not None:  # else computed per micro-batch from the update's forward
            weights, corr_metrics = self.correction(old_log_prob=old_log_prob, rollout_log_prob=batch.rollout_log_prob, mask=mask)
            metrics.update({k: float(v) for k, v in corr_metrics.items()})
        metrics["adv/mean"] = ops.masked_mean(advantages, mask).item()
        metrics["adv/std"] = math.sqrt(max(ops.masked_var(advantages, mask).item(), 0.0))
        metrics["adv/zero_frac"] = ops.masked_mean((advantages == 0).float(), mask).item()
        t2 = time.perf_counter()
        update = self._update(batch, old_log_prob, ref_log_prob, values, advantages, returns, weights, beta)
        metrics.update(update)
        t3 = time.perf_counter()
        self._sync_weights()
        t4 = time.perf_counter()
        if ref_log_prob is not None:
            if old_log_prob is not None:
                metrics["kl/policy_ref"] = ops.masked_mean(old_log_prob - ref_log_prob, mask).item()
            current_kl = metrics["kl/policy_ref"]  # else measured during the update
            self.kl_controller.update(current_kl=current_kl, n_steps=int(mask.shape[0]))
        metrics["kl/coef"] = float(self.kl_controller.value)
        metrics.update({"time/forward": t1 - t0, "time/advantage": t2 - t1, "time/update": t3 - t2, "time/sync": t4 - t3})
        return metrics

    def _update(self, batch, old_log_prob, ref_log_prob, values, advantages, returns, weights, beta) -> dict:
        cfg = self.cfg
        t = cfg.train
        B = batch.input_ids.shape[0]
        gen = torch.Generator().manual_seed(_seed_for(t.seed, self.step, 2))
        sums: dict[str, list[float]] = {}
        for _epoch in range(t.epochs):
            order = torch.randperm(B, generator=gen) if t.minibatches > 1 else torch.arange(B)
            for mb in order.tensor_split(t.minibatches):
                if mb.numel() == 0:
                    continue
                mb_mask = batch.response_mask[mb]
                agg = partial(
                    _aggregate,
                    self.aggregation,
                    global_tokens=int(mb_mask.sum()),
                    global_seqs=int(mb_mask.any(-1).sum()),
                )
                self.optimizer.zero_grad(set_to_none=True)
                if self.critic_optimizer is not None:
                    self.critic_optimizer.zero_grad(set_to_none=True)
                micro = t.micro_batch_size or mb.numel()
                mb_tokens = max(1, int(mb_mask.sum()))
                mb_metrics: dict[str, float] = {}
                for rows in mb.split(micro):
                    m = self._micro_loss(batch, rows, agg, old_log_prob, ref_log_prob, values, advantages, returns, weights, beta)
                    token_share = int(batch.response_mask[rows].sum()) / mb_tokens
                    for k, v in m.items():
                        # losses add over micro-batches (global normalisers); diagnostics are token-weighted
                        mb_metrics[k] = mb_metrics.get(k, 0.0) + v * (1.0 if k.startswith("loss/") else token_share)
                if t.max_grad_norm > 0:
                    norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), t.max_grad_norm)
                    mb_metrics["actor/grad_norm"] = float(norm)
                self.optimizer.step()
                if self.critic_optimizer is not None:
                    if t.max_grad_norm > 0:
                        torch.nn.utils.clip_grad_norm_(self.critic.parameters(), t.max_grad_norm)
                    self.critic_optimizer.step()
                for k, v in mb_metrics.items():
                    sums.setdefault(k, []).append(v)
        self.scheduler.step()
        out = {k: sum(v) / len(v) for k, v in sums.items()}
        out["actor/first_approx_kl"] = sums.get("actor/approx_kl", [0.0])[0]
        out["actor/first_clipfrac"] = sums.get("actor/clipfrac", [0.0])[0]
        return out

    def _micro_loss(self, batch, rows, agg, old_log_prob, ref_log_prob, values, advantages, returns, weights, beta) -> dict:
        cfg = self.cfg
        t = cfg.train
        mask = batch.response_mask[rows]
        need_entropy = True
        log_prob, entropy = self._logprobs(self.policy, batch, rows, with_entropy=need_entropy)
        out: dict[str, float] = {}
        if old_log_prob is None:  # on-policy: this forward is the rollout-time policy
            old = log_prob.detach()
            if self.correction.name != "none":
                w, corr_metrics = self.correction(old_log_prob=old, rollout_log_prob=batch.rollout_log_prob[rows], mask=mask)
                out.update({k: float(v) for k, v in corr_metrics.items()})
            if ref_log_prob is not None:
                out["kl/policy_ref"] = ops.masked_mean(old - ref_log_prob[rows], mask).item()
        else:
            old = old_log_prob[rows]
            w = weights[rows] if weights is not None else None
        pg_loss, pg_metrics = self.policy_loss(
            log_prob=log_prob,
            old_log_prob=old,
            advantages=advantages[rows],
            mask=mask,
            aggregate=agg,
            weights=None if self.correction.name == "none" else w,
        )
        loss = pg_loss
        out.update({k: float(v) for k, v in pg_metrics.items()})
        out["loss/policy"] = pg_loss.item()
        if t.kl_in == "loss" and ref_log_prob is not None and beta > 0:
            kwargs = {}
            if "logits" in self.kl.spec.requires:
                raise RllabError(f"KL penalty {self.kl.name!r} needs full logits; the trainer passes log-probs only")
            kl_tok = self.kl(log_prob=log_prob, ref_log_prob=ref_log_prob[rows], **kwargs)
            kl_loss = agg(kl_tok, mask)
            loss = loss + beta * kl_loss
            out["loss/kl"] = kl_loss.item()
        ent = agg(entropy, mask)
        out["actor/entropy"] = ops.masked_mean(entropy.detach(), mask).item()
        if t.entropy_coef > 0:
            loss = loss - t.entropy_coef * ent
            out["loss/entropy"] = ent.item()
        loss.backward()
        if self.critic is not None:
            v = self.critic.values(batch.input_ids[rows], batch.attention_mask[rows], batch.response_length)
            v_loss, v_metrics = self.value_loss(values=v, old_values=values[rows], returns=returns[rows], mask=mask, aggregate=agg)
            (t.vf_coef * v_loss).backward()
            out["loss/value"] = v_loss.item()
            out.update({k: float(x) for k, x in v_metrics.items()})
        out["loss/total"] = loss.item()
        return out

    # ------------------------------------------------------------------ preference steps

    def _sequence_logps(self, model, pairs: list[tuple[list[int], list[int]]], grad: bool):
        """Sum of response-token log-probs and lengths for (prompt_ids, response_ids) pairs.

        One forward for all of them: a pair's chosen and rejected responses go in together, and
        each row's padding changes nothing (the sums run over its own tokens only).
        """
        comps = [Completion(prompt_ids=tuple(p), token_ids=tuple(r), log_probs=(0.0,) * len(r), finish_reason="stop") for p, r in pairs]
        batch = RolloutBatch.from_completions(comps, [0.0] * len(comps), pad_token_id=self.tokenizer.pad_token_id)
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            lp = response_logprobs(
                model, batch.input_ids, batch.attention_mask, batch.response_length, chunk_size=self.cfg.model.logprob_chunk
            )
        mask = batch.response_mask
        return ops.masked_sum(lp, mask, dim=-1), mask.sum(-1)

    def _response_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids) + [self.tokenizer.eos_token_id]

    def _preference_pairs_from_samples(self, examples, completions, scores) -> tuple[list, dict]:
        """Best-vs-worst pairs per group; groups whose scores are all equal are skipped."""
        pairs = []
        by_group: dict[int, list[tuple[float, Completion]]] = {}
        for c, s in zip(completions, scores):
            by_group.setdefault(c.prompt_index, []).append((s, c))
        skipped = 0
        for g, items in by_group.items():
            best = max(items, key=lambda x: x[0])
            worst = min(items, key=lambda x: x[0])
            if best[0] == worst[0]:
                skipped += 1
                continue
            pairs.append((self.encode(examples[g].prompt), list(best[1].token_ids), list(worst[1].token_ids)))
        return pairs, {"dpo/groups_skipped": float(skipped), "dpo/pairs": float(len(pairs))}

    def _offline_pairs(self) -> list:
        """The offline DPO data: from ``train.pairs_file`` or built once from the task."""
        if self._pairs is not None:
            return self._pairs
        t = self.cfg.train
        pairs = []
        if t.pairs_file:
            path = Path(t.pairs_file)
            if not path.is_file():
                raise RllabError(f"train.pairs_file {str(path)!r} does not exist")
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    pairs.append((self.encode(row["prompt"]), self._response_ids(row["chosen"]), self._response_ids(row["rejected"])))
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise RllabError(f"{path}:{i}: expected a JSON object with prompt, chosen, rejected ({e})") from None
        else:
            # chosen: the demonstration; rejected: the policy's worst sample that fails
            gen = torch.Generator().manual_seed(_seed_for(t.seed, 0, 3))
            examples = self.task.train_examples(t.dpo_pairs, gen)
            comps = self.backend.generate([self.encode(e.prompt) for e in examples], self.sampling_params(10**6, n=4))
            scores, _, _ = self.score(examples, comps)
            worst: dict[int, tuple[float, Completion]] = {}
            for c, s in zip(comps, scores):
                if c.prompt_index not in worst or s < worst[c.prompt_index][0]:
                    worst[c.prompt_index] = (s, c)
            for i, e in enumerate(examples):
                s, c = worst[i]
                if s < 1.0:
                    pairs.append((self.encode(e.prompt), self._response_ids(self.task.demonstration(e)), list(c.token_ids)))
        if not pairs:
            raise RllabError("offline DPO found no preference pairs (every sampled answer was already correct)")
        self._pairs = pairs
        return pairs

    def _preference_step(self) -> dict:
        t = self.cfg.train
        t0 = time.perf_counter()
        if t.algorithm == "online_dpo":
            metrics = {}
            gen = torch.Generator().manual_seed(_seed_for(t.seed, self.step, 0))
            examples = self.task.train_examples(self.cfg.rollout.prompts_per_step, gen)
            comps = self.backend.generate([self.encode(e.prompt) for e in examples], self.sampling_params(self.step, n=self.cfg.rollout.group_size))
            scores, keep, errors = self.score(examples, comps)
            metrics["rollout/reward"] = sum(scores) / len(scores)
            metrics["rollout/accuracy"] = sum(s >= 1.0 for s in scores) / len(scores)
            metrics["rollout/reward_errors"] = float(errors)
            metrics["time/rollout"] = time.perf_counter() - t0
            if errors and self.cfg.rollout.reward_errors == "skip":  # as in the RL loop: drop the failed sample's group
                bad = {c.prompt_index for c, k in zip(comps, keep) if not k}
                kept = [(c, sc) for c, sc in zip(comps, scores) if c.prompt_index not in bad]
                comps, scores = [c for c, _ in kept], [sc for _, sc in kept]
            pairs, m = self._preference_pairs_from_samples(examples, comps, scores)
            metrics.update(m)
        else:
            all_pairs = self._offline_pairs()
            n = len(all_pairs)
            per_epoch = max(1, math.ceil(n / t.dpo_batch_size))
            epoch, pos = divmod(self.step, per_epoch)
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(_seed_for(t.seed, epoch, 4)))
            idx = perm[pos * t.dpo_batch_size : (pos + 1) * t.dpo_batch_size].tolist()
            pairs = [all_pairs[i] for i in idx]
            metrics = {"dpo/pairs": float(len(pairs)), "data/epoch": float(epoch)}
        if not pairs:
            metrics["train/skipped"] = 1.0
            self._skip_scheduler_step()
            return metrics
        t1 = time.perf_counter()
        both = [(p, c) for p, c, _ in pairs] + [(p, r) for p, _, r in pairs]  # chosen rows, then rejected
        P = len(pairs)
        ref, lengths = self._sequence_logps(self.reference, both, grad=False)
        self.optimizer.zero_grad(set_to_none=True)
        pol, _ = self._sequence_logps(self.policy, both, grad=True)
        ref_c, ref_r, len_c, len_r, pol_c, pol_r = ref[:P], ref[P:], lengths[:P], lengths[P:], pol[:P], pol[P:]
        losses, pm = self.preference_loss(
            chosen_logps=pol_c,
            rejected_logps=pol_r,
            ref_chosen_logps=ref_c,
            ref_rejected_logps=ref_r,
            chosen_lengths=len_c,
            rejected_lengths=len_r,
        )
        loss = losses.mean()
        if t.rpo_alpha > 0:  # RPO: keep the chosen responses likely while separating the pair
            nll = (-pol_c / len_c.clamp(min=1)).mean()
            loss = loss + t.rpo_alpha * nll
            metrics["loss/rpo_nll"] = nll.item()
        loss.backward()
        if t.max_grad_norm > 0:
            metrics["actor/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), t.max_grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        t2 = time.perf_counter()
        self._sync_weights()
        metrics.update({k: float(v) for k, v in pm.items()})
        metrics.update({"loss/preference": loss.item(), "time/update": t2 - t1, "time/sync": time.perf_counter() - t2})
        return metrics

    # ------------------------------------------------------------------ eval

    def evaluate(self) -> dict:
        """Greedy accuracy and mean reward on the task's held-out split."""
        examples = self.task.eval_examples()[: self.cfg.train.eval_size]
        t0 = time.perf_counter()
        comps = self.backend.generate([self.encode(e.prompt) for e in examples], self.sampling_params(0, n=1, greedy=True))
        scores, _, _ = self.score(examples, comps)
        return {
            "eval/accuracy": sum(s >= 1.0 for s in scores) / len(scores),
            "eval/reward": sum(scores) / len(scores),
            "eval/n": float(len(scores)),
            "time/eval": time.perf_counter() - t0,
        }

    # ------------------------------------------------------------------ events

    def _emit(self, metrics: dict) -> None:
        step = self.step - 1
        self.history.append({"step": step, **metrics})
        for lg in self.loggers:
            lg.log(step, metrics)
        self.lab.hook.on_step_end(step=step, metrics=dict(metrics))

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Write model, optimizer, scheduler, controller, RNG states and step atomically."""
        root = self.run_dir / CHECKPOINTS
        root.mkdir(exist_ok=True)
        final = root / f"step_{self.step:06d}"
        tmp = root / f".tmp_step_{self.step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        state = {
            "step": self.step,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_optimizer": self.critic_optimizer.state_dict() if self.critic_optimizer is not None else None,
            "kl_controller": _controller_state(self.kl_controller),
            "config": self.cfg.to_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "history": self.history,
        }
        torch.save(state, tmp / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        (root / "latest").write_text(final.name)
        for old in sorted(p for p in root.iterdir() if p.name.startswith("step_"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        self.lab.hook.on_checkpoint_saved(step=self.step, path=final)
        return final

    def load_checkpoint(self, path: Path) -> None:
        state = torch.load(Path(path) / "state.pt", weights_only=False)
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None and state["critic"] is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        _restore_controller(self.kl_controller, state["kl_controller"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.history = list(state.get("history", []))
        self.step = state["step"]
        # the config in force at that step (schedules may have changed components)
        from rllab.config import validate

        cfg = validate(state["config"], lab=self.lab, where="checkpoint")
        self.cfg = attrs.evolve(cfg, schedule=self.cfg.schedule)
        task = self.task
        self._build_components()
        self.task = task
        self._sync_weights()

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()
        self.backend.close()


# --------------------------------------------------------------------------- helpers


_SECTION_KIND = {
    "task": "task",
    "backend": "rollout_backend",
    "advantage": "advantage_estimator",
    "policy_loss": "policy_loss",
    "correction": "importance_correction",
    "aggregation": "loss_aggregation",
    "kl": "kl_penalty",
    "kl_controller": "kl_controller",
    "value_loss": "value_loss",
    "preference_loss": "preference_loss",
}


def _aggregate(component: Component, loss_mat, mask, *, global_tokens, global_seqs):
    return component(loss_mat=loss_mat, mask=mask, global_tokens=global_tokens, global_seqs=global_seqs)


def _lr_factor(t, step: int) -> float:
    warm = min(1.0, (step + 1) / t.warmup_steps) if t.warmup_steps > 0 else 1.0
    if t.lr_schedule == "constant" or t.steps <= 0:
        return warm
    progress = min(1.0, step / max(1, t.steps))
    if t.lr_schedule == "linear":
        return warm * (1.0 - progress)
    return warm * 0.5 * (1.0 + math.cos(math.pi * progress))


def _controller_state(ctl) -> dict:
    return {k: v for k, v in vars(ctl).items() if isinstance(v, (int, float, bool, str, type(None)))}


def _restore_controller(ctl, state: dict) -> None:
    for k, v in state.items():
        setattr(ctl, k, v)


@contextmanager
def _progress_bar(enabled: bool, total: int, start: int):
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
        transient=False,
    ) as prog:
        task = prog.add_task("", total=total, completed=start)
        yield lambda desc: prog.update(task, advance=1, description=desc)


def _describe(m: dict, last_eval: float | None = None) -> str:
    parts = []
    if last_eval is not None:
        parts.append(f"eval {last_eval:.1%}")
    for key, label in (("rollout/reward", "reward"), ("actor/entropy", "entropy"), ("loss/preference", "loss"), ("dpo/accuracy", "pref-acc")):
        if key in m:
            parts.append(f"{label} {m[key]:.3f}")
    for key, label in (("actor/approx_kl", "kl"), ("actor/clipfrac", "clip")):
        if m.get(key):  # always 0 on a fully on-policy step: shown only when informative
            parts.append(f"{label} {m[key]:.3f}")
    if "time/step" in m:
        parts.append(f"{m['time/step']:.2f}s/step")
    return "  ".join(parts)


def plot_run(run_dir: Path, history: list[dict]) -> Path | None:
    """A PNG of training reward and eval accuracy against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history if "rollout/reward" in h]
    if not steps and not any("eval/accuracy" in h for h in history):
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        ax.plot(steps, [h["rollout/reward"] for h in history if "rollout/reward" in h], label="train reward", alpha=0.7)
    ev = [(h["step"], h["eval/accuracy"]) for h in history if "eval/accuracy" in h]
    if ev:
        ax.plot([s for s, _ in ev], [a for _, a in ev], "o-", label="eval accuracy (greedy)")
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(run_dir.name)
    out = run_dir / "curves.png"
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# --------------------------------------------------------------------------- entry points


def _train(trainer: Trainer, *, progress: bool) -> dict:
    cfg = trainer.cfg
    t = cfg.train
    if trainer.step == 0:
        (trainer.run_dir / CONFIG_FILE).write_text(dump_toml(cfg.to_dict()))
        trainer.lab.hook.on_run_start(run_dir=trainer.run_dir, config=cfg)
        initial = trainer.evaluate()
        trainer.history.append({"step": -1, **initial})
        for lg in trainer.loggers:
            lg.log(-1, initial)
    else:
        trainer.lab.hook.on_run_start(run_dir=trainer.run_dir, config=cfg)
    with _progress_bar(progress, t.steps, trainer.step) as advance:
        while trainer.step < t.steps:
            metrics = trainer.train_step()
            if t.eval_every and trainer.step % t.eval_every == 0 and trainer.step < t.steps:
                ev = trainer.evaluate()
                metrics.update(ev)
                trainer.history[-1].update(ev)
                for lg in trainer.loggers:
                    lg.log(trainer.step - 1, ev)
            if t.checkpoint_every and trainer.step % t.checkpoint_every == 0 and trainer.step < t.steps:
                trainer.save_checkpoint()
            if advance:
                last_eval = next((h["eval/accuracy"] for h in reversed(trainer.history) if "eval/accuracy" in h), None)
                advance(_describe(metrics, last_eval))
    final = trainer.evaluate()
    trainer.history.append({"step": t.steps, **final})
    for lg in trainer.loggers:
        lg.log(t.steps, final)
    trainer.save_checkpoint()
    initial = next((h for h in trainer.history if h["step"] == -1), {})
    summary = {
        "initial/accuracy": initial.get("eval/accuracy", float("nan")),
        "final/accuracy": final["eval/accuracy"],
        "final/reward": final["eval/reward"],
        "steps": t.steps,
        "run_dir": str(trainer.run_dir),
    }
    (trainer.run_dir / "final.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_run(trainer.run_dir, trainer.history)
    trainer.lab.hook.on_run_end(run_dir=trainer.run_dir, metrics=summary)
    trainer.close()
    if progress:
        from rich.console import Console

        Console().print(
            f"[bold]done[/]: eval accuracy {summary['initial/accuracy']:.1%} → {summary['final/accuracy']:.1%} "
            f"in {t.steps} steps; run directory [cyan]{trainer.run_dir}[/]"
        )
    return summary


def run_experiment(cfg: ExperimentConfig, *, lab: Lab | None = None, run_dir: Path | None = None, progress: bool = True) -> dict:
    """Train from scratch; returns the summary also written to ``RUN_DIR/final.json``."""
    trainer = Trainer(cfg, lab=lab, run_dir=run_dir, progress=progress)
    return _train(trainer, progress=progress)


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / "latest"
    if pointer.is_file() and (root / pointer.read_text().strip() / "state.pt").is_file():
        return root / pointer.read_text().strip()
    steps = sorted(p for p in root.glob("step_*") if (p / "state.pt").is_file()) if root.is_dir() else []
    return steps[-1] if steps else None


def resume_run(run_dir: Path, *, lab: Lab | None = None, extra_steps: int | None = None, progress: bool = True) -> dict:
    """Continue an interrupted run from its last checkpoint (or restart it if it has none)."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / CONFIG_FILE
    if not cfg_path.is_file():
        raise RllabError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    lab = lab or Lab()
    cfg = load_config(cfg_path, lab=lab)
    if extra_steps is not None:
        cfg = attrs.evolve(cfg, train=attrs.evolve(cfg.train, steps=extra_steps))
    trainer = Trainer(cfg, lab=lab, run_dir=run_dir, progress=progress)
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        trainer.load_checkpoint(ckpt)
        trainer.cfg = attrs.evolve(trainer.cfg, train=cfg.train)
    _truncate_metrics(run_dir, trainer.step, [lg for lg in cfg.loggers])
    return _train(trainer, progress=progress)


def _truncate_metrics(run_dir: Path, step: int, loggers) -> None:
    """Drop metric rows written after the checkpoint, so the resumed log has no duplicates."""
    path = run_dir / "metrics.jsonl"
    if "jsonl" not in loggers or not path.is_file():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < step]
    path.write_text("".join(ln + "\n" for ln in keep))
