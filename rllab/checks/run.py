"""Checks of a run's settings against its components' traits, on a validated config.

Each refuses, naming the setting, the component and its plugin, a combination that would
otherwise fail (or silently not take effect) once the run is built:

- :func:`check_async`: ``rollout.max_staleness > 0`` with a data-parallel strategy, a backend that
  samples from the trainer's own weights (its trait ``shares_weights``), a ``[[schedule]]`` entry
  that changes ``[rollout]``, an algorithm without the trait ``async_rollouts`` (its steps'
  batches do not come from ``rollout.sample(step)`` alone) or an advantage estimator that needs a
  greedy rollout within the step (``requires=("reward_baselines",)``);
- :func:`check_partial`: ``rollout.over_sample > 0`` with an algorithm without ``async_rollouts``;
- :func:`check_sampler`: a sampler that learns from each step's rewards (not ``stateless``) on
  several ranks, with batches sampled ahead or under partial rollouts, and a gate
  (``gate_retries``) under ``rollout.random_reward``;
- :func:`check_data_parallel`: under a data-parallel strategy, settings that would give ranks
  different numbers of rows or couple rows across ranks, and components that cannot run there;
- :func:`check_backend_device`: with ``[model] device = "auto"``, a backend that needs the policy on
  CUDA (its trait ``needs_cuda``) where no CUDA device is available.

:func:`check_run` runs them all; :func:`rllab.config.validate` calls it on every config it
builds, so a ``[[schedule]]`` entry, a swap and a checkpoint's config are checked alike. The
world size is ``torchrun``'s (``WORLD_SIZE``), the number of processes the run has.
"""

from __future__ import annotations

from typing import Any

from rllab.errors import ConfigError, RllabError
from rllab.lab import Lab
from rllab.parallel import placement
from rllab.parallel.launcher import launcher_env


def check_run(cfg: Any, lab: Lab, *, world_size: int | None = None) -> None:
    """Every check of this module on ``cfg`` (an :class:`rllab.config.ExperimentConfig`);
    ``world_size`` None: ``torchrun``'s, from the environment."""
    if world_size is None:
        world_size = launcher_env()[1]
    check_async(cfg, lab)
    check_partial(cfg, lab)
    check_sampler(cfg, lab, world_size=world_size)
    check_data_parallel(cfg, lab, world_size)
    check_backend_device(cfg, lab)


def _algorithm_samples_ahead(cfg: Any, lab: Lab) -> bool:
    algorithm = cfg.component("algorithm")
    return bool(lab.spec("algorithm", algorithm.name).trait("async_rollouts", algorithm.config))


def check_async(cfg: Any, lab: Lab) -> None:
    """Refuse, by name, settings that cannot run with ``rollout.max_staleness > 0``."""
    k = cfg.rollout.max_staleness
    if k == 0:
        return
    where = f"rollout.max_staleness = {k}"
    if placement.strategy(cfg.model.strategy).data_parallel:
        one = " or ".join(f'model.strategy = "{n}"' for n in placement.names(data_parallel=False))
        raise ConfigError(
            f"{where} with model.strategy = {cfg.model.strategy!r} is not supported (asynchronous rollouts run in one "
            f"process); set rollout.max_staleness = 0 or {one}",
            key="max_staleness",
        )
    backend = cfg.component("backend")
    shared = lab.spec("rollout_backend", backend.name).trait("shares_weights", backend.config)
    if shared is not None:
        raise ConfigError(
            f"{where} with backend {backend.name!r} sampling from the trainer's own weights ({shared}): the producer "
            f"samples while the trainer changes the weights, so it needs its own copy; change that or set max_staleness = 0",
            key="max_staleness",
        )
    for entry in cfg.schedule:
        keys = sorted(key for key in entry.set if key.split(".")[0] == "rollout")
        if keys:
            raise ConfigError(
                f"{where}: the [[schedule]] entry at step {entry.step} changes {', '.join(keys)}, but batches are sampled "
                f"up to {k} steps ahead with the [rollout] settings in force when they are sampled; drop the entry or "
                f"use max_staleness = 0",
                key="max_staleness",
            )
    if not _algorithm_samples_ahead(cfg, lab):
        name = cfg.component("algorithm").name
        raise ConfigError(
            f"{where}: algorithm {name!r} does not take its steps' batches from rollout.sample(step) alone (offline "
            f"pairs, or pairs sampled and compared within the step as online_dpo does), so its data cannot be sampled "
            f"ahead; use max_staleness = 0 (algorithms that can: those registered with async_rollouts=True, e.g. 'rl')",
            key="max_staleness",
        )
    if "advantage" in cfg.components and "advantage" not in cfg.unused:
        adv = cfg.component("advantage")
        spec = lab.spec("advantage_estimator", adv.name)
        if "reward_baselines" in spec.requires:
            raise ConfigError(
                f"{where}: advantage {adv.name!r} (plugin {spec.provider}) needs a greedy rollout of the current policy "
                f"within each step (reward_baselines, ReMax), which cannot be sampled ahead; use max_staleness = 0",
                key="max_staleness",
            )


def check_partial(cfg: Any, lab: Lab) -> None:
    """Refuse ``rollout.over_sample > 0`` for an algorithm whose steps do not train on
    ``rollout.sample(step)`` (those registered with ``async_rollouts=True`` do), where it could
    not take effect."""
    if cfg.rollout.over_sample > 0 and not _algorithm_samples_ahead(cfg, lab):
        raise ConfigError(
            f"rollout.over_sample = {cfg.rollout.over_sample!r}: algorithm {cfg.component('algorithm').name!r} does not train "
            f"on the groups rollout.sample(step) gives alone (offline pairs, or pairs built within its step), so partial "
            f"rollouts would not take effect; set rollout.over_sample = 0 (algorithms that can: those registered with "
            f"async_rollouts=True, e.g. 'rl')",
            key="over_sample",
        )


def check_sampler(cfg: Any, lab: Lab, *, world_size: int = 1) -> None:
    """Refuse, naming the sampler, what it cannot run with: a sampler that takes feedback (not
    ``stateless``) on several data-parallel ranks or with batches sampled ahead
    (``rollout.max_staleness > 0``), a sampler that takes feedback or gates under partial rollouts
    (``rollout.over_sample > 0``), and a gate (``gate_retries``) under ``rollout.random_reward``
    (the gate judges the task's rewards, which such a run does not train on)."""
    if "sampler" not in cfg.components or "sampler" in cfg.unused:
        return
    ref = cfg.component("sampler")
    spec = lab.spec("sampler", ref.name)
    where = f"[sampler] {ref.name!r} (plugin {spec.provider})"
    if not spec.trait("stateless", ref.config):
        if world_size > 1:
            raise ConfigError(f"{where} learns from each step's rewards, which one rank alone sees; it cannot run on "
                              f"{world_size} data-parallel ranks. Run it on one process, or use a stateless sampler", key="sampler")
        if cfg.rollout.max_staleness > 0:
            raise ConfigError(f"{where} learns from each step's rewards before the next draw; set rollout.max_staleness = 0 "
                              f"(it is {cfg.rollout.max_staleness}), or use a stateless sampler", key="sampler")
    over = cfg.rollout.over_sample
    if over > 0 and (not spec.trait("stateless", ref.config) or spec.trait("gate_retries", ref.config)):
        raise ConfigError(f"{where} judges each drawn prompt by its group's rewards, but partial rollouts "
                          f"(rollout.over_sample = {over}) draw more prompts than a step trains on and carry or drop "
                          f"the unfinished ones; set rollout.over_sample = 0, or use a stateless sampler", key="sampler")
    if spec.trait("gate_retries", ref.config) and cfg.rollout.random_reward != "off":
        raise ConfigError(f"{where} replaces groups whose task rewards are all equal, but rollout.random_reward = "
                          f"{cfg.rollout.random_reward!r} trains on random rewards; set rollout.random_reward = 'off' or "
                          f"use another sampler", key="sampler")


def check_data_parallel(cfg: Any, lab: Lab, world_size: int) -> None:
    """Refuse settings that would give ranks different numbers of rows or couple rows across ranks
    beyond what :mod:`rllab.parallel.distributed` reduces (each named with the world size), and backends
    that cannot take gathered weights."""
    if not placement.strategy(cfg.model.strategy).data_parallel:
        return
    where = f"model.strategy = {cfg.model.strategy!r} on {world_size} rank(s)"
    backend = cfg.component("backend")
    spec = lab.spec("rollout_backend", backend.name)
    why = spec.trait("sharded_policy", backend.config)
    if why is not None:
        raise RllabError(f"{where}: backend {backend.name!r} (plugin {spec.provider}) cannot take a sharded policy's weights: {why}")
    if world_size == 1:
        return
    r, t = cfg.rollout, cfg.train
    if r.prompts_per_step % world_size:
        raise RllabError(f"{where}: rollout.prompts_per_step = {r.prompts_per_step} must be a multiple of the world size {world_size} (each rank owns whole groups)")
    if r.dynamic_sampling:
        raise RllabError(f"{where}: rollout.dynamic_sampling = true would give ranks different numbers of rows; set it to false")
    if r.reward_errors == "skip":
        raise RllabError(f"{where}: rollout.reward_errors = 'skip' would give ranks different numbers of rows; use 'raise' or 'zero'")
    if t.nonfinite == "skip":
        raise RllabError(f"{where}: train.nonfinite = 'skip' is decided per rank; use 'raise' (a failure on one rank stops every rank)")
    adv = cfg.component("advantage")
    spec = lab.spec("advantage_estimator", adv.name)
    coupled = spec.trait("batch_step", adv.config)
    if coupled not in (None, "whiten"):
        raise RllabError(
            f"{where}: advantage {adv.name!r} (plugin {spec.provider}) couples rows across the batch ({coupled}), "
            "which is not all-reduced; choose an estimator without a batch step or with whitening"
        )
    algorithm = cfg.component("algorithm")
    if not lab.spec("algorithm", algorithm.name).trait("data_parallel", algorithm.config):
        fit = [n for n in lab.names("algorithm") if lab.spec("algorithm", n).traits.get("data_parallel")]
        single = " or ".join(repr(n) for n in placement.names(data_parallel=False))
        raise RllabError(f"{where}: algorithm {algorithm.name!r} has no data-parallel normalisers (it does not declare the trait "
                         f"data_parallel); use an algorithm that does ({', '.join(map(repr, fit)) or 'none installed'}) or strategy {single}")


def check_backend_device(cfg: Any, lab: Lab) -> None:
    """With ``[model] device = "auto"``: refuse a backend whose ``needs_cuda`` trait is set for its
    config when no CUDA device is available here (``auto`` would put the policy on the CPU). An
    explicit device is checked with the config alone (:func:`rllab.checks.config.check_backend_device`)."""
    if str(cfg.model.device) != "auto" or "backend" in cfg.unused:
        return
    backend = cfg.component("backend")
    if lab.spec("rollout_backend", backend.name).trait("needs_cuda", backend.config) is None:
        return
    import torch  # only for a backend that needs CUDA: is there any

    if not torch.cuda.is_available():
        from rllab.checks.config import check_backend_device as check

        check(lab, cfg.components, "cpu", where="[model] device = 'auto'")


__all__ = ["check_async", "check_backend_device", "check_data_parallel", "check_partial", "check_run", "check_sampler"]
