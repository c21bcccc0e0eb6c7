"""The policy-gradient step (PPO, GRPO, RLOO, REINFORCE++, DAPO, … by the components chosen).

One step::

    rollout stage ─► RolloutBatch (scores on the last response token)
        ─► prepare (no grad): old / ref log-probs, critic values, KL in the reward (optional),
           advantages and returns, importance weights  ─► a frozen Prepared batch
        ─► update: epochs × minibatches × micro-batches
               loss = policy_loss(log_prob, old_log_prob, advantages, weights)
                    + β·aggregate(kl(log_prob, ref_log_prob))            (kl_in = "loss")
                    − c_H·aggregate(entropy) + c_V·value_loss            (critic estimators)
               backward; yield OptimizerStep (the trainer checks, clips and steps)
        ─► StepReport: the metrics, and the KL to the reference for the KL controller (a KLSample)

A component's optional inputs (its ``requires=(...)``: critic ``values``, ReMax's greedy
``reward_baselines``, ``rollout_log_prob``, …) come from :data:`PROVIDERS`, a table of named
functions of (context, inputs) that :class:`rllab_algorithms.inputs.Inputs` calls once each, when
a component first asks: the step calls every component through ``inputs.call(component, ...)``.
The rollout events go out through :func:`rllab.algorithm.rollout_batch` (``on_rollout_end``) and
:func:`rllab.algorithm.report_samples` (``on_step_samples``, after the update).

Every minibatch is normalised by its *global* token and sequence counts, passed to the
aggregation, so splitting a minibatch into micro-batches for gradient accumulation never changes
the loss or the gradient (``token_count = "batch_mean"``: every minibatch's token count is the
step's tokens / minibatches instead, as TRL's dapo loss divides; ``"micro_batch"``: each
micro-batch's own, the micro-batches' means averaged, as TRL's bnpo). Minibatches are a new random split
every epoch, one split kept for all epochs, or the batch's row order (``minibatch_order``). Under data parallelism (``model.strategy = "fsdp2"``) the counts are
summed over ranks (``ctx.reducer``), so each rank's loss is its share of the global loss. A fully on-policy step (1 epoch, 1 minibatch, no KL in the reward)
reuses the update's own forward, detached, as the old log-probs instead of a separate no-grad
forward.

Every step logs the rollout-vs-trainer log-prob gap over the response tokens
(``mismatch/abs_diff``, ``mismatch/k1``, ``mismatch/k3``, :func:`rllab.ops.log_prob_gap`): from the
old-log-prob forward when there is one, else from the update's first minibatch before its
optimizer step (on-policy: the whole batch; bypass mode with several minibatches: that
minibatch's rows).

A correction that rejects tokens (``rejection``, see :mod:`rllab.hookspecs`) narrows the
response mask the update trains on, as verl does: rejected tokens leave the loss, the global
token / sequence counts, the KL and entropy terms and the value loss. The keep mask is computed
in ``prepare`` from the old log-probs (so such a correction always runs the old-log-prob
forward), before or after the advantage estimator as the correction says.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any

import attrs
import torch

import rllab
from rllab import ops
from rllab.algorithm import OptimizerStep, RunContext, checked_loss, report_samples, rollout_batch, seed_for
from rllab.models.forward import grouped_response_logprobs, response_log_sum_sq_probs

from .inputs import Inputs, Provider, before_update, models
from .rl_config import RLConfig, check_token_count

__all__ = ["RL", "RLConfig", "Prepared", "Updated", "rl", "kl_times_ratio", "penalty_row_mean"]


@attrs.frozen(kw_only=True, eq=False)
class Prepared:
    """Everything the update needs, computed once per step without gradients. (B, T) tensors."""

    batch: rllab.RolloutBatch
    old_log_prob: torch.Tensor | None
    """None on a fully on-policy step: the update's own forward supplies it."""
    ref_log_prob: torch.Tensor | None
    values: torch.Tensor | None
    advantages: torch.Tensor
    returns: torch.Tensor
    weights: torch.Tensor | None
    """Importance weights from the correction (None: computed per micro-batch, or no correction)."""
    beta: float
    mask: torch.Tensor = attrs.field(default=attrs.Factory(lambda self: self.batch.response_mask, takes_self=True))
    """(B, T) bool: the tokens the update trains on — the response mask, narrowed to the tokens a
    rejecting correction keeps."""
    kl_penalty: float | None = None
    """The KL controller's measure when it is the [kl] penalty's (``kl_measure = penalty_row_mean``,
    KL in the reward): verl's mean over rows of each row's masked mean. None: the step measures
    ``old − ref`` per token instead."""
    pre_update_log_prob: torch.Tensor | None = None
    """(B, T) float32, filled by the update's forwards before its first optimizer step when no
    old-log-prob forward ran: the policy before the update, for the step's samples (NaN: a row
    not reached before that step)."""
    inputs: Inputs | None = None
    """The step's optional inputs (:data:`PROVIDERS`), made once each; None: made afresh from ``batch``."""
    teacher_log_prob: torch.Tensor | None = None
    """(B, T) a teacher's log-probs of the sampled tokens (on-policy distillation); None: no teacher."""
    teacher_topk: tuple[torch.Tensor, torch.Tensor] | None = None
    """(log-probs, token ids), each (B, T, k): the teacher's k most likely tokens at each response
    position (on-policy distillation's exact KL over them); None: not used."""


@attrs.frozen(kw_only=True)
class Updated:
    """What :meth:`RL.update` returns: its metrics (logged only) and the KL it measured."""

    metrics: dict
    policy_ref_kl: float | None = None
    """On-policy steps with a reference: the mean over valid tokens of ``old − ref`` measured by the
    update's own forwards (the first-epoch log-probs are the old policy), aggregated over
    micro-batches and minibatches as its ``kl/policy_ref`` metric is. None otherwise."""


def _logprobs(ctx: RunContext, model, batch, rows=None, with_entropy=False):
    ids = batch.input_ids if rows is None else batch.input_ids[rows]
    attn = batch.attention_mask if rows is None else batch.attention_mask[rows]
    home = next(model.parameters()).device  # the reference may live elsewhere (model.reference_device)
    with ctx.autocast():
        # rows sampled from one prompt share its forward (see rllab.models.forward.grouped_response_logprobs)
        out = grouped_response_logprobs(
            model,
            ids.to(home),
            attn.to(home),
            batch.response_length,
            with_entropy=with_entropy,
            chunk_size=ctx.config.model.logprob_chunk,
            temperature=ctx.config.rollout.temperature,
        )
    if home != ids.device:
        out = out.to(ids.device) if isinstance(out, torch.Tensor) else tuple(t.to(ids.device) for t in out)
    return out


def _values(ctx: RunContext, batch, rows=None):
    ids = batch.input_ids if rows is None else batch.input_ids[rows]
    attn = batch.attention_mask if rows is None else batch.attention_mask[rows]
    with ctx.autocast():
        return ctx.critic.values(ids, attn, batch.response_length).float()


def _old_log_prob(ctx: RunContext, inputs: Inputs) -> torch.Tensor:
    with torch.no_grad():
        return _logprobs(ctx, ctx.policy, inputs.batch)


def _ref_log_prob(ctx: RunContext, inputs: Inputs) -> torch.Tensor | None:
    with torch.no_grad():
        return _logprobs(ctx, ctx.reference, inputs.batch) if ctx.reference is not None else None


def _critic_values(ctx: RunContext, inputs: Inputs) -> torch.Tensor | None:
    with torch.no_grad():
        return _values(ctx, inputs.batch) if ctx.critic is not None else None


def _greedy_baselines(ctx: RunContext, inputs: Inputs) -> torch.Tensor:
    """(B,) the reward of one greedy completion of each row's prompt (ReMax)."""
    if inputs.rollouts is None:
        raise rllab.RllabError("reward_baselines are the rewards of greedy rollouts of the step's prompts: pass the "
                               "step's rollouts with its batch (Inputs(..., rollouts=...))")
    greedy = ctx.rollout.greedy_rewards(inputs.rollouts.examples)
    inputs.metrics["rollout/greedy_reward"] = greedy.mean().item()
    return greedy.to(inputs.batch.index.device)[inputs.batch.index]


def _sum_pi_squared(ctx: RunContext, inputs: Inputs) -> torch.Tensor:
    """(B, T) Σ_v π_v² of the rollout-time policy at each response token (optimal-token baselines)."""
    b = inputs.batch
    with ctx.autocast():
        lss = response_log_sum_sq_probs(ctx.policy, b.input_ids, b.attention_mask, b.response_length,
                                        temperature=ctx.config.rollout.temperature)
    return torch.where(b.response_mask, lss.exp(), torch.zeros_like(lss))


def _reward_components(ctx: RunContext, inputs: Inputs) -> torch.Tensor:
    """(B, K) one column per named reward component of the task."""
    if inputs.batch.reward_components is None:
        raise rllab.RllabError(
            f"advantage {ctx.components['advantage'].name!r} normalises each reward component on its own, but the batch has "
            f"none: the task declares no reward_components (see rllab.types.Task)"
        )
    return inputs.batch.reward_components


PROVIDERS: dict[str, Provider] = {
    "old_log_prob": Provider(fn=_old_log_prob, before_update=True),
    "ref_log_prob": Provider(fn=_ref_log_prob),
    "values": Provider(fn=_critic_values, model="critic"),
    "reward_baselines": Provider(fn=_greedy_baselines),
    "sum_pi_squared": Provider(fn=_sum_pi_squared, before_update=True),
    "reward_components": Provider(fn=_reward_components),
    "rollout_log_prob": Provider(fn=lambda ctx, inputs: inputs.batch.rollout_log_prob),
    "global_rows": Provider(fn=lambda ctx, inputs: ctx.reducer.sum(inputs.size), per_rows=True),
}
"""The step's optional inputs by name, each a function of (context, inputs): what a component's
``requires=(...)`` may name (those in :attr:`RL.provides`), and the forwards ``prepare`` runs."""


def _to(batch: rllab.RolloutBatch, device: torch.device) -> rllab.RolloutBatch:
    if device.type == "cpu":
        return batch
    return attrs.evolve(batch, **{f.name: getattr(batch, f.name).to(device) for f in attrs.fields(type(batch)) if isinstance(getattr(batch, f.name), torch.Tensor)})


class RL:
    """Policy-gradient RL with the run's advantage estimator, policy loss, correction, KL and aggregation."""

    uses = frozenset({"task", "env", "backend", "advantage", "policy_loss", "correction", "aggregation", "kl", "kl_controller", "value_loss", "sampler"})
    provides = {
        "advantage_estimator": ("values", "reward_baselines", "old_log_prob", "sum_pi_squared", "reward_components"),
        "loss_aggregation": ("global_rows",),
        "policy_loss": ("rollout_log_prob",),
    }

    def __init__(self, *, config: RLConfig):
        self.config = config

    policy_loss_coef = 1.0
    """The policy loss's weight in the micro-batch's loss (on-policy distillation alone sets 0)."""

    def extra_loss(self, ctx: RunContext, p: Prepared, rows: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor, agg,
                   out: dict) -> torch.Tensor | None:
        """A term added to the micro-batch's loss before its backward (a subclass's; metrics into ``out``); None: none."""
        return None

    def needs(self, ctx: RunContext) -> set[str]:
        if _bypass(ctx) and not ctx.components["correction"].trait("identity"):
            raise rllab.RllabError(
                f"policy_loss {ctx.components['policy_loss'].name!r} corrects for the sampler itself (bypass mode): "
                f"set correction = \"none\" (got {ctx.components['correction'].name!r}, which would be applied on top)"
            )
        check_token_count(self.config, ctx.components["aggregation"])
        out = models(PROVIDERS, ctx.components, self.provides)  # "critic" for the values a component requires
        if self.config.kl_in != "none" and ctx.kl_coef > 0:
            out.add("reference")
        return out

    def reconfigure(self, config: RLConfig) -> None:
        """Take new knobs between steps (a ``[[schedule]]`` entry): the step holds no other state."""
        self.config = config

    def on_policy(self, ctx: RunContext) -> bool:
        """No separate old-log-prob forward: either one update from the step's own rollouts with
        nothing needing old log-probs before it (the update's forward, detached, is the old
        policy), or a bypass-mode loss (the rollout engine's log-probs are the old policy)."""
        c = self.config
        if _bypass(ctx):
            return True
        if before_update(PROVIDERS, ctx.components, self.provides):
            return False  # a component reads the rollout-time policy before the update
        if _narrows(ctx) is not None:
            return False  # the keep mask sets the minibatches' global counts before the update
        return c.epochs == 1 and c.minibatches == 1 and not (c.kl_in == "reward" and ctx.reference is not None)

    # ------------------------------------------------------------------ the step

    def step(self, ctx: RunContext):
        rollouts = ctx.rollout.sample(ctx.step)
        metrics = dict(rollouts.metrics)
        t_batch = time.perf_counter()  # time/batch: the episodes to the device batch
        batch = rollout_batch(ctx, rollouts)  # on_rollout_end
        if batch is None:
            metrics["train/skipped"] = 1.0
            return metrics
        batch = _to(batch, ctx.device)
        metrics["time/batch"] = time.perf_counter() - t_batch
        prepared, prep_metrics = self.prepare(ctx, batch, Inputs(ctx, batch, PROVIDERS, rollouts=rollouts))
        metrics.update(prep_metrics)
        if prepared.old_log_prob is None:  # the update's first forwards record the policy before it, for the samples
            prepared = attrs.evolve(prepared, pre_update_log_prob=torch.full(
                batch.response_mask.shape, float("nan"), device=batch.response_mask.device))
        updated = yield from self.update(ctx, prepared)
        metrics.update(updated.metrics)
        # on_step_samples: only rank 0 listens, so nothing here runs a forward (NaN, a row reached only
        # after an optimizer step in bypass mode: no trainer log-probs)
        trainer = prepared.old_log_prob if prepared.old_log_prob is not None else prepared.pre_update_log_prob
        metrics.update(report_samples(ctx, rollouts, batch, advantages=prepared.advantages, trainer_log_prob=trainer))
        policy_ref = updated.policy_ref_kl
        if prepared.ref_log_prob is not None and prepared.old_log_prob is not None:
            policy_ref = ops.masked_mean(prepared.old_log_prob - prepared.ref_log_prob, batch.response_mask).item()
            metrics["kl/policy_ref"] = policy_ref
        metrics["kl/coef"] = prepared.beta
        rows = int(batch.input_ids.shape[0])
        metrics["train/rows"] = float(rows)
        # the controller's measure: verl's penalty mean (kl_measure = penalty_row_mean), else old − ref per token
        kl = prepared.kl_penalty if prepared.kl_penalty is not None else policy_ref
        return rllab.StepReport(metrics=metrics, kl=None if kl is None else rllab.KLSample(value=kl, samples=rows))

    def prepare(self, ctx: RunContext, batch: rllab.RolloutBatch, extra: Inputs | dict | None = None) -> tuple[Prepared, dict]:
        """The no-grad forwards, KL in the reward, advantages and importance weights.

        ``extra``: the step's :class:`Inputs` over ``batch`` (with its rollouts, for ReMax's greedy
        baselines), or inputs the caller already has, by name; the others are made here.
        """
        import time

        comps = ctx.components
        mask = batch.response_mask
        metrics: dict[str, float] = {}
        inputs = extra if isinstance(extra, Inputs) else Inputs(ctx, batch, PROVIDERS, given=extra)
        t0 = time.perf_counter()
        old = None if self.on_policy(ctx) else inputs["old_log_prob"]
        ref = inputs["ref_log_prob"]
        values = inputs["values"]
        t1 = time.perf_counter()
        token_rewards = batch.token_rewards
        beta = float(ctx.kl_coef)
        kl_penalty = None
        if self.config.kl_in == "reward" and ref is not None:
            kl_tok = comps["kl"](log_prob=old, ref_log_prob=ref)
            token_rewards = token_rewards - beta * torch.where(mask, kl_tok, torch.zeros_like(kl_tok))
            metrics["kl/reward_kl"] = ops.masked_mean(kl_tok, mask).item()
            if self.config.kl_measure == "penalty_row_mean":
                kl_penalty = penalty_row_mean(kl_tok, mask).item()
                metrics["kl/current"] = kl_penalty
        train_mask, adv_mask = mask, mask
        narrow = _narrows(ctx)
        if narrow is not None and old is not None:
            correction = comps["correction"]
            keep = correction.trait("keep_mask")(
                old_log_prob=old, rollout_log_prob=batch.rollout_log_prob, mask=mask, config=correction.config
            )
            train_mask = mask & keep
            if narrow == "before_advantage":
                adv_mask = train_mask
            metrics["train/kept_token_frac"] = ops.masked_mean(train_mask.float(), mask).item()
        estimator = _task_weighted(comps["advantage"], batch)
        advantages, returns = inputs.call(estimator, token_rewards=token_rewards, mask=adv_mask, index=batch.index)
        metrics.update(inputs.metrics)
        weights = None
        if old is not None:  # else measured / computed per micro-batch from the update's forward
            metrics.update({k: float(v) for k, v in ops.log_prob_gap(old, batch.rollout_log_prob, mask).items()})
            weights, corr_metrics = comps["correction"](old_log_prob=old, rollout_log_prob=batch.rollout_log_prob, mask=mask)
            metrics.update({k: float(v) for k, v in corr_metrics.items()})
        metrics["adv/mean"] = ops.masked_mean(advantages, train_mask).item()
        metrics["adv/std"] = math.sqrt(max(ops.masked_var(advantages, train_mask).item(), 0.0))
        metrics["adv/zero_frac"] = ops.masked_mean((advantages == 0).float(), train_mask).item()
        metrics["time/forward"] = t1 - t0
        metrics["time/advantage"] = time.perf_counter() - t1
        prepared = Prepared(
            batch=batch, old_log_prob=old, ref_log_prob=ref, values=values, advantages=advantages, returns=returns, weights=weights,
            beta=beta, mask=train_mask, kl_penalty=kl_penalty, inputs=inputs,
        )
        return prepared, metrics

    def update(self, ctx: RunContext, p: Prepared):
        """Epochs × minibatches × micro-batches; yields after each minibatch's backward."""
        import time

        c = self.config
        t0 = time.perf_counter()
        batch = p.batch
        B = batch.input_ids.shape[0]
        gen = torch.Generator().manual_seed(seed_for(ctx.seed, ctx.step, 2))
        aggregation = ctx.components["aggregation"]
        inputs = _inputs(ctx, p)
        red = ctx.reducer
        sums: dict[str, list[float]] = {}
        kl_sums: list[float] = []  # the typed twin of the kl/policy_ref metric, aggregated alike
        # batch_mean: every optimizer step divides by the step's tokens / minibatches (over every rank)
        batch_mean = red.sum(int(p.mask.sum())) / c.minibatches if c.token_count == "batch_mean" else None
        order = torch.arange(B)
        for epoch in range(c.epochs):
            if c.minibatches > 1 and (c.minibatch_order == "reshuffle" or c.minibatch_order == "once" and epoch == 0):
                order = torch.randperm(B, generator=gen)
            for mb in order.tensor_split(c.minibatches):
                if mb.numel() == 0:
                    continue
                mb = mb.to(batch.input_ids.device)
                mb_mask = p.mask[mb]  # narrowed by a rejecting correction: only kept tokens count
                # counts of the minibatch over every data-parallel rank (ctx.reducer: identity in one process)
                own_tokens = red.sum(int(mb_mask.sum()))
                counts = {"global_tokens": own_tokens if batch_mean is None else batch_mean,
                          "global_seqs": red.sum(int(mb_mask.any(-1).sum())), **inputs.rows(mb).required(aggregation)}
                agg = partial(_aggregate, aggregation, **counts)
                micro = c.micro_batch_size or mb.numel()
                mb_tokens = max(1, own_tokens)
                mb_metrics: dict[str, float] = {}
                mb_kl: float | None = None
                n_micro = -(-mb.numel() // micro)
                for rows in mb.split(micro):
                    # "micro_batch" (token_count, entropy_mean): this micro-batch's own token mean, averaged
                    # over the micro-batches and ranks
                    rows_tokens = int(p.mask[rows].sum())
                    own = max(1, rows_tokens) * n_micro * red.world_size
                    micro_agg = partial(_aggregate, aggregation, **{**counts, "global_tokens": own}) if c.token_count == "micro_batch" else agg
                    extra = {"entropy_agg": partial(_token_mean, tokens=own)} if c.entropy_mean == "micro_batch" else {}
                    m, kl = self.micro_loss(ctx, p, rows, micro_agg, **extra)
                    token_share = rows_tokens / mb_tokens
                    if kl is not None:
                        mb_kl = (mb_kl or 0.0) + kl * token_share * red.world_size
                    for k, v in m.items():
                        # losses add over micro-batches (global normalisers); diagnostics are token-weighted;
                        # × world size: the trainer averages the ranks' shares
                        mb_metrics[k] = mb_metrics.get(k, 0.0) + v * (1.0 if k.startswith("loss/") else token_share) * red.world_size
                grad_metrics = yield OptimizerStep(critic=ctx.critic is not None)
                p = attrs.evolve(p, pre_update_log_prob=None)  # later forwards see the updated policy
                mb_metrics.update(grad_metrics or {})
                for k, v in mb_metrics.items():
                    sums.setdefault(k, []).append(v)
                if mb_kl is not None:
                    kl_sums.append(mb_kl)
        out = {k: sum(v) / len(v) for k, v in sums.items()}
        # measured in the update (no old-log-prob forward): the first minibatch, before any optimizer step
        out.update({k: v[0] for k, v in sums.items() if k.startswith("mismatch/")})
        out["actor/first_approx_kl"] = sums.get("actor/approx_kl", [0.0])[0]
        out["actor/first_clipfrac"] = sums.get("actor/clipfrac", [0.0])[0]
        out["time/update"] = time.perf_counter() - t0
        return Updated(metrics=out, policy_ref_kl=sum(kl_sums) / len(kl_sums) if kl_sums else None)

    def policy_forward(self, ctx: RunContext, p: Prepared, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch's (log-probs of the sampled tokens, entropies), each (rows, T), with their gradients."""
        return _logprobs(ctx, ctx.policy, p.batch, rows, with_entropy=True)

    def micro_loss(self, ctx: RunContext, p: Prepared, rows: torch.Tensor, agg, entropy_agg=None) -> tuple[dict, float | None]:
        """Forward and backward of one micro-batch; returns its metrics (losses as floats) and, on
        an on-policy step with a reference, its ``old − ref`` KL (mean over its valid tokens)."""
        comps = ctx.components
        batch = p.batch
        mask = p.mask[rows]
        correction = comps["correction"]
        log_prob, entropy = self.policy_forward(ctx, p, rows)
        if p.pre_update_log_prob is not None:  # a listener's samples (see step), before the first optimizer step
            p.pre_update_log_prob[rows] = log_prob.detach().float()
        out: dict[str, float] = {}
        policy_ref = None
        if p.old_log_prob is None:  # this forward's log-probs against the sampler's (update() keeps the first minibatch's)
            out.update({k: float(v) for k, v in ops.log_prob_gap(log_prob, batch.rollout_log_prob[rows], mask).items()})
        if _bypass(ctx):  # the loss corrects for the sampler itself, from π_θ / π_rollout
            old, w = batch.rollout_log_prob[rows], None
        elif p.old_log_prob is None:  # on-policy: this forward is the rollout-time policy
            old = log_prob.detach()
            w = None
            if not correction.trait("identity"):
                w, corr_metrics = correction(old_log_prob=old, rollout_log_prob=batch.rollout_log_prob[rows], mask=mask)
                out.update({k: float(v) for k, v in corr_metrics.items()})
            if p.ref_log_prob is not None:
                policy_ref = ops.masked_mean(old - p.ref_log_prob[rows], mask).item()
                out["kl/policy_ref"] = policy_ref
        else:
            old = p.old_log_prob[rows]
            w = p.weights[rows] if p.weights is not None else None
        policy_loss = comps["policy_loss"]
        pg_loss, pg_metrics = _inputs(ctx, p).rows(rows).call(
            policy_loss,
            log_prob=log_prob,
            old_log_prob=old,
            advantages=p.advantages[rows],
            mask=mask,
            aggregate=agg,
            weights=None if correction.trait("identity") else w,
        )
        loss = checked_loss(pg_loss, ctx, "policy_loss")
        if policy_loss.trait("aggregation") == "seq-mean":
            # a loss that reduces itself to a mean over its rows: weight the micro-batch by its share
            # of the minibatch's rows, so micro-batching leaves the gradient unchanged
            loss = loss * (int(mask.any(-1).sum()) / max(1, agg.keywords["global_seqs"]))
        out.update({k: float(v) for k, v in pg_metrics.items()})
        out["loss/policy"] = loss.item()
        if self.policy_loss_coef != 1.0:
            loss = loss * self.policy_loss_coef
        if self.config.kl_in == "loss" and p.ref_log_prob is not None and p.beta > 0:
            kl_tok = comps["kl"](log_prob=log_prob, ref_log_prob=p.ref_log_prob[rows])
            if self.config.kl_importance_ratio != "none":
                kl_tok = kl_times_ratio(kl_tok, log_prob, old, mask, self.config.kl_importance_ratio)
            kl_loss = checked_loss(agg(kl_tok, mask), ctx, "kl")
            loss = loss + p.beta * kl_loss
            out["loss/kl"] = kl_loss.item()
        extra_loss = self.extra_loss(ctx, p, rows, log_prob, mask, agg, out)
        if extra_loss is not None:
            loss = loss + extra_loss
        out["actor/entropy"] = ops.masked_mean(entropy.detach(), mask).item()
        if self.config.entropy_coef > 0:  # entropy_agg: TRL's per-micro-batch token mean (entropy_mean = "micro_batch")
            ent = checked_loss((entropy_agg or agg)(entropy, mask), ctx, "aggregation")
            loss = loss - self.config.entropy_coef * ent
            out["loss/entropy"] = ent.item()
        loss.backward()
        if ctx.critic is not None:
            v = _values(ctx, batch, rows)
            v_loss, v_metrics = comps["value_loss"](values=v, old_values=p.values[rows], returns=p.returns[rows], mask=mask, aggregate=agg)
            v_loss = checked_loss(v_loss, ctx, "value_loss")
            (self.config.vf_coef * v_loss).backward()
            out["loss/value"] = v_loss.item()
            out.update({k: float(x) for k, x in v_metrics.items()})
        out["loss/total"] = loss.item()
        return out, policy_ref


def kl_times_ratio(kl_tok: torch.Tensor, log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """TRL's ``use_bias_correction_kl``: the per-token KL times the importance ratio ``π/π_old``.

    ``level = "token"``: ``exp(log_prob − old)`` per token; ``"sequence"``: ``exp`` of the row's
    mean log-ratio over its valid tokens (GSPO's ``importance_sampling_level = "sequence"``). The
    ratio keeps its gradient, as TRL's ``coef_1`` does. All tensors (B, T); ``old_log_prob`` is
    detached by the caller's convention; masked positions are zeroed.
    """
    log_ratio = torch.where(mask, log_prob - old_log_prob.detach(), torch.zeros_like(log_prob))
    if level == "sequence":
        log_ratio = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    return torch.where(mask, kl_tok * torch.exp(log_ratio), torch.zeros_like(kl_tok))


def penalty_row_mean(kl_tok: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's KL for the controller: the mean over rows of each row's masked mean (empty rows 0)."""
    rows = ops.masked_sum(kl_tok, mask, dim=-1) / mask.sum(-1).clamp(min=1)
    return rows.mean()


def _aggregate(component: Any, loss_mat, mask, **counts):
    return component(loss_mat=loss_mat, mask=mask, **counts)


def _token_mean(loss_mat, mask, *, tokens: int):
    """Σ over the valid tokens / ``tokens``, whatever the run's aggregation (TRL's entropy bonus)."""
    return ops.masked_sum(loss_mat, mask) / tokens


def _task_weighted(estimator, batch: rllab.RolloutBatch):
    """The estimator (one that reads the reward components has a ``reward_weights`` knob; others are
    returned as they are) with ``reward_weights`` defaulting to the batch's ``reward_component_weights``
    (the task's, ``Σ_k w_k·r_k`` of its scalar reward, e.g. ``(1, format_weight)``), as TRL's one
    ``reward_weights`` serves both aggregations; an explicit ``reward_weights`` knob wins (``[1, 1]``
    is verl's equal weighting)."""
    config = estimator.config
    if not attrs.has(type(config)) or "reward_weights" not in attrs.fields_dict(type(config)):
        return estimator
    weights = batch.reward_component_weights if config.reward_weights is None else None
    if not weights:
        return estimator
    return attrs.evolve(estimator, config=attrs.evolve(config, reward_weights=tuple(weights)))


def _inputs(ctx: RunContext, p: Prepared) -> Inputs:
    """The step's inputs (a Prepared built by hand has none: made afresh from its batch)."""
    return p.inputs if p.inputs is not None else Inputs(ctx, p.batch, PROVIDERS)


def _narrows(ctx: RunContext) -> str | None:
    """When the correction narrows the response mask ("after_advantage", "before_advantage"), or None."""
    return None if _bypass(ctx) else ctx.components["correction"].trait("narrows_mask")


def _bypass(ctx: RunContext) -> bool:
    """The policy loss wants the rollout engine's log-probs as ``old_log_prob`` (bypass mode)."""
    return ctx.components["policy_loss"].trait("old_log_prob") == "rollout"


def rl(*, config: RLConfig) -> RL:
    """Policy-gradient RL: rollouts, advantages, clipped/corrected policy loss, optional KL and critic."""
    return RL(config=config)

