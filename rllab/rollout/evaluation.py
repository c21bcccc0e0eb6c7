"""The rollout stage's held-out evaluation (:class:`HeldOutEvaluation`, a part of
:class:`rllab.rollout.stage.RolloutStage`).

:meth:`HeldOutEvaluation.evaluate` plays the held-out split greedily (and, with samples, at the
rollout temperature) and scores it: ``eval/accuracy``, ``eval/reward``, ``eval/n``, the source's
own measures, ``eval/mean@n`` and ``eval/pass@k`` (:mod:`rllab.rollout.evalmetrics`), and the
per-problem record the trainer writes to ``eval_problems.jsonl``. :meth:`HeldOutEvaluation.evaluate_sampled`
is the same in two parts, sampled then scored, which a stage that is
:meth:`HeldOutEvaluation.scored_elsewhere` may score in another thread.
"""

from __future__ import annotations

import time

import attrs

from rllab.algorithm import seed_for
from rllab.rollout.episodes import EpisodeResult
from rllab.rollout.evalmetrics import held_out_order, sampled_metrics
from rllab.types import SamplingParams


class HeldOutEvaluation:
    """The evaluation of a :class:`~rllab.rollout.stage.RolloutStage`, which holds what it reads:
    ``env``, ``limits``, ``reducer``, ``reporting``, ``seed``, ``samples_ahead``, and its
    ``held_out``, ``sampling_params``, ``runner``, ``play`` and ``solved``."""

    def evaluate(self, size: int, *, samples: int = 0) -> dict:
        """Greedy accuracy and mean reward on the task's held-out split (its first ``size``
        examples); with ``samples`` = n > 0 also n sampled completions per example at the rollout
        temperature, reported as ``eval/mean@n`` and ``eval/pass@k`` (:mod:`rllab.rollout.evalmetrics`).
        The sampled draws use a fixed seed, so every evaluation of a run draws alike.

        Data parallel: rank R evaluates examples R, R + W, R + 2W, … (W the world size); the
        solved counts, reward sums and per-example pass counts are summed or gathered over the
        ranks, so every rank returns the metrics of the whole set (the sampled draws, seeded per
        request, depend on the split as they do on the batch)."""
        return self.evaluate_sampled(size, samples=samples, detached=False)()

    def scored_elsewhere(self) -> bool:
        """Whether an evaluation's answers may be scored in another thread while this stage samples
        on (:meth:`evaluate_sampled` with ``detached``): a source of one turn whose rewards say they
        may be called from any thread (:attr:`rllab.rollout.rewards.RewardSet.says_scores`, as a
        reward service's), in one process (an evaluation's sums are collectives)."""
        rewards = getattr(self.env, "rewards", None)
        return (self.limits.max_turns == 1 and self.reducer.world_size == 1 and not self.samples_ahead
                and getattr(rewards, "says_scores", False) is True)

    def evaluate_sampled(self, size: int, *, samples: int = 0, detached: bool = True):
        """:meth:`evaluate` in two parts: the answers sampled now (the backend's work, in the
        caller's thread), and the returned function, which scores them and gives the metrics
        :meth:`evaluate` gives, value for value. With ``detached`` (a stage that is
        :meth:`scored_elsewhere`) that function touches neither the backend nor the tokenizer, so
        it may run in another thread while the caller samples the next step's answers."""
        red = self.reducer
        examples = self.held_out()[:size][red.rank::red.world_size]
        t0 = time.perf_counter()

        def played(params: SamplingParams):
            if not examples:
                return lambda: []
            if detached:
                return self.runner().play_sampled(examples, params)
            return lambda: self.play(examples, params)

        greedy = played(self.sampling_params(0, n=1, greedy=True))
        if samples > 0 and detached:
            sampled = played(attrs.evolve(self.sampling_params(0, n=samples), seed=seed_for(self.seed, 0, 5)))
        return lambda: self._evaluated(examples, greedy, samples, sampled if samples > 0 and detached else None, t0)

    def _evaluated(self, examples: list, greedy, samples: int, sampled, t0: float) -> dict:
        red = self.reducer
        episodes = greedy()
        self.eval_episodes = episodes
        """The last evaluation's greedy episodes (this rank's share), for the ``on_eval_samples`` event."""
        rewards = [e.reward for e in episodes]
        n = red.sum(len(rewards))
        metrics = {
            "eval/accuracy": red.sum(sum(self._solved_episode(e) for e in episodes)) / n,
            "eval/reward": red.sum(float(sum(rewards))) / n,
            "eval/n": float(n),
        }
        metrics.update(self.reporting.evaluated(episodes, red, n))
        solved, reward = [0] * len(examples), [0.0] * len(examples)
        for e in episodes:
            solved[e.completion.prompt_index] = int(self._solved_episode(e))
            reward[e.completion.prompt_index] = float(e.reward)
        correct = None
        if samples > 0:
            params = attrs.evolve(self.sampling_params(0, n=samples), seed=seed_for(self.seed, 0, 5))
            correct = [0] * len(examples)
            for e in (sampled() if sampled is not None else self.play(examples, params) if examples else []):
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
