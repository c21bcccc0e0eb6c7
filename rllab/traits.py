"""Component traits: what a component declares about itself, once, in its registration.

A trait is a keyword of ``register(name, fn, ...)`` beside ``config``, ``requires`` and the
rest; the :class:`rllab.Lab` checks it (a known trait of the component's kind, a value of the
right type) and records it on :attr:`rllab.ComponentSpec.traits`. Readers ask the spec, or the
bound component::

    register("grpo", grpo, config=GRPOConfig, batch_step=lambda config: ... )
    lab.get("advantage_estimator", "grpo", scale="batch").trait("batch_step")   # "batch std"

A trait marked *per config* may be given as a value or as a callable of the component's frozen
config; :meth:`rllab.ComponentSpec.trait` calls it with the config. :data:`TRAITS` lists every
trait of every kind (``rllab.hookspecs`` documents them with their kind's hook).

Optional *inputs* are not traits: a component that wants one lists it in ``requires=(...)``.
What the kernel reads from a built object (an environment's ``max_turns``, a backend's
``follow_weights``, ...) are its optional members, declared with their defaults in
:mod:`rllab.members`. The kernel asks a trait or a member, never a component's name or a knob of
its config (``tests/test_kernel_seams.py``).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping

import attrs


@attrs.frozen(kw_only=True)
class Trait:
    """One trait of a kind: its meaning, its default and how its value is checked."""

    help: str
    expected: str
    """What a valid value is, in words (shown in errors)."""
    normalize: Callable[[Any], Any]
    """The checked, frozen value; raises ``TypeError`` or ``ValueError`` on a wrong one. A per-config
    trait's callable is checked by this on what it returns."""
    default: Any = None
    per_config: bool = False
    """May be a callable ``config -> value``, resolved by :meth:`rllab.ComponentSpec.trait`."""


def _choice(*allowed: Any) -> Callable[[Any], Any]:
    def normalize(value):
        if value not in allowed:
            raise ValueError(f"got {value!r}")
        return value

    return normalize


def _text(value):
    if not isinstance(value, str) or not value:
        raise TypeError(f"got {type(value).__name__} {value!r}")
    return value


def _function(value):
    if not callable(value):
        raise TypeError(f"got {type(value).__name__} {value!r}")
    return value


def _strs(value) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list, set, frozenset)):
        raise TypeError(f"got {type(value).__name__} {value!r}")
    if not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"got {value!r}, with an item that is not a non-empty string")
    return tuple(value)


def _bool(value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"got {type(value).__name__} {value!r}")
    return value


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"got {type(value).__name__} {value!r}")
    return value


def _floats(value) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise TypeError(f"got {type(value).__name__} {value!r}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise TypeError(f"got {value!r}, with an item that is not a number")
    return tuple(float(v) for v in value)


def _optional(normalize: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(value):
        return None if value is None else normalize(value)

    return check


def _sections(value) -> frozenset[str] | None:
    return None if value is None else frozenset(_strs(value))


def _provides(value) -> Mapping[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise TypeError(f"got {type(value).__name__} {value!r}")
    out = {}
    for kind, inputs in value.items():
        if not isinstance(kind, str):
            raise TypeError(f"got the key {kind!r}, not a component kind")
        out[kind] = _strs(inputs)
    return MappingProxyType(out)


def _reason(help: str, **more: Any) -> "Trait":
    """A trait that gives a reason, per config: why the component does (or cannot do) something, in
    a few words; None: it does not."""
    return Trait(
        help=help, expected="a non-empty string, None, or a callable config -> one of those", normalize=_optional(_text),
        per_config=True, **more,
    )


def _flag(help: str) -> "Trait":
    """A True/False trait, False unless declared."""
    return Trait(help=help, expected="True or False", normalize=_bool, default=False)


NARROWS = ("after_advantage", "before_advantage")

TRAITS: dict[str, dict[str, Trait]] = {
    "advantage_estimator": {
        "batch_step": _reason(
            help="a step that couples every row of the batch (whitening, a batch std, ...), in a few words; "
            "None: the estimator's statistics stay within each group. Read by the contract checks.",
        ),
        "component_weights": Trait(
            help="the weights the estimator gives the task's reward components under a config (one per component, "
            "checked against the task's before any model loads); None: the task's own reward_weights.",
            expected="a tuple of numbers, None, or a callable config -> one of those",
            normalize=_optional(_floats),
            per_config=True,
        ),
    },
    "loss_aggregation": {
        "divides_by_tokens": Trait(
            help="True: the aggregate divides by a token count (global_tokens when given), so a knob that changes that "
            "count (the rl algorithm's token_count) acts on it; False: it ignores global_tokens (the knob is refused "
            "with it); None: not declared (not checked).",
            expected="True, False or None",
            normalize=_optional(_bool),
        ),
        "padding_dependent": _reason(
            help="why the aggregate depends on the padding width under a config (a horizon of the mask width), in a "
            "few words; None: it does not (the contract checks pad the batch and expect the same value).",
        ),
    },
    "logger": {
        "truncate": Trait(
            help="fn(*, run_dir, config, step) -> None: drop what the logger wrote for steps after step, when a run "
            "resumes from a checkpoint of that step (so the resumed log has no duplicates); None: it keeps everything.",
            expected="a callable",
            normalize=_optional(_function),
        ),
    },
    "policy_loss": {
        "aggregation": Trait(
            help="the reduction the loss performs itself instead of calling aggregate ('seq-mean': the mean "
            "over non-empty rows of one loss per row); None: the loss goes through aggregate.",
            expected="'seq-mean' or None",
            normalize=_optional(_choice("seq-mean")),
        ),
        "partition": _reason(
            help="why the loss of a batch depends on how the batch is split into micro-batches under a config (a "
            "selection over the whole batch, ...), in a few words; None: processed whole or in micro-batches with "
            "gradient accumulation it gives the same loss and gradient (the contract checks it).",
        ),
        "old_log_prob": Trait(
            help="whose log-probs the loss receives as old_log_prob: 'trainer' (a forward of the policy at "
            "rollout time) or 'rollout' (the inference engine's; the rl step skips the old-log-prob forward).",
            expected="'trainer' or 'rollout'",
            normalize=_choice("trainer", "rollout"),
            default="trainer",
        ),
    },
    "importance_correction": {
        "identity": _flag(
            help="True: the correction leaves the loss as it is (no correction), so it combines with a policy loss that "
            "corrects for the sampler itself (old_log_prob = 'rollout').",
        ),
        "narrows_mask": Trait(
            help="when the rl step narrows its response mask to keep_mask: 'after_advantage', "
            "'before_advantage' (the estimator sees the narrowed mask) or None (never). Needs keep_mask.",
            expected="'after_advantage', 'before_advantage', None, or a callable config -> one of those",
            normalize=_optional(_choice(*NARROWS)),
            per_config=True,
        ),
        "keep_mask": Trait(
            help="fn(*, old_log_prob, rollout_log_prob, mask, config) -> (B, T) bool, the valid tokens the "
            "correction keeps. Needs narrows_mask.",
            expected="a callable",
            normalize=_optional(_function),
        ),
    },
    "task": {
        "reward_components": Trait(
            help="the names of the task's reward components (empty for a single reward), so a config is "
            "checked before any model loads; None: not declared, checked on the first batch.",
            expected="a tuple of strings, or a callable config -> one",
            normalize=_optional(_strs),
            per_config=True,
        ),
    },
    "reward_function": {
        "signature": Trait(
            help="the calling convention: 'trl' (fn(*, prompts, completions, config, **columns) -> list of N "
            "floats or None) or 'verl' (fn(*, data_source, solution_str, ground_truth, extra_info, config) -> "
            "float or dict with 'score').",
            expected="'trl' or 'verl'",
            normalize=_choice("trl", "verl"),
            default="trl",
        ),
    },
    "rollout_backend": {
        "needs_cuda": _reason(
            help="why the backend needs the policy on CUDA for a config (e.g. weight sync by CUDA-IPC handles), "
            "in a few words; None: it does not. A config whose [model] device is the CPU is refused at load.",
        ),
        "sharded_policy": _reason(
            help="why the backend cannot take the weights of a sharded policy (model.strategy = 'fsdp2') under a "
            "config, in a few words; None: it can. Every rank then calls update_weights with full weights (a plain "
            "module, then state dicts), or, for a backend with follow_weights() (servers every rank shares), rank 0 "
            "pushes a plain CPU module and the other ranks call follow_weights(). Undeclared: refused.",
            default="it does not declare that it takes a sharded policy's weights (its register(...) sets no sharded_policy)",
        ),
        "shares_weights": _reason(
            help="why the backend samples from the trainer's own weights under a config (no copy of its own), in a few "
            "words; None: it keeps its own copy. Asynchronous rollouts (rollout.max_staleness > 0) are refused with it.",
        ),
    },
    "sampler": {
        "stateless": _flag(
            help="True: the sampler's draw depends on (n, rng, source) alone, never on feedback, so it runs on several "
            "data-parallel ranks and with batches sampled ahead (rollout.max_staleness > 0); False: refused there.",
        ),
        "gate_retries": Trait(
            help="the most rounds in which the rollout stage asks the sampler for replacement prompts for the groups "
            "whose scores are all equal (it plays them and swaps in those that are not); None or 0: none.",
            expected="an integer >= 0, None, or a callable config -> one of those",
            normalize=_optional(_count),
            per_config=True,
        ),
    },
    "algorithm": {
        "uses": Trait(
            help="the config sections the algorithm reads (a section it does not use is refused when set); "
            "None: every section.",
            expected="a set of section names, or None",
            normalize=_sections,
        ),
        "provides": Trait(
            help="the optional inputs the algorithm passes to components, by kind: a component whose "
            "requires=(...) names an input missing here is refused at load.",
            expected="a mapping of component kind -> tuple of input names",
            normalize=_provides,
            default=MappingProxyType({}),
        ),
        "data_parallel": Trait(
            help="True: the algorithm's step all-reduces its normalisers across data-parallel ranks, so it runs with "
            "model.strategy = 'fsdp2' on several ranks; False: refused there.",
            expected="True or False",
            normalize=_bool,
            default=False,
        ),
        "async_rollouts": Trait(
            help="True: the algorithm's steps take their batches from ctx.rollout.sample(step) alone, so they may be "
            "sampled ahead (rollout.max_staleness > 0) and over-sampled (rollout.over_sample > 0); False: both refused at load.",
            expected="True or False",
            normalize=_bool,
            default=False,
        ),
        "replayable": Trait(
            help="True: the algorithm's step takes each batch from ctx.rollout.sample(step) (a RolloutBatch of "
            "policy-gradient rollouts), so `rllab record` / `rllab replay` can hand it recorded batches; False: refused there.",
            expected="True or False",
            normalize=_bool,
            default=False,
        ),
    },
}
"""Every trait, by component kind. Kinds not listed take none."""

LEGACY = {
    "advantage_estimator": {"batch_step": "batch_step=...", "needs_reward_components": 'requires=("reward_components",)'},
    "policy_loss": {"aggregation": "aggregation=...", "old_log_prob": 'old_log_prob="rollout"'},
    "importance_correction": {"narrows_mask": "narrows_mask=...", "keep_mask": "keep_mask=..."},
    "task": {"reward_components": "reward_components=..."},
    "algorithm": {"uses": "uses=...", "provides": "provides=..."},
}
"""Function attributes that once declared a trait, by kind, and the ``register`` keyword that
replaces each. A registered function that still carries one is refused."""


def _kind_traits(kind: str) -> str:
    names = TRAITS.get(kind, {})
    return f"allowed traits for {kind}: {', '.join(names)}" if names else f"{kind} takes no traits"


def check_traits(kind: str, who: str, fn: Any, traits: Mapping[str, Any], *, kinds) -> Mapping[str, Any]:
    """The checked, frozen traits of a registration; ``TypeError`` naming ``who`` (the plugin and
    the component) and the trait when one is unknown, not of ``kind``, or of the wrong type."""
    import difflib

    allowed = TRAITS.get(kind, {})
    legacy = LEGACY.get(kind, {})
    if kind == "task" and isinstance(fn, type):  # a Task class as its own factory: reward_components is protocol data
        legacy = {}
    stale = [(a, kw) for a, kw in legacy.items() if hasattr(fn, a)]
    if stale:
        attr, kw = stale[0]
        raise TypeError(
            f"{who}: declares {attr!r} as an attribute of its function; traits are declared in the registration "
            f"now: register(..., {kw}) (the attribute is not read)"
        )
    out = {}
    for name, value in traits.items():
        if name not in allowed:
            owners = [k for k, t in TRAITS.items() if name in t]
            close = difflib.get_close_matches(name, list(allowed), n=1)
            if owners:
                why = f"{name!r} is a trait of {' and '.join(owners)}, not of {kind}"
            else:
                why = f"unknown trait {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            raise TypeError(f"{who}: {why}; {_kind_traits(kind)}.")
        if allowed[name].per_config and callable(value):
            out[name] = value
            continue
        try:
            out[name] = allowed[name].normalize(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{who}: trait {name} must be {allowed[name].expected}; {e}") from None
    if kind == "importance_correction" and ("narrows_mask" in out) != ("keep_mask" in out):
        given, missing = ("narrows_mask", "keep_mask") if "narrows_mask" in out else ("keep_mask", "narrows_mask")
        raise TypeError(f"{who}: trait {given} needs trait {missing} too (the rl step narrows its mask to keep_mask)")
    for key in out.get("provides", {}):
        if key not in kinds:
            raise TypeError(f"{who}: trait provides names {key!r}, which is not a component kind ({', '.join(kinds)})")
    return MappingProxyType(out)


def resolve(kind: str, name: str, traits: Mapping[str, Any], trait: str, config: Any) -> Any:
    """The value of ``trait`` from declared ``traits`` (the kind's default when undeclared),
    called with ``config`` when it is a per-config trait given as a callable."""
    spec = TRAITS.get(kind, {}).get(trait)
    if spec is None:
        raise ValueError(f"{kind} {name!r}: {trait!r} is not a trait of {kind}; {_kind_traits(kind)}")
    value = traits.get(trait, spec.default)
    if not (spec.per_config and callable(value)):
        return value
    got = value(config)
    try:
        return spec.normalize(got)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{kind} {name!r}: trait {trait} returned {got!r} for {config!r}; it must be {spec.expected} [{e}]") from None
