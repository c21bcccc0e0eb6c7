"""The preference steps: offline DPO on fixed pairs and online DPO on fresh samples.

Both compute, for a batch of (prompt, chosen, rejected) pairs, the summed response log-probs of
chosen and rejected under the policy and the frozen reference — one forward per model over the
chosen and rejected rows together — and minimise the run's ``preference_loss`` (DPO, IPO, …)
plus, with ``rpo_alpha > 0``, RPO's NLL term on the chosen response (Pang et al. 2024; TRL's
``rpo_alpha``): ``α · mean(−log π(chosen) / |chosen|)``.

* ``dpo`` (offline): pairs from ``pairs_file`` (JSONL rows ``{"prompt", "chosen", "rejected"}``)
  or, without one, built once from the task: the demonstration (chosen) against the policy's
  worst failing sample among 4 (rejected). Each step takes the next ``batch_size`` pairs of a
  seeded per-epoch permutation.
* ``online_dpo``: each step samples a group per prompt (the rollout stage, with the run's
  shaping, filtering and ``reward_errors`` policy) and pairs the best with the worst sample of
  each group; groups whose scores are all equal give no pair. Its rollouts reach the run's
  listeners as the ``rl`` step's do (``on_rollout_end``, ``on_step_samples``: the traces logger),
  without advantages or trainer log-probs.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import attrs
import torch

import rllab
from rllab import ops
from rllab.algorithm import OptimizerStep, RunContext, checked_loss, report_samples, rollout_batch, seed_for
from rllab.members import member
from rllab.models.forward import response_log_sum_sq_probs, response_logprobs


@attrs.frozen
class DPOConfig:
    """Knobs of offline DPO."""

    pairs: int = rllab.knob(512, help="preference pairs built from the task when no pairs_file is given", ge=1)
    batch_size: int = rllab.knob(32, help="pairs per step", ge=1)
    pairs_file: str | None = rllab.knob(
        None, help="a JSONL file of {prompt, chosen, rejected} rows", validator=lambda i, a, v: _existing_file(a.name, v)
    )
    rpo_alpha: float = rllab.knob(0.0, help="add α·(mean per-token NLL of the chosen response): RPO (TRL's rpo_alpha)", ge=0.0)


@attrs.frozen
class OnlineDPOConfig:
    """Knobs of online DPO (prompts and group size come from [rollout])."""

    rpo_alpha: float = rllab.knob(0.0, help="add α·(mean per-token NLL of the chosen response): RPO (TRL's rpo_alpha)", ge=0.0)


def _existing_file(name: str, value: str | None) -> None:
    if value is not None and not Path(value).expanduser().is_file():
        raise ValueError(f"{name} = {value!r}: no such file")


Pair = tuple[list[int], list[int], list[int]]
"""(prompt ids, chosen response ids, rejected response ids)."""


def token_logps(ctx: RunContext, model, rows: list[tuple[list[int], list[int]]], *, grad: bool):
    """Per-token response log-probs (R, T) and the response mask (R, T) of (prompt ids, response
    ids) rows, in one forward; each row's padding changes nothing."""
    batch = _batch(ctx, rows)
    home = next(model.parameters()).device  # the reference may live elsewhere (model.reference_device)
    ids, attn = batch.input_ids.to(home), batch.attention_mask.to(home)
    with torch.enable_grad() if grad else torch.no_grad(), ctx.autocast():
        lp = response_logprobs(model, ids, attn, batch.response_length, chunk_size=ctx.config.model.logprob_chunk)
    return lp.float().to(ctx.device), batch.response_mask.to(ctx.device)


def log_sum_sq_probs(ctx: RunContext, model, rows: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    """(R, T) ``log Σ_v π(v | prefix)²`` at each response position (WPO's weights), no gradient."""
    batch = _batch(ctx, rows)
    home = next(model.parameters()).device
    with ctx.autocast():
        out = response_log_sum_sq_probs(model, batch.input_ids.to(home), batch.attention_mask.to(home), batch.response_length)
    return out.to(ctx.device)


def _batch(ctx: RunContext, rows) -> rllab.RolloutBatch:
    comps = [rllab.Completion(prompt_ids=tuple(p), token_ids=tuple(r), log_probs=(0.0,) * len(r), finish_reason="stop") for p, r in rows]
    return rllab.RolloutBatch.from_completions(comps, [0.0] * len(comps), pad_token_id=ctx.rollout.tokenizer.pad_token_id)


class _Preference:
    uses = frozenset({"task", "backend", "preference_loss"})
    provides = {"preference_loss": ("token_logps", "log_sum_sq_probs", "bco_running_mean")}

    def __init__(self, *, config):
        self.config = config
        self.bco = {"bco_reward_mean": torch.zeros(()), "bco_reward_count": torch.zeros(())}
        """bco_pair's running reward mean, carried between steps and in checkpoints."""

    def needs(self, ctx: RunContext) -> set[str]:
        return {"reference"}

    def reconfigure(self, config) -> None:
        """Take new knobs between steps (a ``[[schedule]]`` entry)."""
        for fixed in ("pairs", "pairs_file"):
            if getattr(self.config, fixed, None) != getattr(config, fixed, None):
                raise rllab.RllabError(f"algorithm.{fixed} cannot change during a run: the offline pairs are built once")
        self.config = config

    def state_dict(self) -> dict:
        return {k: v.clone() for k, v in self.bco.items()}

    def load_state_dict(self, state: dict) -> None:
        self.bco = {k: torch.as_tensor(v).clone() for k, v in state.items()}

    def train_on(self, ctx: RunContext, pairs: list[Pair], metrics: dict):
        """Loss on ``pairs``, backward, one optimizer step."""
        t1 = time.perf_counter()
        both = [(p, c) for p, c, _ in pairs] + [(p, r) for p, _, r in pairs]  # chosen rows, then rejected
        P = len(pairs)
        loss_fn = ctx.components["preference_loss"]
        requires = set(loss_fn.spec.requires)
        ref_tok, mask = token_logps(ctx, ctx.reference, both, grad=False)
        pol_tok, _ = token_logps(ctx, ctx.policy, both, grad=True)
        ref, pol, lengths = ops.masked_sum(ref_tok, mask, dim=-1), ops.masked_sum(pol_tok, mask, dim=-1), mask.sum(-1)
        extra: dict = {}
        if "token_logps" in requires:
            extra.update(
                chosen_token_logps=pol_tok[:P], rejected_token_logps=pol_tok[P:], ref_chosen_token_logps=ref_tok[:P],
                ref_rejected_token_logps=ref_tok[P:], chosen_mask=mask[:P], rejected_mask=mask[P:],
            )  # fmt: skip
        if "log_sum_sq_probs" in requires:
            sq = log_sum_sq_probs(ctx, ctx.policy, both)
            extra.update(chosen_log_sum_sq_probs=sq[:P], rejected_log_sum_sq_probs=sq[P:])
        if "bco_running_mean" in requires:
            extra.update({k: v.to(ctx.device) for k, v in self.bco.items()})
        losses, pm = loss_fn(
            chosen_logps=pol[:P],
            rejected_logps=pol[P:],
            ref_chosen_logps=ref[:P],
            ref_rejected_logps=ref[P:],
            chosen_lengths=lengths[:P],
            rejected_lengths=lengths[P:],
            **extra,
        )
        if not isinstance(losses, torch.Tensor) or losses.shape != (P,):
            shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
            spec = ctx.components["preference_loss"].spec
            raise rllab.RllabError(
                f"preference_loss {spec.name!r} (plugin {spec.provider}) returned losses of shape {shape}; expected one per pair, ({P},)"
            )
        loss = checked_loss(losses.mean(), ctx, "preference_loss")
        alpha = self.config.rpo_alpha
        if alpha > 0:  # RPO: keep the chosen responses likely while separating the pair
            nll = (-pol[:P] / lengths[:P].clamp(min=1)).mean()
            loss = loss + alpha * nll
            metrics["loss/rpo_nll"] = nll.item()
        loss.backward()
        grad = yield OptimizerStep()
        if "bco_running_mean" in requires and "bco/reward_mean" in pm:
            self.bco = {"bco_reward_mean": torch.as_tensor(pm["bco/reward_mean"]).detach().cpu(), "bco_reward_count": torch.as_tensor(pm["bco/reward_count"]).detach().cpu()}
        metrics.update(grad or {})
        metrics.update({k: float(v) for k, v in pm.items()})
        metrics.update({"loss/preference": loss.item(), "time/update": time.perf_counter() - t1})
        return metrics


class DPO(_Preference):
    """Offline DPO on fixed pairs."""

    def __init__(self, *, config: DPOConfig):
        super().__init__(config=config)
        self._pairs: list[Pair] | None = None

    def pairs(self, ctx: RunContext) -> list[Pair]:
        """The offline data: from ``pairs_file`` or built once from the task."""
        if self._pairs is None:
            if ctx.rollout.config.random_reward != "off":
                raise rllab.ConfigError(
                    f"rollout.random_reward = {ctx.rollout.config.random_reward!r}: offline DPO (algorithm 'dpo') trains on "
                    "fixed pairs, not on scored rollouts, so a random reward would have no effect; use algorithm = "
                    "'online_dpo' or 'rl', or unset rollout.random_reward"
                )
            self._pairs = self._read(ctx) if self.config.pairs_file else self._build(ctx)
            if not self._pairs:
                raise rllab.RllabError("offline DPO found no preference pairs (every sampled answer was already correct)")
        return self._pairs

    def _read(self, ctx: RunContext) -> list[Pair]:
        path = Path(self.config.pairs_file).expanduser()
        if not path.is_file():
            raise rllab.RllabError(f"algorithm.pairs_file {str(path)!r} does not exist")
        pairs = []
        r = ctx.rollout
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt = row["prompt"]
                pairs.append((r.encode(prompt), r.response_ids(row["chosen"], prompt=prompt), r.response_ids(row["rejected"], prompt=prompt)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise rllab.RllabError(f"{path}:{i}: expected a JSON object with prompt, chosen, rejected ({e})") from None
        return pairs

    def _build(self, ctx: RunContext) -> list[Pair]:
        """Chosen: the demonstration; rejected: the policy's worst failing episode among 4 (played
        and scored by the run's episode loop, under its ``reward_errors``)."""
        r = ctx.rollout
        gen = torch.Generator().manual_seed(seed_for(ctx.seed, 0, 3))
        examples = r.task.train_examples(self.config.pairs, gen)
        zeros = [0.0] * len(tuple(member(r.task, "task", "reward_components")))  # a failed episode's components
        worst: dict = {}
        for e in r.play(examples, r.sampling_params(10**6, n=4)):
            i = e.completion.prompt_index
            if i not in worst or e.reward < worst[i].reward:
                worst[i] = e
        return [
            (r.encode(e.prompt), r.response_ids(r.task.demonstration(e), prompt=e.prompt), list(worst[i].completion.token_ids))
            for i, e in enumerate(examples)
            if not r.solved(e, worst[i].reward, list(worst[i].score) or zeros)
        ]

    def step(self, ctx: RunContext):
        all_pairs = self.pairs(ctx)
        n, bs = len(all_pairs), self.config.batch_size
        per_epoch = max(1, math.ceil(n / bs))
        epoch, pos = divmod(ctx.step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed_for(ctx.seed, epoch, 4)))
        pairs = [all_pairs[i] for i in perm[pos * bs : (pos + 1) * bs].tolist()]
        metrics = {"dpo/pairs": float(len(pairs)), "data/epoch": float(epoch)}
        return (yield from self.train_on(ctx, pairs, metrics))


class OnlineDPO(_Preference):
    """Online DPO: best against worst of a freshly sampled group."""

    uses = _Preference.uses | {"sampler"}  # its prompts come from rollout.sample, through the run's sampler

    def pairs_from(self, ctx: RunContext, rollouts) -> tuple[list[tuple[int, Pair]], int]:
        """(group id, pair) for each group with a best and a worst kept sample (by reward after
        shaping); and how many groups were skipped because their rewards were all equal."""
        r = ctx.rollout
        by_group: dict[int, list[tuple[float, rllab.Completion]]] = {}
        for e, s in zip(rollouts.episodes, rollouts.rewards().tolist()):
            if e.keep:
                by_group.setdefault(e.completion.prompt_index, []).append((s, e.completion))
        pairs, skipped = [], 0
        for g, items in by_group.items():
            best, worst = max(items, key=lambda x: x[0]), min(items, key=lambda x: x[0])
            if best[0] == worst[0]:
                skipped += 1
                continue
            pairs.append((g, (r.encode(rollouts.examples[g].prompt), list(best[1].token_ids), list(worst[1].token_ids))))
        return pairs, skipped

    def step(self, ctx: RunContext):
        rollouts = ctx.rollout.sample(ctx.step)
        metrics = dict(rollouts.metrics)
        batch = rollout_batch(ctx, rollouts)  # on_rollout_end
        grouped, skipped = self.pairs_from(ctx, rollouts)
        metrics.update({"dpo/groups_skipped": float(skipped), "dpo/pairs": float(len(grouped))})
        if not grouped:
            metrics["train/skipped"] = 1.0
        else:
            metrics = yield from self.train_on(ctx, [pair for _, pair in grouped], metrics)
        if batch is not None:  # the samples (no advantages; the trainer's log-probs are of the pairs alone, at temperature 1)
            metrics.update(report_samples(ctx, rollouts, batch))
        return metrics


def dpo(*, config: DPOConfig) -> DPO:
    """Offline DPO on pairs from a file or built from the task (demonstration vs failing sample)."""
    return DPO(config=config)


def online_dpo(*, config: OnlineDPOConfig) -> OnlineDPO:
    """Online DPO: sample a group per prompt, pair the best with the worst."""
    return OnlineDPO(config=config)
