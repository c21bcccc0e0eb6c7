"""Reading a foreign config file and importing it: the shared first step of ``rllab import`` and
``rllab crosscheck`` (re-exported by :mod:`rllab_referee`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rllab import ConfigError, RllabError


def read_config_file(path: str, *, what: str, empty_ok: bool = False) -> dict[str, Any]:
    """A YAML or JSON file's top-level mapping (``what``: the kind of config, for errors). A file
    that sets no knob (empty, only comments, or ``{}``) is refused unless ``empty_ok`` (knobs
    given otherwise, as verl's overrides): importing it would write rllab's defaults as if they
    were the file's settings."""
    p = Path(path)
    if not p.is_file():
        raise RllabError(f"{what}: no file {path!r}" + (" (it is a directory)" if p.is_dir() else ""))
    if p.suffix.lower() == ".toml":
        raise ConfigError(f"{what}: {path} is a TOML file; this reads the other framework's config as YAML (or JSON). An rllab "
                          f"config runs as it is: rllab run {path}")
    text = p.read_text()
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except ImportError:
        raise RllabError("reading YAML needs PyYAML: pip install pyyaml (or give the config as .json)") from None
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError: the parser's message says where
        raise ConfigError(f"{what}: {path} is not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {path} holds a {type(data).__name__}, not a mapping of knobs to values")
    if not data and not empty_ok:
        said = "is empty" if not text.strip() else "sets no knob" if text.strip() not in ("{}",) else "is an empty mapping ({})"
        raise ConfigError(f"{what}: {path} {said}: there is nothing to import (rllab's defaults would be written as if they "
                          f"were its settings); give the file that holds the config's knobs")
    return data


def run_import(framework: str, config: str, overrides: list[str], *, lab, processes: int = 1, strict: bool = False):
    """Import ``config`` of ``framework`` ("trl" or "verl"); returns the checked :class:`Translation`."""
    from rllab.config import load_config

    if framework == "trl":
        from rllab_referee import trl

        if overrides:
            raise RllabError(f"rllab import trl takes no overrides ({overrides[0]!r}): edit the YAML, or the written TOML")
        t = trl.translate(read_config_file(config, what="TRL GRPOConfig"), processes=processes)
    else:
        from rllab_referee import verl

        t = verl.translate(read_config_file(config, what="verl config", empty_ok=bool(overrides)), overrides)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(config).stem).strip("-.") or "config"
    t.set("", "name", f"{framework}-{stem}", how=f"imported from {t.source}; run directories are named after it")
    t.finish(strict=strict)
    try:
        load_config(t.to_dict(), lab=lab)
    except RllabError as e:
        raise ConfigError(f"{t.source}: the imported settings are refused by rllab: {e}") from None
    return t
