"""The trainer: builds a run from its config and repeats the algorithm's step.

It is orchestration only. What a step *does* is the algorithm's (a plugin of kind ``algorithm``:
``rl``, ``dpo``, ``online_dpo``, …); generation and scoring are the rollout stage's
(:mod:`rllab.rollout.stage`); the optimizer step is :mod:`rllab.training.optimizer`'s; checkpoint files are
:mod:`rllab.parallel.checkpoint`'s; where the models live (one device, or FSDP2 shards under ``torchrun``)
is :mod:`rllab.placement`'s; the held-out evaluations are :mod:`rllab.training.evaluation`'s; the
console, loggers (:mod:`rllab.training.listeners`) and plots listen to events. The trainer alone
owns what changes the run's state: the optimizer steps, the LR schedule, the KL controller, the
rollout backend's weights, the schedule of component swaps and the run directory::

    for step in range(start, steps):
        apply [[schedule]] entries for this step
        algorithm.step(ctx)  ──yield OptimizerStep──►  Optimizers: check, clip, optimizer.step()  ──► …
                             ──return StepReport (metrics, KLSample)
        scheduler.step(); kl_controller.update(report.kl); row += backend.update_weights(policy)
        events: on_step_end (loggers, console); eval and checkpoint every N steps

Steps are counted as completed steps: metric rows, eval rows and checkpoints after the k-th step
all carry ``step = k`` (the evaluation before training is step 0).

Determinism: every step's data, sampling seed and minibatch order derive from ``(seed, step)``,
and checkpoints hold model, optimizer, scheduler, controller and RNG states, so a resumed run
reproduces the metrics of an uninterrupted one on CPU.
"""

from __future__ import annotations

import json
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import torch

from rllab.rollout import asynchronous as asyncrollout
from rllab.parallel import checkpoint
from rllab.parallel import placement
from rllab.records import provenance
from rllab.parallel import distributed
from rllab.training import memory
from rllab.training import parts
from rllab.algorithm import RunContext, StepEvents
from rllab.checks.config import check_change
from rllab.config import COMPONENT_SECTIONS, ExperimentConfig, apply_schedule, dump_toml, validate
from rllab.errors import ConfigError, NonFiniteError, RewardError, RllabError  # noqa: F401  (RewardError: re-exported)
from rllab.lab import Lab
from rllab.training.evaluation import Evaluations, _Overlapped  # noqa: F401  (_Overlapped: re-exported)
from rllab.training.listeners import RunLoggers
from rllab.members import member
from rllab.training.export import base_model_dir, build_source
from rllab.models.forward import enable_checkpointing, transformers_progress_bars_off
from rllab.training.optimizer import Optimizers, StepOutcome, advance_per_step, lr_factor, lr_scheduler
from rllab.rollout.prompt_limits import PromptLimits
from rllab.rollout.stage import RolloutStage
from rllab.training.rundir import CONFIG_FILE, EVAL_PROBLEMS_FILE, recorded_config, start_run, with_deployment  # noqa: F401
from rllab.specs import Component
from rllab.parallel.distributed import resolve_device  # noqa: F401  (re-exported: where it was)


def run_experiment(cfg: ExperimentConfig, *, lab: Lab | None = None, run_dir: Path | None = None, progress: bool = True,
                   overwrite: bool = False) -> dict:
    """Train from scratch (:class:`Trainer`); returns the summary also written to ``RUN_DIR/final.json``.
    ``run_dir`` (None: a new one), ``overwrite`` and a failure before the first step: see :func:`rllab.training.rundir.start_run`."""
    lab = lab or Lab()
    parts.check_installed(cfg, lab)  # a missing package is said before a run directory is claimed
    reducer = placement.start(cfg.model, device_type=resolve_device(cfg.model.device).type)
    return start_run(cfg, reducer, lambda path: Trainer(cfg, lab=lab, run_dir=path, progress=progress), run_dir=run_dir, overwrite=overwrite)


STEP_PHASES = ("rollout", "reward", "batch", "forward", "advantage", "update", "samples", "sync")
"""The ``time/…`` phases that partition a synchronous step's ``time/step`` (with ``time/other``)."""
ASYNC_STEP_PHASES = ("rollout_wait", "batch", "forward", "advantage", "update", "samples", "sync")
"""The same with ``rollout.max_staleness > 0``: the producer's ``time/rollout`` and ``time/reward``
overlap the step, which waits ``time/rollout_wait`` for its batch (``time/push_wait`` included)."""


class Trainer(Evaluations):
    """Owns the models, optimizers, components and run directory of one experiment.

    Use :func:`run_experiment` / :func:`rllab.training.runs.resume_run`, or drive it from Python::

        trainer = Trainer(cfg, lab=lab, run_dir=path)
        for _ in range(10):
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
        if cfg.train.keep_freed_memory:
            memory.keep_freed_memory()
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        self.device = resolve_device(cfg.model.device)
        dtype = cfg.model.dtype if cfg.model.dtype != "auto" else ("bfloat16" if self.device.type == "cuda" else "float32")
        self.autocast_dtype = None if dtype == "float32" else getattr(torch, dtype)
        # where the models live (single device, or FSDP2 shards under torchrun): rllab.placement
        self.placement = placement.for_config(cfg.model, device=self.device, compute_dtype=self.autocast_dtype)
        self.device = self.placement.device
        self.hook = self.placement.quiet(self.lab.hook)  # one console: ranks other than 0 announce nothing
        with provenance.recording_data() as read:  # the data files the task reads, hashed by content
            source = build_source(cfg, self.lab)
        self.source = source  # the task, or the environment (cfg.source names which)
        self.data_files = provenance.data_hashes(dict.fromkeys([*read, *provenance.config_files(cfg.component(cfg.source).to_dict())]))
        """``{path: sha256}`` of every data file the run read (provenance.json)."""
        self.task = source
        """The run's task or environment, as built (the rollout stage plays it: :attr:`RolloutStage.env`)."""
        built = parts.build_parts(cfg, self.lab)  # the algorithm, the KL controller, the components: rllab.training.parts
        self.algorithm, self.kl_controller, self.components = built.algorithm, built.kl_controller, built.components
        self.prompt_limits: PromptLimits | None = None
        try:
            with transformers_progress_bars_off():  # rllab shows its own progress
                self._build_models()
            self._build_optimizers()
            loggers = [Component(spec=self.lab.spec("logger", ref.name), config=ref.config)(run_dir=self.run_dir) for ref in cfg.loggers
                       if self.placement.speaks]
            self.loggers = RunLoggers(lab=self.lab, loggers=loggers, run_dir=self.run_dir)
        except BaseException:  # a backend built before the failure releases what it holds (servers, snapshots)
            backend = getattr(self, "backend", None)
            if backend is not None and callable(getattr(backend, "close", None)):
                backend.close()
            raise
        self.history: list[dict] = []

    # ------------------------------------------------------------------ setup

    def _component(self, section: str) -> Component:
        return parts.component(self.cfg, self.lab, section)

    def context(self) -> RunContext:
        """What the algorithm sees this step."""
        return parts.run_context(
            self.cfg, self.components, step=self.step, rollout=getattr(self, "rollout", None),
            policy=self.policy, reference=self.reference, critic=self.critic, device=self.device, autocast_dtype=self.autocast_dtype,
            hook=self.hook, reducer=self.placement.reducer, run_dir=self.run_dir,
        )

    def _model_dir(self) -> Path:
        mc = self.cfg.model
        exported = provenance.find_start(mc.sha256) if mc.sha256 and not mc.path else None  # $RLLAB_STARTS: the pinned start as shipped
        if exported is not None:
            return exported
        return base_model_dir(self.cfg, self.source, progress=self.progress)  # model.path, or the tiny model (cached)

    def _load_model(self):
        """The model on CPU in float32 (master weights; lower-precision compute happens under
        autocast); the placement moves or shards it."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)

    def _build_models(self) -> None:
        from rllab.models.forward import load_tokenizer

        self.model_dir = self.placement.reducer.main_first(self._model_dir)  # one rank builds a tiny model's cache
        self.start_sha256 = provenance.check_start(self.model_dir, self.cfg.model.sha256)  # model.sha256 pins it
        self.tokenizer = load_tokenizer(self.model_dir)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

        def prepare(model):  # before the placement shards it: checkpointing, then the policy handle (LoRA: the adapters)
            if self.cfg.model.gradient_checkpointing:
                enable_checkpointing(model)
            self.policy_handle: parts.PolicyHandle = parts.policy_handle(model, self.cfg.model)
            return self.policy_handle.module

        self.policy = self.placement.build_policy(self._load_model, prepare)
        self.policy.train()
        self.reference = None
        self.critic = None
        self._ensure_models()
        backend = self._component("backend")
        self.backend = backend()
        missing = [m for m in ("generate", "update_weights", "last_metrics", "close") if not callable(getattr(self.backend, m, None))]
        if missing:
            raise RllabError(
                f"rollout backend {backend.name!r} (plugin {backend.spec.provider}) has no {', '.join(m + '()' for m in missing)}; "
                f"subclass rllab.RolloutBackend, whose last_metrics() returns {{}} and close() does nothing until overridden"
            )
        self.backend = asyncrollout.versioned(self.backend, self.cfg.rollout)  # max_staleness > 0: syncs counted
        stage = self._rollout_stage()
        self._sync_weights()
        self.rollout = asyncrollout.ahead(stage, limit=lambda: self.cfg.train.steps, cpu=self.device.type == "cpu")
        """What the run samples from: the rollout stage, or (max_staleness > 0) the batches sampled ahead over it."""

    def _ensure_models(self) -> None:
        """Build the reference / critic the algorithm needs now (a schedule may add one later)."""
        needs = self.algorithm.needs(self.context())
        unknown = needs - {"reference", "critic"}
        if unknown:
            raise RllabError(f"algorithm {self.cfg.component('algorithm').name!r} asked for unknown models {sorted(unknown)}")
        if "reference" in needs and self.reference is None:  # LoRA: the base weights, adapters disabled (no second copy)
            ref_device = resolve_device(self.cfg.model.reference_device) if self.cfg.model.reference_device else self.device
            self.reference = self.policy_handle.build_reference(self.placement, self._load_model, ref_device)
        if "critic" in needs and self.critic is None:  # from the policy's weights now, or (sharded) from disk
            self.critic = self.placement.build_critic(self._load_model, self.policy_handle.critic)
            if getattr(self, "optimizer", None) is not None:
                self.critic_optimizer = parts.adamw(self.cfg, self.critic.parameters(), self.cfg.train.critic_lr)

    def _rollout_stage(self) -> RolloutStage:
        name, model_name = self.cfg.component(self.cfg.source).name, f"model {self.cfg.model.path!r}" if self.cfg.model.path else "the tiny model"
        context = getattr(getattr(self.policy, "config", None), "max_position_embeddings", None)
        if self.prompt_limits is None:  # prompts against the context, once the tokenizer exists (rllab.rollout.prompt_limits)
            self.prompt_limits = PromptLimits(self.source, tokenizer=self.tokenizer, rollout=self.cfg.rollout,
                                              context_tokens=context, name=name, model_name=model_name, announce=self.placement.speaks)
        self.prompt_limits.check(self.cfg.rollout)  # refuses a prompt that does not fit; the stage's draw drops longer ones
        sampler = self._component("sampler")
        return RolloutStage(self.source, name=name, context_tokens=context, prompt_limits=self.prompt_limits,
                            backend=self.backend, tokenizer=self.tokenizer, config=self.cfg.rollout, seed=self.cfg.train.seed,
                            model_name=model_name, reducer=self.placement.reducer, sampler=sampler(), sampler_name=sampler.name,
                            gate_retries=sampler.trait("gate_retries") or 0)

    def _build_optimizers(self) -> None:
        self.optimizer, self.critic_optimizer = parts.build_optimizers(self.cfg, self.policy_handle, self.critic)  # all, or the adapters
        self.scheduler = lr_scheduler(self.optimizer, self.cfg.train)  # per optimizer step: it advances itself

    def _sync_weights(self) -> dict[str, float]:
        """Push the policy's weights to the backend; the sync's metrics (e.g. ``time/weight_sync``)."""
        metrics = self.placement.sync_weights(self.backend, self.policy_handle)  # LoRA: the adapters merged in
        return {k: float(v) for k, v in (metrics or {}).items()}

    # ------------------------------------------------------------------ swapping

    def swap(self, section: str, name: str | None = None, **knobs: Any) -> None:
        """Replace a component (or its knobs) between steps, e.g. ``swap("policy_loss", "cispo")``."""
        if section not in COMPONENT_SECTIONS:
            raise RllabError(f"cannot swap {section!r}; swappable: {', '.join(COMPONENT_SECTIONS)}")
        ref = self.cfg.component(section)
        data = self.cfg.to_dict()
        data.pop("plugins", None)
        data[section] = {"name": name or ref.name, **(knobs if name and name != ref.name else {**ref.knobs, **knobs})}
        new = validate(data, lab=self.lab, where="swap")
        self._reconfigure(attrs.evolve(new, schedule=self.cfg.schedule, plugins=self.cfg.plugins, provenance=self.cfg.provenance))

    def _reconfigure(self, new: ExperimentConfig) -> None:
        old = self.cfg
        check_change(old, new)  # what is built once stays (rllab.checks.config)
        if new.component("algorithm") != old.component("algorithm"):
            reconfigure = member(self.algorithm, "algorithm", "reconfigure")
            if reconfigure is None:
                raise RllabError(f"algorithm {new.component('algorithm').name!r} cannot change its knobs during a run (it has no reconfigure method)")
            reconfigure(new.component("algorithm").config)
        self.cfg = new
        if new.component("kl_controller") != old.component("kl_controller"):
            self.kl_controller = self._component("kl_controller")()
        self.components = parts.build_components(new, self.lab, kl_controller=self.kl_controller)
        self.rollout = self.rollout.succeeded_by(self._rollout_stage())  # the sampler, the groups carried into the next step
        with transformers_progress_bars_off():
            self._ensure_models()
        t = new.train
        for opt, lr in ((self.optimizer, t.lr), (self.critic_optimizer, t.critic_lr)):
            if opt is None:
                continue
            for group in opt.param_groups:
                group["weight_decay"] = t.weight_decay
                group["initial_lr"] = lr
        # LambdaLR multiplies base_lrs by the schedule's factor: a new lr takes effect from this step
        self.scheduler.base_lrs = [t.lr]
        self.scheduler.lr_lambdas = [partial(lr_factor, t)]
        for group in self.optimizer.param_groups:
            group["lr"] = t.lr * lr_factor(t, self.scheduler.last_epoch)
        if self.critic_optimizer is not None:
            for group in self.critic_optimizer.param_groups:
                group["lr"] = t.critic_lr

    def _apply_schedule(self) -> list[str]:
        changed = []
        for entry in self.cfg.schedule:
            if entry.step == self.step:
                self._reconfigure(apply_schedule(self.cfg, entry, lab=self.lab))
                changed.append(", ".join(f"{k}={v}" for k, v in entry.set.items()))
        return changed

    # ------------------------------------------------------------------ one step

    def train_step(self) -> dict:
        """One step of the configured algorithm; returns its metrics."""
        t_start = time.perf_counter()
        self._in_step = True
        if any(e.step == self.step for e in self.cfg.schedule):  # the stage may be rebuilt: the evaluation before it is logged first
            self._log_pending_eval()
        changed = self._apply_schedule()
        events = StepEvents(hook=self.hook, step=self.step, run_dir=self.run_dir, tokenizer=self.rollout.tokenizer)
        with self.rollout.announcing(events):  # the rollout events, whatever the algorithm
            outcome = self._run_algorithm(attrs.evolve(self.context(), events=events))
        self._log_pending_eval()  # an algorithm that sampled no step (the stage logs it once the step's rewards are in)
        metrics = outcome.metrics
        for k, v in events.finish().items():  # the samples the algorithm did not report
            metrics[k] = metrics.get(k, 0.0) + v
        self._scheduler_step()
        metrics.update(self.rollout.settle(self.step, metrics))  # the batches sampled ahead with the weights this step trained
        if outcome.stepped:
            t0 = time.perf_counter()
            metrics.update(self._sync_weights())  # the sync after this step's update belongs to this step
            metrics["time/sync"] = time.perf_counter() - t0
        if outcome.kl is not None and self.reference is not None:
            self.kl_controller.update(current_kl=outcome.kl.value, n_steps=outcome.kl.samples)
        metrics["time/step"] = time.perf_counter() - t_start
        # what no named phase covers (schedules, reductions, bookkeeping), so the phases add up to the step
        phases = ASYNC_STEP_PHASES if self.rollout.samples_ahead else STEP_PHASES
        metrics["time/other"] = max(0.0, metrics["time/step"] - sum(metrics.get(f"time/{p}", 0.0) for p in phases))
        metrics["perf/peak_rss_mb"] = memory.peak_rss_mb()
        if self.device.type == "cuda":
            metrics["perf/peak_cuda_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        metrics["optim/lr"] = self.scheduler.get_last_lr()[0]
        metrics.update(self.policy_handle.counts())  # LoRA: model/params, model/trainable_params
        if changed:
            metrics["schedule/changed"] = 1.0
        self.step += 1
        self._in_step = False
        self.rollout.advance(self.step)
        self.history.append({"step": self.step, **metrics})
        self.hook.on_step_end(step=self.step, metrics=dict(metrics), run_dir=self.run_dir)
        return metrics

    def optimizers(self, *, observe=None) -> Optimizers:
        """The run's models and optimizers, answering the algorithm's :class:`OptimizerStep` requests."""
        return parts.optimizers(self.cfg, policy=self.policy, optimizer=self.optimizer, critic=self.critic, critic_optimizer=self.critic_optimizer,
                                observe=observe, clip=self.placement.clip_grad_norm)

    def _run_algorithm(self, ctx: RunContext) -> StepOutcome:
        """Drive the algorithm's step through the kernel's optimizer step (``train.nonfinite`` applies)."""
        with distributed.reducing(self.placement.reducer):  # components read the batch-wide sums through it
            outcome = self.optimizers().drive(
                self.algorithm.step(ctx), step=ctx.step, algorithm=self.cfg.component("algorithm").name, nonfinite=self.cfg.train.nonfinite
            )
        outcome = self.placement.reducer.reduce_outcome(outcome)  # every rank logs and steers β by the same numbers
        if outcome.nonfinite is not None:
            self.nonfinite_skipped = getattr(self, "nonfinite_skipped", 0) + 1
            self._last_nonfinite = outcome.nonfinite
        return outcome

    def _scheduler_step(self) -> None:
        """Advance an LR schedule that counts training steps (also a skipped one)."""
        advance_per_step(self.scheduler, self.cfg.train)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Write model, optimizer, scheduler, controller, RNG states and step atomically.

        Raises :class:`NonFiniteError` without writing if a weight is NaN or inf.
        """
        state = {
            "step": self.step,
            **self.placement.model_states(  # LoRA: the adapters
                policy=self.policy_handle, optimizer=self.optimizer, critic=self.critic, critic_optimizer=self.critic_optimizer
            ),
            "scheduler": self.scheduler.state_dict(),
            "kl_controller": checkpoint.plain_state(self.kl_controller),
            **self.rollout.state_dict(self.step),  # the sampler, the groups carried, the batches sampled ahead
            "algorithm": self.algorithm.state_dict() if hasattr(self.algorithm, "state_dict") else None,
            "config": self.cfg.to_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "history": self.history,
        }
        path = self.placement.save(self.run_dir, self.step, state)
        self.hook.on_checkpoint_saved(step=self.step, path=path)
        return path

    def load_checkpoint(self, path: Path) -> None:
        state = self.placement.load(path)
        # the config in force at that step (schedules may have changed components)
        cfg = validate(with_deployment(state["config"], self.cfg.to_dict()), lab=self.lab, where="checkpoint")
        self._reconfigure(attrs.evolve(cfg, schedule=self.cfg.schedule, plugins=self.cfg.plugins, provenance=self.cfg.provenance, train=self.cfg.train))
        self.placement.load_model_states(
            path, state, policy=self.policy_handle, optimizer=self.optimizer, critic=self.critic, critic_optimizer=self.critic_optimizer
        )
        self.scheduler.load_state_dict(state["scheduler"])
        self.scheduler.lr_lambdas = [partial(lr_factor, self.cfg.train)]
        checkpoint.restore_plain_state(self.kl_controller, state["kl_controller"])
        if state.get("algorithm") is not None:
            self.algorithm.load_state_dict(state["algorithm"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.history = list(state.get("history", []))
        self.step = state["step"]
        self._sync_weights()
        self.rollout.load_state_dict(state)  # after the sync: batches sampled ahead count their age from its weights

    def provenance_record(self) -> dict:
        """What produced this run (``RUN_DIR/provenance.json``, :mod:`rllab.provenance`)."""
        start = {"kind": "model.path" if self.cfg.model.path else "warm_start", "path": str(self.model_dir), "sha256": self.start_sha256}
        inputs = provenance.component_inputs([self.algorithm, self.kl_controller, *self.components.values()])  # e.g. a teacher
        return provenance.collect(self.cfg.to_dict(), lab=self.lab, data=self.data_files, start=start, inputs=inputs)

    def close(self) -> None:
        try:
            self.rollout.close()
            self.loggers.close()
        finally:
            self.backend.close()  # whatever the loggers raise: a backend may hold servers and snapshots

    # ------------------------------------------------------------------ the run

    def run(self) -> dict:
        """Train to ``train.steps`` with evals and checkpoints; returns the summary (``final.json``)."""
        t = self.cfg.train
        try:
            if self.step == 0 and self.placement.speaks:
                (self.run_dir / CONFIG_FILE).write_text(dump_toml(recorded_config(self.cfg, self.lab)))
                provenance.write(self.run_dir, self.provenance_record())
            elif self.placement.speaks:  # a resume: where it ran differently from the run so far is recorded
                provenance.note_resume(self.run_dir, self.provenance_record(), step=self.step)
            self.hook.on_run_start(run_dir=self.run_dir, config=self.cfg, start_step=self.step, total_steps=t.steps, progress=self.progress,
                                   solved_when=self.rollout.solved_rule)
            if self.step == 0:
                self.evaluate(overlapped=t.steps > 0)  # a reward service's waits overlap step 1's
            while self.step < t.steps:
                self.train_step()
                t = self.cfg.train
                if t.eval_every and self.step % t.eval_every == 0 and self.step < t.steps:
                    self.evaluate()
                if t.checkpoint_every and self.step % t.checkpoint_every == 0 and self.step < t.steps:
                    self.save_checkpoint()
            last = self.history[-1] if self.history else {}
            if self.step > 0 and last.get("step") == self.step and "eval/accuracy" in last:
                final = last  # resumed from the checkpoint written after the final evaluation: only final.json is missing
            else:
                final = self.evaluate()
                self.save_checkpoint()
            self.policy_handle.save_final(self.run_dir, self.placement, tokenizer=self.tokenizer)  # RUN_DIR/model; LoRA: RUN_DIR/adapter
        except BaseException as e:
            self._settle_pending_eval(e)
            where = f"at step {self.step + 1}" if getattr(self, "_in_step", False) else f"after step {self.step} (evaluation, checkpoint or export)"
            error = distributed.collective_error(e, reducer=self.placement.reducer, where=where,
                                                 limit_s=getattr(self.cfg.model, "collective_timeout_s", None)) or e
            try:
                self.hook.on_run_error(run_dir=self.run_dir, step=self.step, error=error)
            finally:
                self.close()
            if error is not e:
                raise error from e
            raise
        initial = next((h for h in self.history if h["step"] == 0 and "eval/accuracy" in h), {})
        summary = {
            "initial/accuracy": initial.get("eval/accuracy", float("nan")),
            "final/accuracy": final["eval/accuracy"],
            "final/reward": final["eval/reward"],
            "solved_when": self.rollout.solved_rule,
            "steps": t.steps,
            "nonfinite_skipped": getattr(self, "nonfinite_skipped", 0),
            **(self.prompt_limits.summary() if self.prompt_limits is not None else {}),  # rollout.max_prompt_tokens's drops
            "run_dir": str(self.run_dir),
            **self.policy_handle.summary(),  # LoRA: lora/params, lora/trainable_params
        }
        if self.placement.speaks:
            (self.run_dir / "final.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        self.close()
        self.hook.on_run_end(run_dir=self.run_dir, metrics=summary, history=list(self.history))
        return summary
