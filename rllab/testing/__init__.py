"""The contract suite: checks every component of a kind must pass, for built-ins and yours alike.

Run it from the command line on anything registered::

    rllab check ppo_dual_clip
    rllab check --plugin my_loss.py my_loss

or from pytest in your own plugin's tests (one test per check)::

    import pytest
    from rllab.testing import contract_cases

    @pytest.mark.parametrize("case", contract_cases(names=["my_loss"]), ids=str)
    def test_contract(case):
        case.run()

What is checked, per kind (every registered component must pass these):

- every kind: the component is reachable through the Lab and its default config validates;
- tensor components: finite values and finite gradients on random inputs; changing values at
  masked positions (NaN included) changes nothing; appending padding columns changes nothing;
- policy losses: with ``log_prob == old_log_prob``, ``actor/approx_kl`` is 0 and
  ``actor/clipfrac`` is 0; all-ones weights equal no weights; metric keys are namespaced scalars;
  the loss is what ``aggregate`` returns (it scales with it) — unless the loss declares its own
  reduction (see below), when ``aggregate`` must have no effect and the declared reduction is
  checked instead;
- advantage estimators: all-masked rows get 0 and do not change the other rows; changing one
  group's rewards leaves every other group's advantages unchanged — unless the estimator declares
  a batch-level step (see below), when they may change only by one common map ``x → a·x + b``
  with ``a > 0`` (whitening, a batch std, a batch-wide rescaling);
- aggregations: an all-masked batch gives 0; micro-batches aggregated with the global counts
  sum to the whole batch's value and gradient (≤ 1e-6 relative);
- partition invariance: a policy loss gives the whole batch's loss and gradient (≤ 1e-6
  relative) when the batch is processed in micro-batches with gradient accumulation (an
  ``aggregate`` bound to the whole batch's token count, as the ``rl`` step binds it; a
  ``"seq-mean"`` loss weighted by its share of rows), unless it declares ``partition=`` (below);
  an advantage estimator gives the same advantages for a batch split at a group boundary, unless
  it declares a batch-level step (it then couples the whole batch by definition, and the ``rl``
  step computes advantages once per step on the whole batch). A skipped check names the
  declaration;
- KL penalties: 0 where policy and reference agree;
- importance corrections: weights detached, 0 on padding, 1 when rollout == old;
- value losses: 0 when values equal returns;
- preference losses: per-pair finite losses with finite gradients;
- rollout backends: grouped completions whose log-probs match their tokens, valid finish
  reasons, and repeatable sampling under a seed (on a tiny locally built model);
- KL controllers, tasks, loggers: their factories build objects that honour their protocols;
- samplers: a draw gives ``n`` examples, the same for the same generator; metrics named
  ``sampler/…``; a sampler restored from its ``state_dict`` draws what the original draws; one that
  declares ``stateless=True`` draws the same with and without feedback (:mod:`rllab.testing.samplers`);
- reward functions: one finite float (or None) per completion in their declared signature, the
  same for chat-format completions as for strings, and the same when called twice.

Declarations a component makes about itself (traits, keywords of its ``register(...)`` call, read
here; see :mod:`rllab.traits`):

``aggregation=`` (policy losses)
    A loss that does not reduce its per-token loss through the run's ``aggregate`` — because it
    is defined per sequence, like GMPO — sets this to the reduction it performs instead. Known
    values: ``"seq-mean"`` (the mean over non-empty rows of one loss per row; the contract
    checks that the loss of a batch is the row-weighted mean of the losses of its halves).
    Trainers should warn when such a loss is combined with a non-default aggregation mode.
``partition=`` (policy losses)
    Why the loss of a batch depends on how it is split into micro-batches, by the loss's own
    definition (``clip_cov`` and ``kl_cov`` pick tokens by their covariance within the batch
    they are given, as verl does), in a few words, or a callable ``config -> reason | None``.
    Without it the partition-invariance check applies.
``batch_step=`` (advantage estimators)
    A short description of a step that couples every row of the batch (``"whiten"``, ``"batch
    std"``, ...) or a callable ``config -> description | None`` when a knob turns it on. Without
    it the group-isolation check applies.

An advantage estimator that ``requires=("reward_components",)`` is checked without them: its
fallback, the row score as the one component, must pass the checks.
"""

from __future__ import annotations

from typing import Iterable

import attrs

from rllab.errors import MissingExtraError
from rllab.lab import Lab

from rllab.testing import factories as contract_factories  # noqa: F401  (registers the factory kinds' checks)
from rllab.testing import environments as contract_environments  # noqa: F401,E402  (registers the environments' checks)
from rllab.testing import samplers as contract_samplers  # noqa: F401,E402  (registers the samplers' checks)
from rllab.testing.checks import _REGISTRY, Check, ContractSkip  # noqa: F401  (ContractSkip: for plugin authors' own checks)


@attrs.frozen
class CheckResult:
    kind: str
    component: str
    check: str
    passed: bool
    message: str = ""
    skipped: bool = False


# --------------------------------------------------------------------------- running


@attrs.frozen
class ContractCase:
    """One check on one component; ``run()`` raises AssertionError on failure."""

    kind: str
    name: str
    check: str
    fn: Check = attrs.field(repr=False)
    knobs: dict = attrs.field(factory=dict, repr=False)
    lab: Lab | None = attrs.field(default=None, repr=False, eq=False)

    def __str__(self):
        return f"{self.kind}:{self.name}:{self.check}"

    def run(self) -> None:
        import pytest

        lab = self.lab or Lab()
        missing = required_knobs(lab, self.kind, self.name, self.knobs)
        if missing:
            pytest.skip(f"{self.name} has required knobs {missing}; pass them with contract_cases(knobs=...)")
        comp = lab.get(self.kind, self.name, **self.knobs)
        try:
            self.fn(comp)
        except ContractSkip as e:
            pytest.skip(str(e))


def required_knobs(lab: Lab, kind: str, name: str, given: dict) -> list[str]:
    """Knobs of a component with no default and not in ``given``."""
    cls = lab.spec(kind, name).config
    return [f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING and f.name not in given]


def checks_for(kind: str) -> list[tuple[str, Check]]:
    return list(_REGISTRY.get(kind, []))


def contract_cases(
    *, lab: Lab | None = None, kinds: Iterable[str] | None = None, names: Iterable[str] | None = None, knobs: dict | None = None
) -> list[ContractCase]:
    """Every (component, check) pair, for ``pytest.mark.parametrize``.

    :param names: restrict to these component names (any kind).
    :param knobs: knobs to build each component with (e.g. a required file path).
    """
    lab = lab or Lab()
    wanted = set(names) if names is not None else None
    out = []
    for spec in lab.specs():
        if kinds is not None and spec.kind not in set(kinds):
            continue
        if wanted is not None and spec.name not in wanted and not (set(spec.aliases) & wanted):
            continue
        for check_name, fn in checks_for(spec.kind):
            out.append(ContractCase(spec.kind, spec.name, check_name, fn, dict(knobs or {}), lab))
    return out


def check_knobs(lab: Lab, kind: str, name: str, knobs: dict) -> None:
    """Raise :class:`~rllab.errors.ConfigError` when ``knobs`` (given to build the component
    with) are not a valid config of it: an unknown knob or a value out of range is a mistake in
    the call, not a contract failure of the component. Required knobs left out are not checked
    here (``run_contract`` reports them as a skip)."""
    from rllab.errors import ConfigError
    from rllab.specs import build_config

    spec = lab.spec(kind, name)
    fields = attrs.fields_dict(spec.config)
    if required_knobs(lab, kind, spec.name, knobs):
        knobs = {k: v for k, v in knobs.items() if k not in fields}  # unknown names only
    if not knobs and not required_knobs(lab, kind, spec.name, {}):
        return
    try:
        build_config(spec, knobs)
    except ConfigError as e:
        raise ConfigError(f"the knobs given to build it are not a valid config: {e}", key=e.key) from None


def run_contract(lab: Lab, kind: str, name: str, knobs: dict | None = None) -> list[CheckResult]:
    """Run every check for one component, collecting results (used by ``rllab check``).

    Knobs that do not make a valid config raise :class:`~rllab.errors.ConfigError` before any
    check runs (see :func:`check_knobs`); a default config that does not validate is a failed check.
    A component whose optional package is missing raises :class:`~rllab.errors.MissingExtraError`."""
    spec = lab.spec(kind, name)
    results = []
    knobs = dict(knobs or {})
    missing = required_knobs(lab, kind, spec.name, knobs)
    builds = "builds with the given knobs" if knobs else "builds with its default config"
    if knobs:
        check_knobs(lab, kind, spec.name, knobs)
    if missing:
        msg = f"required knobs {missing} not given (rllab check NAME --knob key=value)"
        return [CheckResult(kind, spec.name, builds, True, msg, skipped=True)]
    try:
        comp = lab.get(kind, spec.name, **knobs)
    except MissingExtraError:
        raise  # not the component's fault: one line naming the install, before any check
    except Exception as e:
        return [CheckResult(kind, spec.name, builds, False, f"{type(e).__name__}: {e}")]
    results.append(CheckResult(kind, spec.name, builds, True))
    for check_name, fn in checks_for(kind):
        try:
            fn(comp)
            results.append(CheckResult(kind, spec.name, check_name, True))
        except ContractSkip as e:
            results.append(CheckResult(kind, spec.name, check_name, True, str(e), skipped=True))
        except MissingExtraError:
            raise  # its optional package is not installed: no check can run, and none failed
        except Exception as e:
            results.append(CheckResult(kind, spec.name, check_name, False, f"{type(e).__name__}: {e}"))
    if not checks_for(kind):
        results.append(CheckResult(kind, spec.name, f"no contract checks for kind {kind}", True, skipped=True))
    return results
