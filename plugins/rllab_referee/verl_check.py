"""``rllab crosscheck verl CONFIG [key=value …]``: rllab's components, as an imported verl config sets
them, against verl 0.9.1's own ``core_algos`` functions on shared batches with signal.

The config is imported as ``rllab import verl`` imports it (refused knobs stop here with the
importer's message). Then, on ``--batches`` seeded batches of ``P`` prompts × ``n`` responses (``n``:
the config's ``rollout.n``, at least 2) whose groups all have rewards that differ, so that every
advantage compared is not 0:

* **advantages**: rllab's ``[advantage]`` estimator against verl's ``compute_*_outcome_advantage`` of
  ``algorithm.adv_estimator`` (outcome rewards on each response's last token, group ids as verl's
  ``uid``s);
* **policy loss**: rllab's ``[policy_loss]`` aggregated by its ``[aggregation]`` against verl's
  ``get_policy_loss_fn(loss_mode)`` with the config's ``ActorConfig`` (clip ratios, dual clip,
  ``loss_agg_mode``, ``loss_scale_factor``), on verl's advantages and log-probabilities that moved
  off the old policy (so that clipping acts): the loss and its gradient w.r.t. the log-probabilities;
* **aggregation**: rllab's ``[aggregation]`` against ``agg_loss`` on a random loss matrix;
* **KL**: rllab's ``[kl]`` estimator against ``kl_penalty`` (per token), and with ``use_kl_loss`` the
  KL loss term (aggregated, times ``kl_loss_coef``) and its gradient;
* **rollout correction**: with ``rollout_is`` set (and no rejection), rllab's ``[correction]``
  weights against ``compute_rollout_correction_weights``.

A part the config does not set (no KL, no rollout correction) is named as not compared. The output
is a table of every comparison (largest absolute and relative difference) and a verdict naming the
largest difference; exit status 1 when one is outside the tolerance (float32: 1e-5 relative with
1e-6 absolute, as the reference tests). verl is imported without its runtime
(:mod:`rllab_referee.verl_reference`): ``pip install omegaconf orjson && pip install --no-deps verl==0.9.1``.
"""

from __future__ import annotations

import zlib
from typing import Any

import attrs

from rllab import ConfigError, RllabError

RTOL, ATOL = 1e-5, 1e-6
A = "actor_rollout_ref.actor."
ESTIMATORS = {  # verl's adv_estimator → its outcome function (verl 0.9.1 core_algos)
    "grpo": "compute_grpo_outcome_advantage", "grpo_vectorized": "compute_grpo_outcome_advantage",
    "rloo": "compute_rloo_outcome_advantage", "rloo_vectorized": "compute_rloo_outcome_advantage",
    "reinforce_plus_plus_baseline": "compute_reinforce_plus_plus_baseline_outcome_advantage",
}  # fmt: skip


@attrs.frozen
class Check:
    quantity: str
    what: str
    abs_diff: float
    rel_diff: float

    @property
    def ok(self) -> bool:
        return self.abs_diff <= ATOL + RTOL * self.scale if self.scale is not None else True

    scale: float | None = None
    """The size of the reference values (the relative difference's denominator)."""


def _diff(quantity: str, what: str, ours, ref, mask=None) -> Check:
    import torch

    a, b = torch.as_tensor(ours).detach().double(), torch.as_tensor(ref).detach().double()
    if mask is not None:
        a, b = a[mask], b[mask]
    d = float((a - b).abs().max()) if a.numel() else 0.0
    scale = float(b.abs().max()) if b.numel() else 0.0
    return Check(quantity, what, d, d / max(scale, 1e-12), scale)


def batch(seed: int, prompts: int, n: int, width: int):
    """A batch with signal: rewards 0/1 with both values in every group, right-padded responses (some
    at the full width), log-probabilities of the old, current, reference and rollout policies."""
    import torch

    g = torch.Generator().manual_seed(zlib.crc32(repr(("verl-check", seed)).encode()))
    B = prompts * n
    index = torch.arange(prompts).repeat_interleave(n)
    score = (torch.rand(B, generator=g) < 0.5).float()
    score[0::n], score[1::n] = 1.0, 0.0  # every group has a right and a wrong answer
    lengths = torch.randint(1, width + 1, (B,), generator=g)
    lengths[::3] = width
    mask = torch.arange(width)[None, :] < lengths[:, None]
    rewards = torch.zeros(B, width)
    rewards[torch.arange(B), lengths - 1] = score  # verl's outcome reward: on the last response token
    old = -torch.rand(B, width, generator=g) * 3
    return {"index": index, "mask": mask, "rewards": rewards, "score": score, "old": old,
            "current": old + torch.randn(B, width, generator=g) * 0.3, "ref": old + torch.randn(B, width, generator=g) * 0.2,
            "rollout": old + torch.randn(B, width, generator=g) * 0.1}  # fmt: skip


def _component(lab, cfg, section: str, **replace):
    from rllab.config import COMPONENT_SECTIONS

    ref = cfg.component(section)
    knobs = {**{k: v for k, v in ref.to_dict().items() if k != "name"}, **replace}
    return lab.get(COMPONENT_SECTIONS[section][0], ref.name, **knobs)


def compare(c: dict, cfg: Any, lab: Any, V: Any, data: dict) -> tuple[list[Check], list[str]]:
    """Every comparison the config allows on one batch; (checks, parts not compared and why)."""
    import numpy as np
    import torch

    ca = V.core_algos
    checks: list[Check] = []
    skipped: list[str] = []
    mask, index = data["mask"], data["index"]
    est = c["algorithm.adv_estimator"]
    if est in ESTIMATORS:
        fn = getattr(ca, ESTIMATORS[est])
        kw = {"norm_adv_by_std_in_grpo": bool(c["algorithm.norm_adv_by_std_in_grpo"])} if est.startswith("grpo") else {}
        ids = np.array([str(int(i)) for i in index], dtype=object)  # verl's uids
        ref_adv, _ = fn(data["rewards"], mask.float(), ids, **kw)
        ours = _component(lab, cfg, "advantage")(token_rewards=data["rewards"], mask=mask, index=index)
        ours_adv = ours[0] if isinstance(ours, tuple) else ours
        checks.append(_diff("advantages", f"[advantage] {cfg.component('advantage').name} vs {ESTIMATORS[est]}",
                            ours_adv, ref_adv, mask))
    else:
        ref_adv = (data["score"] - data["score"].mean())[:, None] * mask
        skipped.append(f"advantages: adv_estimator = {est!r} is not wired to a verl function here "
                       f"({', '.join(sorted(ESTIMATORS))} are); the losses use centred scores")
    ref_adv = ref_adv.detach().float()
    agg_mode, factor = c[A + "loss_agg_mode"], c[A + "loss_scale_factor"]
    aggregation = _component(lab, cfg, "aggregation")

    def rl_agg(m, k):
        return aggregation(loss_mat=m, mask=k)

    def verl_agg(m, k):
        return ca.agg_loss(loss_mat=m, loss_mask=k.float(), loss_agg_mode=agg_mode, loss_scale_factor=factor)

    g = torch.Generator().manual_seed(int(mask.sum()))
    mat = torch.randn(mask.shape, generator=g)
    checks.append(_diff("aggregation", f"[aggregation] {cfg.component('aggregation').name} vs agg_loss({agg_mode!r})",
                        rl_agg(mat, mask), verl_agg(mat, mask)))
    mode = c[A + "policy_loss.loss_mode"]
    every = {}
    if mode == "clip_cov" and float(c[A + "policy_loss.clip_cov_ratio"]) < 1:
        # its tokens are drawn at random (verl and rllab draw differently): compared where every candidate is taken
        c = {**c, A + "policy_loss.clip_cov_ratio": 1.0}
        every = {"clip_cov_ratio": 1.0}
        skipped.append("clip_cov's random choice of tokens: compared with clip_cov_ratio = 1 (every candidate token)")
    actor = V.actor_config(clip_ratio=c[A + "clip_ratio"], clip_ratio_low=c[A + "clip_ratio_low"],
                           clip_ratio_high=c[A + "clip_ratio_high"], clip_ratio_c=c[A + "clip_ratio_c"],
                           loss_agg_mode=agg_mode, loss_scale_factor=factor,
                           # what verl's loss wrapper (workers/utils/losses.py) hands its policy losses, on one rank
                           global_batch_info={"loss_scale_factor": factor} if factor is not None else {},
                           policy_loss={"loss_mode": mode, "clip_cov_ratio": c[A + "policy_loss.clip_cov_ratio"],
                                        "clip_cov_lb": c[A + "policy_loss.clip_cov_lb"], "clip_cov_ub": c[A + "policy_loss.clip_cov_ub"],
                                        "kl_cov_ratio": c[A + "policy_loss.kl_cov_ratio"], "ppo_kl_coef": c[A + "policy_loss.ppo_kl_coef"]})
    verl_fn = ca.compute_policy_loss_reinforce if mode == "reinforce" else ca.get_policy_loss_fn(mode)
    lp_ours, lp_ref = data["current"].clone().requires_grad_(True), data["current"].clone().requires_grad_(True)
    torch.manual_seed(0)  # clip_cov / kl_cov draw the tokens they select: the same draws on both sides
    loss, _ = _component(lab, cfg, "policy_loss", **every)(log_prob=lp_ours, old_log_prob=data["old"], advantages=ref_adv, mask=mask,
                                                  aggregate=rl_agg)
    torch.manual_seed(0)
    ref_loss, _ = verl_fn(data["old"], lp_ref, ref_adv, mask.float(), agg_mode, actor, None)
    name = f"[policy_loss] {cfg.component('policy_loss').name} vs get_policy_loss_fn({mode!r})"
    checks.append(_diff("policy loss", name, loss, ref_loss))
    loss.backward()
    ref_loss.backward()
    checks.append(_diff("policy loss gradient", f"{name}, d/d log-prob", lp_ours.grad, lp_ref.grad, mask))
    _kl(c, cfg, lab, ca, data, checks, skipped, rl_agg, verl_agg)
    _correction(c, cfg, lab, V, data, checks, skipped)
    return checks, skipped


def _kl(c, cfg, lab, ca, data, checks, skipped, rl_agg, verl_agg) -> None:
    in_loss, in_reward = c[A + "use_kl_loss"], c["algorithm.use_kl_in_reward"]
    if not (in_loss or in_reward):
        skipped.append("KL: the config has no KL term (use_kl_loss and use_kl_in_reward are false)")
        return
    kind = c[A + "kl_loss_type"] if in_loss else c["algorithm.kl_penalty"]
    kl = _component(lab, cfg, "kl")
    mask = data["mask"]
    lp_ours, lp_ref = data["current"].clone().requires_grad_(True), data["current"].clone().requires_grad_(True)
    ours, ref = kl(log_prob=lp_ours, ref_log_prob=data["ref"]), ca.kl_penalty(lp_ref, data["ref"], kind)
    checks.append(_diff("KL per token", f"[kl] {cfg.component('kl').name} vs kl_penalty({kind!r})", ours, ref, mask))
    if in_loss:
        coef = float(c[A + "kl_loss_coef"])
        term, ref_term = rl_agg(ours, mask) * coef, verl_agg(ref, mask) * coef
        checks.append(_diff("KL loss", f"kl_loss_coef {coef} × the aggregated KL", term, ref_term))
        term.backward()
        ref_term.backward()
        checks.append(_diff("KL loss gradient", "d/d log-prob", lp_ours.grad, lp_ref.grad, mask))


def _correction(c, cfg, lab, V, data, checks, skipped) -> None:
    rc = "algorithm.rollout_correction."
    level, rs = c[rc + "rollout_is"], c[rc + "rollout_rs"]
    if not level and not rs:
        skipped.append("rollout correction: the config sets none (rollout_is and rollout_rs are null)")
        return
    if rs:
        skipped.append("rollout correction: rejection sampling (rollout_rs) is not compared by the crosscheck")
        return
    mask = data["mask"]
    weights, _ = _component(lab, cfg, "correction")(old_log_prob=data["old"], rollout_log_prob=data["rollout"], mask=mask)
    ref, _ = V.rollout_corr.compute_rollout_correction_weights(
        log_ratio=data["old"] - data["rollout"], response_mask=mask.float(), rollout_is=level,
        rollout_is_threshold=c[rc + "rollout_is_threshold"], rollout_is_batch_normalize=bool(c[rc + "rollout_is_batch_normalize"]))
    checks.append(_diff("rollout correction weights", f"[correction] {cfg.component('correction').name} vs "
                        f"compute_rollout_correction_weights({level!r})", weights, ref, mask))


def run(config: str, overrides: list[str], lab, *, batches: int, prompts: int, width: int) -> tuple[str, int]:
    """The report and the exit status (see the module docstring)."""
    from rllab.config import load_config
    from rllab_referee import verl
    from rllab_referee.source import read_config_file, run_import
    from rllab_referee.verl_reference import INSTALL_HINT, VerlUnavailable, load_verl

    t = run_import("verl", config, overrides, lab=lab)  # the importer's checks and message
    cfg = load_config(t.to_dict(), lab=lab)
    c = verl.settings(read_config_file(config, what="verl config"), overrides)
    try:
        V = load_verl()
    except VerlUnavailable as e:
        raise RllabError(f"rllab crosscheck verl: {e}\n  install verl's functions with: {INSTALL_HINT}") from None
    n = max(2, int(c["actor_rollout_ref.rollout.n"]))
    lines = [f"rllab (as `rllab import verl` sets it) against verl {V.version}'s core_algos, {config}"
             f"{' ' + ' '.join(overrides) if overrides else ''}: {batches} batch(es) of {prompts} prompts × {n} responses, "
             f"up to {width} tokens; every group has a right and a wrong answer (all {prompts} groups with signal)\n",
             "| batch | quantity | compared | max abs(verl) | max abs diff | max rel diff | agrees |", "|---:|---|---|---:|---:|---:|---|"]
    every: list[tuple[int, Check]] = []
    skipped: list[str] = []
    for b in range(batches):
        checks, skipped = compare(c, cfg, lab, V, batch(b, prompts, n, width))
        every += [(b, k) for k in checks]
        lines += [f"| {b} | {k.quantity} | {k.what} | {k.scale:.3g} | {k.abs_diff:.2e} | {k.rel_diff:.2e} | {'yes' if k.ok else 'NO'} |"
                  for k in checks]
    lines += [""] + [f"not compared: {s}" for s in skipped]
    bad = [(b, k) for b, k in every if not k.ok]
    b, worst = max(every, key=lambda bk: bk[1].rel_diff)
    if bad:
        b, k = bad[0]
        lines.append(f"\nDISAGREE on batch {b}, {k.quantity} ({k.what}): max abs diff {k.abs_diff:.2e} "
                     f"> {ATOL:.0e} + {RTOL:.0e} × {k.scale:.3g}")
        return "\n".join(lines), 1
    quantities = sorted({k.quantity for _, k in every})
    lines.append(f"\nagree: {', '.join(quantities)} on {batches} batch(es) with signal; largest difference "
                 f"{worst.rel_diff:.1e} relative ({worst.abs_diff:.1e} absolute), {worst.quantity} on batch {b}")
    return "\n".join(lines), 0


def cmd(args) -> int:
    if args.framework != "verl":
        raise ConfigError("internal: verl_check.cmd handles verl only")
    text, status = run(args.config, args.overrides, args.lab, batches=args.batches, prompts=args.prompts, width=args.width)
    print(text)
    return status
