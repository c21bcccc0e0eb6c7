"""On-policy distillation (``algorithm = "opd"``): the per-token loss against hand-computed values
and gradients, and a student on the tiny model that moves towards its teacher."""

from __future__ import annotations

import math

import pytest
import torch

from rllab.config import load_config
from rllab.errors import ConfigError
from rllab.training.trainer import Trainer
from rllab_algorithms.distill import reverse_kl_loss

from .tiny import TINY, overrides


def test_k1_loss_is_the_log_ratio_with_the_policy_gradient():
    s = torch.tensor([math.log(0.5), math.log(0.2)], requires_grad=True)
    t = torch.tensor([math.log(0.25), math.log(0.4)])
    loss = reverse_kl_loss(s, t, "k1")
    assert loss.tolist() == pytest.approx([math.log(2.0), math.log(0.5)])  # s − t
    loss.sum().backward()
    assert s.grad.tolist() == pytest.approx([math.log(2.0), math.log(0.5)])  # (s − t)·∇s


def test_k3_loss_by_hand():
    s = torch.tensor([math.log(0.5), math.log(0.2)], requires_grad=True)
    t = torch.tensor([math.log(0.25), math.log(0.4)])
    loss = reverse_kl_loss(s, t, "k3")
    # exp(t − s) − (t − s) − 1: r = 0.5 → 0.5 + log 2 − 1; r = 2 → 2 − log 2 − 1
    assert loss.tolist() == pytest.approx([0.5 + math.log(2) - 1, 2 - math.log(2) - 1])
    loss.sum().backward()
    assert s.grad.tolist() == pytest.approx([1 - 0.5, 1 - 2.0])  # d/ds = 1 − exp(t − s)
    assert reverse_kl_loss(t, t, "k3").tolist() == [0.0, 0.0]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _cfg(*extra):
    return load_config(None, [*overrides(TINY), *extra])


def test_a_student_distils_from_its_teacher(tmp_path):
    teacher = Trainer(_cfg(), run_dir=tmp_path / "teacher", progress=False).model_dir  # the warm-started tiny model
    tr = Trainer(_cfg("model.warm_start.steps=0", "algorithm=opd", f"algorithm.teacher={teacher}", "train.lr=3e-3",
                      "rollout.temperature=1.0"), run_dir=tmp_path / "student", progress=False)
    kls = [tr.train_step()["distill/k1"] for _ in range(16)]
    assert all(math.isfinite(k) for k in kls) and kls[0] > 0.5
    assert sum(kls[-4:]) / 4 < 0.8 * sum(kls[:4]) / 4, kls


def test_with_rl_adds_the_rl_loss(tmp_path):
    teacher = Trainer(_cfg(), run_dir=tmp_path / "teacher", progress=False).model_dir
    m = Trainer(_cfg("algorithm=opd", f"algorithm.teacher={teacher}", "algorithm.with_rl=true", "algorithm.estimator=k3",
                     "algorithm.kl_coef=0.5"), run_dir=tmp_path / "s", progress=False).train_step()
    assert m["loss/total"] == pytest.approx(m["loss/policy"] + 0.5 * m["loss/distill"], rel=1e-4, abs=1e-6)
    assert m["loss/distill"] == pytest.approx(m["distill/k3"], rel=1e-4, abs=1e-6)  # token-mean of k3


@pytest.mark.parametrize("extra, key", [
    ((), "teacher"),
    (("algorithm.teacher=/no/such/dir",), "teacher"),
    (("algorithm.teacher=ftp://host/model",), "teacher"),
    (("algorithm.teacher=http://",), "teacher"),
    (("algorithm.teacher={teacher}", "algorithm.estimator=k2"), "estimator"),
    (("algorithm.teacher={teacher}", "algorithm.kl_coef=0"), "kl_coef"),
])
def test_bad_opd_knobs_are_refused_naming_them(tmp_path, extra, key):
    teacher = Trainer(_cfg(), run_dir=tmp_path / "teacher", progress=False).model_dir
    with pytest.raises(ConfigError) as e:
        _cfg("algorithm=opd", *(x.format(teacher=teacher) for x in extra))
    assert key in str(e.value) and "model.path" not in str(e.value)


def test_a_teacher_with_another_vocabulary_is_refused_naming_teacher(tmp_path):
    from rllab.models.tiny import TinyModelConfig, build_tiny_model

    model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, tokenizer="chat"))
    model.save_pretrained(tmp_path / "chat")
    tok.save_pretrained(tmp_path / "chat")
    tr = Trainer(_cfg("algorithm=opd", f"algorithm.teacher={tmp_path / 'chat'}"), run_dir=tmp_path / "s", progress=False)
    with pytest.raises(ConfigError, match=r"teacher .* has \d+ output tokens and the student \d+.*share the student's tokenizer") as e:
        tr.train_step()
    assert e.value.key == "teacher"


def test_a_teacher_directory_given_with_a_tilde_loads(tmp_path, monkeypatch):
    import shutil

    teacher = Trainer(_cfg(), run_dir=tmp_path / "teacher", progress=False).model_dir
    home = tmp_path / "home"
    shutil.copytree(teacher, home / "teachers" / "t")
    monkeypatch.setenv("HOME", str(home))
    m = Trainer(_cfg("algorithm=opd", "algorithm.teacher=~/teachers/t"), run_dir=tmp_path / "s", progress=False).train_step()
    assert math.isfinite(m["distill/k1"])
