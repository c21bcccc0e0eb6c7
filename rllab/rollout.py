"""The rollout stage: prompts → episodes (generate → decode → step) → shape → filter → batch.

Every rollout is played by the episode loop (:mod:`rllab.episodes`): a run's environment
(``env = NAME``) gives multi-turn episodes; a task (``task = NAME``) is an environment of one
turn (:class:`rllab.task_environment.TaskEnvironment`) whose step scores as below, so its batches are
the single-turn batches they always were.

One stage serves every algorithm: the RL step (:meth:`RolloutStage.sample` then
:meth:`RolloutStage.to_batch`), online DPO (the same samples, paired), offline pair building
(:meth:`RolloutStage.generate` and :meth:`RolloutStage.score`) and held-out evaluation
(:meth:`RolloutStage.evaluate`). It is data in, data out: it reads the task and asks the backend
for completions, and never changes weights (the trainer syncs them).

Scoring follows ``rollout.reward_errors``: a reward that raises or is NaN/inf stops the run with
a :class:`~rllab.errors.RewardError` naming the task, prompt and completion (``raise``), drops
the sample's whole group (``skip``) or scores it 0 (``zero``), counted as
``rollout/reward_errors``; a step whose every sample failed (or, for an environment, whose every
episode overflowed its token budget) stops the run (:mod:`rllab.episode_stats`). What "solved" means
(``rollout/accuracy``, ``eval/accuracy``) is :func:`rllab.accuracy.is_solved`: the task's own
``solved(example, reward)``, else its correctness reward component ≥ 1, else ``reward ≥ 1``.

A task may also define ``reward_batch(examples, completions, *, completion_ids) -> list`` (one
``reward`` result per pair; ``completion_ids`` the sampled token ids of each completion, its stop
token included): the stage then scores a whole step with one call (TRL-style reward functions are batched),
and calls it on each completion alone when that call raises, so that a failure is charged to its
own row.

A task with several reward components (``task.reward_components``, see :class:`rllab.types.Task`)
returns a mapping name → float; the stage checks it has exactly the declared names, keeps the
(N, K) components beside the scalar reward ``Σ_k w_k·r_k`` (``task.reward_weights``, default all
1) and logs ``reward/<name>``. A mapping with a missing or extra name, or a non-finite entry, is a
reward error like any other.
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping, Sequence

import attrs
import torch

from rllab import ops
from rllab.algorithm import seed_for
from rllab.chat import Messages, PromptRenderer, prompt_text
from rllab.algorithm import SINGLE, Reducer
from rllab.episodes import EpisodeLimits, EpisodeResult, EpisodeRunner
from rllab.errors import ConfigError, RewardError, RllabError
from rllab.evalmetrics import sampled_metrics
from rllab.episode_stats import ERROR_ADVICE, check_step, episode_metrics
from rllab.members import member
from rllab.task_environment import TaskEnvironment
from rllab.accuracy import solver
from rllab.accuracy import correct_component, solved_rule
from rllab.types import Completion, Example, RolloutBatch, SamplingParams


@attrs.frozen(kw_only=True, eq=False)
class Scored:
    """Completions with their rewards. Tensors are (N,) over the N completions, prompt-major."""

    examples: list[Example]
    completions: list[Completion]
    rewards: torch.Tensor
    """(N,) float32 rewards from the task (0 where a reward failed)."""
    scores: torch.Tensor
    """(N,) float32 rewards after shaping (DAPO's overlong penalty) — what training uses."""
    keep: torch.Tensor
    """(N,) bool: False for samples dropped by ``reward_errors = "skip"`` or dynamic sampling."""
    metrics: dict
    components: torch.Tensor | None = None
    """(N, K) float32 per-component rewards of a multi-component task (0 where a reward failed), else None."""
    component_names: tuple[str, ...] = ()
    episodes: list[EpisodeResult] | None = None
    """The environment's episodes, one per completion (None for a task's single turns)."""
    staleness: torch.Tensor | None = None
    """(N,) int64 weight versions between each completion's sampler and the trainer that takes
    the batch (asynchronous rollouts, :mod:`rllab.asyncrollout`); None: synchronous."""


class RolloutStage:
    """Generation and scoring for one run (see the module docstring).

    :param task: the task component's instance.
    :param task_name: its registered name (for error messages).
    :param env: instead of a task, an environment (:mod:`rllab.environment`), named ``env_name``
        (or ``task_name``); its episodes follow the ``[rollout]`` limits.
    :param context_tokens: the model's context length (``max_position_embeddings``): an
        environment's episode that would outgrow it ends with "overflow" (None: unbounded).
    :param backend: a :class:`rllab.types.RolloutBackend`.
    :param tokenizer: a Hugging Face tokenizer (``pad_token_id`` set).
    :param config: the run's :class:`rllab.config.RolloutConfig`.
    :param seed: the run's seed.
    :param model_name: the model, for error messages (its path, or the tiny model).

    Prompts become token ids through a :class:`rllab.chat.PromptRenderer`: strings as they are,
    chat messages with the tokenizer's chat template (and ``config.system_prompt``); sampling and
    decoding stop at EOS and at the template's end-of-turn token.
    """

    def __init__(self, *, task: Any = None, task_name: str = "?", backend: Any, tokenizer: Any, config: Any, seed: int,
                 model_name: str = "the model", reducer: Reducer = SINGLE, env: Any = None, env_name: str | None = None,
                 context_tokens: int | None = None):
        if (task is None) == (env is None):
            raise RllabError("RolloutStage takes a task or an environment (env=), exactly one")
        self.task = task
        self.env = env
        self.task_name = env_name or task_name  # for messages: the task's name or the environment's
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config
        self.seed = seed
        self.renderer = PromptRenderer(
            tokenizer, system_prompt=getattr(config, "system_prompt", None), task_name=self.task_name, model_name=model_name
        )
        self.reducer = reducer
        """The run's data-parallel ranks: a rank samples its contiguous share of each step's prompts
        and evaluates every ``world_size``-th held-out example (the counts summed over ranks)."""
        self.shard = (reducer.rank, reducer.world_size)
        self.context_tokens = context_tokens
        """The model's context length (an environment's episodes end with "overflow" before it)."""
        self.source = env if env is not None else TaskEnvironment(task, self)
        """What episodes are played on: the environment, or the task as an environment of one turn."""
        self.limits = self._limits()
        if env is None:
            correct_component(task, who=f"task {self.task_name!r}")  # an unknown name is refused before any sampling

    @property
    def kind(self) -> str:
        """``"environment"`` or ``"task"``, for messages."""
        return "task" if self.env is None else "environment"

    def _limits(self) -> EpisodeLimits:
        r = self.config
        if self.env is None:
            return EpisodeLimits(max_turns=1, max_new_tokens=r.max_new_tokens)
        turns = getattr(r, "max_turns", None)
        if turns is None:
            turns = member(self.env, "environment", "max_turns")
            if turns is None or isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
                raise ConfigError(
                    f"environment {self.task_name!r} has max_turns = {turns!r}: an episode needs a bound on its turns; give "
                    f"the environment an integer max_turns ≥ 1 or set rollout.max_turns",
                    key="max_turns",
                )
        return EpisodeLimits(
            max_turns=turns, max_new_tokens=r.max_new_tokens, max_episode_tokens=getattr(r, "max_episode_tokens", None),
            turn_limit_reward=getattr(r, "turn_limit_reward", 0.0), overflow_reward=getattr(r, "overflow_reward", 0.0),
            context_tokens=self.context_tokens,
        )

    def runner(self) -> EpisodeRunner:
        """The episode loop over this stage's environment (or task), backend and limits."""
        return EpisodeRunner(
            self.source, name=self.task_name, backend=self.backend, renderer=self.renderer, limits=self.limits,
            on_error=self.config.reward_errors, kind=self.kind,
        )

    def play(self, examples: Sequence[Example], params: SamplingParams) -> list[EpisodeResult]:
        """``params.n`` episodes per example (prompt-major) through the episode loop."""
        return self.runner().play(examples, params)

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
        return self.backend.generate([self.encode(e.prompt) for e in examples], params)

    def solved(self, example: Example, reward: float, components: Sequence[float] | None = None) -> bool:
        """Whether an answer is solved (:func:`rllab.accuracy.is_solved`; ``components`` the
        answer's reward components in the declared order, for a task that has several)."""
        return self.solver()(example, reward, components)

    def solver(self):
        """The source's notion of solved, resolved now (:func:`rllab.accuracy.solver`): a step
        resolves it once for all its samples rather than looking the members up per sample."""
        return solver(self.task if self.env is None else self.env)

    @property
    def solved_rule(self) -> str:
        """What counts as solved, in words (a run's header, ``final.json``)."""
        return solved_rule(self.task, kind="task") if self.env is None else solved_rule(self.env, kind="environment")

    @property
    def component_names(self) -> tuple[str, ...]:
        """The task's reward component names (empty for a single-reward task and for an environment)."""
        return tuple(member(self.task, "task", "reward_components")) if self.env is None else ()

    def component_weights(self) -> list[float]:
        """w_k of the scalar reward Σ_k w_k·r_k: the task's ``reward_weights``, default all 1."""
        names = self.component_names
        weights = member(self.task, "task", "reward_weights")
        weights = [1.0] * len(names) if weights is None else [float(w) for w in weights]
        if len(weights) != len(names):
            raise RewardError(
                f"task {self.task_name!r}: reward_weights has {len(weights)} entries for its {len(names)} reward "
                f"components {names!r}"
            )
        return weights

    def _batch_rewards(self, examples: Sequence[Example], texts: Sequence[str], ids: Sequence[list[int]]) -> list | None:
        """What ``task.reward_batch(examples, texts)`` returns for every completion at once, when the
        task defines it (reward functions in TRL's batched signature are then called once per step);
        None when it does not, or when the batch call fails — each completion is then scored alone,
        so a failure is charged to its own row under ``reward_errors``."""
        batch = member(self.task, "task", "reward_batch")
        if batch is None or not texts:
            return None
        try:
            out = list(batch(list(examples), list(texts), completion_ids=[list(i) for i in ids]))
        except Exception:
            return None
        return out if len(out) == len(texts) else None

    def _reward(self, ex: Example, text: str, names: tuple[str, ...], weights: list[float], given: Any = None) -> tuple[float, list[float]]:
        """(scalar reward, component values) of one completion (``given``: what the batch call
        returned for it); raises on a malformed reward."""
        out = self.task.reward(ex, text) if given is None else given
        if not names:
            r = float(out)
            if not math.isfinite(r):
                raise ValueError(f"returned {r}")
            return r, []
        if not isinstance(out, Mapping):
            raise TypeError(f"returned {type(out).__name__}, not a mapping of its reward components {names!r}")
        if set(out) != set(names):
            missing, extra = sorted(set(names) - set(out)), sorted(set(out) - set(names))
            raise ValueError(f"returned components {sorted(out)!r}; missing {missing!r}, unexpected {extra!r} (declared {names!r})")
        values = [float(out[n]) for n in names]
        bad = [n for n, v in zip(names, values) if not math.isfinite(v)]
        if bad:
            raise ValueError(f"returned non-finite components {bad!r}: {dict(zip(names, values))!r}")
        return sum(w * v for w, v in zip(weights, values)), values

    def score(self, examples: Sequence[Example], completions: Sequence[Completion]) -> tuple[list[float], list[bool], int]:
        """Rewards for each completion; returns (rewards, keep, n_errors) under ``reward_errors``."""
        rewards, _, keep, errors = self.score_components(examples, completions)
        return rewards, keep, errors

    def score_components(
        self, examples: Sequence[Example], completions: Sequence[Completion]
    ) -> tuple[list[float], list[list[float]], list[bool], int]:
        """As :meth:`score`, with each completion's reward components (empty lists for a
        single-reward task; zeros where a reward failed): ``(rewards, components, keep, n_errors)``."""
        policy = self.config.reward_errors
        names = self.component_names
        rewards, comps, keep, errors = [], [], [], 0
        texts = [self.decode(c) for c in completions]
        rows = [examples[c.prompt_index] for c in completions]
        for ex, text, row in zip(rows, texts, self.score_rows(rows, texts, [list(c.token_ids) for c in completions])):
            if isinstance(row, BaseException):
                if policy == "raise":
                    raise RewardError(f"{self.reward_error_message(ex, text, row)} {ERROR_ADVICE}") from None
                errors += 1
                rewards.append(0.0)
                comps.append([0.0] * len(names))
                keep.append(policy == "zero")
                continue
            rewards.append(row[0])
            comps.append(row[1])
            keep.append(True)
        return rewards, comps, keep, errors

    def score_rows(self, examples: Sequence[Example], texts: Sequence[str], ids: Sequence[list[int]] | None) -> list:
        """Per row (``examples[i]`` answered by ``texts[i]``, sampled as ``ids[i]``): the task's
        ``(scalar reward, component values)``, or the exception its reward raised (malformed or
        non-finite rewards included). The batched ``reward_batch`` is tried first."""
        names = self.component_names
        weights = self.component_weights()
        if ids is None:
            ids = [list(self.tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
        batched = self._batch_rewards(examples, texts, ids)
        one_by_one = member(self.task, "task", "reward_batch") if batched is None else None
        out: list = []
        for i, (ex, text) in enumerate(zip(examples, texts)):
            try:
                given = batched[i] if batched is not None else None
                if one_by_one is not None:  # the batch call failed: each row alone, so the failure is its own
                    given = one_by_one([ex], [text], completion_ids=[list(ids[i])])[0]
                out.append(self._reward(ex, text, names, weights, given))
            except Exception as e:
                out.append(e)
        return out

    def reward_error_message(self, example: Example, text: str | None, e: BaseException) -> str:
        """What a task's failed reward was: the task, the prompt, the completion and the error."""
        return (
            f"reward of task {self.task_name!r} failed on prompt {prompt_text(example.prompt)!r} with completion {text!r}: "
            f"{type(e).__name__}: {e}."
        )

    def overlong_penalty(self, completions: Sequence[Completion]) -> torch.Tensor:
        """DAPO's soft overlong punishment: linear from 0 to −penalty over the last ``buffer``
        tokens, counting the model's tokens only (an episode's observations are not its length)."""
        r = self.config
        lengths = torch.tensor([c.model_tokens for c in completions], dtype=torch.float32)
        if r.overlong_buffer <= 0:
            return torch.zeros_like(lengths)
        expected = r.max_new_tokens - r.overlong_buffer
        return -((lengths - expected).clamp(min=0) / r.overlong_buffer) * r.overlong_penalty

    def sample(self, step: int, *, prompts: int | None = None, group_size: int | None = None) -> Scored:
        """Draw a step's prompts, play a group of episodes for each, score, shape and filter them."""
        r = self.config
        P = prompts or r.prompts_per_step
        G = group_size or r.group_size
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(seed_for(self.seed, step, 0))
        examples = self.source.train_examples(P, gen)
        rank, world = self.shard
        if world > 1:  # data parallel: this rank's contiguous share of the step's prompts (whole groups)
            examples = examples[rank * P // world:(rank + 1) * P // world]
        runner = self.runner()
        episodes = runner.play(examples, self.sampling_params(step, n=G))
        backend_metrics = runner.backend_metrics
        completions = [e.completion for e in episodes]
        t_step = runner.timings["step"]
        t1 = time.perf_counter() - t_step
        t2 = t1 + t_step
        names = self.component_names
        raw = [e.reward for e in episodes]
        errors = sum(e.error is not None for e in episodes)
        keep = [e.error is None or r.reward_errors == "zero" for e in episodes]
        comps = [list(getattr(e.episode, "components", None) or [0.0] * len(names)) if e.error is None else [0.0] * len(names)
                 for e in episodes]
        rewards = torch.tensor(raw, dtype=torch.float32)
        components = torch.tensor(comps, dtype=torch.float32).reshape(len(raw), len(names)) if names else None
        true_reward, true_components = rewards.mean().item(), components
        if r.random_reward != "off":  # the spurious-rewards control: training sees draws blind to the answers
            rewards, components = self.random_rewards(step, completions, raw, keep, rank * P // world), None
        scores = rewards + self.overlong_penalty(completions)
        index = torch.tensor([c.prompt_index for c in completions])
        keep_t = torch.tensor(keep, dtype=torch.bool)
        if errors and r.reward_errors == "skip":  # drop the whole group of a failed sample
            keep_t &= ~torch.isin(index, index[~keep_t].unique())
        lengths = torch.tensor([c.model_tokens for c in completions], dtype=torch.float32)
        count, _, std = ops.group_stats(scores, index)
        all_equal = (std == 0) & (count > 1)
        health = check_step(episodes, kind=self.kind, name=self.task_name, policy=r.reward_errors, limits=self.limits,
                            total=self.reducer.sum if world > 1 else None)
        solved_fn = self.solver()
        solved = [e.error is None and solved_fn(examples[c.prompt_index], x, k)
                  for e, c, x, k in zip(episodes, completions, raw, comps)]
        metrics = {
            "rollout/reward": rewards.mean().item(),
            "rollout/score": scores.mean().item(),
            "rollout/accuracy": sum(solved) / len(solved),
            "rollout/response_length": lengths.mean().item(),
            "rollout/tokens": lengths.sum().item(),
            **_lengths_by_outcome(lengths, solved),
            "rollout/empty_frac": (lengths == 0).float().mean().item(),
            "rollout/stop_frac": sum(c.finish_reason == "stop" for c in completions) / len(completions),
            "rollout/reward_errors": float(errors),
            **health,
            "rollout/groups_all_equal": all_equal.float().sum().item() / max(1, G),
            "time/rollout": t1 - t0,
            "time/reward": t2 - t1,
            "perf/completions_per_s": len(completions) / max(t1 - t0, 1e-9),
            **{k: float(v) for k, v in backend_metrics.items()},
        }
        if r.random_reward != "off":
            metrics["rollout/true_reward"] = true_reward
        for k, name in enumerate(names):
            metrics[f"reward/{name}"] = true_components[:, k].mean().item()
        if self.env is not None:
            metrics.update(episode_metrics(episodes))
        if r.dynamic_sampling:
            keep_t &= ~all_equal
        metrics["rollout/kept_frac"] = keep_t.float().mean().item()
        return Scored(
            examples=examples, completions=completions, rewards=rewards, scores=scores, keep=keep_t, metrics=metrics,
            components=components, component_names=names, episodes=episodes if self.env is not None else None,
        )

    def random_rewards(self, step: int, completions: Sequence[Completion], raw: Sequence[float], keep: Sequence[bool], offset: int) -> torch.Tensor:
        """(N,) float32: ``rollout.random_reward``'s Bernoulli draws (:func:`rllab.rewards.random_rewards`),
        prompts numbered over the whole step (``offset``: this rank's first); ``matched`` takes p
        from the mean task reward of the samples whose reward did not fail."""
        from rllab.rewards import random_rewards

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

    def to_batch(self, scored: Scored) -> RolloutBatch | None:
        """The kept completions as a padded :class:`RolloutBatch` (None when nothing is kept)."""
        kept = [c for c, k in zip(scored.completions, scored.keep.tolist()) if k]
        if not kept:
            return None
        comps = None if scored.components is None else scored.components[scored.keep]
        token_scores = turns = None
        if scored.episodes is not None:  # per-turn rewards on each turn's last model token, shaping on the last
            shaping = (scored.scores - scored.rewards).tolist()
            token_scores, turns = [], []
            for e, extra, k in zip(scored.episodes, shaping, scored.keep.tolist()):
                if not k:
                    continue
                placed = list(e.token_rewards)
                model = e.completion.model_mask or (True,) * len(placed)
                last = max((i for i, m in enumerate(model) if m), default=-1)
                if last >= 0:
                    placed[last] += extra
                token_scores.append(placed)
                turns.append(e.turns)
        batch = RolloutBatch.from_completions(
            kept, scored.scores[scored.keep], pad_token_id=self.tokenizer.pad_token_id,
            reward_components=comps, reward_component_names=scored.component_names,
            reward_component_weights=None if comps is None else self.component_weights(),
            token_scores=token_scores, turns=turns,
        )
        return batch if scored.staleness is None else attrs.evolve(batch, staleness=scored.staleness[scored.keep])

    def evaluate(self, size: int, *, samples: int = 0) -> dict:
        """Greedy accuracy and mean reward on the task's held-out split (its first ``size``
        examples); with ``samples`` = n > 0 also n sampled completions per example at the rollout
        temperature, reported as ``eval/mean@n`` and ``eval/pass@k`` (:mod:`rllab.evalmetrics`).
        The sampled draws use a fixed seed, so every evaluation of a run draws alike.

        Data parallel: rank R evaluates examples R, R + W, R + 2W, … (W the world size); the
        solved counts, reward sums and per-example pass counts are summed or gathered over the
        ranks, so every rank returns the metrics of the whole set (the sampled draws, seeded per
        request, depend on the split as they do on the batch)."""
        red = self.reducer
        examples = self.source.eval_examples()[:size][red.rank::red.world_size]
        t0 = time.perf_counter()
        episodes = self.play(examples, self.sampling_params(0, n=1, greedy=True)) if examples else []
        rewards = [e.reward for e in episodes]
        n = red.sum(len(rewards))
        metrics = {
            "eval/accuracy": red.sum(sum(self._solved_episode(e) for e in episodes)) / n,
            "eval/reward": red.sum(float(sum(rewards))) / n,
            "eval/n": float(n),
        }
        if self.env is not None:
            metrics["eval/turns"] = red.sum(float(sum(e.turns for e in episodes))) / n
        if samples > 0:
            params = attrs.evolve(self.sampling_params(0, n=samples), seed=seed_for(self.seed, 0, 5))
            correct = [0] * len(examples)
            for e in (self.play(examples, params) if examples else []):
                correct[e.completion.prompt_index] += self._solved_episode(e)
            metrics.update(sampled_metrics([k for share in red.gather(correct) for k in share], samples))
        metrics["time/eval"] = time.perf_counter() - t0
        return metrics

    def _solved_episode(self, e: EpisodeResult) -> bool:
        """Whether a played episode is solved (a failed one never is)."""
        return e.error is None and self.solved(e.example, e.reward, getattr(e.episode, "components", None))


def _lengths_by_outcome(lengths: torch.Tensor, solved: Sequence[bool]) -> dict[str, float]:
    """``rollout/response_length_correct`` / ``_incorrect``: the mean response length (tokens) of
    the solved and of the unsolved samples, each logged when the step has one."""
    mask = torch.tensor(list(solved), dtype=torch.bool)
    out = {}
    for name, m in (("correct", mask), ("incorrect", ~mask)):
        if m.any():
            out[f"rollout/response_length_{name}"] = lengths[m].mean().item()
    return out
