"""Labels for runs compared without a suite (``rllab compare RUN_DIR…``): each run named by the
fewest config settings that tell the runs apart, and each run's task by its name and the task knobs
on which runs of it differ. :mod:`rllab_suite.report` publishes these names too."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path


def label_runs(run_dirs: list[Path]) -> list[str]:
    """A label per run from the config keys on which the runs differ (seed and name excluded): the
    fewest of them that tell the groups apart (:func:`shortest_distinguishing`), a component's name
    preferred to its knobs."""
    flat = []
    for d in run_dirs:
        data = tomllib.loads((Path(d) / "config.toml").read_text()) if (Path(d) / "config.toml").is_file() else {}
        flat.append(dict(_flat(data)))
    skip = ("name", "output_dir", "train.seed", "task.")
    keys = sorted({k for f in flat for k in f if not k.startswith(skip) and not k.startswith("provenance")})
    differ = [k for k in keys if len({json.dumps(f.get(k), default=str) for f in flat}) > 1]
    # a component's name first: "policy_loss=cispo" says more than its knobs
    names = [k for k in differ if k.endswith(".name")]
    knobs = [k for k in differ if not k.endswith(".name") and not any(k.startswith(n[:-4]) for n in names)]
    chosen = set(shortest_distinguishing([*names, *knobs], flat, differ))
    out = []
    for f in flat:
        parts = [f"{k[:-5]}={f.get(k)}" for k in names if k in chosen] + [f"{k}={f.get(k)}" for k in knobs if k in chosen]
        out.append(" ".join(parts) or "run")
    return out


def shortest_distinguishing(candidates: list[str], flat: list[dict], differ: list[str], *, exhaustive: int = 3) -> list[str]:
    """The fewest of ``candidates`` (earliest first among equally few) whose values group the runs
    exactly as all the ``differ`` keys do: two runs share a label if and only if their configs
    differ in nothing but the seed. Every subset of up to ``exhaustive`` keys is tried, then keys
    are added in order until the grouping matches."""
    import itertools

    def groups(keys) -> int:
        return len({tuple(json.dumps(f.get(k), default=str) for k in keys) for f in flat})

    want = groups(differ)  # the candidates are a part of differ, which decides them: equal counts, equal groupings
    if want <= 1:
        return []
    for size in range(1, min(exhaustive, len(candidates)) + 1):
        for combo in itertools.combinations(candidates, size):
            if groups(combo) == want:
                return list(combo)
    chosen: list[str] = []
    for k in candidates:
        chosen.append(k)
        if groups(chosen) == want:
            return chosen
    return list(candidates)


def task_labels(run_dirs: list[Path]) -> list[str]:
    """A task label per run: the task's name, plus the task knobs on which runs of that task differ
    (``addition[digits=1]``, as a suite labels them), so runs of different task settings are never
    pooled as one task."""
    flat = []
    for d in run_dirs:
        data = tomllib.loads((Path(d) / "config.toml").read_text()) if (Path(d) / "config.toml").is_file() else {}
        flat.append({k[len("task."):]: v for k, v in _flat(data) if k.startswith("task.")})
    out = []
    for f in flat:
        name = f.get("name", "?")
        same = [g for g in flat if g.get("name", "?") == name]
        keys = sorted({k for g in same for k in g if k != "name"})
        differ = [k for k in keys if len({json.dumps(g.get(k), default=str) for g in same}) > 1]
        out.append(f"{name}[" + ",".join(f"{k}={f.get(k)}" for k in differ) + "]" if differ else str(name))
    return out


def _flat(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v
