"""The contract checks of prompt samplers (kind ``sampler``, :mod:`rllab.sampling`).

Each check builds the sampler from its component, draws from a stand-in source (prompts numbered by
the generator, so a draw is deterministic given the generator's state) and feeds back rewards that
depend on the prompt alone:

- a draw returns ``n`` :class:`~rllab.types.Example` objects, the same for the same generator state;
- its metrics are floats named ``sampler/…``;
- its ``state_dict`` restores exactly: a new sampler loaded with it draws what the original draws;
- a sampler that declares ``stateless=True`` draws the same with and without feedback.

A sampler that serves only some sources (it raises :class:`~rllab.errors.SamplerSourceError` on
the stand-in) is skipped, with its message.
"""

from __future__ import annotations

import copy

import torch

from rllab.errors import SamplerSourceError
from rllab.sampling import feedback, metrics, restore, state
from rllab.specs import Component
from rllab.testing.checks import ContractSkip, _check, _gen
from rllab.types import Example


def numbered(n: int, rng: torch.Generator) -> list[Example]:
    """``n`` examples ``q<k>=`` with ``k`` drawn from ``rng`` (the stand-in for a task's draw)."""
    return [Example(prompt=f"q{k}=", answer=str(k % 7)) for k in torch.randint(0, 1000, (n,), generator=rng).tolist()]


def _reward(e: Example) -> float:
    """A fixed mean reward per prompt: 0, 0.5 or 1 by its number."""
    return (int(e.prompt[1:-1]) % 3) / 2


def _sourced(fn):
    """``fn``, with a sampler that cannot draw from the stand-in source skipped (its message)."""

    def check(comp: Component) -> None:
        try:
            fn(comp)
        except SamplerSourceError as e:
            raise ContractSkip(f"it cannot draw from the contract's stand-in source: {e}") from None

    check.__name__ = fn.__name__
    check.__doc__ = fn.__doc__
    return check


def _steps(sampler, steps: range, rng: torch.Generator, *, fed: bool = True, n: int = 4) -> list[list[str]]:
    out = []
    for step in steps:
        drawn = sampler.draw(n=n, rng=rng, step=step, source=numbered)
        if fed:
            feedback(sampler, step=step, examples=drawn, rewards=[_reward(e) for e in drawn])
        out.append([e.prompt for e in drawn])
    return out


@_check("sampler", "draws n examples, the same for the same generator")
@_sourced
def check_draw(comp: Component) -> None:
    for n in (1, 4):
        a = comp().draw(n=n, rng=_gen(3), step=1, source=numbered)
        b = comp().draw(n=n, rng=_gen(3), step=1, source=numbered)
        if len(a) != n or not all(isinstance(e, Example) for e in a):
            raise AssertionError(f"draw(n={n}) returned {len(a)} items ({[type(e).__name__ for e in a][:3]}…), not {n} Examples")
        if [e.prompt for e in a] != [e.prompt for e in b]:
            raise AssertionError("two samplers built alike drew different prompts from the same generator state")


@_check("sampler", "metrics are floats named sampler/…")
@_sourced
def check_metrics(comp: Component) -> None:
    s = comp()
    _steps(s, range(1, 3), _gen(0))
    for k, v in metrics(s, name=comp.name).items():
        if not isinstance(v, float):
            raise AssertionError(f"metric {k!r} is {type(v).__name__}, not a float")


@_check("sampler", "a sampler restored from its state_dict draws what the original draws")
@_sourced
def check_resume(comp: Component) -> None:
    whole, rng = comp(), _gen(1)
    expected = _steps(whole, range(1, 7), rng)
    first, rng = comp(), _gen(1)
    head = _steps(first, range(1, 4), rng)
    saved = copy.deepcopy(state(first))
    resumed = comp()
    restore(resumed, saved)
    got = head + _steps(resumed, range(4, 7), rng)
    if got != expected:
        raise AssertionError(f"after a resume at step 3 the draws differ: {got[3:]} vs {expected[3:]} (state_dict: {saved!r:.200})")


@_check("sampler", "a stateless sampler draws the same with and without feedback")
@_sourced
def check_stateless(comp: Component) -> None:


    if not comp.trait("stateless"):
        raise ContractSkip("it does not declare stateless=True")
    if _steps(comp(), range(1, 5), _gen(2)) != _steps(comp(), range(1, 5), _gen(2), fed=False):
        raise AssertionError("it declares stateless=True, but its draws change with the feedback it is given")
