"""A step's optional inputs by name: what a component's ``requires=(...)`` may ask for, and who makes it.

A component asks for an optional input by naming it in its registration (``requires=("values",)``,
:mod:`rllab.hookspecs`); the algorithm declares which inputs it passes (``provides=``), and a
config that pairs the two wrongly is refused at load. At run time the algorithm keeps a table of
:class:`Provider` s, one per input name, each a function of (the run context, the step's
:class:`Inputs`), and calls every component through :meth:`Inputs.call`, which adds exactly the
inputs that component requires::

    inputs = Inputs(ctx, batch, PROVIDERS, rollouts=rollouts)
    advantages, returns = inputs.call(estimator, token_rewards=r, mask=mask, index=batch.index)

Each input is computed once per step, when first asked for, and kept: an estimator and a policy
loss that both read ``old_log_prob`` share one forward. A view over some rows
(:meth:`Inputs.rows`, a minibatch or a micro-batch) takes those rows of each whole-batch input;
an input marked ``per_rows`` (a count over the rows, ``global_rows``) is made for the view itself.

What a provider runs is decided by the config alone (the components' ``requires``), never by
anything local to one process: under data parallelism a provider's forward or count is a
collective, which every rank must reach.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import attrs
import torch

from rllab.errors import RllabError


@attrs.frozen(kw_only=True)
class Provider:
    """How one named input is made: ``fn(ctx, inputs) -> value`` (a (B, …) tensor, or None)."""

    fn: Callable[[Any, Inputs], Any]
    model: str | None = None
    """The extra model it reads (``"critic"``): the algorithm's ``needs`` asks for it when a component requires the input."""
    before_update: bool = False
    """It reads the policy as it sampled the batch, so it is made before the update's first optimizer step."""
    per_rows: bool = False
    """Made for each view over rows (a count over the view's rows) instead of taken from the whole batch's."""


class Inputs:
    """The optional inputs of one step's batch (or of some of its rows), by name, each made once."""

    def __init__(self, ctx: Any, batch: Any, providers: Mapping[str, Provider], *, rollouts: Any = None,
                 given: Mapping[str, Any] | None = None):
        self.ctx = ctx
        self.batch = batch
        """The step's :class:`rllab.RolloutBatch` (whole, also in a view over rows)."""
        self.providers = providers
        self.rollouts = rollouts
        """The step's :class:`rllab.rollout.stage.Rollouts` (its examples; None when the batch came alone)."""
        self.metrics: dict[str, float] = {}
        """What the providers measured while making their inputs (``rollout/greedy_reward``)."""
        self.selected: torch.Tensor | None = None
        """The rows of :attr:`batch` this view covers (None: all of them)."""
        self._whole: Inputs | None = None
        self._made: dict[str, Any] = dict(given or {})

    def rows(self, index: torch.Tensor) -> Inputs:
        """The inputs of the rows ``index`` of the whole batch (a minibatch, a micro-batch)."""
        whole = self._whole or self
        view = Inputs(self.ctx, self.batch, self.providers, rollouts=self.rollouts)
        view.metrics, view.selected, view._whole = whole.metrics, index, whole
        return view

    @property
    def size(self) -> int:
        """Rows in this view."""
        return int(self.batch.input_ids.shape[0] if self.selected is None else self.selected.numel())

    def __getitem__(self, name: str) -> Any:
        if name not in self._made:
            provider = self.providers.get(name)
            if provider is None:
                raise RllabError(f"no step input named {name!r} (the inputs this step makes: {', '.join(sorted(self.providers))})")
            if self._whole is None or provider.per_rows:
                value = provider.fn(self.ctx, self)
            else:
                whole = self._whole[name]
                value = None if whole is None else whole[self.selected]
            self._made[name] = value
        return self._made[name]

    def required(self, component: Any) -> dict[str, Any]:
        """The inputs ``component`` requires (``component.spec.requires``), by name."""
        return {name: self[name] for name in component.spec.requires}

    def call(self, component: Any, /, **kw: Any) -> Any:
        """``component(**kw)`` plus every input it requires."""
        return component(**kw, **self.required(component))


def _served(components: Mapping[str, Any], provides: Mapping[str, Iterable[str]]) -> Iterable[Any]:
    """The components of the kinds the algorithm passes inputs to."""
    return [c for c in components.values() if getattr(getattr(c, "spec", None), "kind", None) in provides]


def models(providers: Mapping[str, Provider], components: Mapping[str, Any], provides: Mapping[str, Iterable[str]]) -> set[str]:
    """The extra models (``"critic"``) that the inputs these components require read."""
    return {providers[n].model for c in _served(components, provides) for n in c.spec.requires
            if n in providers and providers[n].model is not None}


def before_update(providers: Mapping[str, Provider], components: Mapping[str, Any], provides: Mapping[str, Iterable[str]]) -> bool:
    """Whether one of these components requires an input of the policy as it sampled (made before the update)."""
    return any(n in providers and providers[n].before_update for c in _served(components, provides) for n in c.spec.requires)
