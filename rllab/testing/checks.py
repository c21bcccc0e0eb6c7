"""The contract suite's checks, one group per component kind (see :mod:`rllab.testing`).

Each check takes a built :class:`~rllab.specs.Component` and raises ``AssertionError`` when the
component breaks the contract of its kind, or :class:`ContractSkip` when the check cannot apply.
``@_check(kind, name)`` registers a check; :func:`rllab.testing.contract_cases` collects them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rllab.lab import Component

Check = Callable[[Component], None]

_REGISTRY: dict[str, list[tuple[str, Check]]] = {}


def _check(kind: str, name: str):
    def deco(fn: Check) -> Check:
        _REGISTRY.setdefault(kind, []).append((name, fn))
        return fn

    return deco


class ContractSkip(Exception):
    """A check that cannot run for this component (e.g. it needs a knob with no default)."""


# --------------------------------------------------------------------------- inputs


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mask(B: int, T: int, g: torch.Generator, holes: bool = True) -> torch.Tensor:
    """Right-padded rows of random lengths (≥1), optionally with holes (observation tokens)."""
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    m = torch.arange(T)[None, :] < lengths[:, None]
    if holes:
        m = m & ~((torch.rand(B, T, generator=g) < 0.15) & (torch.arange(T)[None, :] > 0))
    return m


def _pad(x: torch.Tensor, extra: int, value: float | bool = 0.0) -> torch.Tensor:
    shape = (*x.shape[:-1], extra)
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype)], dim=-1)


def _close(a: torch.Tensor, b: torch.Tensor, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    a, b = torch.as_tensor(a).detach().double(), torch.as_tensor(b).detach().double()
    if a.shape != b.shape or not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=False):
        diff = (a - b).abs().max().item() if a.shape == b.shape else f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
        raise AssertionError(f"{what}: values differ (max abs diff {diff})")


def _finite(x: torch.Tensor, what: str) -> None:
    if not torch.isfinite(torch.as_tensor(x)).all():
        raise AssertionError(f"{what} is not finite: {x}")


def _agg(m: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """token-mean, written out so contract checks do not depend on an aggregation plugin."""
    return torch.where(k, m, torch.zeros((), dtype=m.dtype)).sum() / k.sum().clamp(min=1)


def _metrics_ok(metrics: Any, who: str) -> None:
    if not isinstance(metrics, dict):
        raise AssertionError(f"{who} must return a metrics dict, got {type(metrics).__name__}")
    for k, v in metrics.items():
        if "/" not in k:
            raise AssertionError(f"metric key {k!r} is not namespaced (expected e.g. 'actor/{k}')")
        v = torch.as_tensor(v)
        if v.numel() != 1:
            raise AssertionError(f"metric {k!r} must be a scalar, got shape {tuple(v.shape)}")
        if v.requires_grad:
            raise AssertionError(f"metric {k!r} must be detached")


# --------------------------------------------------------------------------- advantage estimators


def _adv_inputs(comp: Component, B=8, T=7, seed=0):
    g = _gen(seed)
    mask = _mask(B, T, g)
    index = torch.arange(B) // 2
    scores = torch.randint(0, 2, (B,), generator=g).float()
    lengths = mask.long().cumsum(-1).argmax(-1)
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths] = scores
    kw = dict(token_rewards=rewards, mask=mask, index=index)
    if "values" in comp.spec.requires:
        kw["values"] = torch.randn(B, T, generator=g)
    if "old_log_prob" in comp.spec.requires:
        kw["old_log_prob"] = -torch.rand(B, T, generator=g) * 3 - 0.01
    if "sum_pi_squared" in comp.spec.requires:  # Σ_v π_v² ≥ π_t² of the sampled token
        pi = torch.exp(kw.get("old_log_prob", torch.zeros(B, T)))
        kw["sum_pi_squared"] = pi**2 + torch.rand(B, T, generator=g) * (1 - pi**2)
    if "reward_baselines" in comp.spec.requires:  # a per-row baseline (ReMax: the greedy response's reward)
        kw["reward_baselines"] = torch.rand(B, generator=g)
    # reward_components is left out: the estimator's fallback (one component, the row score) is checked
    unknown = set(comp.spec.requires) - {"values", "old_log_prob", "sum_pi_squared", "reward_baselines", "reward_components"}
    if unknown:
        raise ContractSkip(f"{comp.name} requires inputs the suite cannot make: {sorted(unknown)}")
    return kw


@_check("advantage_estimator", "finite outputs of shape (B, T)")
def _adv_finite(comp):
    kw = _adv_inputs(comp)
    adv, ret = comp(**kw)
    for name, x in (("advantages", adv), ("returns", ret)):
        if x.shape != kw["mask"].shape:
            raise AssertionError(f"{name} has shape {tuple(x.shape)}, expected {tuple(kw['mask'].shape)}")
        _finite(x, name)


@_check("advantage_estimator", "values at masked positions change nothing")
def _adv_masked(comp):
    kw = _adv_inputs(comp)
    adv, ret = comp(**kw)
    kw2 = dict(kw)
    noise = torch.randn(kw["mask"].shape, generator=_gen(1)) * 5
    for key in ("token_rewards", "values", "old_log_prob", "sum_pi_squared"):
        if key in kw:
            kw2[key] = torch.where(kw["mask"], kw[key], noise)
    adv2, ret2 = comp(**kw2)
    m = kw["mask"]
    _close(adv[m], adv2[m], "advantages at valid positions")
    _close(ret[m], ret2[m], "returns at valid positions")


@_check("advantage_estimator", "appending padding changes nothing")
def _adv_padding(comp):
    kw = _adv_inputs(comp)
    adv, ret = comp(**kw)
    kw2 = {k: (_pad(v, 3, False if v.dtype == torch.bool else 0.0) if v.ndim == 2 else v) for k, v in kw.items()}
    adv2, ret2 = comp(**kw2)
    m = kw["mask"]
    _close(adv2[:, : m.shape[1]][m], adv[m], "advantages after padding")
    _close(ret2[:, : m.shape[1]][m], ret[m], "returns after padding")


@_check("advantage_estimator", "an all-masked row gets 0 and changes no other row")
def _adv_all_masked(comp):
    kw = _adv_inputs(comp)
    adv, _ = comp(**kw)
    B, T = kw["mask"].shape
    kw2 = {}
    for k, v in kw.items():
        if k == "index":
            kw2[k] = torch.cat([v, torch.tensor([v.max().item() + 1])])
        elif k == "mask":
            kw2[k] = torch.cat([v, torch.zeros(1, T, dtype=torch.bool)])
        else:  # (B, T) inputs get a row, (B,) inputs an entry
            kw2[k] = torch.cat([v, torch.randn(1, *v.shape[1:], generator=_gen(2))])
    adv2, _ = comp(**kw2)
    _finite(adv2, "advantages")
    if not torch.all(adv2[B] == 0):
        raise AssertionError(f"the all-masked row got advantages {adv2[B].tolist()}")
    m = kw["mask"]
    _close(adv2[:B][m], adv[m], "other rows' advantages")


def _batch_step(comp) -> str | None:
    return comp.trait("batch_step")


def _other_groups_after_change(comp):
    """(advantages before, advantages after) at the valid tokens outside group 0, when group 0's rewards change."""
    kw = _adv_inputs(comp)
    index, mask = kw["index"], kw["mask"]
    last = torch.zeros_like(mask)
    last[torch.arange(mask.shape[0]), mask.long().cumsum(-1).argmax(-1)] = True
    # continuous scores: no group of equal scores whose advantages are 0 whatever happens elsewhere
    kw["token_rewards"] = torch.where(last, torch.randn(mask.shape, generator=_gen(5)), 0.0)
    adv, _ = comp(**kw)
    group0 = index == index[0]
    kw2 = dict(kw)
    # new scores 4.0, −2.5, 4.0, ...: the group's sum, spread and share of non-zero scores all change
    new = torch.where(torch.arange(mask.shape[0]) % 2 == 0, 4.0, -2.5)[:, None].expand_as(mask)
    kw2["token_rewards"] = torch.where(group0[:, None] & last, new, kw["token_rewards"])
    adv2, _ = comp(**kw2)
    others = mask & ~group0[:, None]
    return adv[others], adv2[others]


@_check("advantage_estimator", "changing one group's rewards leaves the other groups alone")
def _adv_group_isolation(comp):
    if _batch_step(comp) is not None:
        raise ContractSkip(f"{comp.name} declares a batch-level step ({_batch_step(comp)}); checked separately")
    before, after = _other_groups_after_change(comp)
    _close(after, before, "other groups' advantages after changing group 0's rewards (an estimator "
           "whose statistics span the batch must register with batch_step=...)")


@_check("advantage_estimator", "a declared batch-level step moves other groups by one affine map")
def _adv_batch_step(comp):
    if _batch_step(comp) is None:
        raise ContractSkip(f"{comp.name} declares no batch-level step; the group-isolation check applies")
    x, y = (t.double() for t in _other_groups_after_change(comp))
    if x.numel() < 2 or float(x.std()) < 1e-9:
        raise ContractSkip("the other groups' advantages are constant; no map to recover")
    a = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    b = y.mean() - a * x.mean()
    if not a > 0:
        raise AssertionError(f"other groups' advantages were not moved by an increasing map (slope {float(a)})")
    _close(a * x + b, y, f"other groups' advantages vs one affine map of their old values (a={float(a):.4g})")


# --------------------------------------------------------------------------- policy losses


def _pl_inputs(B=6, T=9, seed=0):
    g = _gen(seed)
    mask = _mask(B, T, g)
    old = -torch.rand(B, T, generator=g) * 3 - 0.05
    logp = old + torch.randn(B, T, generator=g) * 0.3
    adv = torch.randn(B, T, generator=g)
    return dict(log_prob=logp, old_log_prob=old, advantages=adv, mask=mask)


def _pl_call(comp, kw, **extra):
    return _pl_call_with(comp, kw, _agg, **extra)


def _pl_call_with(comp, kw, aggregate, **extra):
    logp = kw["log_prob"].clone().requires_grad_(True)
    loss, metrics = comp(**{**kw, "log_prob": logp}, aggregate=aggregate, **extra)
    if loss.ndim != 0:
        raise AssertionError(f"loss must be a scalar, got shape {tuple(loss.shape)}")
    loss.backward()
    return loss.detach(), logp.grad, metrics


@_check("policy_loss", "finite loss and gradients; namespaced scalar metrics")
def _pl_finite(comp):
    loss, grad, metrics = _pl_call(comp, _pl_inputs())
    _finite(loss, "loss")
    _finite(grad, "gradient")
    _metrics_ok(metrics, comp.name)
    for key in ("actor/approx_kl", "actor/clipfrac"):
        if key not in metrics:
            raise AssertionError(f"metrics lack {key!r} (got {sorted(metrics)})")


@_check("policy_loss", "values at masked positions (NaN included) change nothing")
def _pl_masked(comp):
    kw = _pl_inputs()
    loss, grad, _ = _pl_call(comp, kw)
    m = kw["mask"]
    kw2 = dict(kw)
    for k in ("log_prob", "old_log_prob", "advantages"):
        kw2[k] = torch.where(m, kw[k], torch.full_like(kw[k], float("nan")))
    loss2, grad2, _ = _pl_call(comp, kw2)
    _close(loss2, loss, "loss")
    _close(grad2[m], grad[m], "gradient at valid positions")
    if grad2[~m].abs().sum() != 0 or not torch.isfinite(grad2).all():
        raise AssertionError("masked positions received a nonzero or non-finite gradient")


@_check("policy_loss", "appending padding changes nothing")
def _pl_padding(comp):
    kw = _pl_inputs()
    loss, _, _ = _pl_call(comp, kw)
    kw2 = {k: _pad(v, 4, False if v.dtype == torch.bool else 0.0) for k, v in kw.items()}
    loss2, _, _ = _pl_call(comp, kw2)
    _close(loss2, loss, "loss after padding")


@_check("policy_loss", "approx_kl and clipfrac are 0 when log_prob == old_log_prob")
def _pl_on_policy(comp):
    kw = _pl_inputs()
    kw["log_prob"] = kw["old_log_prob"].clone()
    _, _, metrics = _pl_call(comp, kw)
    for key in ("actor/approx_kl", "actor/clipfrac"):
        if float(metrics[key]) != 0.0:
            raise AssertionError(f"{key} = {float(metrics[key])} on the first minibatch (expected exactly 0)")


def _double(m: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return 2.0 * _agg(m, k)


@_check("policy_loss", "the loss goes through aggregate, or declares its own reduction")
def _pl_aggregation(comp):
    kw = _pl_inputs()
    declared = comp.trait("aggregation")
    calls = []

    def spy(m, k):
        calls.append(m.shape)
        return _double(m, k)

    loss, _, _ = _pl_call(comp, kw)
    loss2, _, _ = _pl_call_with(comp, kw, spy)
    if declared is None:
        if not calls:
            raise AssertionError(
                "the loss never called aggregate; a loss that reduces itself must register with aggregation=..."
            )
        _close(loss2, 2 * loss, "loss under an aggregate that doubles (the loss must be what aggregate returns)")
        return
    if declared != "seq-mean":
        raise AssertionError(f"aggregation = {declared!r} is not a reduction the contract knows ('seq-mean')")
    _close(loss2, loss, f"loss under another aggregate (the loss declares aggregation = {declared!r})")
    B = kw["mask"].shape[0]
    halves = [{k: v[: B // 2] for k, v in kw.items()}, {k: v[B // 2 :] for k, v in kw.items()}]
    rows = [int(h["mask"].any(-1).sum()) for h in halves]
    parts = [_pl_call(comp, h)[0] for h in halves]
    _close((rows[0] * parts[0] + rows[1] * parts[1]) / sum(rows), loss, "seq-mean loss vs the row-weighted mean of its halves")


@_check("policy_loss", "weights of 1 equal no weights")
def _pl_weights(comp):
    kw = _pl_inputs()
    loss, grad, _ = _pl_call(comp, kw)
    loss2, grad2, _ = _pl_call(comp, kw, weights=kw["mask"].float())
    _close(loss2, loss, "loss with unit weights")
    _close(grad2, grad, "gradient with unit weights")


# --------------------------------------------------------------------------- KL penalties


def _kl_inputs(comp, B=4, T=6, V=11, seed=0):
    g = _gen(seed)
    kw: dict[str, Any] = {}
    if "logits" in comp.spec.requires:
        logits = torch.randn(B, T, V, generator=g)
        ref_logits = logits + 0.5 * torch.randn(B, T, V, generator=g)
        labels = torch.randint(0, V, (B, T), generator=g)
        kw["logits"], kw["ref_logits"] = logits, ref_logits
        kw["log_prob"] = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
        kw["ref_log_prob"] = torch.log_softmax(ref_logits, -1).gather(-1, labels[..., None])[..., 0]
    else:
        kw["log_prob"] = -torch.rand(B, T, generator=g) * 3
        kw["ref_log_prob"] = kw["log_prob"] + 0.4 * torch.randn(B, T, generator=g)
    return kw


@_check("kl_penalty", "finite (B, T) values and gradients")
def _kl_finite(comp):
    kw = _kl_inputs(comp)
    grad_key = "logits" if "logits" in kw else "log_prob"
    x = kw[grad_key].clone().requires_grad_(True)
    kl = comp(**{**kw, grad_key: x})
    if kl.shape != kw["log_prob"].shape:
        raise AssertionError(f"KL has shape {tuple(kl.shape)}, expected {tuple(kw['log_prob'].shape)}")
    _finite(kl, "KL")
    kl.sum().backward()
    _finite(x.grad, "gradient")


@_check("kl_penalty", "0 where policy and reference agree")
def _kl_zero(comp):
    kw = _kl_inputs(comp)
    kw["ref_log_prob"] = kw["log_prob"].clone()
    if "logits" in kw:
        kw["ref_logits"] = kw["logits"].clone()
    kl = comp(**kw)
    _close(kl, torch.zeros_like(kl), "KL at equality", atol=1e-6)


# --------------------------------------------------------------------------- aggregations


@_check("loss_aggregation", "masked values (NaN included) and padding change nothing")
def _agg_masked(comp):
    g = _gen(0)
    mask = _mask(5, 8, g)
    x = torch.randn(5, 8, generator=g)
    base = comp(loss_mat=x, mask=mask)
    _finite(base, "aggregate")
    nan = torch.where(mask, x, torch.full_like(x, float("nan")))
    _close(comp(loss_mat=nan, mask=mask), base, "aggregate with NaN at masked positions")
    if comp.trait("padding_dependent") is not None:
        return  # e.g. a horizon of "the mask width" legitimately depends on padding
    _close(comp(loss_mat=_pad(x, 3), mask=_pad(mask, 3, False)), base, "aggregate after padding")


@_check("loss_aggregation", "an all-masked batch gives 0")
def _agg_empty(comp):
    out = comp(loss_mat=torch.randn(3, 4), mask=torch.zeros(3, 4, dtype=torch.bool))
    if float(out) != 0.0:
        raise AssertionError(f"all-masked batch aggregated to {float(out)}")


@_check("loss_aggregation", "micro-batches with global counts sum to the whole batch (loss and gradient, ≤ 1e-6 relative)")
def _agg_split(comp):
    g = _gen(3)
    mask = _mask(8, 6, g)
    mask[2] = False  # an empty row: the sequence counts must still add up
    x = torch.randn(8, 6, generator=g, dtype=torch.float64).requires_grad_(True)
    counts = {"global_tokens": int(mask.sum()), "global_seqs": int(mask.any(-1).sum())}
    if "global_rows" in comp.spec.requires:
        counts["global_rows"] = mask.shape[0]
    whole = comp(loss_mat=x, mask=mask)
    (grad,) = torch.autograd.grad(whole, x)
    parts = sum(comp(loss_mat=x[i : i + 3], mask=mask[i : i + 3], **counts) for i in range(0, 8, 3))
    (grad_parts,) = torch.autograd.grad(parts, x)
    _close(parts, whole, "sum of micro-batch aggregates", rtol=1e-6, atol=1e-12)
    _close(grad_parts, grad, "gradient of the summed micro-batch aggregates", rtol=1e-6, atol=1e-12)


# --------------------------------------------------------------------------- corrections


@_check("importance_correction", "detached weights, 0 on padding, 1 when rollout == old")
def _corr(comp):
    g = _gen(0)
    mask = _mask(5, 7, g)
    old = -torch.rand(5, 7, generator=g) * 2
    old_g = old.clone().requires_grad_(True)
    roll = old + 0.3 * torch.randn(5, 7, generator=g)
    w, metrics = comp(old_log_prob=old_g, rollout_log_prob=roll, mask=mask)
    if w.requires_grad:
        raise AssertionError("weights must be detached")
    _finite(w, "weights")
    if (w[~mask] != 0).any():
        raise AssertionError("weights on masked positions must be 0")
    _metrics_ok(metrics, comp.name)
    w1, _ = comp(old_log_prob=old, rollout_log_prob=old.clone(), mask=mask)
    _close(w1[mask], torch.ones(int(mask.sum())), "weights when rollout_log_prob == old_log_prob")


# --------------------------------------------------------------------------- value losses


@_check("value_loss", "finite, masked-invariant, 0 when values equal returns")
def _vl(comp):
    g = _gen(0)
    mask = _mask(5, 7, g)
    ret = torch.randn(5, 7, generator=g)
    old = ret + 0.3 * torch.randn(5, 7, generator=g)
    v = (old + 0.2 * torch.randn(5, 7, generator=g)).requires_grad_(True)
    loss, metrics = comp(values=v, old_values=old, returns=ret, mask=mask, aggregate=_agg)
    _finite(loss, "value loss")
    loss.backward()
    _finite(v.grad, "gradient")
    _metrics_ok(metrics, comp.name)
    nan = lambda t: torch.where(mask, t.detach(), torch.full_like(t.detach(), float("nan")))  # noqa: E731
    loss2, _ = comp(values=nan(v), old_values=nan(old), returns=nan(ret), mask=mask, aggregate=_agg)
    _close(loss2, loss, "value loss with NaN at masked positions")
    zero, _ = comp(values=ret.clone(), old_values=ret.clone(), returns=ret, mask=mask, aggregate=_agg)
    _close(zero, torch.tensor(0.0), "value loss when values == returns")


# --------------------------------------------------------------------------- preference losses


@_check("preference_loss", "finite per-pair losses and gradients")
def _pref(comp):
    g = _gen(0)
    P = 6
    lens_c = torch.randint(1, 9, (P,), generator=g)
    lens_r = torch.randint(1, 9, (P,), generator=g)
    c = (-torch.rand(P, generator=g) * lens_c).requires_grad_(True)
    r = (-torch.rand(P, generator=g) * lens_r).requires_grad_(True)
    losses, metrics = comp(
        chosen_logps=c,
        rejected_logps=r,
        ref_chosen_logps=c.detach() + 0.1,
        ref_rejected_logps=r.detach() - 0.1,
        chosen_lengths=lens_c,
        rejected_lengths=lens_r,
    )
    if losses.shape != (P,):
        raise AssertionError(f"losses must have shape ({P},), got {tuple(losses.shape)}")
    _finite(losses, "losses")
    losses.mean().backward()
    _finite(c.grad, "gradient (chosen)")
    _finite(r.grad, "gradient (rejected)")
    _metrics_ok(metrics, comp.name)
