"""Reward functions: load the ones users already have, call them, check what they return.

A reward function is named in a config by one of three references::

    "math_verify"                       a registered reward_function (see rllab.hookspecs)
    "my_pkg.rewards:accuracy"           module:function, imported from the Python path
    "path/to/rewards.py:accuracy"       a file and a function in it (no packaging needed)

and follows one of the two signatures people write for TRL and verl:

``trl``  ``fn(prompts, completions, **columns) -> list[float | None]`` — batched. ``prompts`` (N,)
         strings, or message lists (``[{"role", "content"}, ...]``) for chat prompts;
         ``completions`` (N,) strings for string prompts, ``[{"role": "assistant", "content":
         text}]`` for chat prompts, exactly as TRL passes them; ``columns`` the data set's other
         columns as (N,) lists, plus ``ground_truth`` (the reference answers) when the data set has
         no column of that name, and ``completion_ids`` (the sampled token ids) when the rollout
         stage scores a step; TRL's ``trainer_state`` is not passed. A function without
         ``**kwargs`` receives only the columns it names. ``None`` means "not
         applicable" and scores 0 (TRL sums with ``nansum``).
``verl`` ``compute_score(data_source, solution_str, ground_truth, extra_info)`` — one row; returns
         a number or a dict whose ``"score"`` is the reward.

The signature of a registered function is its ``signature`` trait; a loaded function's is read
from its parameters: ``verl`` when it has a parameter ``solution_str``, else ``trl``.

:class:`RewardSet` combines K functions with weights (TRL's ``reward_weights``): one function
gives a scalar reward ``w·r``; two or more give K named components (the function names) that the
rollout stage sums as ``Σ_k w_k·r_k`` and that ``gdpo`` / ``normalize_then_sum`` normalise one by
one. A function that raises, returns NaN/inf, the wrong number of values or a value that is not a
number raises :class:`RewardFunctionError`, naming the function and the row; the rollout stage
then follows ``rollout.reward_errors``.

A reward function that learns its rows' scores one at a time (one that asks a service, row by
row) may say each as it comes with :func:`report_score`; a caller that listens
(:func:`scores_as_known`, e.g. the warm start, which may send its next probe once this one cannot
end it) hears it before the call returns. What is said must be what the call returns for that row.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import inspect
import json
import math
import numbers
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import attrs

from rllab.errors import ConfigError, MissingExtraError, RllabError

STYLES = ("trl", "verl")

_LAB: contextvars.ContextVar = contextvars.ContextVar("rllab_reward_lab", default=None)


@contextlib.contextmanager
def resolving_with(lab: Any):
    """Within the block, registered reward-function names are looked up in ``lab`` (the run's,
    with its ``--plugin`` and config plugins) when no lab is passed explicitly."""
    token = _LAB.set(lab)
    try:
        yield
    finally:
        _LAB.reset(token)


_SCORES: contextvars.ContextVar = contextvars.ContextVar("rllab_reward_scores", default=None)


@contextlib.contextmanager
def scores_as_known(listener: Callable[[int, Any], None] | None):
    """Within the block, ``listener(row, score)`` hears each score a reward function says with
    :func:`report_score` as soon as it is known (``row``: its index in the call, the score the one
    the call will return for it); a row may be said nothing, its score then comes with the call's
    return. None: nobody listens (within a listening block too)."""
    token = _SCORES.set(listener)
    try:
        yield
    finally:
        _SCORES.reset(token)


def report_score(row: int, score: Any) -> None:
    """Say row ``row``'s score (its index in this call of the reward function) before the call
    returns, to a caller that listens (:func:`scores_as_known`); nothing when none does. Say only
    the score the call will return for that row.

    A function that says every row's score this way and may be called from any thread (as
    ``remote`` and ``llm_judge``) declares it with ``fn.says_scores = True``: a caller then
    scores it in a thread of its own from the first call (:attr:`RewardSet.says_scores`)."""
    listener = _SCORES.get()
    if listener is not None:
        listener(row, score)


class RewardFunctionError(RllabError, ValueError):
    """A reward function raised, or returned something that is not a finite score per row."""


def reward_name(ref: str) -> str:
    """The name a reference is logged under: the function's name for ``module:fn`` and
    ``file.py:fn``, the registered name otherwise."""
    return ref.rsplit(":", 1)[1] if ":" in ref else ref


def reward_names(refs: Sequence[str]) -> tuple[str, ...]:
    """One distinct name per reference (a repeated name gets ``_2``, ``_3``, ...)."""
    out: list[str] = []
    for ref in refs:
        base = reward_name(ref)
        name, k = base, 1
        while name in out:
            k += 1
            name = f"{base}_{k}"
        out.append(name)
    return tuple(out)


def style_of(fn: Callable, who: str) -> str:
    """``"verl"`` for a function with a ``solution_str`` parameter, ``"trl"`` for one that takes
    ``completions`` (or ``**kwargs``); anything else is refused."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "trl"
    if "solution_str" in params:
        return "verl"
    if "completions" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return "trl"
    raise ConfigError(
        f"{who}: takes ({', '.join(params)}), which is neither TRL's fn(prompts, completions, **kwargs) nor "
        f"verl's compute_score(data_source, solution_str, ground_truth, extra_info)"
    )


@attrs.frozen(kw_only=True)
class RewardFunction:
    """One loaded reward function."""

    name: str
    """Its name in logs and errors (``reward/<name>`` with several functions)."""
    ref: str
    """The reference the config gave."""
    fn: Callable
    style: str = attrs.field(validator=attrs.validators.in_(STYLES))
    config: Any = None
    """A registered function's frozen config (passed as ``config=``); None for a loaded one."""

    def _kwargs(self, kwargs: dict) -> dict:
        if self.config is not None:
            kwargs["config"] = self.config
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return kwargs
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return kwargs
        return {k: v for k, v in kwargs.items() if k in params}

    def batch(
        self, *, prompts: Sequence[Any], completions: Sequence[str], ground_truth: Sequence[Any],
        columns: Sequence[Mapping[str, Any]], rows: Sequence[str], completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[float | None]:
        """N scores (None: not applicable) for N completions; raises :class:`RewardFunctionError`.

        :param prompts: (N,) prompt strings or message sequences.
        :param completions: (N,) decoded completion texts.
        :param ground_truth: (N,) reference answers.
        :param columns: (N,) the other columns of each row.
        :param rows: (N,) where each row comes from, for errors (``"data.jsonl row 12"``).
        :param completion_ids: (N,) the sampled token ids, passed to TRL-style functions as
            ``completion_ids`` when given.
        """
        n = len(completions)
        if self.style == "verl":
            with scores_as_known(None):  # one row a call: its row 0 is not the batch's
                return [self._verl(prompts[i], completions[i], ground_truth[i], columns[i], rows[i]) for i in range(n)]
        chat = [not isinstance(p, str) for p in prompts]
        kwargs: dict[str, Any] = {
            "prompts": [[dict(m) for m in p] if c else p for p, c in zip(prompts, chat)],
            "completions": [[{"role": "assistant", "content": t}] if c else t for t, c in zip(completions, chat)],
        }
        keys = list(dict.fromkeys(k for cols in columns for k in cols))
        for key in keys:
            if key not in ("prompts", "completions", "prompt", "completion"):
                kwargs[key] = [cols.get(key) for cols in columns]
        kwargs.setdefault("ground_truth", list(ground_truth))
        if completion_ids is not None:
            kwargs["completion_ids"] = [list(ids) for ids in completion_ids]
        where = f"reward function {self.name!r} ({self.ref})"
        try:
            out = self.fn(**self._kwargs(kwargs))
        except MissingExtraError:
            raise  # its package is not installed: no row can score, and nothing to skip
        except Exception as e:
            if n == 1:
                raise RewardFunctionError(f"{where} raised on {rows[0]}: {type(e).__name__}: {e}") from e
            for i in range(n):  # find the row: score each alone (what it says of its row 0 is not row 0's)
                one = {k: v[i : i + 1] if isinstance(v, list) else v for k, v in kwargs.items()}
                try:
                    with scores_as_known(None):
                        self.fn(**self._kwargs(one))
                except Exception as e1:
                    raise RewardFunctionError(f"{where} raised on {rows[i]}: {type(e1).__name__}: {e1}") from e1
            raise RewardFunctionError(f"{where} raised on a batch of {n} rows: {type(e).__name__}: {e}") from e
        if isinstance(out, (str, bytes, Mapping)) or not hasattr(out, "__len__"):
            raise RewardFunctionError(f"{where} returned {type(out).__name__}, not a list of {n} floats (rows: {rows[0]}…)")
        out = list(out)
        if len(out) != n:
            raise RewardFunctionError(f"{where} returned {len(out)} values for {n} completions (rows: {rows[0]}…)")
        return [_number(v, where, rows[i]) for i, v in enumerate(out)]

    def _verl(self, prompt, text, ground_truth, cols: Mapping[str, Any], row: str) -> float | None:
        where = f"reward function {self.name!r} ({self.ref})"
        kwargs = {
            "data_source": cols.get("data_source"),
            "solution_str": text,
            "ground_truth": ground_truth,
            "extra_info": cols.get("extra_info"),
        }
        try:
            out = self.fn(**self._kwargs(kwargs))
        except MissingExtraError:
            raise  # its package is not installed: no row can score, and nothing to skip
        except Exception as e:
            raise RewardFunctionError(f"{where} raised on {row}: {type(e).__name__}: {e}") from e
        if isinstance(out, Mapping):
            if "score" not in out:
                raise RewardFunctionError(f"{where} returned a dict without 'score' on {row}: keys {sorted(out)!r}")
            out = out["score"]
        return _number(out, where, row)


def _number(value: Any, where: str, row: str) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, numbers.Real):  # a 0-d tensor or array
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise RewardFunctionError(f"{where} returned {type(value).__name__} {value!r} on {row}, not a number or None")
    x = float(value)
    if not math.isfinite(x):
        raise RewardFunctionError(f"{where} returned {x} on {row}")
    return x


def load_reward_function(ref: str, *, lab: Any = None, name: str | None = None, knobs: Mapping[str, Any] | None = None) -> RewardFunction:
    """The reward function ``ref`` names: ``file.py:fn``, ``module:fn`` or a registered name,
    looked up in ``lab`` — when None, the lab of the enclosing :func:`resolving_with` (a run's),
    else a fresh :class:`rllab.Lab` — and built with ``knobs`` (its defaults when None)."""
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(f"reward function reference {ref!r}: give a registered name, module:function or path.py:function")
    name = name or reward_name(ref)
    if ":" not in ref and _looks_like_path(ref):
        _refuse_path_without_function(ref)
    if ":" not in ref:
        from rllab.lab import Lab

        lab = lab if lab is not None else (_LAB.get() or Lab())
        try:
            spec = lab.spec("reward_function", ref)
        except KeyError as e:  # a dotted name not registered: most likely a module without its function
            if Path(f"{ref}.py").is_file():
                raise ConfigError(f"{e} There is a file {ref}.py here: name its function as {ref}.py:NAME") from None
            if "." in ref.strip("."):
                raise ConfigError(
                    f"{e} A reward function from a module is named module:function: {ref}:NAME "
                    f"(or path/to/file.py:NAME for a file)"
                ) from None
            raise
        try:
            comp = lab.get("reward_function", ref, **dict(knobs or {}))
        except ConfigError as e:
            if e.key is None or e.key in (knobs or {}):
                raise
            hint = json.dumps({name: {e.key: "..."}})  # a required knob left out: say where knobs go
            raise ConfigError(f"{e} (a reward function's knobs: the task's reward_knobs = '{hint}')", key=e.key) from None
        return RewardFunction(name=name, ref=ref, fn=spec.fn, style=spec.trait("signature"), config=comp.config)
    if knobs:
        raise ConfigError(f"reward function {ref!r}: knobs {dict(knobs)!r} are for registered reward functions; this one has none")
    target, attr = ref.rsplit(":", 1)
    _check_parts(ref, target, attr)
    if _looks_like_path(target):
        path = Path(target).expanduser().resolve()
        if path.is_dir():
            raise ConfigError(f"reward function {ref!r}: {path} is a directory; name a file and a function in it: path/to/file.py:NAME")
        if not path.is_file():
            raise ConfigError(f"reward function {ref!r}: no such file {path}")
        from rllab.lab import import_file

        try:
            module = import_file(path, prefix="rllab_reward_file", reuse=True)
        except BaseException as e:
            raise ConfigError(f"reward function {ref!r}: importing {path} failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ConfigError(f"reward function {ref!r}: cannot import module {target!r}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        have = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(f"reward function {ref!r}: {target} has no function {attr!r} (functions: {', '.join(have) or 'none'})")
    return RewardFunction(name=name, ref=ref, fn=fn, style=style_of(fn, f"reward function {ref!r}"))


def _looks_like_path(ref: str) -> bool:
    return ref.lower().endswith(".py") or "/" in ref or "\\" in ref


def _check_parts(ref: str, target: str, attr: str) -> None:
    """``module:function`` / ``file.py:function`` with both parts given, no spaces, one colon."""
    if not target.strip() or not attr.strip():
        part = "the module or file before" if not target.strip() else "the function after"
        raise ConfigError(f"reward function {ref!r}: {part} ':' is missing; write module:function or path/to/file.py:function")
    if target != target.strip() or attr != attr.strip():
        raise ConfigError(f"reward function {ref!r}: spaces around ':'; write it without them ({target.strip()}:{attr.strip()})")
    if ":" in target and not _looks_like_path(target):
        raise ConfigError(f"reward function {ref!r}: more than one ':'; write module:function or path/to/file.py:function")


def _refuse_path_without_function(ref: str) -> None:
    """A file given without ``:function``: refused, naming the functions the file defines."""
    path = Path(ref).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"reward function {ref!r}: no such file {path}; a file's reward function is named path/to/file.py:NAME")
    try:
        import ast

        tree = ast.parse(path.read_text(encoding="utf-8"))
        have = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_")]
    except (OSError, SyntaxError, ValueError):
        have = []
    listed = f" (functions in it: {', '.join(have)})" if have else ""
    first = have[0] if have else "NAME"
    raise ConfigError(f"reward function {ref!r} names a file but not the function in it: write {ref}:{first}{listed}")


@attrs.frozen(kw_only=True)
class RewardSet:
    """K reward functions and their weights (TRL's ``reward_functions`` + ``reward_weights``)."""

    functions: tuple[RewardFunction, ...]
    weights: tuple[float, ...]

    @classmethod
    def load(cls, refs: Sequence[str], weights: Sequence[float] | None = None, *, lab: Any = None, who: str = "task",
             knobs: Mapping[str, Mapping[str, Any]] | None = None) -> "RewardSet":
        """Load ``refs`` (see :func:`load_reward_function`); ``weights`` default to all 1;
        ``knobs`` maps a function's name to its knobs."""
        refs = (refs,) if isinstance(refs, str) else tuple(refs)
        if not refs:
            raise ConfigError(f"{who}: no reward functions given")
        if weights is not None and len(weights) != len(refs):
            raise ConfigError(f"{who}: {len(weights)} reward_weights for the {len(refs)} reward functions {list(refs)!r}", key="reward_weights")
        names = reward_names(refs)
        knobs = dict(knobs or {})
        unknown = sorted(set(knobs) - set(names))
        if unknown:
            raise ConfigError(f"{who}: reward_knobs names {unknown!r}, which are not among its reward functions {list(names)!r}", key="reward_knobs")
        for i, (ref, name) in enumerate(zip(refs, names)):  # the same function twice, with the same knobs, counts twice
            for ref0, name0 in zip(refs[:i], names[:i]):
                if ref0 == ref and knobs.get(name0) == knobs.get(name):
                    raise ConfigError(
                        f"{who}: reward function {ref!r} is listed twice with the same knobs ({name0!r} and {name!r}): its "
                        f"score would count twice; give it once (a reward_weights entry of 2 weighs it double), or give the "
                        f"second its own knobs in reward_knobs[{name!r}]",
                        key="rewards",
                    )
        fns = tuple(load_reward_function(r, lab=lab, name=n, knobs=knobs.get(n)) for r, n in zip(refs, names))
        return cls(functions=fns, weights=tuple(float(w) for w in weights) if weights is not None else (1.0,) * len(refs))

    @property
    def says_scores(self) -> bool:
        """Whether every function declares that it says its scores as they come and may be called
        from any thread (``fn.says_scores = True``, see :func:`report_score`)."""
        return all(getattr(f.fn, "says_scores", False) is True for f in self.functions)

    @property
    def names(self) -> tuple[str, ...]:
        """The K function names; the task's ``reward_components`` when K ≥ 2."""
        return tuple(f.name for f in self.functions)

    def score(
        self, *, prompts: Sequence[Any], completions: Sequence[str], ground_truth: Sequence[Any],
        columns: Sequence[Mapping[str, Any]], rows: Sequence[str], completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[float | dict[str, float]]:
        """Per completion: ``w·r`` with one function, else a dict name → r (None scored 0).

        A caller that listens (:func:`scores_as_known`) hears a completion's score as soon as
        every function has said its value for it (:func:`report_score`); with a function that
        says nothing, nothing is heard: the scores come with the return, and a caller hearing
        none keeps to its own thread (what a reward function may need, e.g. a timeout by signal)."""
        listener = _SCORES.get()
        known: list[dict[int, float | None]] = [{} for _ in completions]

        def tell(k: int, i: int, value: Any) -> None:
            if not 0 <= i < len(known) or k in known[i]:
                return
            try:
                known[i][k] = _number(value, "", "")
            except RewardFunctionError:
                return  # not a score: the call's return says what it is
            if len(known[i]) == len(self.functions):
                listener(i, self._combined([known[i][j] for j in range(len(self.functions))]))

        per_fn = []
        for k, f in enumerate(self.functions):
            with scores_as_known(None if listener is None else lambda i, value, k=k: tell(k, i, value)):
                per_fn.append(f.batch(prompts=prompts, completions=completions, ground_truth=ground_truth, columns=columns,
                                      rows=rows, completion_ids=completion_ids))
        return [self._combined([col[i] for col in per_fn]) for i in range(len(completions))]

    def _combined(self, values: Sequence[float | None]) -> float | dict[str, float]:
        """One completion's score from its K functions' values (None scored 0)."""
        values = [0.0 if v is None else v for v in values]
        return self.weights[0] * values[0] if len(values) == 1 else dict(zip(self.names, values))


def on_last_model_token(episode, reward: float) -> tuple[float, ...]:
    """An episode's token rewards (:attr:`rllab.rollout.episodes.EpisodeResult.token_rewards`)
    replaced by ``reward`` alone, on its last model token: a random reward replaces every turn's
    reward of an environment's episode."""
    model = episode.completion.model_mask or (True,) * len(episode.token_rewards)
    last = max((i for i, m in enumerate(model) if m), default=-1)
    return tuple(reward if i == last else 0.0 for i in range(len(episode.token_rewards)))


def random_rewards(seed: int, step: int, prompt_index: Sequence[int], p: float) -> list[float]:
    """The spurious-rewards control (Shao et al. 2025, "Spurious Rewards: Rethinking Training
    Signals in RLVR", arXiv 2506.10947; slime's ``--rm-type random``): per sample a reward of 1
    with probability ``p``, else 0, blind to the completion.

    Sample ``j`` of prompt ``i`` (its ``j``-th occurrence in ``prompt_index``) draws
    ``u = numpy.random.default_rng([seed, step, i, j]).random()`` and scores ``1.0`` iff ``u < p``,
    so a draw depends on (seed, step, prompt, sample) alone: the same in every run with that seed,
    whatever was sampled or how the batch is split.

    :param prompt_index: (N,) the prompt each sample answers (prompt-major or not).
    """
    import numpy as np

    if not 0.0 <= p <= 1.0:
        raise ValueError(f"random_rewards: p = {p!r} is not a probability in [0, 1]")
    seen: dict[int, int] = {}
    out = []
    for i in prompt_index:
        j = seen.get(int(i), 0)
        seen[int(i)] = j + 1
        u = np.random.default_rng([int(seed), int(step), int(i), j]).random()
        out.append(1.0 if u < p else 0.0)
    return out
