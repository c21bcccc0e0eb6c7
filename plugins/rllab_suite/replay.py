"""Recorded rollouts, replayed under several losses: compare them on identical data.

``rllab record SOURCE --steps K --out FILE`` samples K rollout batches from a checkpoint (a run
directory's latest, or the warm-started model of a config) *without training between them*, and
saves each batch (token ids, masks, rewards, rollout log-probs, the old and reference log-probs)
together with the policy (and reference) weights they came from and the resolved config.

``rllab replay FILE policy_loss=a policy_loss=b …`` rebuilds each variant's algorithm, components
and optimizers on that recorded config with the trainer's own construction (:mod:`rllab.training.parts`)
and runs the ``rl`` algorithm's own ``step(ctx)`` on every recorded batch, its rollout stage a
:class:`rllab.RecordedRollout` that hands out the batch (so everything after the rollout —
old/ref forwards, KL in the reward, advantages, importance weights, epochs ×
minibatches × micro-batches — is the algorithm's), and answers its optimizer steps with the
trainer's own :class:`rllab.Optimizers` (measure, non-finite check under ``train.nonfinite``,
clip, AdamW step) from the recorded weights — and, when recorded from a run's checkpoint, from its
optimizer state (AdamW's moments), at the learning rate the run's schedule had at that step
(warm-up and decay included; ``train.lr`` of the variant × the recorded factor). Nothing is
duplicated: a change to the RL step or to the optimizer step shows up in replay, and a replayed
loss or gradient that goes non-finite stops the replay with :class:`rllab.NonFiniteError` as it
would stop a run.

It reports each variant's loss, gradient norm, clip fraction and approximate KL, the cosine
between the variants' first gradients, and flags two variants as **identical** when every
optimizer step's gradient agrees within ``RTOL`` (relative L2 distance) on every batch — the same
computation under these settings, found numerically rather than from their names.
"""

from __future__ import annotations

import copy
import itertools
import math
import tempfile
from pathlib import Path

import attrs
import torch

from rllab import RllabError, RolloutBatch
from rllab.members import member

FORMAT = "rllab-record/1"
_RENAMED = {"scores": "rewards", "token_scores": "turn_rewards"}
"""Batch fields a recording of an earlier version names differently: its name → today's."""


def recorded_batch(fields: dict) -> RolloutBatch:
    """The :class:`RolloutBatch` of a recording's fields (those an earlier version named
    differently, :data:`_RENAMED`, under today's names)."""
    return RolloutBatch(**{_RENAMED.get(k, k): v for k, v in fields.items()})
RTOL = 1e-3
"""Two gradients are the same when ‖a − b‖ ≤ RTOL · max(‖a‖, ‖b‖)."""
REPLAYED_SECTIONS = ("algorithm", "advantage", "policy_loss", "correction", "aggregation", "kl", "kl_controller", "value_loss")
"""What a replay exercises; a difference anywhere else (rollout, task, train) is not seen by it."""


# --------------------------------------------------------------------------- record


def record(source: str | Path | None, *, steps: int, out: Path, overrides=(), preset: str | None = None, lab=None, progress: bool = False) -> dict:
    """Sample ``steps`` rollout batches from one checkpoint and save them to ``out``."""
    from rllab import Lab
    from rllab.models.forward import grouped_response_logprobs
    from rllab.training.trainer import Trainer
    from rllab.parallel.checkpoint import latest as latest_checkpoint
    from rllab.config import load_config

    lab = lab or Lab()
    ckpt = None
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        cfg_path = Path(source) / "config.toml"
        if not cfg_path.is_file():
            raise RllabError(f"{source} is not a run directory (no config.toml)")
        cfg = load_config(cfg_path, list(overrides), lab=lab)
        ckpt = latest_checkpoint(Path(source))
    else:
        cfg = load_config(source, list(overrides), lab=lab, preset=preset)
    algo = cfg.component("algorithm")
    if not lab.spec("algorithm", algo.name).trait("replayable", algo.config):
        raise RllabError(f"rllab record records policy-gradient rollouts; this config's algorithm {algo.name!r} does not take its "
                         f"batches from them (it does not declare the trait replayable); use one that does ({_replayable(lab)})")
    if steps < 1:
        raise RllabError(f"--steps must be at least 1, got {steps}")
    if cfg.model.lora:
        raise RllabError("rllab record replays full-model updates; this config sets [model] lora (adapters): record without it")
    with tempfile.TemporaryDirectory(prefix="rllab-record-") as tmp:
        trainer = Trainer(cfg, lab=lab, run_dir=Path(tmp), progress=progress)
        try:
            if ckpt is not None:
                trainer.load_checkpoint(ckpt)
            ctx = trainer.context()
            batches = []
            for k in range(steps):
                rollouts = trainer.rollout.sample(trainer.step + k)
                batch = trainer.rollout.to_batch(rollouts)
                if batch is None:
                    continue
                with torch.no_grad(), ctx.autocast():
                    old = _response_logprobs(cfg, trainer.policy, batch, grouped_response_logprobs)
                    ref = _response_logprobs(cfg, trainer.reference, batch, grouped_response_logprobs) if trainer.reference is not None else old
                fields = {f.name: getattr(batch, f.name) for f in attrs.fields(type(batch))}
                batches.append({"step": trainer.step + k, "batch": fields, "old_log_prob": old, "ref_log_prob": ref, "metrics": dict(rollouts.metrics)})
            if not batches:
                raise RllabError(f"no batch kept in {steps} steps (dynamic sampling dropped every group?); record more steps")
            data = {
                "format": FORMAT,
                "config": cfg.to_dict(),
                "step": trainer.step,
                "checkpoint": str(ckpt) if ckpt else None,
                "model_config": trainer.policy.config.to_dict(),
                "policy": {k: v.detach().cpu().clone() for k, v in trainer.policy.state_dict().items()},
                "reference": {k: v.detach().cpu().clone() for k, v in trainer.reference.state_dict().items()} if trainer.reference is not None else None,
                # AdamW's moments and learning rate at that step (a fresh optimizer's first steps are larger)
                "optimizer": trainer.optimizer.state_dict() if ckpt is not None else None,
                # the schedule's factor at that step (warm-up, cosine): replay steps at train.lr × this
                "lr_factor": trainer.scheduler.get_last_lr()[0] / cfg.train.lr,
                "lr_step": trainer.scheduler.last_epoch,  # where the schedule was (a schedule per optimizer step goes on from it)
                "batches": batches,
            }
        finally:
            trainer.close()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, out)
    return data


def _response_logprobs(cfg, model, batch, fn):
    home = next(model.parameters()).device
    out = fn(model, batch.input_ids.to(home), batch.attention_mask.to(home), batch.response_length,
             chunk_size=cfg.model.logprob_chunk, temperature=cfg.rollout.temperature)
    return out.float().cpu()


def load_record(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise RllabError(f"no recording at {path} (make one with: rllab record RUN_DIR_or_config --steps K --out {path})")
    data = torch.load(path, weights_only=False)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RllabError(f"{path} is not an rllab recording ({FORMAT})")
    return data


# --------------------------------------------------------------------------- replay


@attrs.frozen(kw_only=True)
class ReplayResult:
    name: str
    config: dict
    metrics: dict
    """Averaged over batches: loss/policy, actor/grad_norm, actor/clipfrac, actor/approx_kl, …"""
    grads: list = attrs.field(repr=False)
    """Per batch, the flattened policy gradient of each optimizer step (before clipping)."""


def _model(data: dict, key: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    mc = dict(data["model_config"])
    conf = AutoConfig.for_model(mc.pop("model_type"), **mc)
    model = AutoModelForCausalLM.from_config(conf).float()
    model.load_state_dict(data[key])
    return model


def _replayable(lab) -> str:
    """The installed algorithms that declare the trait replayable, for messages."""
    return ", ".join(repr(n) for n in lab.names("algorithm") if lab.spec("algorithm", n).traits.get("replayable")) or "none installed"


def replay_configs(data: dict, configs: list[tuple[str, dict]], *, lab=None) -> list[ReplayResult]:
    """Run each (name, resolved config) on every recorded batch; see the module docstring."""
    from rllab import Lab, RecordedRollout
    from rllab.training import parts
    from rllab.models.forward import CriticModel
    from rllab.config import load_config

    lab = lab or Lab()
    results = []
    for name, raw in configs:
        cfg = load_config(copy.deepcopy(raw), lab=lab)
        algo_name = cfg.component("algorithm").name
        if not lab.spec("algorithm", algo_name).trait("replayable", cfg.component("algorithm").config):
            raise RllabError(f"variant {name!r}: replay runs an algorithm's step on recorded policy-gradient batches; this "
                             f"variant's algorithm {algo_name!r} does not declare the trait replayable; use one that does ({_replayable(lab)})")

        per_batch_grads, sums = [], {}
        for rec in data["batches"]:
            torch.manual_seed(cfg.train.seed)
            policy = _model(data, "policy").train()
            built = parts.build_parts(cfg, lab)  # the trainer's own construction (rllab.training.parts)
            needs = built.algorithm.needs(parts.run_context(cfg, built.components, step=rec["step"], policy=policy, hook=lab.hook))
            reference = _model(data, "reference" if data.get("reference") is not None else "policy").eval().requires_grad_(False) if "reference" in needs else None
            critic = CriticModel.from_causal_lm(policy) if "critic" in needs else None
            # the algorithm's own step, its rollout stage handing out the recorded batch
            batch = recorded_batch(rec["batch"])
            # the variant's task's reward_weights (all 1 when it declares none), which gdpo /
            # normalize_then_sum default to: they ride on the batch the recorded rollout hands out
            weights = None
            if batch.reward_components is not None:
                weights = member(parts.component(cfg, lab, "task")(), "task", "reward_weights")
                weights = [1.0] * len(batch.reward_component_names) if weights is None else weights
            ctx = parts.run_context(cfg, built.components, step=rec["step"], policy=policy, reference=reference, critic=critic,
                                    rollout=RecordedRollout(batch=batch, component_weights=weights), hook=lab.hook)
            # from the recorded optimizer state, at the learning rate the run's schedule had then
            opt, copt = parts.build_optimizers(cfg, parts.FullPolicy(policy), critic, state=data.get("optimizer"), lr=cfg.train.lr * data.get("lr_factor", 1.0))
            if cfg.train.lr_schedule_unit == "optimizer_step" and "lr_step" in data:  # the rate moves every optimizer step
                _schedule_from(opt, cfg.train, data["lr_step"])
            params = [p for p in policy.parameters()]
            grads = []

            def keep_gradient(request, params=params, grads=grads):  # before the step checks and clips it
                grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]).clone())

            optimizers = parts.optimizers(cfg, policy=policy, optimizer=opt, critic=critic, critic_optimizer=copt, observe=keep_gradient)
            outcome = optimizers.drive(built.algorithm.step(ctx), step=ctx.step, algorithm=algo_name, nonfinite=cfg.train.nonfinite)
            metrics = dict(outcome.metrics)
            metrics["replay/first_grad_norm"] = float(grads[0].norm()) if grads else math.nan
            metrics["replay/optimizer_steps"] = float(len(grads))
            per_batch_grads.append(grads)
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    sums.setdefault(k, []).append(float(v))
        results.append(ReplayResult(name=name, config=raw, metrics={k: sum(v) / len(v) for k, v in sums.items()}, grads=per_batch_grads))
    return results


def compare(results: list[ReplayResult]) -> list[dict]:
    """Pairwise: cosine of the first gradients (mean over batches), the largest relative distance
    over every optimizer step, and whether the two are the same computation."""
    out = []
    for a, b in itertools.combinations(results, 2):
        cos, rel, largest = [], 0.0, 0.0
        same_steps = True
        for ga, gb in zip(a.grads, b.grads):
            if len(ga) != len(gb):
                same_steps = False
            if ga and gb:
                cos.append(min(1.0, float(torch.nn.functional.cosine_similarity(ga[0], gb[0], dim=0))))
            for x, y in zip(ga, gb):
                scale = max(float(x.norm()), float(y.norm()))
                largest = max(largest, scale)
                rel = max(rel, float((x - y).norm()) / max(scale, 1e-30))
        other = differing_sections(a.config, b.config)
        # a batch where every group scored alike gives zero gradients to every loss: no evidence either way
        inconclusive = largest == 0.0
        same_update = same_steps and rel <= RTOL and not inconclusive
        # one computation only when nothing the replay leaves out differs (a reward, a sampler, …)
        out.append({
            "a": a.name, "b": b.name, "cosine": sum(cos) / len(cos) if cos else math.nan, "max_rel_diff": rel,
            "identical": same_update and not other, "same_update": same_update, "inconclusive": inconclusive,
            "differs_outside_replay": other,
        })
    return out


def differing_sections(a: dict, b: dict) -> list[str]:
    """Config sections, outside :data:`REPLAYED_SECTIONS`, where two configs differ."""
    keys = (set(a) | set(b)) - set(REPLAYED_SECTIONS) - {"name", "output_dir", "provenance", "loggers"}
    return sorted(k for k in keys if a.get(k) != b.get(k))


def identical_messages(pairs: list[dict], *, step: int | None = None) -> list[dict]:
    msgs = []
    for p in pairs:
        if not p.get("same_update", p["identical"]):
            continue
        where = "a recorded batch" if step is None else f"batches recorded after step {step} (the learning rate then: the schedule at that step)"
        same = f"the same gradients on {where} (relative difference {p['max_rel_diff']:.1e} ≤ {RTOL:g}, cosine {p['cosine']:.6f})"
        if p["differs_outside_replay"]:
            outside = "], [".join(p["differs_outside_replay"])
            message = (
                f"SAME UPDATE ON THE RECORDED BATCH {p['a']}, {p['b']}: {same}, but not one computation: they differ in "
                f"[{outside}], which the replay does not exercise, so their runs see other batches"
            )
        else:
            message = (
                f"IDENTICAL {p['a']} ≡ {p['b']}: {same}: there they are one computation. Later steps can still part them, "
                f"once the policy has moved far enough for what differs (clipping, corrections) to act"
            )
        msgs.append({**p, "message": message})
    return msgs


def render(results: list[ReplayResult], pairs: list[dict], console, *, step: int | None = None) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAVY, title="replay: each variant on the recorded batches (mean over batches)")
    cols = (("loss/policy", "loss"), ("replay/first_grad_norm", "grad norm (1st step)"), ("actor/grad_norm", "grad norm (mean)"),
            ("actor/clipfrac", "clip frac"), ("actor/approx_kl", "approx KL"), ("replay/optimizer_steps", "optimizer steps"))
    t.add_column("variant")
    for _, label in cols:
        t.add_column(label, justify="right")
    for r in results:
        t.add_row(escape(r.name), *[f"{r.metrics[k]:.4g}" if k in r.metrics else "—" for k, _ in cols])
    console.print(t)
    if pairs:
        t = Table(box=box.SIMPLE_HEAVY, title="pairs: first-gradient cosine, largest relative gradient difference")
        for c in ("a", "b", "cosine", "max rel diff", "same computation"):
            t.add_column(c, justify="right" if c not in ("a", "b") else "left")
        for p in pairs:
            same = "[yellow]yes[/]" if p["identical"] else "? (zero gradients)" if p.get("inconclusive") else "no"
            t.add_row(escape(p["a"]), escape(p["b"]), f"{p['cosine']:.6f}", f"{p['max_rel_diff']:.2e}", same)
        console.print(t)
    for m in identical_messages(pairs, step=step):
        console.print(f"[yellow]{escape(m['message'])}[/]", highlight=False)


def _schedule_from(optimizer, train, step: int) -> None:
    """``optimizer`` on ``train``'s schedule per optimizer step, from its ``step``-th optimizer
    step (the recorded run's), so each optimizer step of a replayed training step has its own rate."""
    from rllab.training.optimizer import lr_factor, lr_scheduler

    for group in optimizer.param_groups:
        group["lr"] = train.lr
    scheduler = lr_scheduler(optimizer, train)
    scheduler.last_epoch = step
    for group in optimizer.param_groups:
        group["lr"] = train.lr * lr_factor(train, step)
