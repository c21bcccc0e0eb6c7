"""A suite file: a base config, the variants to compare, tasks, seeds and a budget → cells.

::

    name = "grpo-family"
    preset = "grpo"                      # the base: a preset, or config = "base.toml"
    steps = 200                          # the budget, train.steps of every cell
    seeds = [0, 1, 2]                    # or seeds = 3 (0, 1, 2)
    tasks = ["addition", { name = "sort", max_length = 5 }]
    baseline = "grpo"                    # probability of improvement is against this variant
    track = ["rollout/response_length"]  # optional: training metrics the report follows over the run
    controls = ["random_reward", "no_rl"]  # optional: control arms added to every task
    compute = "tokens"                   # the report's curves are fitted against tokens or seconds
    starts = 3                           # optional: every cell from 3 starting models, warm-start seeds 0, 1, 2
    # starts = [{ seed = 0, sha256 = "04908f32…" }, 1, 2]   # seeds, each optionally pinned by hash
    starts_dir = "starts"                # optional: where the starts are exported (start-<hash>) and looked up

    [claims.dr_grpo_shorter_wrong]       # optional: what a paper claims; the report decides the verdict
    statement = "Dr.GRPO ends above GRPO"  # (rllab_suite.verdicts)
    arm = "dr_grpo"
    against = "grpo"
    metric = "final_accuracy"            # final_/auc_ accuracy or reward, or pass@K
    direction = "higher"                 # higher, lower or equal (arm − against)
    min_effect = 0.03                    # the smallest effect that counts (0.03 = 3 points)
    margin = 0.02                        # the equivalence margin ±m (TOST)

    [overrides]                          # applied to every cell
    "rollout.prompts_per_step" = 8

    [variants]                           # name = overrides (optionally its own preset / config)
    grpo = {}
    dr_grpo = { preset = "dr_grpo" }
    rloo = { advantage = "rloo" }

    [axes]                               # a grid, crossed with every variant
    "policy_loss.clip_high" = [0.2, 0.28]

A cell is (variant × task × seed), or (variant × task × start × seed) with ``starts``: start ``s``
sets ``model.tiny.seed`` (the initialisation) and ``model.warm_start.seed`` (the demonstrations
drawn and the probe) to ``s``, so each start is an independently trained warm start, and a start
given with ``sha256`` is pinned (``model.sha256``: the run refuses a start that hashes otherwise).
Its config is validated with :func:`rllab.config.load_config`
and its run directory is keyed by a hash of the resolved config, so a suite that is run again
finds the cells it already has.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import attrs

from rllab import ConfigError, RllabError
from rllab.config import load_config, parse_overrides
from rllab_suite.verdicts import ClaimError, parse_claims

MANIFEST = "suite.json"
"""A suite directory's manifest: its name, cells and where its suite file came from."""
SUITE_KEYS = {"name", "preset", "config", "steps", "seeds", "tasks", "baseline", "overrides", "variants", "axes", "track", "description",
              "controls", "compute", "claims", "starts", "starts_dir"}
CONTROLS = ("random_reward", "no_rl")
"""Control arms a suite can add (``controls = [...]``): the baseline (or the base config) trained on a
random reward (``rollout.random_reward``), and the warm start alone (0 steps), evaluated alike."""
COMPUTE = ("tokens", "seconds")
"""What the report fits curves against: sampled response tokens (``rollout/tokens``) or training seconds (``time/step``)."""
VARIANT_KEYS = {"preset", "config"}
HASH_EXCLUDE = ("name", "output_dir", "provenance")
"""Config keys that do not change the computation and stay out of a cell's hash (``model.sha256``
too: it only checks the start, so a suite pinned after it ran finds its cells)."""
SUITE_OWNED = {"train.seed": "seeds", "train.steps": "steps"}
"""Config keys a suite sets in every cell itself (from ``seeds`` / ``steps``), never from overrides."""
START_OWNED = ("model.tiny.seed", "model.warm_start.seed", "model.sha256", "model.path")
"""Config keys a suite with ``starts`` sets in every cell itself (or, ``model.path``, cannot honour)."""
SHA256 = re.compile(r"[0-9a-f]{8,64}")


class SuiteError(RllabError):
    """A suite file that cannot be expanded into runnable cells."""


@attrs.frozen(kw_only=True)
class Variant:
    name: str
    preset: str | None = None
    config: str | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    control: str | None = None
    """For a control arm, which one (:data:`CONTROLS`); its variant name is the same."""


@attrs.frozen(kw_only=True)
class Cell:
    """One run of the suite: a variant on a task with a seed, and its resolved config."""

    variant: str
    task: str
    """The task's label: its name, or ``name[knob=value,…]`` when the suite has that task in several configs."""
    seed: int
    config: dict
    """The resolved config (``ExperimentConfig.to_dict()``), what the worker re-validates and runs."""
    key: str
    """Hash of the resolved config (its name and output directory excluded)."""

    start: int | None = None
    """The warm-start seed of a suite with ``starts`` (None: the suite has one start, the config's)."""

    @property
    def slug(self) -> str:
        where = "" if self.start is None else f"-w{self.start}"
        return _slug(f"{self.variant}-{self.task}{where}-s{self.seed}") + f"-{self.key[:10]}"

    def to_dict(self) -> dict:
        return {"variant": self.variant, "task": self.task, "seed": self.seed, "key": self.key, "run": self.slug,
                **({} if self.start is None else {"start": self.start})}


@attrs.frozen(kw_only=True)
class Start:
    """One starting model of a suite with ``starts``: its warm-start seed, and the hash that pins it."""

    seed: int
    sha256: str | None = None

    def to_dict(self) -> dict:
        return {"seed": self.seed, **({} if self.sha256 is None else {"sha256": self.sha256})}


@attrs.frozen(kw_only=True)
class Suite:
    name: str
    path: Path | None
    base_preset: str | None
    base_config: str | None
    overrides: tuple[tuple[str, Any], ...]
    variants: tuple[Variant, ...]
    tasks: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    """(name, (("task.KNOB", value), …)) per task; name "" means the base config's task."""
    task_labels: tuple[str, ...]
    """Per task, what cells and reports call it ("" means the resolved task's name)."""
    seeds: tuple[int, ...]
    steps: int | None
    baseline: str | None
    track: tuple[str, ...] = ()
    """Training metrics (``metrics.jsonl`` keys such as ``rollout/response_length``) the report
    follows over the run: their mean over the last steps and by fifths of the run."""
    compute: str = "tokens"
    """The compute axis of the report's fitted curves (:data:`COMPUTE`)."""
    claims: tuple = ()
    """What the papers claim (``[claims.NAME]``, :class:`rllab_suite.verdicts.Claim`): the report decides each one's verdict."""
    starts: tuple = ()
    """The starting models (:class:`Start`) every cell runs from, one cell each; () for the config's own start."""
    starts_dir: Path | None = None
    """Where the suite exports each start it builds (``start-<16 hex digits>``, once per hash) and
    where a pinned start is looked up (put before ``$RLLAB_STARTS``)."""
    base_dir: Path | None = None
    """Where a relative ``config`` is looked for after the suite file's own directory: the original
    suite file's directory, for the copy a suite directory keeps (recorded in its manifest)."""

    @property
    def variant_names(self) -> list[str]:
        return [v.name for v in self.variants]

    @property
    def controls(self) -> list[str]:
        """The control arms' variant names, in the order given."""
        return [v.name for v in self.variants if v.control]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text).strip("_")


def config_key(config: dict) -> str:
    """A stable hash of a resolved config: equal computations, equal keys."""
    data = {k: v for k, v in config.items() if k not in HASH_EXCLUDE}
    if isinstance(data.get("model"), dict) and "sha256" in data["model"]:
        data["model"] = {k: v for k, v in data["model"].items() if k != "sha256"}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _pairs(raw: Any, where: str) -> list[tuple[str, Any]]:
    """Overrides given as a table of dotted keys or as a list of ``key=value`` strings."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        return [(str(k), v) for k, v in _flatten(raw)]
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        try:
            return parse_overrides(raw)
        except ConfigError as e:
            raise SuiteError(f"{where}: {e}") from None
    raise SuiteError(f"{where}: overrides must be a table of dotted keys or a list of \"key=value\" strings, got {raw!r}")


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k not in ("tiny", "warm_start"):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def parse_suite(source: str | Path | dict) -> Suite:
    """Read a suite file (or its parsed dict); structural errors name the offending key."""
    path = None
    if isinstance(source, dict):
        data = dict(source)
        where = "<suite>"
    else:
        path = Path(source)
        if not path.is_file():
            raise SuiteError(f"suite file not found: {path}")
        where = str(path)
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise SuiteError(f"{where}: not valid TOML: {e}") from None
    if not data:
        raise SuiteError(f"{where}: the suite file is empty; give at least its variants (variants = {{...}}) or axes, "
                         "and its base (preset = ... or config = ...); see docs/suites.md")
    unknown = sorted(set(data) - SUITE_KEYS)
    if unknown:
        raise SuiteError(f"{where}: unknown suite key(s) {', '.join(unknown)}; known: {', '.join(sorted(SUITE_KEYS))}")
    if data.get("preset") and data.get("config"):
        raise SuiteError(f"{where}: give the base as preset = ... or config = ..., not both")
    seeds = data.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise SuiteError(f"{where}: seeds = {seeds}: need at least one seed")
        seeds = list(range(seeds))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise SuiteError(f"{where}: seeds must be a count or a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise SuiteError(f"{where}: seeds {seeds} repeat a seed")
    steps = data.get("steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise SuiteError(f"{where}: steps must be a positive integer, got {steps!r}")
    if data.get("tasks", [None]) == []:
        raise SuiteError(f"{where}: tasks = []: no cells to run; name at least one task, or leave tasks out for the base config's task")
    if "tasks" in data and not isinstance(data["tasks"], list):
        raise SuiteError(f"{where}: tasks must be a list of task names or tables (tasks = [\"addition\"]), got {data['tasks']!r}")
    tasks = []
    for t in data.get("tasks", [None]):
        if t is None:
            tasks.append(("", ()))
        elif isinstance(t, str):
            tasks.append((t, ()))
        elif isinstance(t, dict) and isinstance(t.get("name"), str):
            knobs = tuple((f"task.{k}", v) for k, v in t.items() if k != "name")
            tasks.append((t["name"], knobs))
        else:
            raise SuiteError(f"{where}: a task is a name or a table with a name, got {t!r}")
    labels = _task_labels(tasks, where)
    variants = []
    raw_variants = data.get("variants") or {"base": {}}
    if not isinstance(raw_variants, dict):
        raise SuiteError(f"{where}: [variants] must be a table of name = {{ overrides }}")
    for name, body in raw_variants.items():
        if not isinstance(body, dict):
            raise SuiteError(f"{where}: variant {name!r} must be a table of overrides, got {body!r}")
        if body.get("preset") and body.get("config"):
            raise SuiteError(f"{where}: variant {name!r} gives both preset and config")
        rest = {k: v for k, v in body.items() if k not in VARIANT_KEYS}
        variants.append(Variant(name=name, preset=body.get("preset"), config=body.get("config"), overrides=tuple(_pairs(rest, f"{where}: variant {name!r}"))))
    axes = data.get("axes") or {}
    if not isinstance(axes, dict):
        raise SuiteError(f"{where}: [axes] must be a table of key = [values]")
    for k, vals in axes.items():
        if not isinstance(vals, list) or not vals:
            raise SuiteError(f"{where}: axis {k!r} must be a non-empty list of values, got {vals!r}")
        repeated = _repeated(vals)
        if repeated:
            raise SuiteError(f"{where}: axis {k!r} repeats {', '.join(map(repr, repeated))}: two cells would be one run; give each value once")
    if axes:
        grid = []
        keys = list(axes)
        for v in variants:
            for combo in itertools.product(*(axes[k] for k in keys)):
                label = ",".join(f"{k.rsplit('.', 1)[-1]}={c}" for k, c in zip(keys, combo))
                name = label if len(variants) == 1 and v.name == "base" else f"{v.name}/{label}"
                grid.append(attrs.evolve(v, name=name, overrides=v.overrides + tuple(zip(keys, combo))))
        variants = grid
    names = [v.name for v in variants]
    repeated = _repeated(names)
    if repeated:
        raise SuiteError(f"{where}: variant name(s) {', '.join(map(repr, repeated))} occur more than once; name each variant once")
    overrides = tuple(_pairs(data.get("overrides"), f"{where}: [overrides]"))
    owned = [("[overrides]", k) for k, _ in overrides] + [(f"variant {v.name!r}", k) for v in variants for k, _ in v.overrides]
    for what, key in owned:
        if key in SUITE_OWNED and (key != "train.steps" or steps is not None):
            field = SUITE_OWNED[key]
            raise SuiteError(
                f"{where}: {what} sets {key}, which the suite sets in every cell from its {field!r} "
                f"(it would be replaced); use the suite's {field} = …"
            )
    track = data.get("track", [])
    if not isinstance(track, list) or not all(isinstance(t, str) and t.strip() for t in track):
        raise SuiteError(f"{where}: track must be a list of training metric names (keys of a run's metrics.jsonl, e.g. \"rollout/response_length\"), got {track!r}")
    if _repeated(track):
        raise SuiteError(f"{where}: track repeats {', '.join(map(repr, _repeated(track)))}; give each metric once")
    if any(t.startswith("eval/") for t in track):
        raise SuiteError(f"{where}: track = {track!r}: eval/ metrics are evaluations, not training metrics; the report already shows eval/accuracy and eval/reward")
    baseline = data.get("baseline")
    if baseline in CONTROLS and baseline not in names:
        raise SuiteError(f"{where}: baseline {baseline!r} is a control arm: give a variant as the baseline (every arm is set against the controls anyway); variants: {', '.join(names)}")
    if baseline is not None and baseline not in names:
        raise SuiteError(f"{where}: baseline {baseline!r} is not a variant; variants: {', '.join(names)}")
    variants += _controls(data.get("controls", []), next((v for v in variants if v.name == baseline), None), names, where)
    compute = data.get("compute", "tokens")
    if compute not in COMPUTE:
        raise SuiteError(f"{where}: compute = {compute!r}: the fitted curves' axis is one of {', '.join(map(repr, COMPUTE))}")
    try:
        claims = parse_claims(data.get("claims"), [v.name for v in variants], where)
    except ClaimError as e:
        raise SuiteError(str(e)) from None
    for c in claims:
        if c.metric.startswith("track:") and c.metric[6:] not in track:
            raise SuiteError(f"{where}: claim {c.name!r}: metric = {c.metric!r}, but {c.metric[6:]!r} is not in the suite's track; add it there")
    starts = _starts(data.get("starts"), where)
    if starts:
        for what, key in owned:
            if key in START_OWNED or key in ("model.tiny", "model.warm_start"):
                raise SuiteError(f"{where}: {what} sets {key}, which the suite sets in every cell from its 'starts' "
                                 "(seed s sets model.tiny.seed and model.warm_start.seed; sha256 pins model.sha256); drop it, or drop 'starts'")
    starts_dir = data.get("starts_dir")
    if starts_dir is not None and (not isinstance(starts_dir, str) or not starts_dir.strip()):
        raise SuiteError(f"{where}: starts_dir = {starts_dir!r}: give a directory (relative to the suite file) for the exported starts")
    if starts_dir is not None:
        starts_dir = Path(starts_dir).expanduser()
        if not starts_dir.is_absolute() and path is not None:
            starts_dir = path.resolve().parent / starts_dir
    return Suite(
        name=data.get("name") or (path.stem if path else "suite"),
        path=path,
        base_preset=data.get("preset"),
        base_config=data.get("config"),
        overrides=overrides,
        variants=tuple(variants),
        tasks=tuple(tasks),
        task_labels=labels,
        seeds=tuple(seeds),
        steps=steps,
        baseline=baseline,
        track=tuple(track),
        compute=compute,
        claims=claims,
        starts=starts,
        starts_dir=starts_dir,
        base_dir=_kept_copy_source(path),
    )


def _starts(raw: Any, where: str) -> tuple[Start, ...]:
    """``starts = N`` (warm-start seeds 0 … N−1), or a list of seeds and ``{ seed = S, sha256 = "…" }`` tables."""
    if raw is None:
        return ()
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            raise SuiteError(f"{where}: starts = {raw}: need at least one start (a count, or a list of warm-start seeds)")
        return tuple(Start(seed=s) for s in range(raw))
    if not isinstance(raw, list) or not raw:
        raise SuiteError(f"{where}: starts must be a count or a non-empty list of warm-start seeds "
                         f"(an integer, or {{ seed = S, sha256 = \"…\" }} to pin it), got {raw!r}")
    out = []
    for item in raw:
        if isinstance(item, int) and not isinstance(item, bool):
            out.append(Start(seed=item))
            continue
        if not isinstance(item, dict) or set(item) - {"seed", "sha256"} or not isinstance(item.get("seed"), int) or isinstance(item.get("seed"), bool):
            raise SuiteError(f"{where}: starts: {item!r} is not a start; give a warm-start seed (an integer) or {{ seed = S, sha256 = \"…\" }}")
        sha = item.get("sha256")
        if sha is not None and (not isinstance(sha, str) or not SHA256.fullmatch(sha.strip().lower().removeprefix("sha256:"))):
            raise SuiteError(f"{where}: starts: seed {item['seed']}: sha256 = {sha!r}; give the start's sha256 (64 hex digits, or a prefix of at least 8)")
        out.append(Start(seed=item["seed"], sha256=None if sha is None else sha.strip().lower().removeprefix("sha256:")))
    repeated = _repeated([s.seed for s in out])
    if repeated:
        raise SuiteError(f"{where}: starts repeat the warm-start seed(s) {', '.join(map(str, repeated))}; give each start once")
    return tuple(out)


def _controls(raw: Any, baseline: Variant | None, names: list[str], where: str) -> list[Variant]:
    """The control arms of ``controls = ["random_reward", "no_rl"]`` (a control may be a table,
    ``{ name = "random_reward", p = 0.2 }``, ``p = "matched"`` for the policy's own success rate):
    each is the baseline variant (else the base config) with the control's overrides."""
    if not isinstance(raw, list):
        raise SuiteError(f"{where}: controls must be a list of {', '.join(map(repr, CONTROLS))}, got {raw!r}")
    out = []
    for item in raw:
        name, knobs = (item, {}) if isinstance(item, str) else (item.get("name"), {k: v for k, v in item.items() if k != "name"}) if isinstance(item, dict) else (None, {})
        if name not in CONTROLS:
            raise SuiteError(f"{where}: controls: {item!r} is not a control; known: {', '.join(map(repr, CONTROLS))} (a name, or a table with a name)")
        if name in names or name in [v.name for v in out]:
            raise SuiteError(f"{where}: controls: {name!r} is given twice, or is also a variant's name; give each arm once")
        allowed = {"p"} if name == "random_reward" else set()
        if set(knobs) - allowed:
            raise SuiteError(f"{where}: control {name!r} takes {'p' if allowed else 'no settings'}, not {', '.join(sorted(set(knobs) - allowed))}")
        pairs: list[tuple[str, Any]] = []
        if name == "random_reward":
            p = knobs.get("p", 0.5)
            if p == "matched":
                pairs = [("rollout.random_reward", "matched")]
            elif isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1:
                pairs = [("rollout.random_reward", "given"), ("rollout.random_reward_p", float(p))]
            else:
                raise SuiteError(f"{where}: control 'random_reward': p = {p!r}: give a probability in [0, 1] or \"matched\"")
        base = baseline or Variant(name=name)
        out.append(Variant(name=name, preset=base.preset, config=base.config, overrides=base.overrides + tuple(pairs), control=name))
    return out


def _repeated(values: list) -> list:
    """The values that occur more than once (each once, in order)."""
    seen, out = [], []
    for v in values:
        if v in seen and v not in out:
            out.append(v)
        seen.append(v)
    return out


def _task_labels(tasks: list, where: str) -> tuple[str, ...]:
    """Each task's label: its name, or ``name[knob=value,…]`` when the name occurs with several
    configs, so that no report pools two different tasks under one name; a repeated task is refused."""
    keys = [(name, tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in knobs))) for name, knobs in tasks]
    repeated = _repeated(keys)
    if repeated:
        shown = ", ".join(name or "(the base config's task)" for name, _ in repeated)
        raise SuiteError(f"{where}: tasks repeat {shown} with the same knobs: two cells would be one run; give each task once")
    names = [name for name, _ in tasks]
    labels = []
    for name, knobs in tasks:
        if names.count(name) > 1 and knobs:
            name = name + "[" + ",".join(f"{k.removeprefix('task.')}={v}" for k, v in sorted(knobs, key=lambda kv: kv[0])) + "]"
        labels.append(name)
    return tuple(labels)


def _kept_copy_source(path: Path | None) -> Path | None:
    """For ``DIR/suite.toml`` next to ``DIR/suite.json``: the directory of the suite file it was
    copied from, where its relative ``config`` paths point."""
    if path is None or path.name != "suite.toml" or not (path.parent / MANIFEST).is_file():
        return None
    try:
        source = json.loads((path.parent / MANIFEST).read_text()).get("source_dir")
    except (OSError, ValueError):
        return None
    return Path(source) if source else None


def _resolve(path: str | None, suite: Suite) -> str | None:
    """A ``config`` path: relative to the suite file, else (for a suite directory's kept copy) to
    the suite file it was copied from."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_absolute() and suite.path is not None:
        here = suite.path.resolve().parent / p
        if not here.is_file() and suite.base_dir is not None and (suite.base_dir / p).is_file():
            return str(suite.base_dir / p)
        p = here
    return str(p)


def cell_overrides(suite: Suite, variant: Variant, task: tuple, seed: int, environments=(), start: Start | None = None) -> list[tuple[str, Any]]:
    """A cell's overrides, in order. A ``tasks`` entry that names one of ``environments`` (the
    registered environment names) selects ``env`` instead of ``task``, its knobs as ``env.KNOB``;
    ``start`` sets the warm start's seeds (and pins its hash)."""
    name, knobs = task
    pairs = list(suite.overrides)
    if name in environments:
        pairs += [("env", name), *((f"env.{k.removeprefix('task.')}", v) for k, v in knobs)]
    elif name:
        pairs += [("task", name), *knobs]
    pairs += list(variant.overrides)
    if start is not None:
        pairs += [("model.tiny.seed", start.seed), ("model.warm_start.seed", start.seed)]
        pairs += [("model.sha256", start.sha256)] if start.sha256 else []
    pairs += [("train.seed", seed)]
    if variant.control == "no_rl":
        pairs.append(("train.steps", 0))  # the warm start alone, evaluated like every other arm
    elif suite.steps is not None:
        pairs.append(("train.steps", suite.steps))
    return pairs


def expand(suite: Suite, *, lab=None) -> list[Cell]:
    """Every cell's config, validated before anything runs; all problems are reported at once,
    each naming its variant."""
    from rllab import Lab

    lab = lab or Lab()
    cells: list[Cell] = []
    problems: dict[str, str] = {}
    environments = frozenset(lab.names("environment"))
    for v in suite.variants:
        for task, label in zip(suite.tasks, suite.task_labels):
            for start in suite.starts or (None,):
                for seed in suite.seeds:
                    preset = v.preset or (None if v.config else suite.base_preset)
                    source = _resolve(v.config or (None if v.preset else suite.base_config), suite)
                    try:
                        cfg = load_config(source, cell_overrides(suite, v, task, seed, environments, start), lab=lab, preset=preset)
                    except RllabError as e:
                        problems.setdefault(v.name, str(e))
                        continue
                    data = cfg.to_dict()
                    data["name"] = _slug(f"{suite.name}-{v.name}")
                    if start is not None and data["model"].get("path"):
                        problems.setdefault(v.name, f"model.path = {data['model']['path']!r}: a suite with 'starts' trains its own warm starts; "
                                                    "drop model.path, or drop 'starts' (pin one start with model.sha256)")
                        continue
                    cells.append(Cell(variant=v.name, task=label or cfg.component(cfg.source).name, seed=seed, config=data, key=config_key(data),
                                      start=None if start is None else start.seed))
    if problems:
        lines = "\n".join(f"  variant {name!r}: {msg}" for name, msg in problems.items())
        raise SuiteError(f"suite {suite.name!r}: {len(problems)} variant(s) do not validate (nothing was run):\n{lines}")
    seen: dict[str, Cell] = {}
    for c in cells:
        other = seen.get(c.key)
        if other is not None and other.variant == c.variant:
            raise SuiteError(
                f"suite {suite.name!r}: tasks {other.task!r} and {c.task!r} resolve to the same config "
                f"(variant {c.variant}, seed {c.seed}): two cells would be one run; give each task once"
            )
        if other is not None and other.variant != c.variant:
            raise SuiteError(
                f"suite {suite.name!r}: variants {other.variant!r} and {c.variant!r} resolve to the same config "
                f"(task {c.task}, seed {c.seed}); drop one or make them differ"
            )
        seen[c.key] = c
    return cells
