"""The knobs of the ``rl`` algorithm (:mod:`rllab_algorithms.rl`)."""

from __future__ import annotations

import attrs

import rllab


@attrs.frozen
class RLConfig:
    """Knobs of the policy-gradient step."""

    epochs: int = rllab.knob(1, help="passes over each step's rollouts", ge=1)
    minibatches: int = rllab.knob(1, help="optimizer steps per epoch", ge=1)
    micro_batch_size: int | None = rllab.knob(None, help="rows per forward/backward (gradient accumulation); None: whole minibatch", ge=1)
    minibatch_order: str = rllab.knob(
        "reshuffle",
        help="how the rollouts are split into minibatches: reshuffle, a new random split every epoch; once, one random "
        "split kept (in its order) for every epoch (TRL's num_iterations); in_order, contiguous minibatches in the "
        "batch's row order, whole groups together (verl's default, actor.shuffle = false)",
        choices=("reshuffle", "once", "in_order"),
    )
    token_count: str = rllab.knob(
        "minibatch",
        help="the token count a token-mean aggregation divides by: minibatch, that minibatch's own valid tokens; "
        "batch_mean, the step's valid tokens / minibatches, one normaliser for every optimizer step of the step "
        "(TRL's dapo, cispo and vespo losses); micro_batch, each micro-batch's own tokens, the micro-batches' means "
        "averaged (TRL's bnpo under gradient accumulation)",
        choices=("minibatch", "batch_mean", "micro_batch"),
    )
    entropy_coef: float = rllab.knob(0.0, help="entropy bonus coefficient", ge=0.0)
    entropy_mean: str = rllab.knob(
        "aggregation",
        help="how the entropy bonus averages its tokens: aggregation, by the run's [aggregation], as the loss; "
        "micro_batch, each micro-batch's own token mean, averaged over micro-batches and ranks (TRL's entropy bonus, "
        "whatever its loss_type)",
        choices=("aggregation", "micro_batch"),
        validator=lambda i, a, v: _needs_entropy(i, a, v),
    )
    vf_coef: float = rllab.knob(0.5, help="value-loss coefficient (critic estimators only)", ge=0.0)
    kl_in: str = rllab.knob("none", help="where the KL penalty to the reference applies", choices=("none", "reward", "loss"))
    kl_importance_ratio: str = rllab.knob(
        "none",
        help="kl_in = loss: multiply the per-token KL by the importance ratio π/π_old, per token or per sequence "
        "(TRL's use_bias_correction_kl with importance_sampling_level); none: plain KL",
        choices=("none", "token", "sequence"),
        validator=lambda i, a, v: _needs_kl_in(i, a, v, "none", "loss"),
    )
    kl_measure: str = rllab.knob(
        "k1_token_mean",
        help="the KL the controller adapts to: k1_token_mean, mean over valid tokens of old − ref (rllab); "
        "penalty_row_mean, mean over rows of each row's masked mean of the [kl] penalty, empty rows 0 (verl)",
        choices=("k1_token_mean", "penalty_row_mean"),
        validator=lambda i, a, v: _needs_kl_in(i, a, v, "k1_token_mean", "reward"),
    )


def _needs_kl_in(inst, attribute, value, default, kl_in: str) -> None:
    if value != default and inst.kl_in != kl_in:
        raise ValueError(f"{attribute.name} = {value!r} applies only with kl_in = {kl_in!r} (kl_in is {inst.kl_in!r})")


def _needs_entropy(inst, attribute, value) -> None:
    if value != "aggregation" and inst.entropy_coef == 0:
        raise ValueError(f"{attribute.name} = {value!r} applies only with an entropy bonus (entropy_coef is 0)")


def check_token_count(config: RLConfig, aggregation) -> None:
    """Refuse a ``token_count`` the run's aggregation would ignore (it declares ``divides_by_tokens = False``)."""
    if config.token_count != "minibatch" and aggregation.trait("divides_by_tokens") is False:
        raise rllab.ConfigError(
            f"algorithm.token_count = {config.token_count!r} changes the token count a loss divides by, but aggregation "
            f"{aggregation.name!r} does not divide by tokens, so it would have no effect: use a token-mean aggregation, "
            f"or token_count = 'minibatch'", key="token_count",
        )
