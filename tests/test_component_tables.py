"""Every built-in component, given as a table with every knob set to a valid non-default value,
survives the run directory's config.toml: written as a run writes it, read back as ``--resume``
reads it, the same component with the same knobs. The components and their knobs come from the
registry; the values are searched for, so a new component or knob is covered without editing this.

Also: no knob may be named like the key that picks the component (``name``), and a config.toml
written before the wandb and trackio knobs were renamed still resumes."""

from __future__ import annotations

import itertools
import json
import random
import re
import tomllib
import warnings

import attrs
import pytest

from rllab.config import COMPONENT_SECTIONS, _component, load_config
from rllab.errors import ConfigError
from rllab.lab import Lab
from rllab.specs import SELECTOR_KEY, build_config
from rllab.records.tomlio import dump_toml

KINDS = [(sec, kind) for sec, (kind, _) in COMPONENT_SECTIONS.items()] + [("loggers", "logger")]


@pytest.fixture(scope="module")
def lab():
    return Lab()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Files a knob may have to name (a data file, a directory)."""
    d = tmp_path_factory.mktemp("knobs")
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1), "chosen": str(i + 1), "rejected": "0"} for i in range(8)]
    (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "model").mkdir()
    (d / "model" / "config.json").write_text("{}")
    (d / "model" / "model.safetensors").write_bytes(b"")
    (d / "model" / "tokenizer_config.json").write_text("{}")
    return d


def _candidates(default, typ: str, files) -> list:
    """Values to try for a knob of type ``typ`` whose default is ``default`` (its type first)."""
    path = str(files / "data.jsonl")
    if typ == "bool" or isinstance(default, bool):
        return [True, False]
    ints = [1, 2, 3, 0, 7, 100, 1000, 30000, -1]
    if isinstance(default, int):
        ints = [default + 1, default * 2, default - 1] + ints
    floats = [0.25, 0.5, 0.75, 0.1, 0.9, 1.5, 2.0, 3.0, 5.0, 0.01, 1e-4, -0.5, 10.0]
    if isinstance(default, float):
        floats = [default * 0.5, default + 0.5, default * 2, default - 0.25] + floats
    strs = ["x", "http://127.0.0.1:9", path, str(files / "model"), '{"a": {"b": 1}}', "a", "0123abcd" * 8]  # … and a sha256
    out: list = []
    if "tuple[str" in typ or "str | tuple" in typ:
        out += [["http://127.0.0.1:9", "http://127.0.0.1:10"], ["a", "b"], ["sigmoid", "sft"], ["a"]]
    if "tuple[float" in typ or "float | tuple" in typ:
        out += [[0.5, 0.25], [1.0, 2.0], [0.5]]
    if typ.startswith("int") or "| int" in typ:
        out += ints
    if "float" in typ:
        out += floats
    if typ.startswith("str") or "| str" in typ:
        out += strs
    if typ.startswith("dict"):
        out += [{"size": 10}, {"r": 4}, {"a": "b"}]
    if not out:
        out = ints + floats + strs
    return out


def _choices(f) -> tuple | None:
    for cell in getattr(f.validator, "__closure__", None) or ():
        v = cell.cell_contents
        if isinstance(v, tuple) and v and not any(callable(x) for x in v) and "one of" in f.metadata.get("allowed", ""):
            return v
    return None


HINTS = {
    ("preference_loss", "mpo"): {"loss_types": ["discopop"], "loss_weights": [1.0]},
    ("preference_loss", "combined"): {"loss_types": ["discopop"], "loss_weights": [1.0]},
}
"""Starting tables for the search where a knob acts only with two others at values of their own
(more tables to start from; the components still come from the registry)."""


def full_tables(spec, files) -> list[dict]:
    """Tables of ``spec``'s knobs that the component accepts, each setting every knob, such that each
    knob is at a value other than its default in at least one (the first sets as many as go
    together); fails naming a knob for which no such value was found. Values come from the knob's
    type and choices, and from the names the component's own errors list as allowed."""
    fields = attrs.fields_dict(attrs.resolve_types(spec.config))
    info = {k.name: k for k in spec.knobs()}
    learned: dict[str, list[str]] = {n: [] for n in info}  # per knob, names its errors offer ("must be one of ...")

    def default(name):
        return None if info[name].default == "(required)" else info[name].default

    def cands(name):
        typ = info[name].type
        values = _choices(fields[name]) or _candidates(default(name), typ, files)
        if "str" in typ and not _choices(fields[name]):
            words = learned[name][:24]
            values = [*values, *words] + ([[w] for w in words] + [[a, b] for a, b in zip(words, words[1:])] if "tuple" in typ else [])
        return [v for v in values if v != default(name) and (not isinstance(v, list) or tuple(v) != default(name))]

    seen: dict[str, bool] = {}

    def ok(values, knob=None):
        key = repr(sorted(values.items()))
        if key not in seen:
            seen[key] = _builds(values)
        return seen[key]

    def _builds(values):
        try:
            build_config(spec, values)
            return True
        except ConfigError as e:
            if e.key in learned and len(learned[e.key]) < 40:
                text = str(e).split(":", 1)[-1]
                names = re.findall(r"[A-Za-z_][\w.-]*[_\d-][\w.-]*", text) + re.findall(r"\b[a-z]+\b", text)  # identifiers first
                for w in names:
                    if w not in learned[e.key] and len(learned[e.key]) < 40:
                        learned[e.key].append(w)
            return False

    required = {n: None for n in info if default(n) is None and info[n].default == "(required)"}

    def base_with(changes: dict, knob=None) -> dict | None:
        """``changes`` over a value for each required knob that builds with them, if any."""
        todo = [n for n in required if n not in changes]
        for combo in itertools.islice(itertools.product(*(cands(n) for n in todo)), 12):
            t = {**dict(zip(todo, combo)), **changes}
            if ok(t, knob):
                return t
        return None

    def alone(n, start: dict, bases: tuple = ("start", "none")) -> dict | None:
        """A table in which knob ``n`` is away from its default: ``start`` with ``n`` changed (and one
        other knob too if it needs one), else the same from the required knobs alone."""
        hint = HINTS.get((spec.kind, spec.name))
        for base in [start if b == "start" else {} for b in bases] + ([hint] if hint and "none" in bases else []):
            for _ in range(2):  # the second round has the names the first one's errors offered
                for c in cands(n):
                    t = base_with({**base, n: c}, n)
                    if t is not None:
                        return t
            for m in info:
                for cm in cands(m) + [default(m)]:
                    for c in cands(n):
                        t = base_with({**base, m: cm, n: c})
                        if t is not None:
                            return t
        empty = base_with({}) or {}
        rng = random.Random(n)  # a knob that needs two others at values of their own: a seeded random search
        others = [m for m in info if m != n]
        for _ in range(3000 if "none" in bases else 0):
            t = {**(start if rng.random() < 0.5 or "none" not in bases else empty), n: rng.choice(cands(n))}
            for m in rng.sample(others, min(len(others), rng.randint(1, 3))):
                t[m] = rng.choice(cands(m) + [default(m)])
            if ok(t):
                return t
        return None

    greedy: dict = base_with({}) or {}
    for rounds in range(3):  # as many knobs away from their defaults as the component accepts together
        for n in info:
            if greedy.get(n, default(n)) != default(n):
                continue
            t = next((g for c in cands(n) if (g := base_with({**greedy, n: c}, n)) is not None), None)
            if t is None and rounds == 2:
                t = alone(n, greedy, bases=("start",))  # a knob that acts only with another: the two together
            if t is not None:
                greedy = t
    tables = [greedy]
    for n in info:
        if any(t.get(n, default(n)) != default(n) for t in tables):
            continue
        t = alone(n, greedy)
        assert t is not None, f"{spec.kind} {spec.name!r}: no valid non-default value found for knob {n!r}"
        tables.append(t)
    defaults = {n: _plain(default(n)) for n in info if n not in required}
    return [{**defaults, **t} for t in tables]  # every knob written out, as a run's config.toml writes it


def _all_components(lab):
    return [(sec, kind, name) for sec, kind in KINDS for name in lab.names(kind)]


def test_no_built_in_knob_is_named_like_the_selector(lab):
    for sec, kind, name in _all_components(lab):
        assert SELECTOR_KEY not in {k.name for k in lab.spec(kind, name).knobs()}, (kind, name)


def test_a_knob_named_like_the_selector_is_refused_at_registration(tmp_path):
    plugin = tmp_path / "named.py"
    plugin.write_text(
        "import attrs, rllab\n"
        "@attrs.frozen\nclass C:\n    name: str = rllab.knob('', help='a display name')\n"
        "def lg(*, config, run_dir):\n    return None\n"
        "@rllab.hookimpl\ndef register_loggers(register):\n    register('named', lg, config=C)\n"
    )
    lab = Lab(entry_points=False)
    lab.add_plugin(str(plugin))
    broken = [p for p in lab.plugins if not p.ok]
    assert broken and "has a knob named 'name', the key that picks the component" in broken[0].error
    with pytest.raises(KeyError):
        lab.spec("logger", "named")


def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


def test_every_component_as_a_full_table_round_trips_through_config_toml(lab, files):
    """The table a run records (every knob, ``ExperimentConfig.to_dict`` and the TOML writer), read
    back by the parser ``--resume`` uses: the same component, the same config, every knob at the
    value the table gave (each knob away from its default in at least one table)."""
    base = load_config(None, lab=lab)
    seen = set()
    for sec, kind, name in _all_components(lab):
        spec = lab.spec(kind, name)
        for knobs in full_tables(spec, files):
            ref = _component(lab, sec, kind, {"name": name, **knobs}, name, "", "<test>")
            if sec == "loggers":
                cfg = attrs.evolve(base, loggers=(ref,))
            else:
                cfg = attrs.evolve(base, components={**base.components, sec: ref}, unused=base.unused - {sec})
            text = dump_toml(cfg.to_dict())
            data = tomllib.loads(text)
            table = data["loggers"][0] if sec == "loggers" else data[sec]
            back = _component(lab, sec, kind, table, "?", text, "config.toml")
            assert back.name == name, (sec, name, table)
            assert back.config == ref.config, (sec, name)
            got = {k: _plain(v) for k, v in attrs.asdict(back.config, recurse=False).items()}
            assert got == {k: _plain(v) for k, v in knobs.items()}, (sec, name)
            seen.add((sec, name))
    assert seen == {(sec, name) for sec, _, name in _all_components(lab)} and len(seen) > 80


def test_every_logger_as_a_full_table_resumes_from_the_run_directory(lab, files, tmp_path):
    """The whole path of a run: the table on the command line, the run directory's config.toml as a
    run writes it, and the config ``--resume`` loads from it."""
    from rllab.training.rundir import recorded_config

    for logger in lab.names("logger"):
        for knobs in full_tables(lab.spec("logger", logger), files):
            table = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in {"name": logger, **knobs}.items()) + " }"
            cfg = load_config(None, [f'loggers=["jsonl", {table}]'], lab=lab)
            (tmp_path / "config.toml").write_text(dump_toml(recorded_config(cfg, lab)))
            again = load_config(tmp_path / "config.toml", lab=lab)  # as --resume reads it
            assert [r.name for r in again.loggers] == ["jsonl", logger]
            assert again.loggers[1].config == cfg.loggers[1].config
            assert {k: _plain(v) for k, v in attrs.asdict(again.loggers[1].config, recurse=False).items()} == knobs


OLD_WANDB = ('loggers = ["jsonl", { name = "", project = "x", entity = "", group = "", tags = [], mode = "offline", '
             'log_model = false, traces = 4 }]\n')
OLD_TRACKIO = 'loggers = [{ name = "", project = "p", group = "g", traces = 2 }]\n'


@pytest.mark.parametrize("text, want, knobs", [(OLD_WANDB, "wandb", {"project": "x"}), (OLD_TRACKIO, "trackio", {"group": "g", "traces": 2})])
def test_a_config_toml_that_lost_its_loggers_name_still_resumes(lab, tmp_path, text, want, knobs):
    """Before the wandb and trackio display-name knob was called ``run_name``, its empty default
    overwrote the logger's name in config.toml; such a file is read as the one logger whose knobs
    it holds, with a warning saying what to write."""
    (tmp_path / "config.toml").write_text(text)
    with pytest.warns(FutureWarning, match=f'read as {want!r}.*write name = "{want}"'):
        cfg = load_config(tmp_path / "config.toml", lab=lab)
    ref = cfg.loggers[-1]
    assert ref.name == want and all(getattr(ref.config, k) == v for k, v in knobs.items())
    assert ref.config.run_name == ""


def test_an_empty_name_that_fits_no_component_is_refused_naming_the_choices(lab):
    with pytest.raises(ConfigError, match=r"loggers name is empty: it must name the logger to use \(one of jsonl, "):
        load_config(None, ['loggers=[{name="", project="x"}]'], lab=lab)
    with pytest.raises(ConfigError, match=r"\[advantage\] name is empty"):
        load_config(None, ['advantage.name=""'], lab=lab)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match="has no knob 'name2'; did you mean 'run_name'"):
            load_config(None, ['loggers=[{name="wandb", name2="x"}]'], lab=lab)


HOSTILE_STRINGS = ["two\nlines", "cr\r\nlf", "tab\there", "bell\x07", "del\x7f", 'quote"q', "back\\slash", "\\n as text",
                   "é ☃ \u2028", "]]>", "{ name = \"x\" }"]


def test_any_string_a_knob_holds_survives_config_toml(lab, tmp_path):
    """A knob's text with newlines or control characters (a run name, a prompt) is escaped in the
    TOML the run writes, so the file parses and resumes with the same text."""
    from rllab.training.rundir import recorded_config

    for text in HOSTILE_STRINGS:
        cfg = load_config(None, ["loggers=[\"jsonl\", {name=\"wandb\"}]"], lab=lab)
        cfg = attrs.evolve(cfg, name=text, loggers=(cfg.loggers[0], _component(lab, "loggers", "logger", {"name": "wandb", "run_name": text},
                                                                                   "wandb", "", "<test>")))
        (tmp_path / "config.toml").write_text(dump_toml(recorded_config(cfg, lab)), encoding="utf-8")
        again = load_config(tmp_path / "config.toml", lab=lab)
        assert again.name == text and again.loggers[1].config.run_name == text, repr(text)
    table = {"k\n": "v\x00", "plain": {"nested\t": ["a\nb", 1.5, True]}}
    assert tomllib.loads(dump_toml({"s": table})) == {"s": table}
