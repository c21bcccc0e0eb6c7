"""docs/architecture.md is checked against the code: its module table names every kernel module
that exists and none that does not, and its walk from `rllab run` to an optimizer step numbers each
stage once."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
ENTRY_POINTS = {"rllab/__init__.py", "rllab/__main__.py", "rllab/presets/__init__.py"}
"""Package markers the table does not list (the public API is described in the text)."""


def _listed_elsewhere(path: str, doc: str) -> bool:
    """An entry point, a ``python -m`` entry of a package, or the ``__init__`` of a package the
    table names as a whole (`rllab/rollout/`)."""
    folder = path.rpartition("/")[0] + "/"
    return path in ENTRY_POINTS or path.endswith("/__main__.py") or (path.endswith("/__init__.py") and f"`{folder}`" in doc)


def test_every_kernel_module_is_in_the_architecture_table_and_every_named_one_exists():
    doc = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`(rllab/[\w/]+\.py)`", doc))
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "rllab").rglob("*.py")}
    missing = sorted(f for f in files - named if not _listed_elsewhere(f, doc))
    assert not missing, f"modules missing from docs/architecture.md: {missing}"
    assert not named - files, f"docs/architecture.md names modules that do not exist: {sorted(named - files)}"


def test_each_stage_of_the_walk_is_numbered_once():
    doc = DOC.read_text(encoding="utf-8")
    walk = doc.split("## From `rllab run` to an optimizer step", 1)[1].split("\n## ", 1)[0]
    numbers = [int(n) for n in re.findall(r"^(\d+)\. \*\*", walk, flags=re.M)]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    paragraphs = [p.strip() for p in re.split(r"^\d+\. ", walk, flags=re.M) if p.strip()]
    sentences = [s.strip() for p in paragraphs for s in re.split(r"(?<=[.;])\s+", " ".join(p.split())) if len(s) > 40]
    repeated = sorted({s for s in sentences if sentences.count(s) > 1})
    assert not repeated, f"docs/architecture.md repeats itself: {repeated}"
