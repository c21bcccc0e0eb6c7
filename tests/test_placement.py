"""The placement protocol and its table: one module per strategy, chosen by ``model.strategy``;
every other module asks a strategy's traits, never its name; no placement knows of adapters and
the trainer holds one policy handle, with no LoRA branch."""

from __future__ import annotations

import io
import re
import tokenize
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from rllab.parallel import placement
from rllab.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _members(protocol: type) -> set[str]:
    """The names a protocol declares (annotations and methods), not ``typing``'s own."""
    own = set(getattr(protocol, "__annotations__", {})) | {n for n in vars(protocol) if not n.startswith("_")}
    return own - set(vars(typing.Protocol)) - {"_is_protocol"}


def _names(path: Path) -> set[str]:
    """The identifiers of a source file: its code, without strings, docstrings and comments."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return {t.string for t in tokens if t.type == tokenize.NAME}


@pytest.mark.parametrize("name", sorted(placement.STRATEGIES))
def test_each_row_loads_a_class_that_implements_the_protocol_with_the_rows_traits(name):
    row = placement.STRATEGIES[name]
    cls = row.cls()
    assert cls.name == name and cls.data_parallel is row.data_parallel and cls.sharded is row.sharded
    missing = {m for m in _members(placement.Placement) if not hasattr(cls, m) and m not in ("device", "reducer")}
    assert not missing, f"{cls.__name__} lacks {sorted(missing)}"
    assert callable(cls.start) and callable(cls.for_config)


def test_the_strategy_setting_offers_the_tables_rows():
    from rllab.config import load_config

    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.strategy=ddp"])
    for name in placement.STRATEGIES:
        assert repr(name) in str(e.value) or name in str(e.value)
    with pytest.raises(Exception, match="'ddp' is not a placement strategy; choose one of 'single', 'fsdp2'"):
        placement.strategy("ddp")
    assert placement.names(data_parallel=True) == ["fsdp2"] and placement.names(data_parallel=False) == ["single"]


def test_the_load_time_checks_ask_the_traits_not_the_name(monkeypatch):
    """A data-parallel row of another name passes the torchrun check and is refused with
    asynchronous rollouts; a one-process row is refused under torchrun, naming the data-parallel rows."""
    from rllab.checks.run import check_async
    from rllab.checks.config import check_launcher

    monkeypatch.setitem(placement.STRATEGIES, "ddp", placement.Strategy(name="ddp", data_parallel=True, sharded=False, module="builtins", attr="object"))
    monkeypatch.setitem(placement.STRATEGIES, "pipe", placement.Strategy(name="pipe", data_parallel=False, sharded=False, module="builtins", attr="object"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    check_launcher(SimpleNamespace(strategy="ddp"), "", "t")  # no error
    with pytest.raises(ConfigError, match="strategy = 'pipe'.*Set model.strategy=fsdp2 or model.strategy=ddp to train"):
        check_launcher(SimpleNamespace(strategy="pipe"), "", "t")
    cfg = SimpleNamespace(rollout=SimpleNamespace(max_staleness=1), model=SimpleNamespace(strategy="ddp"))
    with pytest.raises(ConfigError, match="model.strategy = 'ddp' is not supported.*model.strategy = \"single\" or model.strategy = \"pipe\""):
        check_async(cfg, lab=None)


def test_no_module_but_the_table_compares_a_strategy_name():
    pattern = re.compile(r"strategy\s*(==|!=|\bin\b|\bnot in\b)\s*[\"'(]")
    offenders = []
    for path in sorted([*(ROOT / "rllab").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]):
        if path == ROOT / "rllab" / "parallel" / "placement.py":
            continue
        code = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith(("#", "\"", "'", "f\"")))
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(code)]
    assert not offenders, offenders


def test_no_placement_knows_of_adapters_and_the_trainer_has_no_lora_branch():
    for name in ("rllab/parallel/placement.py", "rllab/parallel/single.py", "rllab/parallel/fsdp2.py", "rllab/parallel/dcp.py", "rllab/training/trainer.py"):
        code = _names(ROOT / name)
        assert not {n for n in code if "lora" in n.lower() or "adapter" in n.lower()}, name


def test_full_and_lora_policy_handles_answer_the_same_questions():
    from rllab.models import lora
    from rllab.training import parts

    members = _members(parts.PolicyHandle) | _members(placement.PolicyWeights)
    for cls in (parts.FullPolicy, lora.LoraPolicy):
        assert not {m for m in members if not hasattr(cls, m) and m not in attrs_fields(cls)}, cls


def attrs_fields(cls) -> set[str]:
    import attrs

    return {f.name for f in attrs.fields(cls)}


def test_a_silent_rank_drops_every_event_of_the_runs_hooks_and_no_other_name():
    from rllab.lab import Lab
    from rllab.parallel.fsdp2 import Silent

    hook = Lab().hook
    silent = Silent(hook)
    assert silent.on_step_end(step=1, metrics={}, run_dir=None) == []
    assert silent.on_run_start(run_dir=None, config=None, start_step=0, total_steps=1, progress=False, solved_when="") == []
    with pytest.raises(AttributeError):
        silent.on_stpe_end  # a typo is an error, as on the run's own hooks
    with pytest.raises(AttributeError):
        hook.on_stpe_end
