"""Hook specifications: how plugins add components to rllab and listen to a run.

There are two families of hooks.

**Registration hooks** (``register_*``) are called once per :class:`rllab.Lab`, while it
loads plugins. Each receives a ``register`` callable; the plugin calls it once per component it
provides and returns nothing::

    @rllab.hookimpl
    def register_policy_losses(register):
        register("my_loss", my_loss, config=MyLossConfig)

``register(name, fn, *, config=None, summary=None, aliases=(), requires=(), **traits)`` records
a :class:`rllab.ComponentSpec`. ``fn`` is called with keyword arguments only (see each hook for
the signature it must accept) plus ``config=`` — an instance of the frozen ``config`` class
holding the component's knobs. ``summary`` defaults to the first line of ``fn.__doc__``;
``aliases`` are extra names.

``requires`` is the one way to ask for an optional input: it lists the inputs the component
needs from the algorithm (``"values"`` for a critic, ``"logits"`` for full-vocabulary KL, ...;
each hook below lists its kind's), and the algorithm passes each one, as a keyword argument,
only to the components that require it. A config that pairs a component with an algorithm that
does not provide one of its requirements is refused at load.

``traits`` are what a component declares about itself (how it reduces, whether its statistics
span the batch, ...), as further keywords: each hook below lists the traits its kind accepts
(see also :data:`rllab.traits.TRAITS`). They are recorded on ``ComponentSpec.traits`` and read
with ``spec.trait(name, config)`` or ``component.trait(name)``. A trait marked *per config* may
be a value or a callable of the component's frozen config. An unknown trait, a trait of another
kind or a value of the wrong type makes the plugin fail to load, with an error that names the
plugin, the component and the trait. So does a function that still carries a trait as an
attribute (``fn.batch_step = ...``, the old style): the error names the ``register`` keyword that
replaces it.

**Event hooks** (``on_*``, at the end of this module) are called by
the trainer as a run progresses. Their return values are ignored; an exception in one aborts the run (a logger that cannot write must not silently
lose a run's metrics).

All hooks are called with keyword arguments, so a spec can grow a parameter without breaking
plugins that do not ask for it. Shapes use the glossary in :mod:`rllab.types`.
"""

from __future__ import annotations

import pluggy

PROJECT = "rllab"
"""The plugin project name: the entry-point group and pluggy's marker name."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------- registration


@hookspec
def register_advantage_estimators(register):
    """Register advantage estimators.

    An estimator turns per-token rewards into per-token advantages and returns. It is called
    once per training step, after rewards (and values, if it ``requires=("values",)``) are known::

        fn(*, token_rewards, mask, index, values=None, config) -> (advantages, returns)

    :param register: call ``register(name, fn, config=...)`` once per estimator.

    ``token_rewards`` (B, T) float: the reward of each response token (the sequence score sits
    on the last model token; an environment's per-turn rewards on the last model token of each
    turn; a KL-in-reward penalty may be spread over every token).
    ``mask`` (B, T) bool: True where a response token counts.
    ``index`` (B,) int64: a group id per row; rows sharing an id were sampled from one prompt.
    ``values`` (B, T) float or None: critic values, for estimators that require them.
    ``reward_baselines`` (B,) float, only for an estimator registered with
    ``requires=("reward_baselines",)``: the reward of the policy's greedy response to each row's
    prompt (ReMax), sampled by the ``rl`` step.
    ``old_log_prob``, ``sum_pi_squared`` (B, T) float, only with ``requires=("old_log_prob",
    "sum_pi_squared")``: the rollout-time policy's log-probs and Σ_v π_v² (optimal baselines).
    ``reward_components`` (B, K) float, only with ``requires=("reward_components",)``: one column
    per named reward component of the task; such an estimator is refused at load with a task that
    declares fewer than two, and the ``rl`` step raises on a batch that has none.
    Returns two (B, T) float tensors.

    Traits: ``batch_step=`` (per config) — a few words naming a step that couples every row of
    the batch (``"whiten"``, ``"batch std"``), or None: the estimator's statistics stay within
    each group. The contract suite then checks that other groups move by one affine map instead
    of not at all. ``component_weights=`` (per config) — the weights the estimator gives the
    task's reward components (one per component, checked against the task's at load), or None:
    the task's own ``reward_weights``.
    """


@hookspec
def register_policy_losses(register):
    """Register policy-gradient losses.

    Called for every minibatch of every epoch::

        fn(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None)
            -> (loss, metrics)

    :param register: call ``register(name, fn, config=...)`` once per loss.

    ``log_prob``, ``old_log_prob``, ``advantages``: (B, T) float; ``mask`` (B, T) bool.
    ``aggregate(loss_mat, mask) -> scalar`` reduces a (B, T) per-token loss with the run's
    aggregation mode (already bound to the global token / sequence counts).
    ``weights`` (B, T) float or None: detached per-token importance weights from an importance
    correction; multiply them into the per-token loss before aggregating.
    Returns a scalar loss and a dict of scalar metric tensors with namespaced keys
    (``actor/clipfrac``, ``actor/approx_kl``, ...).
    ``rollout_log_prob`` (B, T) float, only for a loss registered with
    ``requires=("rollout_log_prob",)``: the inference engine's log-probs of the sampled tokens.

    Traits: ``aggregation="seq-mean"`` — the loss reduces itself to the mean over non-empty rows
    of one loss per row instead of calling ``aggregate`` (the ``rl`` step then weights each
    micro-batch by its share of rows); ``old_log_prob="rollout"`` — the loss receives the
    inference engine's log-probs as ``old_log_prob`` (default ``"trainer"``: a forward of the
    policy at rollout time), and the ``rl`` step skips its old-log-prob forward;
    ``partition=`` (per config) — why the loss of a batch depends on how it is split into
    micro-batches (by definition: a selection over the whole batch); without it the contract checks
    that micro-batches with gradient accumulation give the whole batch's loss and gradient.
    """


@hookspec
def register_kl_penalties(register):
    """Register KL penalty estimators.

    Called wherever a KL term is needed (in the reward, or as a loss)::

        fn(*, log_prob, ref_log_prob, config) -> kl

    :param register: call ``register(name, fn, config=...)`` once per estimator.

    ``log_prob``, ``ref_log_prob``: (B, T) float. Returns the per-token estimate, (B, T).
    A penalty that ``requires=("logits",)`` also receives ``logits`` and ``ref_logits``
    (B, T, V) float.

    Traits: none.
    """


@hookspec
def register_loss_aggregations(register):
    """Register loss-aggregation modes.

    ::

        fn(*, loss_mat, mask, config, global_tokens=None, global_seqs=None) -> scalar

    :param register: call ``register(name, fn, config=...)`` once per mode.

    ``loss_mat`` (B, T) float, ``mask`` (B, T) bool. ``global_tokens`` / ``global_seqs``, when
    given, replace the local count of valid tokens / non-empty rows as the normaliser, so that
    a loss summed over micro-batches equals the loss of the whole batch. ``global_tokens`` may be
    a float: a normaliser rather than a count (the ``rl`` algorithm's ``token_count =
    "batch_mean"`` passes the step's tokens / its minibatches).
    Masked positions must not influence the result even if they hold NaN.
    ``global_rows`` int, only for a mode registered with ``requires=("global_rows",)``: the
    number of rows of the whole minibatch, empty rows included.

    Traits: ``divides_by_tokens=`` — True when the aggregate divides by a token count
    (``global_tokens``), False when it ignores it (then the ``rl`` algorithm refuses a
    ``token_count`` other than ``"minibatch"``), None (default): not declared.
    ``padding_dependent=`` (per config) — why the aggregate depends on the padding width
    (a horizon of the mask width), or None: it does not, and the contract checks pad a batch and
    expect the same value.
    """


@hookspec
def register_rollout_backends(register):
    """Register rollout backends (where completions come from).

    ``fn(*, config) -> backend`` is a factory; the backend follows
    :class:`rllab.types.RolloutBackend`: ``generate(prompts, params)``, ``last_metrics()`` (the
    last ``generate``'s counters for the step's row; ``{}`` when there are none),
    ``update_weights(model)`` (returns the sync's metrics, added to the row of the step it
    follows, or None) and ``close()``. A backend missing one is refused when a run builds it.

    :param register: call ``register(name, factory, config=...)`` once per backend.

    Traits: ``needs_cuda=`` — why the backend needs the policy on CUDA (a string, or a callable
    ``config -> str | None``); a config with ``[model] device`` on the CPU is then refused at load.
    ``sharded_policy=`` — why the backend cannot serve a sharded policy (``model.strategy =
    "fsdp2"``), or None when it can: every rank's backend then gets full weights through
    ``update_weights`` (a plain module, then state dicts), or, when the backend has
    ``follow_weights()`` (servers every rank shares), rank 0's alone gets a plain CPU module and the
    other ranks' ``follow_weights()`` is called once it is pushed. Undeclared: refused.
    ``shares_weights=`` (per config) — why the backend samples from the trainer's own weights (no
    copy of its own), or None: it keeps a copy; asynchronous rollouts are refused with it.

    Subclass :class:`rllab.RolloutBackend` for the defaults of ``last_metrics``, ``close`` and
    the optional members (:data:`rllab.members.MEMBERS`).
    """


@hookspec
def register_importance_corrections(register):
    """Register importance corrections for rollout/training mismatch (TIS, MIS, ...).

    ::

        fn(*, old_log_prob, rollout_log_prob, mask, config) -> (weights, metrics)

    :param register: call ``register(name, fn, config=...)`` once per correction.

    ``old_log_prob`` (training engine) and ``rollout_log_prob`` (inference engine): (B, T).
    Returns detached (B, T) weights (0 on masked positions) and scalar metrics (``tis/…``).

    Traits: a correction that *rejects* tokens (verl's rejection sampling) may also narrow the
    training step's response mask, so rejected tokens leave the normaliser, the token/sequence
    counts and the KL and entropy terms. It declares both ``narrows_mask=`` (per config):
    ``"after_advantage"``, ``"before_advantage"`` (when the step narrows, relative to the advantage
    estimator) or None (never); and ``keep_mask=``, a function
    ``(*, old_log_prob, rollout_log_prob, mask, config) -> (B, T) bool`` (the valid tokens kept).
    The ``rl`` step then computes the old log-probs before the update. ``identity=True`` — the
    correction changes nothing (``none``), so it combines with a policy loss that corrects for the
    sampler itself.
    """


@hookspec
def register_preference_losses(register):
    """Register preference losses (the DPO family).

    ::

        fn(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
           chosen_lengths, rejected_lengths, config) -> (losses, metrics)

    :param register: call ``register(name, fn, config=...)`` once per loss.

    Every argument is (P,) over P pairs: sequence log-prob *sums* under the policy and the
    reference, and the number of response tokens. Returns per-pair losses (P,) and scalar
    metrics (``dpo/…``).

    Optional inputs, passed as extra keyword arguments only to a loss registered with the
    matching ``requires=(...)`` entry (a loss reads them only when one of its knobs asks; every
    loss also works with the six inputs above alone under its default knobs):

    ``requires=("token_logps",)``
        ``chosen_token_logps`` (P, T_w) and ``rejected_token_logps`` (P, T_l): the policy's
        per-token log-probs of the responses (with gradient); ``ref_chosen_token_logps`` /
        ``ref_rejected_token_logps``: the same under the reference (no gradient);
        ``chosen_mask`` (P, T_w) / ``rejected_mask`` (P, T_l) bool, True on response tokens, row
        sums equal to ``chosen_lengths`` / ``rejected_lengths``. T_w and T_l are each side's padded
        length. Read by LD-DPO's ``ld_alpha`` and by WPO weighting.
    ``requires=("log_sum_sq_probs",)``
        ``chosen_log_sum_sq_probs`` (P, T_w) / ``rejected_log_sum_sq_probs`` (P, T_l): the
        policy's log Σ_v π(v | prefix)² at each response position,
        ``logsumexp(2·logits) − 2·logsumexp(logits)`` over the vocabulary (no gradient needed).
        Read by WPO weighting (with ``token_logps``).
    ``requires=("bco_running_mean",)``
        ``bco_reward_mean`` and ``bco_reward_count``: 0-d tensors, the running-mean state of
        ``bco_pair``'s reward shift before this step (0 and 0 at the first step). The loss
        returns the updated state as the metrics ``bco/reward_mean`` and ``bco/reward_count``;
        pass those back at the next step (and checkpoint them). Read only with the shift on.

    Traits: none.
    """


@hookspec
def register_tasks(register):
    """Register tasks: environments of one turn with verifiable rewards, chosen with ``task = NAME``.

    ``fn(*, config) -> task`` is a factory; the task is an :class:`rllab.SingleTurn` (the one-turn
    :class:`rllab.Environment` whose rubric scores the answer), or any object of the task protocol
    (:class:`rllab.types.Task`), played as one. This hook is the registration of such environments
    under the name users know (``register_environments`` registers those of several turns).

    :param register: call ``register(name, factory, config=...)`` once per task.

    Traits: ``reward_components=`` (per config) — the names of the reward components the task's
    instances declare (empty for a single reward), so a config is checked before any model loads;
    undeclared, the check waits for the first batch.

    Subclass :class:`rllab.SingleTurn` for the defaults of its optional members (``reward_weights``,
    ``solved``, ``reward_batch``, …; :data:`rllab.members.MEMBERS`).
    """


@hookspec
def register_environments(register):
    """Register environments: sources of multi-turn episodes (see :mod:`rllab.rollout.environment`).

    ``fn(*, config) -> environment`` is a factory; the environment follows
    :class:`rllab.rollout.environment.Environment` (``train_examples``, ``eval_examples``,
    ``start(example) -> episode`` whose ``step(text)`` answers each model turn with a
    :class:`rllab.rollout.environment.Step`, ``demonstration``). A run selects one with ``env = NAME``
    (instead of ``task``). An environment and a task may not share a name.

    :param register: call ``register(name, factory, config=...)`` once per environment.

    Traits: none. Subclass :class:`rllab.Environment` for the defaults of its optional members
    (``max_turns``, ``solved``, ``describe_error``, ``rollout_defaults``, …;
    :data:`rllab.members.MEMBERS`).
    """


@hookspec
def register_samplers(register):
    """Register prompt samplers: which of the task's (or environment's) examples a step trains on.

    ``fn(*, config) -> sampler`` is a factory, called once per run; the ``[sampler]`` section
    names it. The sampler follows :class:`rllab.sampling.Sampler`::

        draw(*, n, rng, step, source) -> list[Example]    # the step's n prompts
        feedback(*, step, examples, rewards) -> None       # each prompt's mean group reward
        state_dict() -> dict; load_state_dict(state)       # checkpointed with the run
        metrics() -> dict[str, float]                      # logged as sampler/... each step

    ``source(n, rng)`` is the run's own draw (the task's ``train_examples``): ``n`` examples drawn
    with the torch generator ``rng``. ``rng`` is the step's generator (seeded from the run's seed
    and the step). ``examples`` are the step's prompts, then any replacements the gate played;
    ``rewards`` one float each: the prompt's mean task reward over its group (None for a prompt
    whose every sample failed its reward).

    :param register: call ``register(name, factory, config=...)`` once per sampler.

    Traits: ``stateless=True`` — ``draw`` depends on ``(n, rng, source)`` alone (no feedback),
    so the sampler runs on several data-parallel ranks and with batches sampled ahead
    (``rollout.max_staleness > 0``); undeclared (False), those are refused at load.
    ``gate_retries=`` (per config) — the most rounds in which the rollout stage asks the sampler
    for replacement prompts for the groups whose scores are all equal (the step plays them and
    swaps in those that are not); None or 0: no replacement.

    Subclass :class:`rllab.Sampler` for the defaults of ``feedback``, ``state_dict``,
    ``load_state_dict`` and ``metrics``.
    """


@hookspec
def register_reward_functions(register):
    """Register reward functions: scorers a task (such as ``dataset``) combines by name.

    A reward function follows one of the two signatures users already write, named by its
    ``signature=`` trait:

    ``"trl"`` (the default), TRL's batched form::

        fn(*, prompts, completions, config, **columns) -> list[float | None]

    ``prompts`` (N,) strings, or message lists for chat prompts; ``completions`` (N,) strings, or
    ``[{"role": "assistant", "content": ...}]`` for chat prompts; ``columns`` the data set's other
    columns as (N,) lists, plus ``ground_truth`` (the task's reference answers) when the data set
    has no column of that name, and ``completion_ids`` (the sampled token ids) in a run. Returns N floats; ``None`` means "not applicable" (scored 0).

    ``"verl"``, verl's per-row form::

        fn(*, data_source, solution_str, ground_truth, extra_info, config) -> float | dict

    a float, or a dict whose ``"score"`` is the reward.

    :param register: call ``register(name, fn, config=...)`` once per reward function.

    A function that raises, returns NaN, the wrong number of values or a value that is not a
    number follows ``rollout.reward_errors``; the error names the function and the row.

    Traits: ``signature=`` — ``"trl"`` or ``"verl"``, the calling convention above.
    """


@hookspec
def register_loggers(register):
    """Register metric loggers (JSONL, TensorBoard, ...).

    ``fn(*, config, run_dir) -> logger`` with ``log(step, metrics)`` and ``close()``. A run
    builds the loggers its config names and subscribes them to its own ``on_step_end`` and
    ``on_eval_end`` events (:mod:`rllab.training.listeners`): ``log`` receives exactly what those events
    carry, before the other listeners; ``close`` runs when the run ends.
    A logger may also have ``start(config)``, called on ``on_run_start`` (also on resume) with
    the resolved config as a plain nested dict. ``close`` runs after ``final.json`` and the last
    checkpoint are written when the run succeeds, and without them when it stops on an error.

    :param register: call ``register(name, factory, config=...)`` once per logger.

    Traits: ``truncate=`` — a function ``(*, run_dir, config, step) -> None`` that drops what
    the logger wrote for steps after ``step`` when a run resumes from that step's checkpoint (so
    the resumed log has no duplicates); None: it keeps everything.
    """


@hookspec
def register_kl_controllers(register):
    """Register KL-coefficient controllers (fixed, adaptive, ...).

    ``fn(*, config) -> controller`` with a float attribute ``value`` (the current β) and
    ``update(current_kl, n_steps)`` called once per training step in which the algorithm reported
    a KL (``StepReport.kl``, a :class:`rllab.KLSample`: ``current_kl = value``,
    ``n_steps = samples``) and the run has a reference model.

    :param register: call ``register(name, factory, config=...)`` once per controller.

    Traits: none.
    """


@hookspec
def register_value_losses(register):
    """Register critic losses.

    ::

        fn(*, values, old_values, returns, mask, aggregate, config) -> (loss, metrics)

    :param register: call ``register(name, fn, config=...)`` once per loss.

    ``values`` (current critic), ``old_values`` (critic at rollout time), ``returns``: (B, T).

    Traits: none.
    """


@hookspec
def register_algorithms(register):
    """Register training algorithms: the step a run repeats (RL, DPO, online DPO, SFT, …).

    ``fn(*, config) -> algorithm`` is a factory, called once per run; the ``[algorithm]``
    section of the config names it and sets its knobs. The algorithm follows
    :class:`rllab.Algorithm`::

        needs(ctx) -> set[str]        # models the trainer must build: "reference", "critic"
        step(ctx) -> Generator[OptimizerStep, dict, dict]

    ``ctx`` is a :class:`rllab.RunContext` (the step number, the config, the built components by
    section, the rollout — a :class:`rllab.Rollout`: ``sample``, ``to_batch``, ``greedy_rewards``, …,
    and nothing else —, the models, the KL coefficient). ``step`` is a generator: after
    each backward pass it yields an :class:`rllab.OptimizerStep`; the trainer then checks the
    gradients, clips them, steps the optimizer(s), zeroes the gradients and sends back a dict of
    metrics (``actor/grad_norm``, …) — :class:`rllab.Optimizers`, the same step ``rllab replay``
    uses. When the generator returns, its value is a :class:`rllab.StepReport`: the step's
    metrics (a flat dict of floats, only logged) and ``kl``, a :class:`rllab.KLSample` (the KL to
    the reference and the samples it was measured on) that the KL controller adapts to, or None;
    returning a plain dict means metrics without a KL. The trainer then advances the LR schedule,
    updates the KL controller and syncs the rollout backend's weights. Algorithms never step an
    optimizer or touch the backend's weights themselves.

    :param register: call ``register(name, factory, config=...)`` once per algorithm.

    Traits: ``uses=`` — the config sections the algorithm reads (a set of names such as
    ``{"task", "backend", "policy_loss"}``; a section it does not use is refused when a config
    sets it; None: every section); ``provides=`` — the optional inputs it passes to components,
    by kind (``{"advantage_estimator": ("values", ...)}``): a component whose ``requires`` names
    an input its algorithm does not provide is refused at load. ``data_parallel=True`` — its step
    all-reduces its normalisers across ranks, so it runs with ``model.strategy = "fsdp2"`` on
    several ranks (otherwise refused there); ``replayable=True`` — its step takes each batch from
    ``ctx.rollout.sample(step)``, so ``rllab record`` / ``rllab replay`` can hand it recorded ones;
    ``async_rollouts=True`` — its steps take their batches from ``ctx.rollout.sample(step)`` alone,
    so they may be sampled ahead (``rollout.max_staleness > 0``) and over-sampled
    (``rollout.over_sample > 0``), both refused at load otherwise. Optional member:
    ``reconfigure(config)`` (default None) — it takes a ``[[schedule]]`` entry's new knobs.
    """


@hookspec
def register_commands(subparsers):
    """Add subcommands to the ``rllab`` command line (as ``llm``'s ``register_commands``).

    Called once when ``rllab`` starts, after plugins (including ``--plugin`` ones) are loaded.

    :param subparsers: the :mod:`argparse` sub-parser collection of ``rllab``. Add a command with
        ``p = subparsers.add_parser("name", help=...)``, its arguments with ``p.add_argument``,
        and its handler with ``p.set_defaults(func=handler)``; ``handler(args)`` returns the exit
        code, and ``args.lab`` is the loaded :class:`rllab.Lab`. Raise :class:`rllab.RllabError`
        for a user-facing error.
    """


# --------------------------------------------------------------------------- events: what a run tells its listeners


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
    """Called when a step's rollouts, generated and scored, are made into a batch, whatever the
    algorithm: the kernel fires it (:class:`rllab.algorithm.StepEvents`).

    :param step: the number of the step being taken (1 for the first).
    :param batch: the :class:`rllab.types.RolloutBatch` about to be trained on.
    :param metrics: the ``rollout/…`` metrics so far (a dict of floats; do not mutate).
    """


@hookspec
def on_step_samples(step, episodes, batch, advantages, trainer_log_prob, tokenizer, run_dir):
    """Called after a step's update, with its samples: what a per-sample trace needs (the
    ``traces`` logger, :mod:`rllab_loggers.traces`). The kernel fires it for every algorithm
    (:class:`rllab.algorithm.StepEvents`): with the advantages and log-probs an algorithm hands to
    :func:`rllab.algorithm.report_samples`, else after its step without them; only rank 0's
    loggers listen.

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
