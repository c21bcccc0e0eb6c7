"""``rllab export`` and ``rllab eval``: the trained policy out as a Hugging Face directory that
transformers loads alone, and scored as the run scored it.

One tiny run (module scope, ~10 s) trains a few steps on one-digit addition; the tests export it,
reload it with ``AutoModelForCausalLM`` / ``AutoTokenizer``, compare weights, token ids and greedy
generations with the run's own policy, and evaluate the run, the export and ``RUN_DIR/model``
against the run's ``final.json``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rllab.cli import main
from rllab.training.evaluate import bootstrap, wilson
from tests.tiny import TINY, overrides

RUN = [*overrides(TINY), "task.digits=1", "model.warm_start.steps=120", "rollout.max_new_tokens=4", "train.lr=2e-3", "train.steps=3"]


def cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def run_dir(model_cache, tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "run"
    assert main(["run", *RUN, "--run-dir", str(path), "-q"]) == 0
    return path


def _eval_json(capsys, *argv) -> dict:
    code, out, err = cli(capsys, "eval", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# --------------------------------------------------------------------------- intervals, by hand


def test_wilson_matches_hand_computed_values():
    # 5 of 10, z = 1.96: centre (0.5 + 0.19208) / 1.38416 = 0.5; half 1.96·sqrt(0.025 + 0.0096040)/1.38416 = 0.26340
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.23659, abs=1e-5) and hi == pytest.approx(0.76341, abs=1e-5)
    # 0 of 20: lower bound 0, upper z²/n / (1 + z²/n) = 0.19208 / 1.19208 = 0.16113
    lo, hi = wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.16113, abs=1e-5)
    assert all(math.isnan(x) for x in wilson(0, 0))
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_bootstrap_interval_of_two_problems_and_of_a_constant():
    # resampled means of [0, 1]: 0 (1/4), 0.5 (1/2), 1 (1/4) → the 2.5% and 97.5% quantiles are 0 and 1
    assert bootstrap([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap([0.25] * 7) == (0.25, 0.25)
    assert bootstrap([0.0, 1.0, 1.0], seed=3) == bootstrap([0.0, 1.0, 1.0], seed=3)  # a fixed seed draws alike
    lo, hi = bootstrap([0.0] * 30 + [1.0] * 10)
    assert lo < 0.25 < hi


# --------------------------------------------------------------------------- tokenizer


def test_character_tokenizer_is_written_so_autotokenizer_encodes_alike(tmp_path):
    from transformers import AutoTokenizer, Qwen2Config

    from rllab.models.tokenizer import CHARACTERS, build_chat_tokenizer, build_tokenizer
    from rllab.models.hfdir import check_tokenizer, hf_tokenizer

    tok = build_tokenizer()
    Qwen2Config(vocab_size=len(tok)).save_pretrained(tmp_path)  # AutoTokenizer picks its class from the model type
    hf_tokenizer(tok, "qwen2").save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "12+34=46\n" + CHARACTERS
    assert reloaded(text).input_ids == tok(text).input_ids  # <bos> first, then one id per character
    assert reloaded(text).input_ids[0] == tok.bos_token_id
    assert reloaded.decode(tok(text).input_ids, skip_special_tokens=True) == text
    check_tokenizer(tmp_path, tok, [text])
    chat = build_chat_tokenizer()
    assert hf_tokenizer(chat, "qwen2") is chat  # already the class AutoTokenizer gives a Qwen2 directory


def test_a_tokenizer_that_reloads_differently_is_refused(tmp_path):
    from transformers import Qwen2Config

    from rllab import RllabError
    from rllab.models.tokenizer import build_tokenizer
    from rllab.models.hfdir import check_tokenizer

    tok = build_tokenizer()
    Qwen2Config(vocab_size=len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)  # as saved by the tiny model's cache: AutoTokenizer loads Qwen2's BPE, which drops spaces
    with pytest.raises(RllabError, match="encodes"):
        check_tokenizer(tmp_path, tok)


# --------------------------------------------------------------------------- export


def test_finished_full_fine_tune_leaves_a_model_directory(run_dir):
    from transformers import AutoModelForCausalLM

    from rllab.parallel import checkpoint

    model_dir = run_dir / "model"
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in model_dir.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    state = checkpoint.load(checkpoint.latest(run_dir))["policy"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_export_round_trips_through_transformers(run_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rllab.parallel import checkpoint
    from rllab.training.export import build_source, load_run_policy, run_config
    from rllab import Lab

    out = tmp_path / "export"
    code, text, err = cli(capsys, "export", str(run_dir), "--out", str(out))
    assert code == 0, err
    assert "after step 3" in text and "--model-path" in text
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "rllab_config.toml"} <= {p.name for p in out.iterdir()}

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ckpt = checkpoint.load(checkpoint.latest(run_dir))["policy"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, ckpt[name]), name
    policy, run_tok, cfg, step, _ = load_run_policy(run_dir)
    base = AutoModelForCausalLM.from_pretrained(_warm_start_dir(run_dir), dtype=torch.float32).state_dict()
    assert step == 3 and any(not torch.equal(base[k], v) for k, v in ckpt.items())  # training moved the weights

    lab = Lab()
    prompts = [e.prompt for e in build_source(run_config(run_dir, lab=lab), lab).eval_examples()[:8]]
    assert len(prompts) == 8
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        assert ids[0].tolist() == run_tok(prompt).input_ids
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=4, do_sample=False)
            want = policy.generate(ids, max_new_tokens=4, do_sample=False)
        assert got.tolist() == want.tolist()
        assert model.generation_config.eos_token_id == run_tok.eos_token_id


def _warm_start_dir(run_dir):
    from rllab import Lab
    from rllab.training.export import base_model_dir, build_source, run_config

    lab = Lab()
    cfg = run_config(run_dir, lab=lab)
    return base_model_dir(cfg, build_source(cfg, lab))


def test_export_refusals(run_dir, tmp_path, capsys):
    code, _, err = cli(capsys, "export", str(run_dir), "--step", "1", "--out", str(tmp_path / "x"))
    assert code == 1 and "no checkpoint after step 1" in err and "kept: 3" in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    code, _, err = cli(capsys, "export", str(run_dir), "--out", str(tmp_path / "full"))
    assert code == 1 and "not empty" in err and "--overwrite" in err
    code, _, err = cli(capsys, "export", str(tmp_path), "--out", str(tmp_path / "y"))
    assert code == 1 and "not a run directory" in err
    code, _, err = cli(capsys, "export", str(run_dir), "--out", str(run_dir / "checkpoints"))
    assert code == 1 and "part of the run" in err


# --------------------------------------------------------------------------- eval


def test_eval_reproduces_the_runs_final_accuracy(run_dir, tmp_path, capsys):
    final = json.loads((run_dir / "final.json").read_text())
    assert 0 < final["final/accuracy"] < 1  # a number that could come out otherwise
    out = tmp_path / "export"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    capsys.readouterr()
    for target in (run_dir, run_dir / "model", out):
        result = _eval_json(capsys, str(target))
        assert result["metrics"]["eval/accuracy"] == final["final/accuracy"], target
        assert result["metrics"]["eval/reward"] == final["final/reward"], target
        assert result["task"] == "addition" and result["problems"] == 16
    by_path = _eval_json(capsys, f"model.path={out}", "task.digits=1", "train.eval_size=16", "rollout.max_new_tokens=4")
    assert by_path["metrics"]["eval/accuracy"] == final["final/accuracy"]


def test_eval_samples_give_pass_at_k_with_intervals(run_dir, capsys):
    result = _eval_json(capsys, str(run_dir), "--samples", "4", "--show", "2")
    m, ci = result["metrics"], result["intervals"]
    assert set(m) >= {"eval/accuracy", "eval/mean@4", "eval/pass@2", "eval/pass@4"}
    assert m["eval/mean@4"] <= m["eval/pass@2"] <= m["eval/pass@4"]
    solved = round(m["eval/accuracy"] * 16)
    assert ci["eval/accuracy"] == pytest.approx(list(wilson(solved, 16)))
    for key in ("eval/mean@4", "eval/pass@2", "eval/pass@4"):
        lo, hi = ci[key]
        assert lo <= m[key] <= hi
    assert len(result["samples"]) == 2
    s = result["samples"][0]
    assert s["prompt"].endswith("=") and isinstance(s["completion"], str) and s["solved"] == (s["completion"].strip() == s["answer"])


def test_eval_table_and_samples_printed(run_dir, capsys):
    code, out, err = cli(capsys, "eval", str(run_dir), "--show", "1")
    assert code == 0, err
    assert "accuracy" in out and "(Wilson)" in out and "sample 1" in out and "prompt:" in out and "model:" in out


def test_eval_refusals(run_dir, tmp_path, capsys):
    code, _, err = cli(capsys, "eval", str(tmp_path / "missing"))
    assert code == 1 and "does not exist" in err
    code, _, err = cli(capsys, "eval", str(run_dir), "--step", "2")
    assert code == 1 and "no checkpoint after step 2" in err
    code, _, err = cli(capsys, "eval", str(run_dir), "--samples", "0")
    assert code == 1 and "--samples" in err


def test_lora_run_exports_merged_weights_that_score_its_final_accuracy(run_dir, tmp_path, capsys):
    pytest.importorskip("peft", reason="LoRA needs peft (pip install 'rllab[lora]')")
    from transformers import AutoModelForCausalLM

    from rllab.training.export import load_run_policy

    lora_run = tmp_path / "lora"
    assert main(["run", *RUN, "model.lora.r=4", "train.lr=2e-2", "--run-dir", str(lora_run), "-q"]) == 0
    assert (lora_run / "adapter" / "adapter_config.json").is_file() and not (lora_run / "model").exists()
    out = tmp_path / "merged"
    assert main(["export", str(lora_run), "--out", str(out)]) == 0
    capsys.readouterr()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    assert not any("lora" in k for k in merged)
    policy, *_ = load_run_policy(lora_run)
    for name, tensor in policy.state_dict().items():
        assert torch.equal(merged[name], tensor), name
    base = AutoModelForCausalLM.from_pretrained(_warm_start_dir(lora_run), dtype=torch.float32).state_dict()
    assert any(not torch.equal(base[k], v) for k, v in merged.items())  # the adapters are in the weights
    final = json.loads((lora_run / "final.json").read_text())
    assert _eval_json(capsys, str(out))["metrics"]["eval/accuracy"] == final["final/accuracy"]
    # a base that is not the one the adapters trained on (its recorded hash differs) is refused
    record = json.loads((lora_run / "provenance.json").read_text())
    record["hashes"]["start"]["sha256"] = "0" * 64
    (lora_run / "provenance.json").write_text(json.dumps(record))
    code, _, err = cli(capsys, "export", str(lora_run), "--out", str(tmp_path / "other"))
    assert code == 1 and "trained LoRA adapters on a base model of sha256 000000000000" in " ".join(err.split())
