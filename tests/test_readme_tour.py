"""The README's tour runs as written: every ``rllab run FILE …`` line names a file the repository
ships, and its config loads with the line's overrides."""

import re
import shlex
from pathlib import Path

from rllab.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def _tour_lines() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("## A 30-second tour", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", tour, flags=re.S).group(1)
    return [shlex.split(line.split("  #", 1)[0]) for line in block.splitlines() if line.startswith("rllab ")]


def test_the_tours_experiment_files_exist_and_load(lab):
    runs = [words for words in _tour_lines() if words[1] == "run" and len(words) > 2 and words[2].endswith(".toml")]
    files = {w[2] for w in runs if not w[2].startswith("runs/")}
    assert files == {"examples/exp.toml"}
    for words in runs:
        if words[2].startswith("runs/"):
            continue
        overrides = [w for w in words[3:] if "=" in w and not w.startswith("-")]
        cfg = load_config(ROOT / words[2], overrides, lab=lab)
        if "advantage=rloo" in overrides:
            assert cfg.component("advantage").name == "rloo"
    assert load_config(ROOT / "examples/exp.toml", [], lab=lab).train.steps == 200


def test_what_to_expect_quotes_the_benchmarks_numbers():
    """README's "What to expect" quotes benchmarks/README.md: every decimal figure in it is there too."""
    readme = (ROOT / "README.md").read_text()
    expect = readme.split("### What to expect", 1)[1].split("\n## ", 1)[0]
    bench = (ROOT / "benchmarks" / "README.md").read_text()
    figures = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", expect))
    assert {"31.0", "31.5", "36.5", "33.5", "39.5", "64.5", "70.5"} <= figures
    assert sorted(f for f in figures if f not in bench) == []
