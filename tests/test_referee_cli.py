"""``rllab import`` on the command line: files written with their comments, errors, and the shipped
examples importing to TOMLs that ``rllab run --steps 2`` runs."""

import json
import tomllib
from pathlib import Path

import pytest

from rllab.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "frameworks"


def run(capsys, *argv):
    code = main(["--plugin", "rllab_referee", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_command_is_a_registered_entry_point():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["rllab"]["rllab_referee"] == "rllab_referee"
    import rllab_referee

    assert hasattr(rllab_referee, "register_commands")


def test_writes_the_toml_with_a_comment_per_key(capsys, tmp_path):
    src = tmp_path / "grpo.json"
    src.write_text(json.dumps({"loss_type": "grpo", "beta": 0.04, "report_to": "wandb", "gradient_checkpointing": True}))
    out = tmp_path / "run.toml"
    code, text, err = run(capsys, "import", "trl", str(src), "--out", str(out))
    assert code == 0, err
    body = out.read_text()
    cfg = tomllib.loads(body)
    assert cfg["aggregation"]["name"] == "seq-mean-token-mean" and cfg["kl_controller"]["kl_coef"] == 0.04
    for line in body.splitlines():
        if "=" in line and not line.startswith("#"):
            assert "  # " in line, line  # every key names its source
    assert 'name = "seq-mean-token-mean"' in body and "# loss_type = \"grpo\"" in body
    assert "report_to: logging" in text and "gradient_checkpointing: hardware" in text
    code, _, err = run(capsys, "import", "trl", str(src), "--out", str(out))
    assert code == 1 and "--force" in err


@pytest.mark.parametrize(
    "content, suffix, message",
    [
        (None, ".yaml", "no file"),
        ("", ".yaml", "c.yaml is empty: there is nothing to import"),
        ("# only a comment\n\n", ".yaml", "c.yaml sets no knob: there is nothing to import"),
        ("{}", ".json", "c.json is an empty mapping ({}): there is nothing to import"),
        ("[train]\nlr = 1e-5\n", ".toml", "c.toml is a TOML file; this reads the other framework's config as YAML (or JSON)"),
        ("- 1\n- 2\n", ".yaml", "holds a list"),
        ("{bad json", ".json", "not valid JSON"),
        ("a: [1\n", ".yaml", "not valid YAML"),
        ("learning_rate: fast\n", ".yaml", 'learning_rate = "fast": expected a number'),
        ("per_device_train_batch_size: 8\nloss_type: dpo\n", ".yaml", "loss_type"),
    ],
)
def test_bad_inputs_are_named(capsys, tmp_path, content, suffix, message):
    src = tmp_path / f"c{suffix}"
    if content is not None:
        src.write_text(content)
    code, _, err = run(capsys, "import", "trl", str(src))
    assert code == 1 and message in err.replace("\n", " "), err


def test_an_out_that_is_a_directory_is_refused_even_with_force(capsys, tmp_path):
    src = tmp_path / "grpo.yaml"
    src.write_text("learning_rate: 1.0e-6\n")
    for extra in ([], ["--force"]):
        code, _, err = run(capsys, "import", "trl", str(src), "--out", str(tmp_path), *extra)
        assert code == 1 and f"--out {tmp_path} is a directory; give the TOML file to write, e.g. --out {tmp_path / 'run.toml'}" \
            in " ".join(err.split()), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grpo.yaml"]


def test_an_empty_verl_file_is_refused_but_its_overrides_may_carry_the_knobs(capsys, tmp_path):
    src = tmp_path / "v.yaml"
    src.write_text("")
    code, _, err = run(capsys, "import", "verl", str(src))
    assert code == 1 and "verl config: " in err and "v.yaml is empty: there is nothing to import" in err.replace("\n", " ")
    code, text, err = run(capsys, "import", "verl", str(src), "algorithm.adv_estimator=rloo")
    assert code == 0, err
    assert tomllib.loads(text)["advantage"]["name"] == "rloo"


def test_verl_overrides_and_strict(capsys, tmp_path):
    src = tmp_path / "v.yaml"
    src.write_text("algorithm:\n  adv_estimator: grpo\n")
    code, text, err = run(capsys, "import", "verl", str(src), "actor_rollout_ref.actor.clip_ratio_high=0.28",
                          "data.truncation=left")
    assert code == 0, err
    assert tomllib.loads(text)["policy_loss"]["clip_high"] == 0.28 and "differs" in err
    code, _, err = run(capsys, "import", "verl", str(src), "data.truncation=left", "--strict")
    assert code == 1 and "(--strict)" in err
    code, _, err = run(capsys, "import", "trl", str(src), "a=1")
    assert code == 1 and "no overrides" in err


def test_a_setting_rllab_refuses_is_reported_at_import(capsys, tmp_path):
    src = tmp_path / "v.yaml"
    src.write_text("actor_rollout_ref:\n  rollout:\n    temperature: 0\n")
    code, _, err = run(capsys, "import", "verl", str(src))
    assert code == 1 and "refused by rllab" in err and "temperature" in err


@pytest.mark.parametrize("framework, name", [("trl", "trl_grpo"), ("trl", "trl_dapo"), ("trl", "trl_gspo"), ("verl", "verl_dapo")])
def test_examples_import_and_run_two_steps(capsys, tmp_path, framework, name):
    out = tmp_path / f"{name}.toml"
    code, _, err = run(capsys, "import", framework, str(EXAMPLES / f"{name}.yaml"), "--out", str(out))
    assert code == 0, err
    code, _, err = run(capsys, "run", str(out), "--steps", "2", "-q", "train.eval_size=4", "--run-dir", str(tmp_path / "run"))
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows if "time/step" in r} == {1, 2}
