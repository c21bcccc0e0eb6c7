"""The rollout stage: a step's episodes through five named phases, then a batch::

    draw ──► play ──► shape ──► filter ──► measure ──► Rollouts ──► to_batch ──► RolloutBatch

:meth:`RolloutStage.sample` runs them over the step's episodes: ``draw`` the prompts (the
sampler's, within the prompt limits; partial rollouts: the carried groups first; data parallel:
this rank's share), ``play`` a group of episodes per prompt through the episode loop (partial
rollouts' stand-in backend; the sampler's gate), then the shapers, filters and measures
(:mod:`rllab.rollout.phases`) chosen from ``[rollout]`` when the stage is built. The stage's
:meth:`RolloutStage.state_dict` holds what carries from step to step: the sampler's state and the
groups partial rollouts carry.

Every rollout is played by the episode loop (:mod:`rllab.rollout.episodes`) over one source of
episodes, an environment (:func:`rllab.rollout.single_turn.playable`): a run's environment
(``env = NAME``) gives multi-turn episodes; a task (``task = NAME``) is an environment of one
turn, :class:`rllab.rollout.single_turn.SingleTurn`, whose step scores the answer with its rubric
(:mod:`rllab.rollout.scoring`), so its batches are the single-turn batches they always were. The
run's prompt limits (:class:`rllab.rollout.prompt_limits.PromptLimits`) filter the draw.

One stage serves every algorithm: the RL step (:meth:`RolloutStage.sample` then
:meth:`RolloutStage.to_batch`), online DPO (the same samples, paired), offline pair building
(:meth:`RolloutStage.play`) and held-out evaluation (:meth:`RolloutStage.evaluate`). It is data
in, data out: it reads the source and asks the backend for completions, and never changes
weights (the trainer syncs them).

Scoring follows ``rollout.reward_errors``: a reward that raises or is NaN/inf stops the run with
a :class:`~rllab.errors.RewardError` naming the task, prompt and completion (``raise``), drops
the sample's whole group (``skip``) or scores it 0 (``zero``), counted as
``rollout/reward_errors``; a step whose every sample failed (or, for an environment, whose every
episode overflowed its token budget) stops the run (:mod:`rllab.rollout.episode_stats`). What "solved" means
(``rollout/accuracy``, ``eval/accuracy``) is :func:`rllab.rollout.accuracy.is_solved`: the task's own
``solved(example, reward)``, else its correctness reward component ≥ 1, else ``reward ≥ 1``.
A task's reward components are logged as ``reward/<name>`` (:mod:`rllab.rollout.scoring`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import attrs
import torch

from rllab import sampling
from rllab.algorithm import seed_for
from rllab.rollout.chat import Messages, PromptRenderer
from rllab.parallel.reducer import SINGLE, Reducer
from rllab.rollout.episodes import EpisodeResult, EpisodeRunner
from rllab.errors import RewardError, RllabError
from rllab.rollout.evalmetrics import held_out_order, sampled_metrics  # noqa: F401  (re-exported: where they were)
from rllab.rollout.evaluation import HeldOutEvaluation
from rllab.rollout.gate import gate
from rllab.rollout.rewards import random_rewards
from rllab.rollout.episode_stats import ERROR_ADVICE
from rllab.rollout.phases import StepEpisodes, episode_batch, filters, measures, reporting, shaped, shapers, truncated
from rllab.members import member
from rllab.rollout.accuracy import correct_component, solved_rule, solver
from rllab.rollout.episodes import EpisodeLimits, one_turn
from rllab.rollout.scoring import component_weights
from rllab.rollout.single_turn import kind_of
from rllab.settings import RolloutConfig
from rllab.types import Completion, Example, RolloutBatch, SamplingParams


@attrs.frozen(kw_only=True, eq=False)
class Rollouts:
    """One step's episodes, prompt-major, with the step's metrics (what :meth:`RolloutStage.sample` gives)."""

    examples: list[Example]
    """The step's examples (an episode's ``completion.prompt_index`` indexes them)."""
    episodes: list[EpisodeResult]
    """Every episode played, each with its ``shaping`` and ``keep``."""
    metrics: dict

    @property
    def completions(self) -> list[Completion]:
        return [e.completion for e in self.episodes]

    @property
    def keep(self) -> torch.Tensor:
        """(N,) bool: the episodes the batch takes."""
        return torch.tensor([e.keep for e in self.episodes], dtype=torch.bool)

    def rewards(self) -> torch.Tensor:
        """(N,) float32 what training uses: each episode's reward plus its shaping."""
        return shaped(self.episodes)


class RolloutStage(HeldOutEvaluation):
    """Generation and scoring for one run (see the module docstring).

    :param source: what the episodes are played on: the run's environment, or its task (an
        environment of one turn, :func:`rllab.rollout.single_turn.playable`), registered as ``name``.
    :param backend: a :class:`rllab.types.RolloutBackend`.
    :param tokenizer: a Hugging Face tokenizer (``pad_token_id`` set).
    :param config: the run's :class:`rllab.config.RolloutConfig`.
    :param seed: the run's seed.
    :param model_name: the model, for error messages (its path, or the tiny model).
    :param sampler: the run's prompt sampler (:mod:`rllab.sampling`), named ``sampler_name`` in
        messages, with its ``gate_retries`` trait; None: the source's own draw.

    Prompts become token ids through a :class:`rllab.rollout.chat.PromptRenderer`: strings as they are,
    chat messages with the tokenizer's chat template (and ``config.system_prompt``); sampling and
    decoding stop at EOS and at the template's end-of-turn token.
    """

    def __init__(self, source: Any = None, *, name: str = "?", backend: Any, tokenizer: Any, config: RolloutConfig, seed: int,
                 model_name: str = "the model", reducer: Reducer = SINGLE, sampler: Any = None, sampler_name: str = "?",
                 gate_retries: int = 0, context_tokens: int | None = None, prompt_limits: Any = None, **former: Any):
        if former or source is None:
            raise RllabError(
                f"RolloutStage takes the run's task or environment and its name (got {', '.join(sorted(former)) or 'none'}): "
                f"RolloutStage(source, name=..., ...), or rllab.rollout.stage.build_stage(task=... or env=..., ...)"
            )
        self.source_kind = kind_of(source)
        """What the source is (:class:`~rllab.rollout.single_turn.SourceKind`), said once: its name in messages, its failures."""
        self.kind = self.source_kind.name
        """What the source is called in messages: ``"task"`` or ``"environment"``."""
        correct_component(source, who=f"{self.kind} {name!r}")  # an unknown name is refused before any sampling
        self.env = self.source_kind.play(source, name=name, tokenizer=tokenizer)
        """The environment the episodes are played on (a task: its :class:`~rllab.rollout.single_turn.SingleTurn`)."""
        self.task_name = name  # for messages: the task's name or the environment's
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config
        self.seed = seed
        self.prompt_limits = prompt_limits
        """The run's :class:`~rllab.rollout.prompt_limits.PromptLimits` (checked), which filter the draw; None: none."""
        self.reporting = reporting(self.env)
        """How the episodes are reported (:class:`~rllab.rollout.phases.Reporting`): as episodes of turns (env/*,
        eval/turns, the random-reward control at the solved rate, partial rollouts refused) or as answers."""
        self.renderer = PromptRenderer(
            tokenizer, system_prompt=config.system_prompt, task_name=self.task_name, model_name=model_name
        )
        self.reducer = reducer
        """The run's data-parallel ranks: a rank samples its contiguous share of each step's prompts
        and evaluates every ``world_size``-th held-out example (the counts summed over ranks)."""
        self.shard = (reducer.rank, reducer.world_size)
        self.limits = EpisodeLimits.of(self.env, config, name=name, context_tokens=context_tokens)
        self.sampler = sampler
        """The run's prompt sampler (:mod:`rllab.sampling`), named ``sampler_name``; None: the source's own draw."""
        self.sampler_name = sampler_name
        self.gate_retries = gate_retries if sampler is not None else 0
        """The sampler's ``gate_retries`` trait: rounds of replacement prompts for flat groups (:mod:`rllab.rollout.gate`)."""
        self.partial = None
        """Partial rollouts (``rollout.over_sample > 0``, :mod:`rllab.rollout.partial`): their state, else None."""
        if config.over_sample > 0:
            self.partial = self.reporting.partial(backend, config, world=self.shard[1], name=self.task_name)
        self.shapers = shapers(self)
        """The shape phase's steps, chosen from ``[rollout]`` (:meth:`sample`)."""
        self.filters = filters(config)
        """The filter phase's steps, chosen from ``[rollout]``."""
        self.measures = measures(self)
        """The measure phase's steps: the step's metrics, then each feature's in use."""

    def draw(self, step: int, n: int, rng: torch.Generator) -> list[Example]:
        """``n`` training examples for ``step``: the sampler's, else the source's own draw with ``rng``
        (prompts the run's prompt limits drop, drawn again)."""
        source = self.env.train_examples if self.prompt_limits is None else self.prompt_limits.draw
        if self.sampler is None:
            return source(n, rng)
        examples = self.sampler.draw(n=n, rng=rng, step=step, source=source)
        if len(examples) != n:
            raise RllabError(f"sampler {self.sampler_name!r} drew {len(examples)} examples where step {step} asked for {n}")
        return list(examples)

    def held_out(self) -> list[Example]:
        """The source's held-out examples (those the run's prompt limits keep)."""
        return self.env.eval_examples() if self.prompt_limits is None else self.prompt_limits.held_out()

    @property
    def task(self) -> Any:
        """The run's source of episodes: its environment, or its task (an environment of one turn,
        :class:`~rllab.rollout.single_turn.SingleTurn`, whose ``demonstration`` is one answer)."""
        return self.env

    def runner(self) -> EpisodeRunner:
        """The episode loop over this stage's source, backend and limits."""
        return EpisodeRunner(
            self.env, name=self.task_name, backend=self.backend, renderer=self.renderer, limits=self.limits,
            on_error=self.config.reward_errors, kind=self.kind,
        )

    def play(self, examples: Sequence[Example], params: SamplingParams) -> list[EpisodeResult]:
        """``params.n`` episodes per example (prompt-major) through the episode loop."""
        return self.runner().play(examples, params)

    # -- the run's rollout state (what the trainer checkpoints and carries across a reconfiguration)

    samples_ahead = False
    """Whether batches are sampled ahead of the step that trains on them (:class:`rllab.rollout.asynchronous.AsyncRollout`)."""

    def state_dict(self, step: int) -> dict:
        """What a checkpoint after ``step`` holds of the rollout side: the sampler's state
        (:func:`rllab.sampling.state`) and the groups carried into the next step (partial rollouts)."""
        return {"sampler": sampling.state(self.sampler),
                "partial_rollouts": self.partial.state_dict() if self.partial is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Set back :meth:`state_dict` (a checkpoint's; keys it lacks leave their part as it is)."""
        sampling.restore(self.sampler, state.get("sampler"))
        if state.get("partial_rollouts") and self.partial is not None:
            self.partial.load_state_dict(state["partial_rollouts"])

    def succeeded_by(self, stage: RolloutStage) -> RolloutStage:
        """``stage`` (this run's stage rebuilt for a changed config) with this stage's sampler and
        the groups it carries into the next step."""
        stage.sampler = self.sampler
        if self.partial is not None and stage.partial is not None:
            stage.partial.carried = self.partial.carried
        return stage

    def settle(self, step: int, metrics: dict) -> dict:
        """Before the weight sync that follows ``step``: nothing to wait for (metrics to add: none)."""
        return {}

    def advance(self, step: int) -> None:
        """Step ``step`` is next (nothing is sampled ahead)."""

    def close(self) -> None:
        """Nothing to release (the backend is the trainer's)."""

    events = None
    """The step's :class:`rllab.algorithm.StepEvents` while the trainer runs a step (:meth:`announcing`), else None."""

    pending_eval = None
    """An evaluation being scored in another thread (:meth:`evaluate_sampled`), called once this
    stage's next step has its rewards, to wait for it and log it before the step's events; else None."""

    @contextlib.contextmanager
    def announcing(self, events: Any):
        """Within the block, each batch made (:meth:`to_batch`) is announced to ``events``."""
        self.events = events
        try:
            yield
        finally:
            self.events = None

    # -- text

    def encode(self, prompt: str | Messages) -> list[int]:
        """The token ids of a prompt (a string, or chat messages rendered with the chat template)."""
        return self.renderer.encode(prompt)

    def response_ids(self, text: str, *, prompt: str | Messages | None = None) -> list[int]:
        """Token ids of a response text to ``prompt``, ending as a sampled response would (EOS, or
        the template's end-of-turn token for a prompt rendered with the chat template)."""
        return self.renderer.response_ids(text, prompt=prompt)

    def decode(self, c: Completion) -> str:
        """The completion's text up to its first stop token (EOS or end-of-turn)."""
        return self.renderer.decode(c.token_ids)

    # -- generation and scoring

    def sampling_params(self, step: int, *, n: int, greedy: bool = False) -> SamplingParams:
        r = self.config
        return SamplingParams(
            n=n,
            max_new_tokens=r.max_new_tokens,
            temperature=0.0 if greedy else r.temperature,
            top_p=1.0 if greedy else r.top_p,
            top_k=-1 if greedy else r.top_k,
            stop_token_ids=self.renderer.stop_ids,
            seed=seed_for(self.seed, step, 1 if self.shard[0] == 0 else 1000 + self.shard[0]),  # a stream per data-parallel rank
        )

    def generate(self, examples: Sequence[Example], params: SamplingParams) -> list[Completion]:
        """Completions of the examples' prompts, straight from the backend (no episode, no reward)."""
        return self.backend.generate([self.encode(e.prompt) for e in examples], params)

    def solved(self, example: Example, reward: float, components: Sequence[float] | None = None) -> bool:
        """Whether an answer is solved (:func:`rllab.rollout.accuracy.is_solved`; ``components`` the
        answer's reward components in the declared order, for a task that has several)."""
        return self.solver()(example, reward, components)

    def solver(self):
        """The source's notion of solved, resolved now (:func:`rllab.rollout.accuracy.solver`): a step
        resolves it once for all its samples rather than looking the members up per sample."""
        return solver(self.env)

    @property
    def solved_rule(self) -> str:
        """What counts as solved, in words (a run's header, ``final.json``)."""
        return solved_rule(self.env, kind=self.kind)

    @property
    def component_names(self) -> tuple[str, ...]:
        """The task's reward component names (empty for a single-reward task and for an environment)."""
        return tuple(member(self.env, "environment", "reward_components"))

    def component_weights(self) -> list[float]:
        """w_k of the scalar reward Σ_k w_k·r_k: the source's ``reward_weights``, default all 1."""
        return component_weights(self.env, self.component_names, who=f"{self.kind} {self.task_name!r}")

    def score(self, examples: Sequence[Example], completions: Sequence[Completion]) -> tuple[list[float], list[bool], int]:
        """Rewards for each completion; returns (rewards, keep, n_errors) under ``reward_errors``."""
        rewards, _, keep, errors = self.score_components(examples, completions)
        return rewards, keep, errors

    def score_components(
        self, examples: Sequence[Example], completions: Sequence[Completion]
    ) -> tuple[list[float], list[list[float]], list[bool], int]:
        """The rewards of completions sampled apart from the episode loop, each the one turn of an
        episode of its example (a task's: scored by its rubric): ``(rewards, components, keep,
        n_errors)`` under ``reward_errors`` (components: empty lists for a single reward; zeros
        where a reward failed). An environment of several turns is refused: a completion is not
        a whole episode of it."""
        if self.limits.max_turns > 1:
            raise RllabError(f"{self.kind} {self.task_name!r} plays episodes of up to {self.limits.max_turns} turns: a completion "
                             f"sampled apart from the episode loop is not a whole episode to score; play episodes instead "
                             f"(rollout.play)")
        policy = self.config.reward_errors
        names = self.component_names
        rewards, comps, keep, errors = [], [], [], 0
        texts = [self.decode(c) for c in completions]
        rows = [examples[c.prompt_index] for c in completions]
        describe = member(self.env, "environment", "describe_error")
        for ex, text, step in zip(rows, texts, one_turn(self.env, rows, texts, [list(c.token_ids) for c in completions])):
            if isinstance(step, BaseException):
                if policy == "raise":
                    why = describe(ex, text, 1, step) if describe is not None else f"{self.kind} {self.task_name!r} failed: {step!r}."
                    raise RewardError(f"{why} {ERROR_ADVICE}") from None
                errors += 1
                rewards.append(0.0)
                comps.append([0.0] * len(names))
                keep.append(policy == "zero")
                continue
            rewards.append(step.reward)
            comps.append(list(step.score))
            keep.append(True)
        return rewards, comps, keep, errors

    def overlong_penalty(self, completions: Sequence[Completion]) -> torch.Tensor:
        """DAPO's soft overlong punishment: linear from 0 to −penalty over the last ``buffer``
        tokens, counting the model's tokens only (an episode's observations are not its length)."""
        r = self.config
        lengths = torch.tensor([c.model_tokens for c in completions], dtype=torch.float32)
        if r.overlong_buffer <= 0:
            return torch.zeros_like(lengths)
        expected = r.max_new_tokens - r.overlong_buffer
        return -((lengths - expected).clamp(min=0) / r.overlong_buffer) * r.overlong_penalty

    def sample(self, step: int, *, prompts: int | None = None, group_size: int | None = None) -> Rollouts:
        """A step's episodes through the named phases draw → play → shape → filter → measure: the
        prompts drawn (:meth:`draw_step`), a group of episodes played for each (:meth:`play_step`),
        then the shapers, filters and measures chosen from ``[rollout]`` when the stage was built
        (:attr:`shapers`, :attr:`filters`, :attr:`measures`), each a function of the stage and the
        step's :class:`~rllab.rollout.phases.StepEpisodes` (:mod:`rllab.rollout.phases`)."""
        s = self.draw_step(step, prompts or self.config.prompts_per_step)
        self.play_step(s, group_size or self.config.group_size)
        pending, self.pending_eval = self.pending_eval, None
        if pending is not None:  # the evaluation scored while this step sampled and scored: logged before the step's events
            pending()
        for shape in self.shapers:
            shape(self, s)
        for keep in self.filters:
            keep(self, s)
        for measure in self.measures:
            s.metrics.update(measure(self, s))
        return Rollouts(examples=s.examples, episodes=s.final_episodes(), metrics=s.metrics)

    # -- the phases of a step (sample)

    def draw_step(self, step: int, prompts: int) -> StepEpisodes:
        """draw: the step's examples (partial rollouts: over-sampled, the carried groups first, and
        the step's stand-in backend; data parallel: this rank's contiguous share, whole groups)."""
        gen = torch.Generator().manual_seed(seed_for(self.seed, step, 0))
        if self.partial is not None:  # rllab.rollout.partial
            examples, carried = self.partial.examples(prompts, lambda k: self.draw(step, k, gen))
            return StepEpisodes(step=step, prompts=prompts, examples=examples, partial=self.partial.step_backend(step, prompts, carried))
        rank, world = self.shard
        examples = self.draw(step, prompts, gen)
        if world > 1:
            examples = examples[rank * prompts // world:(rank + 1) * prompts // world]
        return StepEpisodes(step=step, prompts=prompts, examples=examples)

    def play_step(self, s: StepEpisodes, group_size: int) -> None:
        """play: ``group_size`` episodes per example through the episode loop (partial rollouts:
        through the step's backend, each token's step recorded), the sampler's gate replacing flat
        groups (:mod:`rllab.rollout.gate`); then each episode's outcome as played."""
        s.params = self.sampling_params(s.step, n=group_size)
        runner = self.runner()
        if s.partial is not None:
            runner.backend = s.partial
        s.episodes = runner.play(s.examples, s.params)
        s.backend_metrics, s.timings = runner.backend_metrics, {k: runner.timings[k] for k in ("rollout", "step")}
        if s.partial is not None:
            s.partial.keep(s.examples)
            s.episodes = [attrs.evolve(e, token_versions=s.partial.versions.get(id(e.completion))) for e in s.episodes]
        if self.gate_retries:
            self._gate(s)
        s.played(self.component_names, self.solver(), zero_failed=self.config.reward_errors == "zero")

    def _gate(self, s: StepEpisodes) -> None:
        runner = self.runner()

        def play(examples: Sequence[Example], params: SamplingParams) -> list[EpisodeResult]:
            out = runner.play(examples, params)
            for k in s.timings:  # the replacements' time is the step's
                s.timings[k] += runner.timings[k]
            return out

        s.gated = gate(examples=s.examples, episodes=s.episodes, retries=self.gate_retries, step=s.step, seed=self.seed,
                       params=s.params, draw=lambda n, rng: self.draw(s.step, n, rng), play=play,
                       score=lambda eps: (shaped(eps) + self.overlong_penalty([e.completion for e in eps])).tolist())
        s.examples, s.episodes = s.gated.examples, s.gated.episodes

    def random_rewards(self, step: int, completions: Sequence[Completion], raw: Sequence[float], keep: Sequence[bool], offset: int) -> torch.Tensor:
        """(N,) float32: ``rollout.random_reward``'s Bernoulli draws (:func:`rllab.rollout.rewards.random_rewards`),
        prompts numbered over the whole step (``offset``: this rank's first); ``matched`` takes p
        from the mean of ``raw`` over the samples whose reward did not fail (the task rewards, or an
        environment's solved flags)."""
        r = self.config
        ok = [x for x, k in zip(raw, keep) if k]
        p = r.random_reward_p if r.random_reward == "given" else min(1.0, max(0.0, sum(ok) / len(ok) if ok else 0.0))
        return torch.tensor(random_rewards(self.seed, step, [offset + c.prompt_index for c in completions], p), dtype=torch.float32)

    def greedy_rewards(self, examples: Sequence[Example]) -> torch.Tensor:
        """(P,) float32: the reward of the policy's greedy episode for each example (ReMax's
        baseline), scored under ``reward_errors`` (a failed reward counts 0 unless it raises)."""
        episodes = self.play(examples, self.sampling_params(0, n=1, greedy=True))
        out = torch.zeros(len(examples), dtype=torch.float32)
        out[torch.tensor([e.completion.prompt_index for e in episodes], dtype=torch.long)] = torch.tensor(
            [e.reward for e in episodes], dtype=torch.float32)
        return out

    def to_batch(self, rollouts: Rollouts) -> RolloutBatch | None:
        """The kept episodes as a padded :class:`RolloutBatch` (:func:`episode_batch`; None when
        nothing is kept), announced to the step's :attr:`events` (``on_rollout_end``)."""
        batch = self._batch(rollouts)
        if self.events is not None:
            self.events.batched(rollouts, batch)
        return batch

    def _batch(self, rollouts: Rollouts) -> RolloutBatch | None:
        kept = [e for e in rollouts.episodes if e.keep]
        if not kept:
            return None
        names = self.component_names if self.config.random_reward == "off" else ()  # the control trains on draws alone
        batch = episode_batch(kept, pad_token_id=self.tokenizer.pad_token_id, component_names=names,
                              component_weights=self.component_weights() if names else None)
        if self.config.mask_truncated:  # overlong filtering: in the group, out of the loss
            cut = torch.tensor([truncated(e) for e in kept], dtype=torch.bool)
            batch = attrs.evolve(batch, response_mask=batch.response_mask & ~cut[:, None])
        return batch


def build_stage(*, task: Any = None, env: Any = None, task_name: str = "?", env_name: str | None = None, **kw: Any) -> RolloutStage:
    """A :class:`RolloutStage` over ``task`` or ``env`` (exactly one), named ``env_name`` or
    ``task_name``; the rest of ``kw`` the stage's own arguments (``context_tokens`` the model's
    context, which an environment's episodes stay within)."""
    if (task is None) == (env is None):
        raise RllabError("a stage plays a task or an environment (env=), exactly one")
    return RolloutStage(env if task is None else task, name=env_name or task_name, **kw)
