"""A run leaves the process as it found it: settings it changes for itself are restored."""

from transformers.utils import logging as hf_logging

from rllab.training.trainer import Trainer

from .test_trainer import _cache, small_cfg  # noqa: F401  (the module-scoped model cache)


def test_trainer_turns_transformers_bars_off_only_while_it_loads_models(tmp_path, lab, monkeypatch):
    """Class: test-order dependence (state leaking between runs in one process). Building a
    Trainer switched transformers' progress bars off for the whole process, so anything after it
    (an SGLang disk sync test checking that its own switch is restored) saw them off. They are
    off while the trainer loads its models, and as they were afterwards."""
    seen = []
    load = Trainer._load_model
    monkeypatch.setattr(Trainer, "_load_model", lambda self: (seen.append(hf_logging.is_progress_bar_enabled()), load(self))[1])
    assert hf_logging.is_progress_bar_enabled()
    trainer = Trainer(small_cfg("train.steps=1", lab=lab), lab=lab, run_dir=tmp_path / "run", progress=False)
    try:
        assert seen and not any(seen)  # the policy loaded quietly
        assert hf_logging.is_progress_bar_enabled()
    finally:
        trainer.close()
    hf_logging.disable_progress_bar()
    try:  # a process that turned them off itself keeps them off
        Trainer(small_cfg("train.steps=1", lab=lab), lab=lab, run_dir=tmp_path / "run2", progress=False).close()
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_suite_prebuild_restores_transformers_bars(lab):
    """Class: test-order dependence. The suite's model prebuild restores the bars too."""
    from rllab_suite.spec import expand, parse_suite
    from rllab_suite.suite import prebuild_models

    from tests.tiny import TINY

    over = dict(TINY)
    cells = expand(parse_suite({"name": "p", "steps": 1, "seeds": 1, "tasks": ["addition"], "overrides": over, "variants": {"a": {}}}), lab=lab)
    prebuild_models(cells, lab=lab)
    assert hf_logging.is_progress_bar_enabled()


def test_a_task_refusing_its_data_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    """Class: accepted input failing with a traceback. A task whose factory refuses its knobs or
    data (a missing file, an unknown data set) ends in ``error: ...`` naming the task, exit 2.
    ``rllab run`` in this process (rllab.cli.main): an exception it let through would fail the test."""
    from rllab.cli import main

    try:
        code = main(["run", "task=jsonl", f"task.path={tmp_path / 'nope.jsonl'}", "--steps", "1", f"output_dir={tmp_path}"])
    except SystemExit as e:  # argparse's exit
        code = e.code
    out = capsys.readouterr()
    assert code not in (0, None)
    assert "Traceback" not in out.err, out.err[-2000:]
    assert "task 'jsonl': no such file" in out.err + out.out
