"""Event hook specifications: what a run tells its listeners as it progresses.

The trainer calls these ``on_*`` hooks; their return values are ignored, and an exception in one
aborts the run (a logger that cannot write must not silently lose a run's metrics). They are
re-exported by :mod:`rllab.hookspecs`, whose module the plugin manager reads, so a plugin
implements them with ``@rllab.hookimpl`` like any other hook.
"""

from __future__ import annotations

import pluggy

PROJECT = "rllab"
"""The plugin project name: the entry-point group and pluggy's marker name."""

hookspec = pluggy.HookspecMarker(PROJECT)

@hookspec
def on_run_start(run_dir, config, start_step, total_steps, progress, solved_when):
    """Called once before the first step of a run (also when resuming).

    :param run_dir: the run directory (:class:`pathlib.Path`).
    :param config: the resolved :class:`rllab.config.ExperimentConfig`.
    :param start_step: steps already done (0 for a new run, the checkpoint's step on resume).
    :param total_steps: the step the run ends at.
    :param progress: whether live progress output is wanted (False under ``rllab run -q``).
    :param solved_when: what counts as solved for ``rollout/accuracy`` and ``eval/accuracy``, in
        words (:func:`rllab.rollout.accuracy.solved_rule`: ``"reward ≥ 1"``, ``"reward component
        'correct' ≥ 1 (…)"``, ``"the task's own solved(example, reward) is true"``).
    """


@hookspec
def on_rollout_end(step, batch, metrics):
    """Called after the rollouts of a step are generated and scored, for every algorithm that
    samples them (:func:`rllab.algorithm.rollout_batch`).

    :param step: the number of the step being taken (1 for the first).
    :param batch: the :class:`rllab.types.RolloutBatch` about to be trained on.
    :param metrics: the ``rollout/…`` metrics so far (a dict of floats; do not mutate).
    """


@hookspec
def on_step_samples(step, episodes, batch, advantages, trainer_log_prob, tokenizer, run_dir):
    """Called by an algorithm after its update, with the step's samples: what a per-sample trace
    needs (the ``traces`` logger, :mod:`rllab_loggers.traces`). Algorithms fire it through
    :func:`rllab.algorithm.report_samples`; only rank 0's loggers listen.

    :param step: the number of the step being taken (1 for the first).
    :param episodes: the step's kept :class:`rllab.rollout.episodes.EpisodeResult`, one per row of
        ``batch``, in its order (each with its example, completion, texts, reward, components,
        staleness and token versions).
    :param batch: the :class:`rllab.types.RolloutBatch` being trained on (``rollout_log_prob``: the
        sampler's log-probs).
    :param advantages: (B, T) the advantages the update used, or None (an algorithm without
        advantages, as ``online_dpo``).
    :param trainer_log_prob: (B, T) the trainer's log-probs of the sampled tokens before the update
        (the old policy; on an on-policy step, the update's own first forward), or None: the
        algorithm runs no such forward (no step runs one for its listeners alone).
    :param tokenizer: the policy's tokenizer.
    :param run_dir: the run directory (None outside a run).
    """


@hookspec
def on_eval_samples(step, episodes, tokenizer, run_dir):
    """Called after a held-out evaluation with its greedy episodes (the ``traces`` logger writes some).

    :param step: the number of steps completed when it ran (0: before training).
    :param episodes: the evaluation's :class:`rllab.rollout.episodes.EpisodeResult` (this rank's share).
    :param tokenizer: the policy's tokenizer.
    :param run_dir: the run directory.
    """


@hookspec
def on_step_end(step, metrics, run_dir):
    """Called after each training step with that step's metrics (a dict of floats).

    :param step: the number of steps completed (1 after the first).
    :param run_dir: the run directory (several runs may share a process).
    """


@hookspec
def on_eval_end(step, metrics, run_dir):
    """Called after each held-out evaluation (``eval/accuracy``, ``eval/reward``, …).

    :param step: the number of steps completed when it ran (0: before training).
    :param run_dir: the run directory.
    """


@hookspec
def on_checkpoint_saved(step, path):
    """Called after a checkpoint was written completely to ``path`` (after ``step`` steps)."""


@hookspec
def on_run_error(run_dir, step, error):
    """Called when a run stops on an error (a non-finite loss, a failed reward, a dead server, …).

    :param run_dir: the run directory; its last checkpoint is where ``--resume`` restarts.
    :param step: the number of steps completed.
    :param error: the exception, which propagates after this hook returns.
    """


@hookspec
def on_run_end(run_dir, metrics, history):
    """Called once when a run finishes.

    :param run_dir: the run directory.
    :param metrics: the summary also written to ``final.json`` (accuracy before and after, …).
    :param history: every metrics row of the run, oldest first: dicts with a ``step`` key.
    """
