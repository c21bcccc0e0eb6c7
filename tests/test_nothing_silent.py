"""Mistakes a user makes must be refused or take effect, never pass without a word.

Each test here names the mistake it covers; each failed (the mistake passed silently) before the
behaviour it checks was built.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import rllab
from rllab.cli import main as rllab_main
from rllab.config import ConfigError, load_config
from rllab.training.trainer import Trainer, run_experiment

from .test_trainer import SMALL, _cache, small_cfg  # noqa: F401  (the module-scoped model cache)

BAD_LOSSES = textwrap.dedent(
    '''
    import torch
    import rllab


    def nan_loss(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
        """A policy loss that goes NaN."""
        return aggregate(log_prob * float("nan"), mask), {}


    def matrix_loss(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
        """A policy loss that forgets to aggregate."""
        return -advantages * log_prob, {}


    @rllab.hookimpl
    def register_policy_losses(register):
        register("nan_loss", nan_loss)
        register("matrix_loss", matrix_loss)
    '''
)


@pytest.fixture(scope="module")
def bad_plugin(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugins") / "bad_losses.py"
    path.write_text(BAD_LOSSES)
    return path


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rllab.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=dict(os.environ))


@pytest.fixture
def main_cli(capsys):
    """``rllab ...`` in this process (``rllab.cli.main``, what ``python -m rllab.cli`` exits with): its
    exit code and what it printed, as ``cli`` gives them, without a new interpreter's imports.
    ``cli`` (a process of its own) stays where the process itself matters: a resume that finds
    its plugins with nothing imported, the summary line when piped."""

    def call(*args):
        capsys.readouterr()
        code = rllab_main([str(a) for a in args])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["rllab", *map(str, args)], code, out.out, out.err)

    return call


# 1. a non-finite loss stops the run loudly and saves nothing it broke


def test_nan_loss_stops_the_run_naming_component_and_step_without_a_checkpoint(tmp_path, bad_plugin, main_cli):
    run = tmp_path / "run"
    r = main_cli("run", *SMALL, "policy_loss=nan_loss", "train.checkpoint_every=1", "--plugin", bad_plugin, "--run-dir", run, "-q")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "policy_loss 'nan_loss'" in r.stderr and "non-finite loss" in r.stderr and "step 1" in r.stderr
    assert not (run / "checkpoints").exists() and not (run / "final.json").exists()


def test_nonfinite_skip_policy_drops_updates_and_counts_them(tmp_path, bad_plugin):
    lab = rllab.Lab([str(bad_plugin)])
    cfg = small_cfg("policy_loss=nan_loss", "train.nonfinite=skip", "train.steps=2", lab=lab)
    tr = Trainer(cfg, lab=lab, run_dir=tmp_path, progress=False)
    before = [p.detach().clone() for p in tr.policy.parameters()]
    m = tr.train_step()
    assert m["train/nonfinite"] == 1.0 and m["train/skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, tr.policy.parameters()))
    tr.close()


def test_a_checkpoint_with_nonfinite_weights_is_refused(tmp_path):
    tr = Trainer(small_cfg(), run_dir=tmp_path, progress=False)
    with torch.no_grad():
        next(tr.policy.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(rllab.RllabError, match="refusing to write the checkpoint .* non-finite policy weights"):
        tr.save_checkpoint()
    assert not (tmp_path / "checkpoints" / "step_000000").exists()
    tr.close()


# 2. a loss of the wrong shape is named, not a raw traceback


def test_matrix_loss_error_names_plugin_component_and_shape(tmp_path, bad_plugin, main_cli):
    r = main_cli("run", *SMALL, "policy_loss=matrix_loss", "--plugin", bad_plugin, "--run-dir", tmp_path / "run", "-q")
    assert r.returncode == 1
    assert "policy_loss 'matrix_loss' (plugin" in r.stderr and "returned a loss of shape (16, " in r.stderr
    assert "Traceback" not in r.stderr


# 3. overrides mean the same in any order; a knob of a replaced component is refused


def test_override_order_does_not_matter():
    a = load_config(None, ["policy_loss.clip_c=5", "policy_loss=ppo_dual_clip"])
    b = load_config(None, ["policy_loss=ppo_dual_clip", "policy_loss.clip_c=5"])
    assert a.component("policy_loss").config.clip_c == 5.0 == b.component("policy_loss").config.clip_c
    assert a.to_dict() == b.to_dict()


def test_knob_of_the_replaced_component_is_an_error():
    with pytest.raises(ConfigError, match="policy_loss 'vanilla_pg'.* has no knob 'clip_high'"):
        load_config(None, ["policy_loss.clip_high=0.28", "policy_loss=vanilla_pg"])


# 4. --resume with an override extends the run or refuses


def test_resume_with_more_steps_extends_the_run(tmp_path, main_cli):
    run = tmp_path / "run"
    assert main_cli("run", *SMALL, "train.steps=2", "--run-dir", run, "-q").returncode == 0
    r = main_cli("run", "--resume", run, "train.steps=4", "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "final.json").read_text())["steps"] == 4
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "rollout/reward" in x] == [1, 2, 3, 4]
    again = main_cli("run", "--resume", run, "-q")
    assert again.returncode == 1 and "already finished its 4 steps" in again.stderr and "train.steps=N" in again.stderr
    other = main_cli("run", "--resume", run, "train.lr=0.1", "-q")
    assert other.returncode == 1 and "--resume cannot change train.lr" in other.stderr


# 5. --plugin anywhere on the line; a missing file is an error; a resumed run finds its plugins


def test_plugin_option_before_the_subcommand(tmp_path, bad_plugin, main_cli):
    r = main_cli("--plugin", bad_plugin, "plugins", "show", "matrix_loss")
    assert r.returncode == 0 and "A policy loss that forgets to aggregate" in r.stdout


def test_missing_plugin_file_is_an_error(tmp_path, main_cli):
    r = main_cli("run", "--plugin", tmp_path / "nope.py", "-q")
    assert r.returncode == 1 and "plugin file not found" in r.stderr


def test_run_records_its_plugins_and_resume_finds_them(tmp_path, main_cli):
    plugin = tmp_path / "elsewhere" / "my_adv.py"
    plugin.parent.mkdir()
    plugin.write_text(
        "import rllab, torch\n"
        "def flat(*, token_rewards, mask, index, values=None, config):\n"
        "    '''Advantage = reward (no baseline).'''\n"
        "    a = torch.where(mask, token_rewards.sum(-1, keepdim=True).expand_as(token_rewards), torch.zeros_like(token_rewards))\n"
        "    return a, a\n"
        "@rllab.hookimpl\n"
        "def register_advantage_estimators(register):\n"
        "    register('flat_adv', flat)\n"
    )
    run = tmp_path / "run"
    r = main_cli("run", *SMALL, "advantage=flat_adv", "train.steps=1", "--plugin", plugin, "--run-dir", run, "-q")
    assert r.returncode == 0, r.stderr
    recorded = (run / "config.toml").read_text()
    assert str(plugin.resolve()) in recorded and "[provenance]" in recorded and "torch = " in recorded
    # from another directory, without --plugin, in a process that has imported nothing: the recorded plugin is found
    again = cli("run", "--resume", run, "train.steps=2", "-q", cwd=tmp_path / "elsewhere")
    assert again.returncode == 0, again.stderr
    # and the recorded config reproduces the run
    assert main_cli("run", run / "config.toml", "--run-dir", tmp_path / "rerun", "-q").returncode == 0


# 6. a scheduled learning rate takes effect


def test_scheduled_lr_changes_the_optimizer(tmp_path):
    cfg = load_config({"schedule": [{"step": 1, "set": {"train.lr": 1e-5}}]}, [*SMALL, "train.lr_schedule=constant", "train.warmup_steps=0"])
    tr = Trainer(cfg, run_dir=tmp_path, progress=False)
    m0, m1 = tr.train_step(), tr.train_step()
    assert m0["optim/lr"] == pytest.approx(2e-4) and m1["optim/lr"] == pytest.approx(1e-5)
    assert tr.optimizer.param_groups[0]["lr"] == pytest.approx(1e-5)
    tr.close()


def test_schedule_refuses_what_cannot_change_mid_run():
    with pytest.raises(ConfigError, match="train.seed cannot change during a run"):
        load_config({"schedule": [{"step": 1, "set": {"train.seed": 3}}]})
    with pytest.raises(ConfigError, match="algorithm.name cannot change|the algorithm owns"):
        load_config({"schedule": [{"step": 1, "set": {"algorithm": "dpo"}}]})


# 7. RLLAB_PLUGINS keeps the built-ins (tests/test_lab.py covers the rule; here the CLI)


def test_plugin_allow_list_keeps_builtins(tmp_path):
    env = dict(os.environ, RLLAB_PLUGINS="rllab_topr")
    r = subprocess.run([sys.executable, "-m", "rllab.cli", "plugins", "show", "addition"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "task from plugin rllab_tasks" in r.stdout


# 8. the same --plugin twice loads once


def test_same_plugin_twice_on_the_command_line(bad_plugin, main_cli):
    r = main_cli("--plugin", bad_plugin, "plugins", "--kind", "policy_loss", "--plugin", bad_plugin)
    assert r.returncode == 0 and "registered twice" not in r.stdout + r.stderr and r.stdout.count("matrix_loss") == 1


# 9. TOML errors point at the key's own line


def test_unknown_knob_points_at_its_own_line(tmp_path):
    p = tmp_path / "exp.toml"
    p.write_text('name = "x"\n\n[policy_loss]\nname = "ppo_clip"\nclip_high = 0.28\nclip_hgh = 0.3\n\n[train]\nsteps = 3\n')
    with pytest.raises(ConfigError, match=r"\[policy_loss\] \(line 6\)"):
        load_config(p)
    p.write_text('[advantage]\nname = "grpo"\nepsilon = 1e-6\nnorm_by_std = "false"\n')
    with pytest.raises(ConfigError, match=r"\(line 4\)"):
        load_config(p)


def test_unused_section_is_refused():
    with pytest.raises(ConfigError, match=r"\[preference_loss\] .*is set, but algorithm 'rl' does not use it"):
        load_config({"preference_loss": {"name": "dpo", "beta": 0.2}})


def test_requires_checked_at_load():
    with pytest.raises(ConfigError, match=r"kl_penalty 'full' .*requires logits, which algorithm 'rl' does not provide"):
        load_config(None, ["kl=full", "algorithm.kl_in=loss"])


def test_moved_train_setting_says_where_it_went():
    with pytest.raises(ConfigError, match=r"train.epochs moved to \[algorithm\] epochs"):
        load_config(None, ["train.epochs=2"])


# 10. booleans


def test_bool_knob_error_says_true_or_false():
    with pytest.raises(ConfigError, match=r"expected true or false .*got str 'False' \(write false, without quotes\)"):
        load_config(None, ["advantage.norm_by_std=False"])


# -q still prints the summary, whole, when piped


def test_quiet_run_prints_the_summary_line(tmp_path):
    run = tmp_path / ("a-long-directory-name-" * 6) / "run"
    r = cli("run", *SMALL, "train.steps=1", "--run-dir", run, "-q")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("done:"))
    assert "eval accuracy" in line and str(run) in line


def test_run_experiment_python_api_records_everything(tmp_path):
    summary = run_experiment(small_cfg("train.steps=1"), run_dir=tmp_path / "r", progress=False)
    text = (tmp_path / "r" / "config.toml").read_text()
    # every knob, defaults included
    assert "clip_high = " in text and "epsilon = " in text and "[algorithm]" in text
    assert summary["steps"] == 1


def test_missing_pairs_file_fails_at_load(tmp_path):
    with pytest.raises(ConfigError, match=r"pairs_file = '.*nope.jsonl': no such file"):
        load_config(None, ["algorithm=dpo", f"algorithm.pairs_file={tmp_path / 'nope.jsonl'}"])


# a second run into a directory that already holds one is refused, or replaced with --overwrite


def test_a_run_dir_that_holds_a_run_is_refused_unless_resumed_or_overwritten(tmp_path, main_cli):
    """Mistake: reusing --run-dir D for a new run (it used to mix both runs' metrics and overwrite
    the first run's checkpoints and final.json without a word)."""
    run = tmp_path / "run"
    assert main_cli("run", *SMALL, "train.steps=1", "--run-dir", run, "-q").returncode == 0
    first = (run / "final.json").read_text()
    again = main_cli("run", *SMALL, "train.steps=1", "--run-dir", run, "-q")
    assert again.returncode == 1 and "already holds a run" in again.stderr and "--resume" in again.stderr and "--overwrite" in again.stderr
    assert (run / "final.json").read_text() == first
    (run / "stale.txt").write_text("from the old run")
    over = main_cli("run", *SMALL, "train.steps=2", "--run-dir", run, "--overwrite", "-q")
    assert over.returncode == 0, over.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "rollout/reward" in x] == [1, 2]  # the new run's rows only
    assert not (run / "stale.txt").exists() and not list(tmp_path.glob(".run.replaced*"))
    # --overwrite never removes a directory that does not look like a run directory
    other = tmp_path / "mine"
    other.mkdir()
    (other / "config.toml").write_text("[train]\nsteps = 1\n")
    r = main_cli("run", *SMALL, "train.steps=1", "--run-dir", other, "--overwrite", "-q")
    assert r.returncode == 1 and "not a config a run recorded" in r.stderr and (other / "config.toml").read_text() == "[train]\nsteps = 1\n"


def test_run_dir_checks_in_the_python_api(tmp_path):
    """Mistake: run_experiment into a used directory (the suite and TUI call it too); an empty
    directory, or one holding only a suite cell's log, is fine."""
    from rllab.training.runs import prepare_run_dir

    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare_run_dir(empty) == empty
    (empty / "log.txt").write_text("a suite cell's log\n")
    assert prepare_run_dir(empty) == empty
    (tmp_path / "file").write_text("x")
    with pytest.raises(rllab.RllabError, match="is a file, not a directory"):
        prepare_run_dir(tmp_path / "file")
    used = tmp_path / "used"
    (used / "checkpoints").mkdir(parents=True)
    with pytest.raises(rllab.RllabError, match="does not look like a run directory"):
        prepare_run_dir(used, overwrite=True)
    assert (used / "checkpoints").is_dir()
    (used / "config.toml").write_text('name = "x"\n[provenance]\nrllab = "0"\n')
    with pytest.raises(rllab.RllabError, match="already holds a run"):
        run_experiment(small_cfg("train.steps=1"), run_dir=used, progress=False)
    assert prepare_run_dir(used, overwrite=True) == used and not any(used.iterdir())
    # two runs started within the same second without --run-dir get two directories
    from rllab.training.runs import default_run_dir

    cfg = load_config(None, [f"output_dir={tmp_path / 'out'}"])
    assert len({default_run_dir(cfg), default_run_dir(cfg)}) == 2


def test_run_and_resume_flags_that_do_not_combine_are_refused(tmp_path, main_cli):
    """Mistake: --overwrite without --run-dir, or with --resume (it would be ignored)."""
    r = main_cli("run", *SMALL, "--overwrite", "-q")
    assert r.returncode == 1 and "--overwrite replaces the run in --run-dir" in r.stderr
    r = main_cli("run", "--resume", tmp_path, "--overwrite", "-q")
    assert r.returncode == 1 and "--overwrite do not apply" in r.stderr


def test_a_config_argument_that_is_not_a_config_says_what_it_is(tmp_path):
    """Mistake: `rllab run RUN_DIR` or `rllab run rec.pt` (a directory or a binary file where a
    TOML config goes; the binary file used to end in a UnicodeDecodeError traceback)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("")
    with pytest.raises(ConfigError, match=r"is a directory; it is a run directory: continue it with --resume"):
        load_config(run)
    pt = tmp_path / "rec.pt"
    torch.save({"x": torch.zeros(3)}, pt)
    with pytest.raises(ConfigError, match=r"is not text \(a recording or checkpoint"):
        load_config(pt)


@pytest.mark.parametrize(
    "extra, match",
    [
        (("backend=sglang", "backend.urls=http://127.0.0.1:9", "backend.weight_sync=tensor", "model.device=cpu"), "needs the policy on CUDA"),
        (("advantage=gdpo", "task=sort"), "task 'sort' has one reward"),
        (("policy_loss=bypass_mode", "correction=tis"), r"bypass mode.*set correction = \"none\""),
    ],
    ids=["tensor-sync-on-cpu", "gdpo-single-reward-task", "bypass-with-correction"],
)
def test_config_only_mistakes_are_refused_at_load(extra, match):
    """Slow and noisy refusal: mistakes visible in the config alone (weight_sync = 'tensor' with a
    CPU policy, gdpo on a task with one reward, a bypass-mode loss under a correction) were found
    only after the model was built, and left a partial run directory. They are refused when the
    config loads, before anything runs."""
    with pytest.raises(ConfigError, match=match):
        small_cfg(*extra)


def test_a_run_that_fails_before_its_first_step_leaves_no_run_directory(tmp_path, monkeypatch):
    """Litter: a run that failed while it was being built (or before its first step) left a
    partial run directory that passes for a run. One the run created is removed; in a directory
    that existed, only what the run added is."""
    import rllab.training.trainer

    def broken(self):
        raise rllab.RllabError("broken before the first step")

    monkeypatch.setattr(rllab.training.trainer.Trainer, "_build_optimizers", broken)
    cfg = small_cfg("train.steps=1", f"output_dir={tmp_path / 'runs'}")
    with pytest.raises(rllab.RllabError, match="broken before"):
        run_experiment(cfg, progress=False)
    assert list((tmp_path / "runs").iterdir()) == []
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(rllab.RllabError, match="broken before"):
        run_experiment(cfg, run_dir=kept, progress=False)
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    monkeypatch.undo()
    monkeypatch.setattr(rllab.training.trainer.Trainer, "train_step", lambda self: broken(self))
    with pytest.raises(rllab.RllabError, match="broken before"):
        run_experiment(cfg, run_dir=tmp_path / "new", progress=False)  # after the step-0 eval, before step 1
    assert not (tmp_path / "new").exists()


def test_the_summary_names_the_components_a_schedule_switched_to(tmp_path, capsys):
    """Stale report: after a step-0 ``[[schedule]]`` switch the run summary still named the
    starting components (``rl: grpo + …``). It names those actually used, and each later switch
    with its step."""
    from rllab_console import components_used, timeline

    sched = [{"step": 0, "set": {"advantage": "rloo"}}]
    cfg = load_config({"schedule": sched}, [*SMALL, "train.steps=1"])
    run_experiment(cfg, run_dir=tmp_path / "r", progress=False)
    out = capsys.readouterr().out
    assert "(rl: rloo + " in out and "grpo" not in out
    parts = {"advantage": "grpo", "policy_loss": "ppo_clip", "preference_loss": "dpo"}
    later = [type("E", (), {"step": 5, "set": {"policy_loss.name": "cispo"}}), type("E", (), {"step": 9, "set": {"advantage": "rloo"}})]
    assert components_used("rl", timeline(parts, later, total=8)) == "rl: grpo + ppo_clip → grpo + cispo from step 5"


def test_extending_a_run_whose_decay_has_its_own_length_asks_for_the_new_length(tmp_path, main_cli):
    """More train.steps on --resume would leave the extra steps at the rate a fixed-length decay
    ended on (0): refused until train.lr_schedule_steps says where the decay now ends."""
    run = tmp_path / "run"
    sched = ["train.lr_schedule=linear", "train.warmup_steps=0", "train.lr_schedule_steps=2"]
    assert main_cli("run", *SMALL, "train.steps=2", *sched, "--run-dir", run, "-q").returncode == 0
    r = main_cli("run", "--resume", run, "train.steps=3", "-q")
    assert r.returncode == 1 and "train.lr_schedule_steps = 2" in r.stderr and "give train.lr_schedule_steps=N" in r.stderr
    r = main_cli("run", "--resume", run, "train.steps=3", "train.lr_schedule_steps=3", "-q")
    assert r.returncode == 0, r.stderr
    lrs = [x["optim/lr"] for x in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "optim/lr" in x]
    assert lrs[-1] == pytest.approx(0.0) and lrs[1] == pytest.approx(0.0)  # each decay ends at its length: 2, then 3
