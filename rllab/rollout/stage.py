"""The rollout stage: a step's episodes through five named phases, then a batch::

    draw ──► play ──► shape ──► filter ──► measure ──► Rollouts ──► to_batch ──► RolloutBatch

:meth:`RolloutStage.sample` runs them, each a function over the step's :class:`StepEpisodes`:
``draw`` the prompts (the sampler's, within the prompt limits; partial rollouts: the carried
groups first; data parallel: this rank's share), ``play`` a group of episodes per prompt through
the episode loop (partial rollouts' stand-in backend; the sampler's gate), then the shapers
(``rollout.random_reward``, the overlong penalty), filters (failed samples and, with
``reward_errors = "skip"``, their groups; ``rollout.dynamic_sampling``) and measures (the step's
metrics, each feature's in use) chosen from ``[rollout]`` when the stage is built. The stage's
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

A step's rows are :class:`~rllab.rollout.episodes.EpisodeResult` records from sampling to batching:
each carries its ``reward`` (scalar), ``score`` (reward components) and ``token_rewards``
(placed per token), then the stage's ``shaping`` and ``keep``; :func:`episode_batch` pads the
kept ones into the :class:`~rllab.types.RolloutBatch`, in one place.

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
import time
from typing import Any, Sequence

import attrs
import torch

from rllab import ops, sampling
from rllab.algorithm import seed_for
from rllab.rollout.chat import Messages, PromptRenderer
from rllab.parallel.reducer import SINGLE, Reducer
from rllab.rollout.episodes import EpisodeResult, EpisodeRunner
from rllab.errors import RewardError, RllabError
from rllab.rollout.evalmetrics import sampled_metrics
from rllab.rollout.gate import gate, group_means, played_feedback
from rllab.rollout.rewards import on_last_model_token, random_rewards
from rllab.rollout.partial import for_stage
from rllab.rollout.episode_stats import ERROR_ADVICE, check_step, episode_metrics
from rllab.members import member
from rllab.rollout.accuracy import correct_component, solved_rule, solver
from rllab.rollout.episodes import EpisodeLimits, one_turn
from rllab.rollout.scoring import component_weights
from rllab.rollout.single_turn import kind_of, playable
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
        return _shaped(self.episodes)


@attrs.define(kw_only=True, eq=False)
class StepEpisodes:
    """One step's episodes between the phases of :meth:`RolloutStage.sample`: drawn
    (``examples``), played (``episodes``, with each one's outcome as played: ``raw``, ``comps``,
    ``solved``), shaped (``rewards``, ``shaping``), filtered (``keep``) and measured (``metrics``)."""

    step: int
    prompts: int
    """The step's prompt count (over all data-parallel ranks)."""
    examples: list[Example]
    partial: Any = None
    """Partial rollouts: the step's stand-in backend (:mod:`rllab.rollout.partial`), else None."""
    params: SamplingParams | None = None
    episodes: list[EpisodeResult] = attrs.Factory(list)
    gated: Any = None
    """The sampler's gate's :class:`~rllab.rollout.gate.GateResult`, else None."""
    timings: dict = attrs.Factory(dict)
    """The episode loop's own seconds: ``rollout`` (sampling) and ``step`` (the environment's steps)."""
    backend_metrics: dict = attrs.Factory(dict)
    raw: list[float] = attrs.Factory(list)
    """Each episode's reward as played."""
    comps: list[list[float]] = attrs.Factory(list)
    """Each episode's reward components as played (zeros for a failed one)."""
    solved: list[bool] = attrs.Factory(list)
    rewards: torch.Tensor | None = None
    """(N,) float32 the rewards training sees (``rollout.random_reward``: the draws)."""
    shaping: torch.Tensor | None = None
    """(N,) float32 added to ``rewards`` (the overlong penalty; zeros without it)."""
    keep: torch.Tensor | None = None
    """(N,) bool the episodes the batch takes."""
    metrics: dict = attrs.Factory(dict)

    @property
    def completions(self) -> list[Completion]:
        return [e.completion for e in self.episodes]

    @property
    def scores(self) -> torch.Tensor:
        """(N,) float32 ``rewards + shaping``."""
        return self.rewards + self.shaping

    @property
    def index(self) -> torch.Tensor:
        """(N,) int64 each episode's prompt index."""
        return torch.tensor([e.completion.prompt_index for e in self.episodes])

    def played(self, names: Sequence[str], solved: Any, *, zero_failed: bool) -> None:
        """Record each episode's outcome as played; a failed one is kept only when it scores 0 (``zero_failed``)."""
        self.raw = [e.reward for e in self.episodes]
        self.comps = [list(e.score) or [0.0] * len(names) for e in self.episodes]
        self.solved = [e.error is None and solved(self.examples[e.completion.prompt_index], x, k)
                       for e, x, k in zip(self.episodes, self.raw, self.comps)]
        self.rewards = torch.tensor(self.raw, dtype=torch.float32)
        self.shaping = torch.zeros(len(self.raw), dtype=torch.float32)
        self.keep = torch.tensor([e.error is None or zero_failed for e in self.episodes], dtype=torch.bool)

    def final_episodes(self) -> list[EpisodeResult]:
        """The episodes with their ``shaping`` and ``keep`` (evolved only where they change, ~13 µs each)."""
        return [e if (x, k) == (e.shaping, e.keep) else attrs.evolve(e, shaping=x, keep=k)
                for e, x, k in zip(self.episodes, self.shaping.tolist(), self.keep.tolist())]


def _skip_failed_groups(s: StepEpisodes) -> None:
    """``reward_errors = "skip"``: drop the whole group of a failed sample."""
    if not s.keep.all():
        index = s.index
        s.keep &= ~torch.isin(index, index[~s.keep].unique())


def _drop_flat_groups(s: StepEpisodes) -> None:
    """``rollout.dynamic_sampling``: drop the groups (of more than one sample) whose scores are all equal."""
    count, _, std = ops.group_stats(s.scores, s.index)
    s.keep &= ~((std == 0) & (count > 1))


def _component_metrics(s: StepEpisodes, names: Sequence[str]) -> dict:
    """``reward/<name>``: each reward component's mean as played (the task's, whatever trains)."""
    comps = torch.tensor(s.comps, dtype=torch.float32).reshape(len(s.comps), len(names))
    return {f"reward/{name}": comps[:, k].mean().item() for k, name in enumerate(names)}


def _shaped(episodes: Sequence[EpisodeResult]) -> torch.Tensor:
    return torch.tensor([e.reward for e in episodes], dtype=torch.float32) + torch.tensor(
        [e.shaping for e in episodes], dtype=torch.float32)


TRUNCATED = ("length", "overflow")
"""Finish reasons of a cut-off sample: stopped by ``max_new_tokens`` (an episode: its last turn), or an
episode that outgrew its token budget."""


def truncated(episode: EpisodeResult) -> bool:
    """Whether ``episode`` was cut off (``rollout.mask_truncated`` leaves it out of the loss)."""
    return episode.finish_reason in TRUNCATED


def episode_batch(episodes: Sequence[EpisodeResult], *, pad_token_id: int, component_names: Sequence[str] = (),
                  component_weights: Sequence[float] | None = None) -> RolloutBatch:
    """The padded :class:`RolloutBatch` of ``episodes`` (the kept ones of a step): rows in their
    order, ``index`` the prompt index, ``rewards`` each episode's reward plus its shaping (float32),
    ``reward_components`` their ``score`` (zeros for a failed episode) with the K names and
    weights, ``turns``, ``staleness`` and (partial rollouts) ``token_versions``.

    Placed rewards: a row of one turn has its reward on its last model token (the batch's
    default placement); when some row took several turns, every row's are given
    (``turn_rewards``): each turn's reward on its last model token, the shaping added to the
    last one."""
    rewards = _shaped(episodes)
    names = tuple(component_names)
    comps = None
    if names:
        comps = torch.tensor([list(e.score) or [0.0] * len(names) for e in episodes], dtype=torch.float32)
        comps = comps.reshape(len(episodes), len(names))
    placed = None
    if any(e.turns > 1 for e in episodes):
        raw = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
        placed = []
        for e, extra, total in zip(episodes, (rewards - raw).tolist(), rewards.tolist()):
            row = list(e.token_rewards)
            model = e.completion.model_mask or (True,) * len(row)
            last = max((i for i, m in enumerate(model) if m), default=-1)
            if last >= 0 and e.turns > 1:
                row[last] += extra
            elif last >= 0:  # one turn: the row's reward, as the default placement has it
                row = [0.0] * len(row)
                row[last] = total
            placed.append(row)
    staleness = [e.staleness for e in episodes]
    versions = None  # partial rollouts: each token's step (a row without them: all the newest step's)
    if any(e.token_versions is not None for e in episodes):
        newest = max((v for e in episodes for v in e.token_versions or ()), default=0)
        versions = [e.token_versions or (newest,) * len(e.completion.token_ids) for e in episodes]
    return RolloutBatch.from_completions(
        [e.completion for e in episodes], rewards, pad_token_id=pad_token_id, reward_components=comps,
        reward_component_names=names, reward_component_weights=None if comps is None else component_weights,
        turn_rewards=placed, turns=[e.turns for e in episodes], staleness=None if None in staleness else staleness,
        token_versions=versions,
    )


class RolloutStage:
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
        self.kind = kind_of(source)
        """What the source is called in messages: ``"task"`` or ``"environment"``."""
        correct_component(source, who=f"{self.kind} {name!r}")  # an unknown name is refused before any sampling
        self.env = playable(source, name=name, tokenizer=tokenizer)
        """The environment the episodes are played on (a task: its :class:`~rllab.rollout.single_turn.SingleTurn`)."""
        self.task_name = name  # for messages: the task's name or the environment's
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config
        self.seed = seed
        self.prompt_limits = prompt_limits
        """The run's :class:`~rllab.rollout.prompt_limits.PromptLimits` (checked), which filter the draw; None: none."""
        self.multi_turn = bool(member(self.env, "environment", "multi_turn"))
        """Whether the episodes are reported as episodes of turns (env/*, eval/turns; the environment's ``multi_turn``)."""
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
            self.partial = for_stage(backend, config, multi_turn=self.multi_turn, world=self.shard[1], name=self.task_name)
        self.shapers = self._shapers()
        """The shape phase's steps, chosen from ``[rollout]`` (:meth:`sample`)."""
        self.filters = self._filters()
        """The filter phase's steps, chosen from ``[rollout]``."""
        self.measures = self._measures()
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
        (:attr:`shapers`, :attr:`filters`, :attr:`measures`), each a function of the step's
        :class:`StepEpisodes`."""
        s = self.draw_step(step, prompts or self.config.prompts_per_step)
        self.play_step(s, group_size or self.config.group_size)
        for shape in self.shapers:
            shape(s)
        for keep in self.filters:
            keep(s)
        for measure in self.measures:
            s.metrics.update(measure(s))
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
                       score=lambda eps: (_shaped(eps) + self.overlong_penalty([e.completion for e in eps])).tolist())
        s.examples, s.episodes = s.gated.examples, s.gated.episodes

    def _shapers(self) -> list:
        """shape: ``rollout.random_reward`` (the spurious-rewards control: training sees draws blind
        to the answers), then DAPO's overlong penalty (``rollout.overlong_buffer``)."""
        r = self.config
        return [f for on, f in ((r.random_reward != "off", self._random_reward), (r.overlong_buffer > 0, self._overlong)) if on]

    def _random_reward(self, s: StepEpisodes) -> None:
        rank, world = self.shard
        rate = s.solved if self.multi_turn else s.raw  # an environment's base rate: its solved fraction
        s.rewards = self.random_rewards(s.step, s.completions, rate, s.keep.tolist(), rank * s.prompts // world)
        s.episodes = [attrs.evolve(e, reward=x, score=(), token_rewards=on_last_model_token(e, x))
                      for e, x in zip(s.episodes, s.rewards.tolist())]

    def _overlong(self, s: StepEpisodes) -> None:
        s.shaping = self.overlong_penalty(s.completions)

    def _filters(self) -> list:
        """filter (after the failed samples, left out unless ``reward_errors = "zero"``):
        ``reward_errors = "skip"`` drops a failed sample's whole group; ``rollout.dynamic_sampling``
        the groups whose scores are all equal (DAPO)."""
        r = self.config
        return [f for on, f in ((r.reward_errors == "skip", _skip_failed_groups), (r.dynamic_sampling, _drop_flat_groups)) if on]

    def _measures(self) -> list:
        """measure: the step's ``rollout/*`` metrics, then those of the features in use."""
        r = self.config
        return [f for on, f in (
            (True, self._measure),
            (r.random_reward != "off", lambda s: {"rollout/true_reward": torch.tensor(s.raw, dtype=torch.float32).mean().item()}),
            (self.partial is not None, lambda s: s.partial.token_metrics(s.completions)),
            (bool(self.component_names), lambda s: _component_metrics(s, self.component_names)),
            (self.multi_turn, lambda s: episode_metrics(s.episodes)),
            (self.sampler is not None, self._feed_sampler),
            (True, lambda s: {"rollout/kept_frac": s.keep.float().mean().item()}),
        ) if on]

    def _measure(self, s: StepEpisodes) -> dict:
        """The ``rollout/*``, ``time/*`` and backend metrics of a step."""
        completions, episodes, world = s.completions, s.episodes, self.shard[1]
        lengths = torch.tensor([c.model_tokens for c in completions], dtype=torch.float32)
        count, _, std = ops.group_stats(s.scores, torch.tensor([c.prompt_index for c in completions]))
        health = check_step(episodes, kind=self.kind, name=self.task_name, policy=self.config.reward_errors, limits=self.limits,
                            total=self.reducer.sum if world > 1 else None)
        return {
            "rollout/reward": s.rewards.mean().item(),
            "rollout/score": s.scores.mean().item(),
            "rollout/accuracy": sum(s.solved) / len(s.solved),
            "rollout/response_length": lengths.mean().item(),
            "rollout/tokens": lengths.sum().item(),
            **_lengths_by_outcome(lengths, s.solved),
            "rollout/empty_frac": (lengths == 0).float().mean().item(),
            "rollout/stop_frac": sum(c.finish_reason == "stop" for c in completions) / len(completions),
            "rollout/truncated_frac": sum(truncated(e) for e in episodes) / len(episodes),
            "rollout/reward_errors": float(sum(e.error is not None for e in episodes)),
            **health,
            "rollout/groups_all_equal": ((std == 0) & (count > 1)).float().sum().item() / max(1, s.params.n),
            "time/rollout": s.timings["rollout"],
            "time/reward": s.timings["step"],
            "perf/completions_per_s": len(completions) / max(s.timings["rollout"], 1e-9),
            **{k: float(v) for k, v in s.backend_metrics.items()},
        }

    def _feed_sampler(self, s: StepEpisodes) -> dict:
        """The sampler's feedback (each prompt's mean reward, the gate's replacements too) and metrics."""
        fed, means = list(s.examples), group_means(s.episodes, len(s.examples))
        if s.gated is not None:
            more, more_means = played_feedback(s.gated.played)
            fed, means = fed + more, means + more_means
        sampling.feedback(self.sampler, step=s.step, examples=fed, rewards=means)
        return {**(s.gated.metrics if s.gated is not None else {}), **sampling.metrics(self.sampler, name=self.sampler_name)}

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

    def evaluate(self, size: int, *, samples: int = 0) -> dict:
        """Greedy accuracy and mean reward on the task's held-out split (its first ``size``
        examples); with ``samples`` = n > 0 also n sampled completions per example at the rollout
        temperature, reported as ``eval/mean@n`` and ``eval/pass@k`` (:mod:`rllab.rollout.evalmetrics`).
        The sampled draws use a fixed seed, so every evaluation of a run draws alike.

        Data parallel: rank R evaluates examples R, R + W, R + 2W, … (W the world size); the
        solved counts, reward sums and per-example pass counts are summed or gathered over the
        ranks, so every rank returns the metrics of the whole set (the sampled draws, seeded per
        request, depend on the split as they do on the batch)."""
        red = self.reducer
        examples = self.held_out()[:size][red.rank::red.world_size]
        t0 = time.perf_counter()
        episodes = self.play(examples, self.sampling_params(0, n=1, greedy=True)) if examples else []
        self.eval_episodes = episodes
        """The last evaluation's greedy episodes (this rank's share), for the ``on_eval_samples`` event."""
        rewards = [e.reward for e in episodes]
        n = red.sum(len(rewards))
        metrics = {
            "eval/accuracy": red.sum(sum(self._solved_episode(e) for e in episodes)) / n,
            "eval/reward": red.sum(float(sum(rewards))) / n,
            "eval/n": float(n),
        }
        if self.multi_turn:
            metrics["eval/turns"] = red.sum(float(sum(e.turns for e in episodes))) / n
        solved, reward = [0] * len(examples), [0.0] * len(examples)
        for e in episodes:
            solved[e.completion.prompt_index] = int(self._solved_episode(e))
            reward[e.completion.prompt_index] = float(e.reward)
        correct = None
        if samples > 0:
            params = attrs.evolve(self.sampling_params(0, n=samples), seed=seed_for(self.seed, 0, 5))
            correct = [0] * len(examples)
            for e in (self.play(examples, params) if examples else []):
                correct[e.completion.prompt_index] += self._solved_episode(e)
            metrics.update(sampled_metrics([k for share in red.gather(correct) for k in share], samples))
        self.eval_problems = {"solved": held_out_order(red.gather(solved)), "reward": held_out_order(red.gather(reward)),
                              **({"sampled_correct": held_out_order(red.gather(correct)), "samples": samples} if correct is not None else {})}
        """The last evaluation per held-out problem, in the held-out set's order: greedy ``solved``
        (0/1) and ``reward``, and with samples each problem's count of solved samples."""
        metrics["time/eval"] = time.perf_counter() - t0
        return metrics

    def _solved_episode(self, e: EpisodeResult) -> bool:
        """Whether a played episode is solved (a failed one never is)."""
        return e.error is None and self.solved(e.example, e.reward, list(e.score))


def build_stage(*, task: Any = None, env: Any = None, task_name: str = "?", env_name: str | None = None, **kw: Any) -> RolloutStage:
    """A :class:`RolloutStage` over ``task`` or ``env`` (exactly one), named ``env_name`` or
    ``task_name``; the rest of ``kw`` the stage's own arguments (``context_tokens`` the model's
    context, which an environment's episodes stay within)."""
    if (task is None) == (env is None):
        raise RllabError("a stage plays a task or an environment (env=), exactly one")
    return RolloutStage(env if task is None else task, name=env_name or task_name, **kw)


def held_out_order(shares: Sequence[Sequence]) -> list:
    """Per-rank shares of a per-example list (rank R held examples R, R + W, R + 2W, …) merged back
    into the held-out set's order."""
    W = len(shares)
    out = [None] * sum(len(s) for s in shares)
    for r, share in enumerate(shares):
        out[r::W] = list(share)
    return out


def _lengths_by_outcome(lengths: torch.Tensor, solved: Sequence[bool]) -> dict[str, float]:
    """``rollout/response_length_correct`` / ``_incorrect``: the mean response length (tokens) of
    the solved and of the unsolved samples, each logged when the step has one."""
    mask = torch.tensor(list(solved), dtype=torch.bool)
    out = {}
    for name, m in (("correct", mask), ("incorrect", ~mask)):
        if m.any():
            out[f"rollout/response_length_{name}"] = lengths[m].mean().item()
    return out
