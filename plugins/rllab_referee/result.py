"""One import's outcome: the rllab settings with the knob each came from, and every other knob's fate.

A :class:`Translation` collects, while a reader (:mod:`rllab_referee.trl`,
:mod:`rllab_referee.verl`) walks a foreign config:

* **mapped** settings: ``(section, key) -> value``, each with the source knobs it came from
  (written as the key's comment in the TOML);
* **differs**: knobs rllab reproduces up to a stated difference (refused under ``--strict``);
* **ignored**: knobs that only move hardware, logging, data loading or evaluation, with the reason;
* **refused**: knobs that would change the algorithm and that rllab cannot reproduce, with the reason.

:meth:`Translation.finish` refuses, naming it, every knob of the source that no rule accounted
for — no knob is dropped silently.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from rllab import ConfigError
from rllab.records.tomlio import dump_toml

SECTION_ORDER = ("", "algorithm", "rollout", "train", "model", "advantage", "policy_loss", "aggregation", "kl",
                 "kl_controller", "correction", "value_loss")  # fmt: skip


@attrs.define
class Translation:
    """What an import produced (see the module docstring)."""

    source: str
    """The framework and config kind, in words (``"TRL GRPOConfig"``)."""
    given: dict[str, Any] = attrs.field(factory=dict)
    """The source's knobs as the user set them (flat names), in the order read."""
    defaults: dict[str, Any] = attrs.field(factory=dict)
    """The source's defaults, shown in the comments of the knobs the user left unset."""
    values: dict[tuple[str, str], tuple[Any, str]] = attrs.field(factory=dict)
    ignored: dict[str, str] = attrs.field(factory=dict)
    differs: dict[str, str] = attrs.field(factory=dict)
    refused: dict[str, str] = attrs.field(factory=dict)
    mapped_from: set[str] = attrs.field(factory=set)
    warnings: dict[str, str] = attrs.field(factory=dict)
    """Knobs mapped faithfully whose setting the source framework itself warns about."""
    spelling: dict[str, str] = attrs.field(factory=dict)
    """A knob's name as the source spelled it, where the reader reads it under another (a renamed key):
    comments, lists and errors name the knob as the user wrote it."""

    def _name(self, knob: str) -> str:
        return self.spelling.get(knob, knob)

    def set(self, section: str, key: str, value: Any, *knobs: str, how: str = "") -> None:
        """rllab's ``[section] key = value``, from the source ``knobs`` (``how``: the formula, if any)."""
        if value is None:
            raise TypeError(f"[{section}] {key}: TOML has no null; write the knob's 'off' value instead")
        knobs = tuple(self._name(k) for k in knobs)
        names = ", ".join(f"{k} = {self._show(k)}" for k in knobs)
        self.values[(section, key)] = (value, f"{names}{' — ' + how if how else ''}" if knobs else how)
        self.mapped_from.update(knobs)

    def ignore(self, knob: str, why: str) -> None:
        """A knob that does not change the algorithm (hardware, logging, data loading, evaluation)."""
        knob = self._name(knob)
        if knob not in self.refused:
            self.ignored[knob] = why

    def differ(self, knob: str, how: str) -> None:
        """A knob rllab follows up to the difference ``how``."""
        knob = self._name(knob)
        self.differs[knob] = how
        self.mapped_from.add(knob)

    def warn(self, knob: str, text: str) -> None:
        """A warning the source framework gives about ``knob``'s setting (printed in the summary)."""
        self.warnings[self._name(knob)] = text

    def refuse(self, knob: str, why: str) -> None:
        """A knob whose value changes the algorithm in a way rllab cannot reproduce."""
        knob = self._name(knob)
        self.refused[knob] = why
        self.ignored.pop(knob, None)

    def _show(self, knob: str) -> str:
        if knob in self.given:
            value = self.given[knob]
            return "{…}" if isinstance(value, Mapping) and value else _value(value) if value is not None else "null"
        default = self.defaults.get(knob)
        return f"{_value(default) if default is not None else 'null'} (default)"

    def accounted(self) -> set[str]:
        return self.mapped_from | set(self.ignored) | set(self.differs) | set(self.refused)

    def finish(self, *, strict: bool = False) -> None:
        """Refuse every given knob no rule accounted for; raise :class:`ConfigError` if any is refused.

        ``strict``: the knobs that differ are refused too."""
        for knob in self.given:
            if knob not in self.accounted():
                self.refuse(knob, "no rule maps this knob (report it: every knob must be mapped, ignored or refused)")
        refused = dict(self.refused)
        if strict:
            refused.update({k: f"(--strict) {v}" for k, v in self.differs.items()})
        if refused:
            lines = "\n".join(f"  {k} = {self._show(k)}: {why}" for k, why in refused.items())
            raise ConfigError(
                f"{self.source}: {len(refused)} knob(s) cannot be reproduced by rllab, so nothing was written:\n{lines}\n"
                "Remove them (or set them to their defaults) and import again; rllab's own settings can then be "
                "changed in the written TOML.",
                key=next(iter(refused)),
            )

    def to_dict(self) -> dict[str, Any]:
        """The config as nested dicts (sections in :data:`SECTION_ORDER`), for :func:`rllab.config.load_config`."""
        out: dict[str, Any] = {}
        for (section, key), (value, _) in sorted(self.values.items(), key=_order):
            (out if not section else out.setdefault(section, {}))[key] = value
        return out

    def toml(self, *, header: str = "") -> str:
        """The TOML text, one comment per key naming the source knob(s)."""
        lines = [f"# {line}" if line else "#" for line in header.splitlines()]
        current = None
        for (section, key), (value, comment) in sorted(self.values.items(), key=_order):
            if section != current:
                current = section
                if section:
                    lines.append(f"\n[{section}]")
            text = f"{key} = {_value(value)}"
            lines.append(f"{text:<40} # {comment}" if comment else text)
        return "\n".join(lines).lstrip("\n") + "\n"

    def summary(self) -> str:
        """The printed summary: counts, then the knobs that differ, the ignored ones and the mapped ones."""
        parts = [f"{self.source}: {len(self.values)} rllab setting(s) written; "
                 f"{len(self.differs)} knob(s) differ slightly, {len(self.ignored)} ignored."]  # fmt: skip
        if self.warnings:
            parts.append("warnings:")
            parts.extend(f"  {k}: {v}" for k, v in self.warnings.items())
        if self.differs:
            parts.append("differs (refused under --strict):")
            parts.extend(f"  {k}: {v}" for k, v in self.differs.items())
        if self.ignored:
            parts.append("ignored (they do not change the algorithm):")
            parts.extend(f"  {k}: {v}" for k, v in sorted(self.ignored.items()))
        return "\n".join(parts)


def _order(item) -> tuple:
    (section, key), _ = item
    rank = SECTION_ORDER.index(section) if section in SECTION_ORDER else len(SECTION_ORDER)
    return (rank, section, 0 if key == "name" else 1, key)


def _value(value: Any) -> str:
    """One TOML value as :func:`rllab.records.tomlio.dump_toml` writes it (a mapping as an inline table)."""
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    try:
        return dump_toml({"v": value}).strip()[len("v = "):]
    except TypeError:
        return repr(value)
