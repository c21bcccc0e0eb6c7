"""``rllab new-plugin``: scaffold a separate, pip-installable plugin package.

The package has its own ``pyproject.toml`` with an ``rllab`` entry point, one module holding a
working example component of the requested kind (passing the contract suite as generated), and a
test that runs the contract suite on it. After ``pip install -e DIR``, ``rllab plugins`` lists it.
"""

from __future__ import annotations

import keyword
import re
import textwrap
from pathlib import Path

from rllab.lab import KINDS, ConfigError
from rllab.traits import TRAITS

_HOOK = KINDS

_BODIES: dict[str, tuple[str, str]] = {
    # kind: (config fields, function)
    "policy_loss": (
        'clip: float = rllab.knob(2.0, help="upper bound on the detached ratio", gt=1.0)',
        '''
def {fn}(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
    """Truncated-ratio policy gradient: −sg(min(r, clip))·A·log π.

    log_prob, old_log_prob, advantages: (B, T) float; mask: (B, T) bool.
    Returns a scalar loss and scalar metrics.
    """
    rllab.check_mask("{name}", mask, log_prob)
    zero = torch.zeros((), dtype=log_prob.dtype)
    log_ratio = torch.where(mask, log_prob - old_log_prob, zero).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    truncated = torch.clamp(ratio, max=config.clip).detach()
    adv = torch.where(mask, advantages, zero)
    per_token = -truncated * adv * torch.where(mask, log_prob, zero)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(per_token, mask)
    metrics = {{
        "actor/approx_kl": ops.masked_mean(-log_ratio, mask).detach(),
        "actor/clipfrac": ops.masked_mean((ratio > config.clip).float(), mask).detach(),
    }}
    return loss, metrics
''',
    ),
    "advantage_estimator": (
        'epsilon: float = rllab.knob(1e-6, help="added to the group std", gt=0.0)',
        '''
def {fn}(*, token_rewards, mask, index, values=None, config):
    """Group-normalised score, broadcast over the row's tokens.

    token_rewards: (B, T) float; mask: (B, T) bool; index: (B,) int64 group ids.
    Returns (advantages, returns), both (B, T).
    """
    rllab.check_mask("{name}", mask, token_rewards)
    scores = ops.masked_sum(token_rewards, mask, dim=-1)
    ops.check_finite("{name}", "scores", scores)
    count, mean, std = ops.group_stats(scores, index)
    adv = torch.where(count > 1, (scores - mean) / (std + config.epsilon), torch.zeros_like(scores))
    adv = torch.where(mask, adv[:, None], torch.zeros((), dtype=adv.dtype))
    return adv, adv
''',
    ),
    "kl_penalty": (
        'scale: float = rllab.knob(1.0, help="multiplies the estimate", ge=0.0)',
        '''
def {fn}(*, log_prob, ref_log_prob, config):
    """Scaled squared log-ratio: scale·½(log π − log π_ref)². Shapes (B, T) → (B, T)."""
    return config.scale * 0.5 * (log_prob - ref_log_prob) ** 2
''',
    ),
    "loss_aggregation": (
        "",
        '''
def {fn}(*, loss_mat, mask, config, global_tokens=None, global_seqs=None):
    """Token mean: Σ loss·mask / (number of valid tokens). (B, T) → scalar."""
    total = ops.masked_sum(loss_mat, mask)
    count = mask.sum() if global_tokens is None else torch.tensor(global_tokens)
    return total / count.clamp(min=1).to(total.dtype)
''',
    ),
    "importance_correction": (
        'c_max: float = rllab.knob(2.0, help="upper truncation of the weight", gt=0.0)',
        '''
def {fn}(*, old_log_prob, rollout_log_prob, mask, config):
    """Truncated token weights min(exp(old − rollout), c_max), detached, 0 on padding."""
    zero = torch.zeros((), dtype=old_log_prob.dtype)
    log_w = torch.where(mask, old_log_prob.detach() - rollout_log_prob, zero)
    w = torch.where(mask, torch.exp(log_w).clamp(max=config.c_max), zero)
    return w, {{"tis/mean_weight": ops.masked_mean(w, mask)}}
''',
    ),
    "value_loss": (
        "",
        '''
def {fn}(*, values, old_values, returns, mask, aggregate, config):
    """Unclipped squared error ½·aggregate((V − R)²)."""
    zero = torch.zeros((), dtype=values.dtype)
    err = torch.where(mask, values - returns, zero)
    loss = 0.5 * aggregate(err**2, mask)
    return loss, {{"critic/vf_mse": ops.masked_mean(err.detach() ** 2, mask)}}
''',
    ),
    "preference_loss": (
        'beta: float = rllab.knob(0.1, help="inverse temperature", gt=0.0)',
        '''
def {fn}(*, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
         chosen_lengths, rejected_lengths, config):
    """Sigmoid preference loss −log σ(β·Δ). Every argument is (P,); returns (P,) losses."""
    delta = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    losses = -torch.nn.functional.logsigmoid(config.beta * delta)
    return losses, {{"dpo/accuracy": (delta > 0).float().mean().detach()}}
''',
    ),
    "reward_function": (
        'max_chars: int = rllab.knob(200, help="longest completion that still scores 1", ge=1)',
        '''
def {fn}(*, completions, config, **columns):
    """1.0 for a completion of at most max_chars characters, else 0.0 (TRL's signature).

    completions: N strings, or [{{"role": "assistant", "content": ...}}] lists for chat prompts;
    columns: the data set's other columns and ground_truth (the reference answers), N values each.
    Returns N floats (None: not applicable).
    """
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if len(t) <= config.max_chars else 0.0 for t in texts]
''',
    ),
    "sampler": (
        'replay: float = rllab.knob(0.5, help="share of each step\'s prompts taken from the failed ones", ge=0.0, le=1.0)\n'
        'below: float = rllab.knob(0.5, help="a prompt whose mean group reward is below this is replayed", ge=0.0, le=1.0)\n'
        'keep: int = rllab.knob(256, help="the most failed prompts kept for replay (the latest)", ge=1)',
        '''
class {fn}(rllab.Sampler):
    """Replays failed prompts: up to a share ``replay`` of each step's prompts are earlier prompts
    whose mean group reward was below ``below`` (oldest first), the rest come from the task.

    Optional members not set here take rllab.Sampler's defaults (see rllab.members).
    """

    def __init__(self, *, config):
        self.config = config
        self.failed = []
        """The prompts to replay (rllab.Example), oldest first."""

    def draw(self, *, n, rng, step, source):
        """n examples: replayed ones, then source(k, rng), the task's own draw."""
        k = min(len(self.failed), int(n * self.config.replay))
        replayed, self.failed = self.failed[:k], self.failed[k:]
        return replayed + source(n - k, rng)

    def feedback(self, *, step, examples, rewards):
        """Each drawn prompt's mean group reward (None: every sample failed its reward)."""
        self.failed += [e for e, r in zip(examples, rewards) if r is not None and r < self.config.below]
        self.failed = self.failed[-self.config.keep:]

    def state_dict(self):
        return {{"failed": [(e.prompt, e.answer, dict(e.meta)) for e in self.failed]}}

    def load_state_dict(self, state):
        self.failed = [rllab.Example(prompt=p, answer=a, meta=m) for p, a, m in state["failed"]]

    def metrics(self):
        return {{"sampler/replay_queue": float(len(self.failed))}}
''',
    ),
    "environment": (
        'high: int = rllab.knob(8, help="secrets are drawn from 1..high", ge=2)\n'
        'max_turns: int = rllab.knob(4, help="guesses allowed per episode (binary search needs ceil(log2(high + 1)))", ge=1)',
        '''
class {cls}Episode:
    """One game: the model guesses the secret; a wrong guess is answered "higher" or "lower"."""

    def __init__(self, secret: int):
        self.secret = secret

    def step(self, text: str) -> rllab.Step:
        """Consume one model turn (decoded up to its stop token); 1.0 and done when right."""
        guess = text.strip()
        if guess == str(self.secret):
            return rllab.Step(reward=1.0, done=True)
        higher = not guess.isdigit() or int(guess) < self.secret
        return rllab.Step(observation="higher:" if higher else "lower:")


class {fn}(rllab.Environment):
    """Higher/lower in 1..high. The class is its own factory: ``{fn}(config=...)``.

    Optional members not set here take rllab.Environment's defaults (see rllab.members):
    solved (total reward ≥ 1), describe_error, step_batch, tools, warm_start_defaults, ...
    """

    rollout_defaults = {{"max_new_tokens": 4}}
    """[rollout] settings this environment needs, applied to those a config does not set."""

    def __init__(self, *, config):
        self.config = config
        self.max_turns = config.max_turns

    def _example(self, secret: int) -> rllab.Example:
        return rllab.Example(prompt=f"guess 1-{{self.config.high}}:", answer=str(secret), meta={{"secret": secret}})

    def train_examples(self, n, rng):
        """n secrets drawn with the torch.Generator rng."""
        return [self._example(s) for s in torch.randint(1, self.config.high + 1, (n,), generator=rng).tolist()]

    def eval_examples(self):
        """Every secret once, in order."""
        return [self._example(s) for s in range(1, self.config.high + 1)]

    def start(self, example):
        return {cls}Episode(example.meta["secret"])

    def demonstration(self, example):
        """Binary search: the model turns of a solved episode (for the supervised warm start)."""
        lo, hi, secret, turns = 1, self.config.high, example.meta["secret"], []
        while True:
            guess = (lo + hi) // 2
            turns.append(str(guess))
            if guess == secret:
                return turns
            lo, hi = (guess + 1, hi) if secret > guess else (lo, guess - 1)
''',
    ),
}


def _identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name).strip("_").lower()
    if not ident or ident[0].isdigit() or keyword.iskeyword(ident):
        ident = f"p_{ident}"
    return ident


def _register_comment(kind: str) -> str:
    """Comment lines above the generated ``register`` call: the optional inputs and the traits
    this kind may declare there (all keywords of ``register``, checked when the plugin loads)."""
    lines = [
        "# requires=(...): optional inputs this component needs from the algorithm (see rllab.hookspecs).",
    ]
    traits = TRAITS.get(kind, {})
    if traits:
        lines.append("# Traits this component may declare, as keywords of register (see rllab.traits):")
        for trait_name, trait in traits.items():
            wrapped = textwrap.wrap(f"{trait_name}=... : {trait.help}", 92, break_on_hyphens=False)
            lines.extend(["#   " + wrapped[0], *("#     " + w for w in wrapped[1:])])
    return "\n".join("    " + line for line in lines)


def scaffold(name: str, kind: str, directory: Path) -> Path:
    """Write a plugin package for a component ``name`` of ``kind`` under ``directory``."""
    if kind not in _BODIES:
        raise ConfigError(f"new-plugin cannot scaffold kind {kind!r}; choose one of: {', '.join(_BODIES)}")
    ident = _identifier(name)
    pkg = f"rllab_{ident}"
    dist = f"rllab-{ident.replace('_', '-')}"
    root = Path(directory) / dist
    if root.exists():
        raise ConfigError(f"{root} already exists; choose another name or directory")
    (root / pkg).mkdir(parents=True)
    (root / "tests").mkdir()
    fields, body = _BODIES[kind]
    cfg_cls = "".join(p.capitalize() for p in ident.split("_")) + "Config"
    fields_block = textwrap.indent(fields, "    ") if fields else "    pass"
    module = f'''"""{name}: a {kind.replace("_", " ")} for rllab.

Describe the method here: the paper, the equation, every tensor shape.
"""

import attrs
import torch

import rllab
from rllab import ops


@attrs.frozen
class {cfg_cls}:
    """Knobs of {name}."""

{fields_block}
{body.format(fn=ident, name=name, cls=cfg_cls.removesuffix("Config"))}

@rllab.hookimpl
def {_HOOK[kind]}(register):
{_register_comment(kind)}
    register("{name}", {ident}, config={cfg_cls})
'''
    (root / pkg / "__init__.py").write_text(module)
    (root / "pyproject.toml").write_text(
        f'''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "{name}: an rllab {kind.replace("_", " ")} plugin"
requires-python = ">=3.11"
dependencies = ["rllab"]

[project.entry-points.rllab]
{pkg} = "{pkg}"

[tool.setuptools]
packages = ["{pkg}"]
'''
    )
    (root / "tests" / "test_contract.py").write_text(
        f'''"""Runs rllab's contract suite on {name}."""

import pytest

from rllab.testing import contract_cases


@pytest.mark.parametrize("case", contract_cases(names=["{name}"]), ids=str)
def test_contract(case):
    case.run()


def test_is_registered():
    import rllab

    assert rllab.Lab().spec("{kind}", "{name}").provider == "{pkg}"
'''
    )
    (root / "README.md").write_text(
        f"# {dist}\n\nAn rllab {kind.replace('_', ' ')} plugin.\n\n"
        f"```\npip install -e .\nrllab plugins --kind {kind}\nrllab check {name}\npytest tests\n```\n"
    )
    return root
