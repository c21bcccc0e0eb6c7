"""Import paths of earlier releases, kept working until rllab 1.0.

Each path below was documented once and has since moved. Importing a name from it still works
and warns (:class:`RllabDeprecationWarning`, a :class:`DeprecationWarning`), naming the import to
use now: ``from rllab import Step`` where ``rllab`` publishes the name, its new module otherwise.
Nothing is imported until a name is asked for, so the table costs ``import rllab`` nothing.

Internal modules may move freely: a path documented in a release gets a row here when it moves.
The mechanism is :class:`rllab.FormerPaths` (:mod:`rllab.former`), which plugins use for their own
moved modules.
"""

from __future__ import annotations

from rllab.former import FormerPaths, RllabDeprecationWarning  # noqa: F401  (RllabDeprecationWarning: its former home)

FORMER_MODULES = {
    "rllab.chat": "rllab.rollout.chat",
    "rllab.distributed": "rllab.parallel.distributed",
    "rllab.environment": "rllab.rollout.environment",
    "rllab.episodes": "rllab.rollout.episodes",
    "rllab.events": "rllab.hookspecs",
    "rllab.lora": "rllab.models.lora",
    "rllab.optimizer": "rllab.training.optimizer",
    "rllab.parts": "rllab.training.parts",
    "rllab.placement": "rllab.parallel.placement",
    "rllab.provenance": "rllab.records.provenance",
    "rllab.reducer": "rllab.parallel.reducer",
    "rllab.rewards": "rllab.rollout.rewards",
    "rllab.runs": "rllab.training.runs",
    "rllab.tinymodel": "rllab.models.tiny",
    "rllab.tomlio": "rllab.records.tomlio",
    "rllab.tools": "rllab.rollout.tools",
    "rllab.trainer": "rllab.training.trainer",
}
"""A former module → the module that holds its names now."""

FORMER_NAMES = {
    "rllab.models": ("rllab.models.forward", (
        "CriticModel", "HIDDEN_PATH_MODEL_TYPES", "TOKENIZER_PROBE", "ValueHead", "enable_checkpointing",
        "grouped_response_logprobs", "is_sharded", "load_tokenizer", "position_ids_from_mask", "response_log_sum_sq_probs",
        "response_logprobs", "supports_hidden_path", "transformers_progress_bars_off",
    )),
    "rllab.rollout": ("rllab.rollout.stage", ("episode_batch",)),
}  # fmt: skip
"""A former module that is a package now → the module that holds the names it had, and those
names (``from rllab.models import grouped_response_logprobs``); read by the package's
``__getattr__`` (``FORMER.package_getattr``). Any other name is not looked up, so the package's
own submodules import as ever."""

FORMER = FormerPaths(
    FORMER_MODULES,
    {package: home for package, (home, _) in FORMER_NAMES.items()},
    names={package: names for package, (_, names) in FORMER_NAMES.items()},
    published_by="rllab",
)
"""rllab's own table (:class:`rllab.FormerPaths`); a name ``rllab`` publishes is named as ``from rllab import …``."""


def install() -> None:
    """Make rllab's former modules importable, and show rllab's deprecations by default."""
    FORMER.install()
