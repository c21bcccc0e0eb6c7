"""The warm start: supervised fine-tuning of a model on a task's demonstrations, so that RL starts
from a policy that is sometimes right, stopping once a greedy probe reaches its target accuracy
(:func:`warm_start`; the demonstration encoding, loss and greedy evaluation it uses are
:mod:`rllab.models.supervised`'s). :func:`rllab.models.tiny.get_or_build` runs it on a fresh tiny
model and caches the result; these names are importable from :mod:`rllab.models.tiny` as well."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import torch

from rllab.rollout.chat import PromptRenderer
from rllab.rollout.single_turn import kind_of
from rllab.models.supervised import ProbeScores, demonstration_loss, evaluate_greedy, greedy_answers, solved_rates
from rllab.models.tinyconfig import WarmStartConfig
from rllab.models.progress import warm_start_progress


class torch_threads:
    """Run a block with ``torch.set_num_threads(n)`` (no change when ``n`` is None), then restore."""

    def __init__(self, n: int | None):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        if self.n is not None and self.n != self.before:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        if torch.get_num_threads() != self.before:
            torch.set_num_threads(self.before)


def count_parameters(model) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def warm_start(
    model, tokenizer, task, config: WarmStartConfig = WarmStartConfig(), *, progress: bool = False,
    renderer: PromptRenderer | None = None, prompt_limits: Any = None, held_out: list | None = None,
) -> dict:
    """Fine-tune ``model`` in place on ``task.demonstration`` completions of training prompts
    (for an environment, on its demonstration episodes, :func:`rllab.rollout.demonstrations.encode_episodes`: the loss covers
    the model's turns, not the observations; the probe plays greedy episodes).

    Each step draws ``batch_size`` fresh training examples with a generator seeded by
    ``config.seed`` and minimises the mean cross-entropy of ``completion + <eos>`` given
    ``<bos> prompt`` (prompt tokens carry no loss; chat prompts are rendered by ``renderer``, as
    in :func:`encode_demonstrations`); AdamW with a linear warm-up, then a
    constant learning rate. Every ``check_every`` steps the greedy accuracy on a fixed probe of
    ``probe_size`` training examples is measured; training stops once it reaches
    ``target_accuracy`` (or after ``steps`` steps).

    :returns: metrics ``warm/steps`` (steps run), ``warm/loss_first``, ``warm/loss`` (mean of
        the last ``check_every`` steps), ``warm/probe_accuracy``, ``warm/eval_accuracy``
        (greedy, on up to ``eval_limit`` held-out examples), ``warm/train_seconds``,
        ``warm/seconds``, ``warm/parameters``.

    Its prompts are those ``prompt_limits`` (a checked :class:`rllab.rollout.prompt_limits.PromptLimits`
    of ``task``) keep, when given.

    ``held_out``, a list: when the task's rewards may be called from any thread (a reward
    service's, :attr:`rllab.rollout.rewards.RewardSet.says_scores`), the held-out evaluation's
    answers are sampled here but not waited for: a function that scores them and gives
    ``{"warm/eval_accuracy": ...}`` is appended to the list instead (it touches neither model nor
    tokenizer, so it may run in another thread while the model is saved and trained). So is one
    giving ``{"warm/probe_accuracy": ...}`` when the last probe is known to reach the target (or,
    at the last step, to stay below it) while some of its answers are still out: the warm start
    returns without waiting for them, and the progress bar says where the probe stands.
    """
    with torch_threads(config.num_threads):
        return _warm_start(model, tokenizer, task, config, progress, renderer or PromptRenderer(tokenizer), prompt_limits,
                           held_out)


def scored_anywhere(task: Any) -> bool:
    """Whether ``task``'s rewards may be called from any thread (a reward service's:
    :attr:`rllab.rollout.rewards.RewardSet.says_scores`)."""
    return getattr(getattr(task, "rewards", None), "says_scores", False) is True


PROBES_AHEAD = 3
"""Probes whose answers the warm start may hold, taken and waiting to be scored, besides the one
being scored, while it trains towards the next: at most ``PROBES_AHEAD + 1`` probe intervals are
trained ahead, and undone when a probe ends the warm start (their answers are never scored)."""


class TrainAhead:
    """Iterates a generator in a thread of its own, at most ``depth`` items ahead of the
    consumer: the warm start trains on (and takes its next probes' answers) while the caller
    scores a probe. :meth:`stop` ends the thread at its next item (or sooner, when the generator
    watches ``halt``, the event :meth:`stop` sets); an error in it is raised to the caller where
    the item would have come."""

    def __init__(self, items, depth: int, halt=None):
        import queue
        import threading

        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.halt = threading.Event() if halt is None else halt

        def run():
            try:
                for item in items:
                    while not self.halt.is_set():
                        try:
                            self.queue.put(("item", item), timeout=0.05)
                            break
                        except queue.Full:
                            continue
                    if self.halt.is_set():
                        return
                self.queue.put(("end", None))
            except BaseException as e:  # raised in the caller's thread by __iter__
                self.queue.put(("error", e))

        self.thread = threading.Thread(target=run, name="warm-start", daemon=True)
        self.thread.start()

    def __iter__(self):
        while True:
            kind, value = self.queue.get()
            if kind == "end":
                self.thread.join()
                return
            if kind == "error":
                self.thread.join()
                raise value
            yield value

    def stop(self) -> None:
        """End the thread (what it is doing finishes first) and wait for it."""
        import queue

        self.halt.set()
        while self.thread.is_alive():
            try:
                self.queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self.thread.join()


def _warm_start(model, tokenizer, task, config: WarmStartConfig, progress: bool, renderer: PromptRenderer,
                limits: Any = None, held_out: list | None = None) -> dict:
    t0 = time.perf_counter()
    draw = task.train_examples if limits is None else limits.draw  # the prompts the run's limits keep
    kind = kind_of(task)  # how its demonstrations are encoded (its probes: greedy_answers)
    metrics: dict[str, Any] = {"warm/steps": 0, "warm/parameters": count_parameters(model)}
    rng = torch.Generator().manual_seed(config.seed)
    probe = draw(config.probe_size, torch.Generator().manual_seed(config.seed + 1))
    losses: list[float] = []
    scores = ProbeScores(task, probe, renderer)  # the probes' rewards: an answer that did not change is not scored again
    last = None  # the last probe taken: (its step, its ProbeScores.Probe, its verdict)
    later = held_out is not None and scored_anywhere(task) and config.target_accuracy is not None
    """Whether the last probe's value may come after the warm start returns (``held_out``)."""
    bar = contextlib.ExitStack()  # the progress bar, open until the last probe's accuracy (or, not waited for, its verdict) is shown
    if config.steps > 0:
        model.train()
        opt = torch.optim.AdamW(
            model.parameters(), lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay
        )
        warmup = max(1, config.warmup_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup))

        def train_step(step: int) -> None:
            examples = draw(config.batch_size, rng)
            loss = demonstration_loss(model, *kind.demonstrations(tokenizer, task, examples, renderer))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            opt.step()
            sched.step()
            losses.append(loss.item())

        halt = threading.Event()  # set once a probe ends the warm start: what is trained ahead stops at once

        def probes():
            """Train, and at each probe step take the probe's greedy answers: yields (step, the
            answers, the weights then, or None at the last step)."""
            for step in range(1, config.steps + 1):
                if halt.is_set():
                    return
                train_step(step)
                if halt.is_set():
                    return
                if step % config.check_every == 0 or step == config.steps:
                    answers = greedy_answers(model, tokenizer, task, probe, config.eval_max_new_tokens, renderer)
                    saved = {k: v.detach().clone() for k, v in model.state_dict().items()} if step < config.steps else None
                    yield step, answers, saved
                else:
                    advance(step, losses[-1], None)

        shows = warm_start_progress(progress, config.steps, config.target_accuracy)
        advance = bar.enter_context(shows)
        shown: list = []  # probes taken whose accuracy the bar has not shown: (steps trained then, the loss then, the probe)

        def show(every: bool) -> None:
            """The probes' accuracies on the bar, in order, as far as they are scored (``every``: waiting for them)."""
            while shown and (every or shown[0][2].finished):
                at, loss, p = shown.pop(0)
                advance(at, loss, p.accuracy())

        ahead = TrainAhead(probes(), depth=PROBES_AHEAD, halt=halt)
        try:
            for step, answers, saved in ahead:
                # scored while the next steps train, in a thread of its own once the reward has said a
                # score (a reward service's answers then cost no training time); the next probe's
                # answers are sent as soon as this one is sure to stay below the target, its slowest
                # answers still out, and none of a probe after the one that ends the warm start
                p = scores.submit(answers)
                verdict = p.verdict(config.target_accuracy)
                if verdict == "done" and config.target_accuracy is not None:
                    verdict = "reached" if p.accuracy() >= config.target_accuracy else "below"
                last = (step, p, verdict)
                if verdict == "reached":
                    ahead.stop()
                    if saved is not None:  # the steps trained ahead are undone: the model is the one probed
                        model.load_state_dict(saved)
                        del losses[step:]
                    shown.append((step, losses[-1], p))
                    break
                shown.append((len(losses), losses[-1], p))
                show(every=False)
        except BaseException as e:  # the bar closes on the way out, as a with block would close it
            bar.__exit__(type(e), e, e.__traceback__)
            raise
        finally:
            ahead.stop()
        model.eval()
        tail = losses[-config.check_every :]
        metrics["warm/loss_first"] = losses[0]
        metrics["warm/loss"] = sum(tail) / len(tail)
    with bar:
        metrics["warm/train_seconds"] = time.perf_counter() - t0
        examples = (task.eval_examples() if limits is None else limits.held_out())[:config.eval_limit]
        if config.eval_limit > 0 and held_out is not None and examples and kind.one_response and scored_anywhere(task):
            answers = greedy_answers(model, tokenizer, task, examples, config.eval_max_new_tokens, renderer)
            held_out.append(lambda: {"warm/eval_accuracy": solved_rates(task, examples, [answers], None, renderer)[0]})
        elif config.eval_limit > 0:  # while the last probe's slowest answers are still out
            metrics["warm/eval_accuracy"] = evaluate_greedy(
                model, tokenizer, task, limit=config.eval_limit, max_new_tokens=config.eval_max_new_tokens, renderer=renderer,
                examples=None if limits is None else limits.held_out(),
            )
        if last is not None:
            step, p, verdict = last
            metrics["warm/steps"] = step
            if later and not p.finished:  # its verdict is known: its value comes with its last scores
                show(every=False)
                shows.pending(step, losses[step - 1], verdict)
                held_out.append(lambda: {"warm/probe_accuracy": p.accuracy()})
            else:
                show(every=True)
                metrics["warm/probe_accuracy"] = p.accuracy()
    metrics["warm/seconds"] = time.perf_counter() - t0
    return metrics
