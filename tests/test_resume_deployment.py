"""``rllab run --resume RUN key=value``: deployment settings may change and are recorded; settings
that change the experiment are refused by name."""

from __future__ import annotations

import json
import tomllib

import pytest

import rllab
from rllab.training.runs import DEPLOYMENT_SETTINGS, RESUME_LOG, resume_run
from rllab.training.trainer import run_experiment

from .test_trainer import _cache, small_cfg  # noqa: F401  (the module-scoped model cache)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 1-step run with the hf backend, its final checkpoint written."""
    run = tmp_path_factory.mktemp("runs") / "run"
    run_experiment(small_cfg("train.steps=1", "train.eval_size=8"), run_dir=run, progress=False)
    return run


@pytest.mark.parametrize(
    "override, named",
    [
        ("rollout.temperature=0.5", "rollout.temperature"),
        ("backend.prompts_per_request=4", "backend.prompts_per_request"),  # batching: not deployment
        ("backend.num_threads=2", "backend.num_threads"),  # CPU reductions split differently
        ("backend=sglang", "backend"),
    ],
)
def test_settings_that_change_the_experiment_are_still_refused(finished, override, named):
    with pytest.raises(rllab.RllabError, match=rf"--resume cannot change {named}: .*backend.urls.*start a new run"):
        resume_run(finished, overrides=[override], progress=False)


def test_another_kind_of_device_is_refused(finished, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # "auto" is the CPU here
    with pytest.raises(rllab.RllabError, match=r"cannot change model.device from 'auto' \(cpu\) to 'cuda' \(cuda\)"):
        resume_run(finished, overrides=["model.device=cuda"], progress=False)
    with pytest.raises(rllab.RllabError, match=r"cannot change backend.device from 'auto' \(cpu\) to 'cuda:1' \(cuda\)"):
        resume_run(finished, overrides=["backend.device=cuda:1"], progress=False)
    assert not (finished / RESUME_LOG).exists()


def test_a_placement_change_is_recorded_and_kept_for_the_next_resume(finished, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    before = tomllib.loads((finished / "config.toml").read_text())
    summary = resume_run(finished, overrides=["train.steps=2", "backend.device=cpu", "model.device=cpu"], progress=False)
    assert summary["steps"] == 2
    out = capsys.readouterr().out
    assert "resume at step 1: backend.device changed from 'auto' to 'cpu'" in out
    assert "model.device changed from 'auto' to 'cpu'" in out
    (entry,) = [json.loads(line) for line in (finished / RESUME_LOG).read_text().splitlines()]
    assert entry["from_step"] == 1
    assert entry["changes"] == {"backend.device": {"from": "auto", "to": "cpu"}, "model.device": {"from": "auto", "to": "cpu"}}
    after = tomllib.loads((finished / "config.toml").read_text())
    assert after["backend"]["device"] == "cpu" and after["model"]["device"] == "cpu"
    assert after["provenance"] == before["provenance"]  # the rest as recorded
    assert {k: v for k, v in after.items() if k not in ("backend", "model")} == {
        k: v for k, v in before.items() if k not in ("backend", "model")}
    # a value given again unchanged is no change: nothing more is logged
    resume_run(finished, overrides=["train.steps=3", "backend.device=cpu"], progress=False)
    assert len((finished / RESUME_LOG).read_text().splitlines()) == 1



def test_a_finished_run_without_checkpoints_is_not_trained_again_over_its_results(finished, tmp_path):
    """Silently wrong: ``--resume`` of a finished run whose checkpoints were removed trained it
    again from step 0, replacing its metrics and final.json, and said nothing."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy)
    shutil.rmtree(copy / "checkpoints")
    final = (copy / "final.json").read_text()
    with pytest.raises(rllab.RllabError, match=r"finished \(final.json\) but keeps no checkpoint.*start a new run: rllab run .*config.toml --run-dir NEW_DIR"):
        resume_run(copy, overrides=["train.steps=2"], progress=False)
    assert (copy / "final.json").read_text() == final

def test_the_deployment_settings_are_knobs_of_the_shipped_components():
    """Every listed setting exists (a typo would make it unreachable, not refused)."""
    from rllab.config import load_config

    hf = load_config(None, []).to_dict()
    sg = load_config(None, ["backend=sglang", "backend.urls=http://127.0.0.1:1"]).to_dict()
    for key in DEPLOYMENT_SETTINGS:
        section, knob = key.split(".")
        assert knob in hf[section] or knob in sg[section] or (section == "model" and knob == "reference_device"), key


def test_a_file_of_a_run_directory_given_for_it_says_to_give_the_directory(finished, tmp_path):
    """Unclear message: ``--resume RUN/config.toml`` said "RUN/config.toml is not a run directory
    (no config.toml)"; export and reproduce likewise."""
    from rllab.training.export import run_checkpoint
    from rllab.training.reproduce import reproduce_run

    said = rf"config.toml is a file of the run directory {finished}: give the directory"
    with pytest.raises(rllab.RllabError, match=said):
        resume_run(finished / "config.toml", progress=False)
    with pytest.raises(rllab.RllabError, match=said):
        run_checkpoint(finished / "config.toml")
    with pytest.raises(rllab.RllabError, match=said):
        reproduce_run(finished / "config.toml", run_dir=tmp_path / "again")
    with pytest.raises(rllab.RllabError, match=r"nowhere is not a run directory \(no config.toml\)$"):
        run_checkpoint(tmp_path / "nowhere")
