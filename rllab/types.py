"""The data types components exchange, and the shape glossary.

Shape glossary
--------------
``B``  sequences (rows) in a batch; ``G`` samples per prompt (a group); ``P`` prompts or pairs;
``T``  response tokens (padded); ``L`` prompt + response tokens; ``V`` vocabulary size;
``N``  flattened tokens.

Response-aligned tensors are ``(B, T)``; masks are ``bool`` and True where a token counts.
Groups are identified by an integer id per row (``index``, shape ``(B,)``), never by position.
Batches are ``attrs.frozen(eq=False)`` records whose validators check shapes and dtypes — never
values, so building one never synchronises a device.
"""

from __future__ import annotations

import abc
from itertools import chain
from typing import Any, Mapping, Sequence

import attrs
import numpy as np
import torch

from rllab.errors import NoDemonstrationError, PromptError
from rllab.members import Structural, member, with_defaults
from rllab.ops import check_mask, check_same_shape, check_tensor  # noqa: F401  (re-exported: where they were)

# --------------------------------------------------------------------------- validators


def _tensor(*, ndim: int | None = None, dtype: torch.dtype | tuple | None = None, optional=False):
    """An attrs validator that checks a field is a tensor of the given rank and dtype."""

    dtypes = dtype if isinstance(dtype, tuple) else ((dtype,) if dtype is not None else None)

    def check(inst, attribute, value):
        if value is None and optional:
            return
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{type(inst).__name__}.{attribute.name} must be a torch.Tensor, got {type(value).__name__}")
        if ndim is not None and value.ndim != ndim:
            raise ValueError(
                f"{type(inst).__name__}.{attribute.name} must have {ndim} dimensions, got shape {tuple(value.shape)}"
            )
        if dtypes is not None and value.dtype not in dtypes:
            names = " or ".join(str(d) for d in dtypes)
            raise TypeError(f"{type(inst).__name__}.{attribute.name} must be {names}, got {value.dtype}")

    return check


# --------------------------------------------------------------------------- prompts


ROLES = ("system", "user", "assistant", "tool")
"""The roles a chat message may have."""

Messages = tuple  # tuple[dict[str, str], ...]
"""A chat prompt: a tuple of ``{"role": ..., "content": ...}`` dicts."""


def is_messages(prompt: Any) -> bool:
    """Whether ``prompt`` is a chat-messages prompt (not a string)."""
    return not isinstance(prompt, str)


def check_messages(messages: Any, *, where: str = "prompt") -> Messages:
    """``messages`` as a tuple of plain ``{"role", "content"}`` dicts, or a :class:`~rllab.errors.PromptError` (a ValueError) naming ``where``.

    Each message must be a mapping with a ``role`` in :data:`ROLES` and a string ``content``;
    other keys (``name``, ``tool_calls``...) are kept for the template. The sequence must not be empty.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise PromptError(f"{where}: a prompt is a string or a list of chat messages, got {type(messages).__name__}")
    if not messages:
        raise PromptError(f"{where}: the chat messages are empty")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise PromptError(f"{where}: message {i} is a {type(m).__name__}, not a {{'role': ..., 'content': ...}} mapping")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise PromptError(f"{where}: message {i} has role {role!r}; a role is one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise PromptError(f"{where}: message {i} ({role}) has content of type {type(content).__name__}, not a string")
        out.append(dict(m))
    return tuple(out)


def check_prompt(prompt: Any, *, where: str = "prompt") -> str | Messages:
    """A string prompt unchanged, or chat messages checked by :func:`check_messages`."""
    return prompt if isinstance(prompt, str) else check_messages(prompt, where=where)


# --------------------------------------------------------------------------- rollouts


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How a rollout backend samples. Mirrors SGLang's ``sampling_params``."""

    n: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    """Samples per prompt (the group size G)."""
    max_new_tokens: int = attrs.field(default=32, validator=attrs.validators.ge(1))
    temperature: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    """0 means greedy."""
    top_p: float = attrs.field(default=1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)])
    top_k: int = -1
    """-1 disables top-k."""
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@attrs.frozen(kw_only=True)
class Completion:
    """One sampled response.

    ``token_ids`` and ``log_probs`` have one entry per generated token (the stop token included
    when generation stopped on one). ``finish_reason`` is ``"stop"`` or ``"length"``
    (or ``"abort"`` when the backend gave up on it).

    A multi-turn episode (:mod:`rllab.rollout.episodes`) is one completion too: ``token_ids`` are every
    response-side token after the opening prompt — each turn's sampled ids and each
    observation's ids, in order — and ``model_mask`` says which are the model's (its holes are
    the observations, whose ``log_probs`` are 0). Its ``finish_reason`` may also be
    ``"max_turns"`` or ``"overflow"`` (:data:`rllab.rollout.episodes.FINISH_REASONS`).
    """

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: str
    prompt_index: int = 0
    """Which prompt of the ``generate`` call this answers."""
    weight_version: str | None = None
    """The weights the server sampled with, when the backend reports it (SGLang's
    ``meta_info.weight_version``); None for in-process backends."""
    model_mask: tuple[bool, ...] | None = None
    """One bool per entry of ``token_ids``: True where the model sampled the token, False on an
    environment's observation tokens. None: every token is the model's (a single turn)."""

    def __attrs_post_init__(self):
        if len(self.token_ids) != len(self.log_probs):
            raise ValueError(
                f"Completion: {len(self.token_ids)} token_ids but {len(self.log_probs)} log_probs"
            )
        if self.model_mask is not None and len(self.model_mask) != len(self.token_ids):
            raise ValueError(
                f"Completion: {len(self.token_ids)} token_ids but {len(self.model_mask)} model_mask entries"
            )

    @property
    def model_tokens(self) -> int:
        """How many of ``token_ids`` the model sampled."""
        return len(self.token_ids) if self.model_mask is None else sum(self.model_mask)

    @classmethod
    def columns(
        cls, prompt_ids: Sequence[tuple[int, ...]], token_ids: Sequence[tuple[int, ...]],
        log_probs: Sequence[tuple[float, ...]], finish_reason: Sequence[str], prompt_index: Sequence[int],
        weight_version: Sequence[str | None],
    ) -> list["Completion"]:
        """One completion per row of equal-length columns (a backend parsing a batch of responses
        calls this): ``Completion(...)`` per row, whose errors name the row."""
        B = len(token_ids)
        cols = (prompt_ids, token_ids, log_probs, finish_reason, prompt_index, weight_version)
        if any(len(c) != B for c in cols):
            raise ValueError(f"Completion.columns: columns of lengths {[len(c) for c in cols]}")
        rows = []
        for row, (p, t, lp, f, i, w) in enumerate(zip(*cols)):
            try:
                rows.append(
                    cls(prompt_ids=p, token_ids=t, log_probs=lp, finish_reason=f, prompt_index=i, weight_version=w)
                )
            except ValueError as e:
                raise ValueError(f"{e} (row {row})") from None
        return rows


@with_defaults("rollout_backend")
class RolloutBackend(Structural):
    """Where completions come from (in-process transformers, SGLang servers, ...); the base class of
    rollout backends.

    ``isinstance(obj, RolloutBackend)`` holds for any object with ``generate``, ``last_metrics``,
    ``update_weights`` and ``close`` (duck typing). A subclass defines ``generate`` and
    ``update_weights`` and inherits the rest: ``last_metrics() -> {}``, ``close()`` doing nothing,
    and the default of every optional member (:data:`rllab.members.MEMBERS` ``["rollout_backend"]``),
    which the kernel applies to an object that does not subclass too:

    - ``follow_weights() -> Mapping[str, float] | None`` (default None): servers every
      data-parallel rank shares; another rank pushed the weights
      (:meth:`rllab.parallel.placement.FSDP2.sync_weights`), count them. None: each rank's backend takes
      the weights itself.
    - ``pushes_in_flight`` (bool, default False): a weight sync need not wait for the batch being
      sampled (asynchronous rollouts overlap them).

    What a backend declares before it is built (needs CUDA, takes a sharded policy's weights,
    samples from the trainer's own weights) are traits of its registration (:mod:`rllab.traits`).

    Its metrics reach the step's row through two typed channels, never through attributes the
    trainer looks for: ``last_metrics()`` (what the last ``generate`` measured, read by the
    rollout stage right after it) and the return value of ``update_weights`` (what the weight
    sync after a step measured, added by the trainer to that same step's row). Keys are
    namespaced (``sglang/retries``, ``time/weight_sync``); values are floats.
    """

    _required = ("generate", "last_metrics", "update_weights", "close")

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Sample ``params.n`` completions for each prompt, grouped: prompt 0's n first."""

    def last_metrics(self) -> Mapping[str, float]:
        """Counters of the last ``generate`` call for the step's row; ``{}`` when there are none."""
        return {}

    @abc.abstractmethod
    def update_weights(self, model: Any) -> Mapping[str, float] | None:
        """Make later ``generate`` calls sample from ``model``'s current weights; returns the
        sync's metrics for the step it follows (or None: nothing to report)."""

    def close(self) -> None:
        """Release whatever the backend holds (servers, threads, memory)."""


# --------------------------------------------------------------------------- tasks


@attrs.frozen(kw_only=True)
class Example:
    """One task instance: the prompt, the reference answer, and anything else.

    ``prompt`` is a string (tokenized as it is) or chat messages — a tuple of
    ``{"role": ..., "content": ...}`` dicts (a list is accepted), rendered with the tokenizer's
    chat template (:mod:`rllab.rollout.chat`); malformed messages raise a
    :class:`rllab.errors.PromptError` naming the bad message.
    """

    prompt: "str | tuple[dict, ...]" = attrs.field(converter=lambda p: check_prompt(p, where="Example.prompt"))
    answer: str
    meta: dict = attrs.field(factory=dict, eq=False)


@with_defaults("task")
class Task(Structural):
    """A prompt source with a verifiable reward; the base class of tasks.

    ``isinstance(obj, Task)`` holds for any object with ``train_examples``, ``eval_examples``,
    ``reward`` and ``demonstration`` (duck typing). A subclass inherits the default of every
    optional member (:data:`rllab.members.MEMBERS` ``["task"]``), which the kernel applies to an
    object that does not subclass too: ``reward_components`` (``()``), ``reward_weights``,
    ``correct_component``, ``solved``, ``reward_batch``, ``train`` (None each), ``warm_start_defaults``
    and ``tiny_model_defaults`` (``{}``), described below and in :mod:`rllab.members`.

    **What counts as solved** for ``rollout/accuracy``, ``eval/accuracy`` and the warm start's
    probe (:func:`is_solved`), in this order: the task's own ``solved(example, reward) -> bool``
    when it defines one; else, for a task of several reward components, its correctness
    component ≥ 1 — the one ``correct_component`` names, default the first (primary) component;
    else a reward ≥ 1. Accuracy never comes from the weighted sum of several components, where a
    negative shaping term (a length penalty) would pull a correct answer under 1.

    **Several reward components.** A task that scores a completion on several criteria (as TRL's
    list of ``reward_funcs``) sets ``reward_components``, a tuple of K ≥ 2 names, and its
    ``reward`` returns a mapping with exactly those names → float. The rollout stage then keeps
    the (B, K) components on the batch (``RolloutBatch.reward_components``, columns in the
    declared order), logs each one's mean as ``reward/<name>``, and defines the scalar reward as
    the weighted sum ``Σ_k w_k·r_k`` with the task's optional ``reward_weights`` (K floats,
    default all 1 — TRL's default ``sum_then_normalize`` aggregation); the scalar is what
    the task's ``solved``, the single-reward estimators and the reward metrics see. The optional
    ``correct_component`` (one of the names; default the first) is the component that says
    whether an answer is correct (see above). Estimators that
    normalise each component on its own (``gdpo``, ``normalize_then_sum``) read the components.
    So that a config is checked before any model loads, the task's registration declares the
    names too: ``register(name, factory, reward_components=...)``, a tuple or a callable
    ``config -> tuple`` (empty for one reward).
    Single-reward tasks set nothing and return a float, as before.

    **Batched rewards.** ``reward_batch(examples, texts, *, completion_ids) -> list`` (optional)
    scores every completion of a step at once.
    """

    _required = ("train_examples", "eval_examples", "reward", "demonstration")

    @abc.abstractmethod
    def train_examples(self, n: int, rng: "torch.Generator") -> list[Example]:
        """Draw ``n`` training examples using ``rng`` (deterministic given its state)."""

    @abc.abstractmethod
    def eval_examples(self) -> list[Example]:
        """The held-out evaluation split (fixed)."""

    @abc.abstractmethod
    def reward(self, example: Example, completion: str) -> float:
        """Score a decoded completion; 1.0 for a correct answer is the convention."""

    def demonstration(self, example: Example) -> str:
        """A correct completion for ``example`` (used for a supervised warm start)."""
        raise NoDemonstrationError(
            f"{type(self).__name__} has no demonstration(example): the tiny model's supervised warm start needs one; define it, "
            f"or skip the warm start (model.warm_start.steps=0), or train a model of your own (model.path=...)"
        )


# --------------------------------------------------------------------------- batches


@attrs.frozen(kw_only=True, eq=False)
class RolloutBatch:
    """A padded batch of scored completions, ready for the training forwards.

    ``input_ids`` / ``attention_mask`` (B, L) hold prompt + response, left-padded prompts and
    right-padded responses; the response occupies the last ``T`` columns.

    Multi-turn episodes: a row's response holds its model turns and the environment's
    observations between them; ``response_mask`` is True on the model's tokens only (observations
    are holes: context the forward sees through ``attention_mask``, never trained on, their
    ``rollout_log_prob`` 0). ``turn_rewards`` then places each turn's reward on the last model
    token of that turn, ``rewards`` is the episode's total, and ``turns`` counts its model turns.

    Rewards have three names: ``rewards`` (B,) the scalar reward of each row, what training uses;
    ``reward_components`` (B, K) the score of each component; ``token_rewards`` (B, T) the
    rewards placed on the response tokens.
    """

    input_ids: torch.Tensor = attrs.field(validator=_tensor(ndim=2, dtype=torch.long))
    """(B, L) int64 prompt + response token ids."""
    attention_mask: torch.Tensor = attrs.field(validator=_tensor(ndim=2, dtype=torch.bool))
    """(B, L) bool, True on real tokens."""
    response_mask: torch.Tensor = attrs.field(validator=_tensor(ndim=2, dtype=torch.bool))
    """(B, T) bool, True on generated tokens."""
    rollout_log_prob: torch.Tensor = attrs.field(validator=_tensor(ndim=2, dtype=torch.float32))
    """(B, T) float32 log-probs the rollout backend reported for the sampled tokens."""
    index: torch.Tensor = attrs.field(validator=_tensor(ndim=1, dtype=torch.long))
    """(B,) int64 group id per row."""
    rewards: torch.Tensor = attrs.field(validator=_tensor(ndim=1, dtype=torch.float32))
    """(B,) float32 reward of each row (after shaping): what training uses."""
    reward_components: torch.Tensor | None = attrs.field(default=None, validator=_tensor(ndim=2, dtype=torch.float32, optional=True))
    """(B, K) float32 per-component rewards of a multi-component task (None: one reward)."""
    reward_component_names: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """The K component names, in column order (empty with one reward)."""
    reward_component_weights: tuple[float, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(lambda ws: tuple(float(w) for w in ws))
    )
    """The K weights w_k of the task's scalar reward Σ_k w_k·r_k, in column order (the task's
    ``reward_weights``; the rollout stage gives all 1 when it declares none). None: not given
    (one reward, or a batch built without them); estimators then weigh every component 1."""
    turn_rewards: torch.Tensor | None = attrs.field(default=None, validator=_tensor(ndim=2, dtype=torch.float32, optional=True))
    """(B, T) float32 rewards placed on response tokens — each turn's reward on the last model
    token of its turn (episodes of several turns); None: each row's reward sits on its last model token."""
    turns: torch.Tensor | None = attrs.field(default=None, validator=_tensor(ndim=1, dtype=torch.long, optional=True))
    """(B,) int64 model turns of each row's episode (None: one turn each)."""
    staleness: torch.Tensor | None = attrs.field(default=None, validator=_tensor(ndim=1, dtype=torch.long, optional=True))
    """(B,) int64 weight versions between each row's sampler and the trainer (asynchronous
    rollouts, ``rollout.max_staleness``); None: sampled with the weights it trains (synchronous)."""
    token_versions: torch.Tensor | None = attrs.field(default=None, validator=_tensor(ndim=2, dtype=torch.long, optional=True))
    """(B, T) int64 the step whose weights sampled each response token (partial rollouts, ``rollout.partial =
    "continue"``; -1 on padding); None: every token sampled by the step's own weights."""

    def __attrs_post_init__(self):
        B, L = self.input_ids.shape
        check_same_shape("RolloutBatch", input_ids=self.input_ids, attention_mask=self.attention_mask)
        check_same_shape("RolloutBatch", response_mask=self.response_mask, rollout_log_prob=self.rollout_log_prob)
        if self.response_mask.shape[0] != B or self.response_mask.shape[1] > L:
            raise ValueError(
                f"RolloutBatch: response_mask has shape {tuple(self.response_mask.shape)}, "
                f"incompatible with input_ids {tuple(self.input_ids.shape)}"
            )
        check_same_shape("RolloutBatch", response_mask=self.response_mask, turn_rewards=self.turn_rewards)
        for f in attrs.fields(type(self)):  # every tensor field is per row: B first (as select indexes them)
            if isinstance(value := getattr(self, f.name), torch.Tensor) and value.shape[:1] != (B,):
                raise ValueError(f"RolloutBatch: {f.name} must have its B = {B} rows first, got shape {tuple(value.shape)}")
        comps, names = self.reward_components, self.reward_component_names
        if (comps is None) != (not names) or (comps is not None and comps.shape != (B, len(names))):
            got = None if comps is None else tuple(comps.shape)
            raise ValueError(
                f"RolloutBatch: reward_components {got} must be (B, K) = ({B}, {len(names)}) for the names {names!r}"
            )
        weights = self.reward_component_weights
        if weights is not None and len(weights) != len(names):
            raise ValueError(f"RolloutBatch: reward_component_weights has {len(weights)} entries for the {len(names)} components {names!r}")

    @property
    def response_length(self) -> int:
        """T, the padded response width."""
        return self.response_mask.shape[1]

    @property
    def scores(self) -> torch.Tensor:
        """The former name of :attr:`rewards`."""
        return self.rewards

    @property
    def token_rewards(self) -> torch.Tensor:
        """(B, T) float32: ``turn_rewards`` when the batch has them (episodes of several turns);
        else each row's reward on its last True of ``response_mask`` (its last model token,
        whatever holes precede it), 0 elsewhere. A row with no response token gets no reward
        token (its reward is kept in ``rewards``)."""
        if self.turn_rewards is not None:
            return self.turn_rewards
        mask = self.response_mask
        B, T = mask.shape
        out = torch.zeros(B, T, dtype=torch.float32, device=mask.device)
        cols = torch.arange(T, device=mask.device).expand(B, T)
        last = torch.where(mask, cols, torch.full_like(cols, -1)).amax(-1)  # -1: no model token
        out[torch.arange(B, device=out.device), last.clamp(min=0)] = torch.where(last >= 0, self.rewards, torch.zeros_like(self.rewards))
        return out

    @classmethod
    def from_completions(
        cls, completions: Sequence[Completion], rewards: Sequence[float], pad_token_id: int,
        *, reward_components: "torch.Tensor | None" = None, reward_component_names: Sequence[str] = (),
        reward_component_weights: Sequence[float] | None = None, turn_rewards: "Sequence[Sequence[float]] | None" = None,
        turns: "Sequence[int] | None" = None, staleness: "Sequence[int] | None" = None,
        token_versions: "Sequence[Sequence[int]] | None" = None,
    ) -> "RolloutBatch":
        """Pad completions into a batch. Rows keep the order given; ``index`` is the prompt index.

        ``response_mask`` is True on each completion's model tokens (``Completion.model_mask``;
        all of them when it is None), ``attention_mask`` on every real token.

        :param reward_components: (B, K) float per-component rewards, with their K names and
            (optionally) the K weights of the task's scalar reward.
        :param turn_rewards: per completion, one reward per entry of its ``token_ids`` (episodes).
        :param turns: per completion, its episode's model turns; ``staleness``: its weight versions behind;
            ``token_versions``: one step per entry of its ``token_ids``."""
        if len(completions) == 0 or len(rewards) != len(completions):
            raise ValueError(f"RolloutBatch.from_completions: {len(completions)} completions but {len(rewards)} rewards")
        if pad_token_id is None:
            raise ValueError("RolloutBatch.from_completions: pad_token_id is None (give the tokenizer a pad token)")
        # No per-token Python loop: prompts and responses, concatenated, are written once through the attention mask
        # (row-major, the concatenation's order); a row's valid columns are [P - prompt length, P + response length).
        B = len(completions)
        ps = [c.prompt_ids for c in completions]
        ts = [c.token_ids for c in completions]
        pl, tl = list(map(len, ps)), list(map(len, ts))
        P, T = max(pl), max(1, max(tl))
        col = np.arange(P + T)
        attention = (col >= np.subtract(P, pl)[:, None]) & (col < np.add(P, tl)[:, None])
        rows = [None] * (2 * B)
        rows[0::2], rows[1::2] = ps, ts
        ids = np.empty((B, P + T), dtype=np.int64)
        ids.fill(pad_token_id)
        ids[attention] = np.fromiter(chain.from_iterable(rows), np.int64, sum(pl) + sum(tl))
        real = attention[:, P:]
        lps = np.zeros((B, T), dtype=np.float32)
        lps[real] = np.fromiter(chain.from_iterable([c.log_probs for c in completions]), np.float32, sum(tl))
        response = real.copy()
        if any(c.model_mask is not None for c in completions):  # holes: the observations
            masks = [c.model_mask if c.model_mask is not None else (True,) * len(c.token_ids) for c in completions]
            response[real] = np.fromiter(chain.from_iterable(masks), np.bool_, sum(tl))
            lps[~response] = 0.0
        turn_rewards_t = None
        if turn_rewards is not None:
            if len(turn_rewards) != B or any(len(r) != n for r, n in zip(turn_rewards, tl)):
                raise ValueError("RolloutBatch.from_completions: turn_rewards must give one reward per token of each completion")
            placed = np.zeros((B, T), dtype=np.float32)
            placed[real] = np.fromiter(chain.from_iterable(turn_rewards), np.float32, sum(tl))
            turn_rewards_t = torch.from_numpy(placed)
        versions = None if token_versions is None else np.full((B, T), -1, dtype=np.int64)
        if versions is not None:
            versions[real] = np.fromiter(chain.from_iterable(token_versions), np.int64, sum(tl))
        if isinstance(rewards, torch.Tensor):
            rewards_t = rewards.detach().to("cpu", torch.float32, copy=True)
        else:
            rewards_t = torch.from_numpy(np.array(rewards, dtype=np.float32))
        return cls(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(attention),
            response_mask=torch.from_numpy(response),
            rollout_log_prob=torch.from_numpy(lps),
            index=torch.from_numpy(np.fromiter([c.prompt_index for c in completions], np.int64, B)),
            rewards=rewards_t,
            reward_components=None if reward_components is None else torch.as_tensor(reward_components, dtype=torch.float32),
            reward_component_names=tuple(reward_component_names),
            reward_component_weights=reward_component_weights,
            turn_rewards=turn_rewards_t,
            turns=None if turns is None else torch.tensor(list(turns), dtype=torch.long),
            staleness=None if staleness is None else torch.tensor(list(staleness), dtype=torch.long),
            token_versions=None if versions is None else torch.from_numpy(versions),
        )

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        """The sub-batch of the given rows (a bool mask or integer index over B). Every tensor field of a batch is per row (its first dimension is B), so each one is
        indexed, the fields added later included; the others (the component names and weights) are kept."""
        return attrs.evolve(self, **{
            f.name: value[rows] for f in attrs.fields(type(self)) if isinstance(value := getattr(self, f.name), torch.Tensor)
        })


@attrs.frozen(kw_only=True)
class PreferencePair:
    """A (prompt, chosen, rejected) triple, as token ids."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
