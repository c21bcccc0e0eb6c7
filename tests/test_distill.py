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


# --------------------------------------------------------------------------- exact KL over the teacher's top-k


def test_topk_kl_by_hand():
    from rllab_algorithms.distill import topk_kl_loss

    S = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    P = torch.log(torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))
    rev = 0.5 * math.log(0.5 / 0.25) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    fwd = 0.25 * math.log(0.25 / 0.5) + 0.25 * math.log(0.25 / 0.3) + 0.5 * math.log(0.5 / 0.2)
    assert float(topk_kl_loss(S, P, "reverse_topk")) == pytest.approx(rev)  # k = V: the exact KL
    assert float(topk_kl_loss(S, P, "forward_topk")) == pytest.approx(fwd)
    # the teacher's top-2 (tokens 2 and 0): reverse adds the rest (token 1) as one token; forward sums over K alone
    idx = torch.tensor([2, 0])
    assert float(topk_kl_loss(S[idx], P[idx], "reverse_topk")) == pytest.approx(rev)  # the rest is token 1 alone
    assert float(topk_kl_loss(S[idx], P[idx], "forward_topk")) == pytest.approx(0.5 * math.log(0.5 / 0.2) + 0.25 * math.log(0.25 / 0.5))
    S4 = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64))
    P4 = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64))
    k = torch.tensor([3, 2])  # the teacher's top-2; the rest: s 0.7, p 0.3
    want = 0.1 * math.log(0.1 / 0.4) + 0.2 * math.log(0.2 / 0.3) + 0.7 * math.log(0.7 / 0.3)
    assert float(topk_kl_loss(S4[k], P4[k], "reverse_topk")) == pytest.approx(want) and want > 0
    # log-probs below the clamp count at the clamp (verl's log_prob_min_clamp)
    tiny = torch.tensor([math.log(1e-6)])
    assert float(topk_kl_loss(tiny, torch.tensor([math.log(0.5)]), "forward_topk", -10.0)) == pytest.approx(0.5 * (math.log(0.5) + 10.0))


def test_reverse_topk_over_the_whole_vocabulary_has_the_kls_gradient():
    from rllab_algorithms.distill import topk_kl_loss

    z = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    P = torch.log_softmax(torch.randn(4, 7, dtype=torch.float64), -1)
    S = torch.log_softmax(z, -1)
    (g,) = torch.autograd.grad(topk_kl_loss(S, P, "reverse_topk", -math.inf).sum(), z)
    S = torch.log_softmax(z, -1)
    exact = (S.exp() * (S - P)).sum()
    (want,) = torch.autograd.grad(exact, z)
    assert torch.allclose(g, want)


def test_response_log_softmax_gathers_to_the_sampled_tokens_log_probs(tmp_path):
    from rllab.models.forward import response_log_softmax, response_logprobs

    tr = Trainer(_cfg(), run_dir=tmp_path / "r", progress=False)
    batch = tr.rollout.to_batch(tr.rollout.sample(0))
    T = batch.response_length
    with torch.no_grad():
        full = response_log_softmax(tr.policy, batch.input_ids, batch.attention_mask, T, temperature=0.7)
        lp = response_logprobs(tr.policy, batch.input_ids, batch.attention_mask, T, temperature=0.7)
    got = full.gather(-1, batch.input_ids[:, -T:, None]).squeeze(-1)
    m = batch.response_mask
    assert torch.allclose(got[m], lp[m], atol=1e-5)
    assert torch.allclose(full.exp().sum(-1), torch.ones(full.shape[:2]), atol=1e-5)


@pytest.mark.parametrize("estimator", ["reverse_topk", "forward_topk"])
def test_a_student_distils_over_the_teachers_top_k(tmp_path, estimator):
    teacher = Trainer(_cfg(), run_dir=tmp_path / "teacher", progress=False).model_dir
    tr = Trainer(_cfg("model.warm_start.steps=0", "algorithm=opd", f"algorithm.teacher={teacher}", "train.lr=3e-3",
                      f"algorithm.estimator={estimator}", "algorithm.topk=8", "rollout.temperature=1.0"),
                 run_dir=tmp_path / "student", progress=False)
    steps = [tr.train_step() for _ in range(12)]
    losses = [m["loss/distill"] for m in steps]
    assert all(math.isfinite(x) for x in losses) and (estimator == "forward_topk" or min(losses) >= 0)
    assert 0 < steps[0]["distill/teacher_mass"] <= 1 and 0 < steps[0]["distill/student_mass"] <= 1
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses


@pytest.mark.parametrize("extra, needle", [
    (("algorithm.topk=8",), "topk = 8 applies only with estimator"),
    (("algorithm.topk_log_prob_min=-5",), "topk_log_prob_min = -5"),
    (("algorithm.estimator=reverse_topk", "algorithm.teacher=http://127.0.0.1:30000"), "needs the teacher's whole distribution"),
    (("algorithm.estimator=forward_topk", "algorithm.topk=0"), "topk"),
])
def test_topk_knobs_are_refused_where_they_cannot_take_effect(tmp_path, extra, needle):
    teacher = Trainer(_cfg(), run_dir=tmp_path / "teacher", progress=False).model_dir
    with pytest.raises(ConfigError, match=needle):
        _cfg("algorithm=opd", f"algorithm.teacher={teacher}", *extra)


# --------------------------------------------------------------------------- the teacher pinned by content


def _teacher_dir(tmp_path):
    """A teacher directory of its own (the warm-started tiny model's files, copied) and the sha256
    of its files by hand: each file's name, a NUL and its bytes' sha256, one line each in name order,
    without rllab_warm_start.json (how it was made, not the model)."""
    import hashlib
    import shutil

    src = Trainer(_cfg(), run_dir=tmp_path / "warm", progress=False).model_dir
    teacher = tmp_path / "teacher"
    shutil.copytree(src, teacher)
    lines = "".join(f"{p.name}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n"
                    for p in sorted(teacher.iterdir()) if p.is_file() and p.name != "rllab_warm_start.json")
    return teacher, hashlib.sha256(lines.encode()).hexdigest()


def test_a_pinned_teacher_that_matches_trains_and_is_recorded_in_provenance(tmp_path):
    from rllab.records import provenance

    teacher, digest = _teacher_dir(tmp_path)
    tr = Trainer(_cfg("algorithm=opd", f"algorithm.teacher={teacher}", f"algorithm.teacher_sha256={digest[:12]}"),
                 run_dir=tmp_path / "s", progress=False)
    assert "distill/k1" in tr.train_step()
    record = tr.provenance_record()
    assert record["hashes"]["inputs"] == [{"setting": "algorithm.teacher", "path": str(teacher), "sha256": digest}]
    assert provenance.comparable(record)["hashes.inputs"] == [f"algorithm.teacher:{digest}"]
    # the pin checks the teacher, it does not change the run: same config hash without it
    unpinned = Trainer(_cfg("algorithm=opd", f"algorithm.teacher={teacher}"), run_dir=tmp_path / "u", progress=False)
    assert unpinned.provenance_record()["hashes"]["inputs"][0]["sha256"] == digest  # recorded pinned or not
    assert unpinned.provenance_record()["hashes"]["config"] == record["hashes"]["config"]
    # a run without a teacher records no other inputs
    assert "inputs" not in Trainer(_cfg(), run_dir=tmp_path / "g", progress=False).provenance_record()["hashes"]


def test_a_pinned_teacher_that_differs_is_refused_naming_the_knob_path_and_both_hashes(tmp_path):
    teacher, digest = _teacher_dir(tmp_path)
    (teacher / "notes.txt").write_text("one more file is another teacher\n")
    import hashlib

    lines = "".join(f"{p.name}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n"
                    for p in sorted(teacher.iterdir()) if p.is_file() and p.name != "rllab_warm_start.json")
    found = hashlib.sha256(lines.encode()).hexdigest()
    with pytest.raises(ConfigError) as e:
        Trainer(_cfg("algorithm=opd", f"algorithm.teacher={teacher}", f"algorithm.teacher_sha256={digest}"),
                run_dir=tmp_path / "s", progress=False)
    msg = str(e.value)
    assert "algorithm.teacher_sha256" in msg and str(teacher) in msg and digest in msg and found in msg
    assert e.value.key == "teacher_sha256"
    assert not (tmp_path / "s" / "provenance.json").exists()  # refused before the first step


@pytest.mark.parametrize("extra, needle", [
    (("algorithm.teacher=http://127.0.0.1:30000", "rollout.temperature=1", "algorithm.teacher_sha256=" + "ab" * 32),
     r"teacher_sha256 = 'abab.*is a server, whose weights cannot be hashed here"),
    (("algorithm.teacher={teacher}", "algorithm.teacher_sha256=xyz"), r"teacher_sha256 = 'xyz' is not a sha256"),
    (("algorithm.teacher={teacher}", "algorithm.teacher_sha256=abc1234"), r"teacher_sha256 = 'abc1234' is not a sha256"),
])
def test_a_teacher_pin_that_cannot_take_effect_is_refused_naming_it(tmp_path, extra, needle):
    teacher = tmp_path / "t"
    if any("{teacher}" in x for x in extra):
        teacher, _ = _teacher_dir(tmp_path)
    with pytest.raises(ConfigError, match=needle) as e:
        _cfg("algorithm=opd", *(x.format(teacher=teacher) for x in extra))
    assert e.value.key == "teacher_sha256"


def test_a_suite_result_and_rllab_provenance_show_the_teacher_by_hash(tmp_path):
    """A suite result lists each cell's other inputs (the teacher) from the cell's record, and
    ``rllab provenance`` prints them; a cell without one lists none."""
    import json

    from rllab.records import provenance
    from rllab_suite.reproduce import _lines
    from rllab_suite.suite import write_suite_provenance

    digest = "7c" * 32
    teacher = {"setting": "algorithm.teacher", "path": "/teachers/t", "sha256": digest}
    for run, inputs in (("opd-s0", [teacher]), ("grpo-s0", [])):
        record = provenance.collect({"seed": 0}, start={"kind": "warm_start", "path": "/m", "sha256": "ab" * 32}, inputs=inputs)
        (tmp_path / "runs" / run).mkdir(parents=True)
        provenance.write(tmp_path / "runs" / run, record)
    manifest = {"cells": [{"variant": v, "task": "addition", "seed": 0, "run": f"{v}-s0"} for v in ("opd", "grpo")]}
    cells = provenance.read(write_suite_provenance(tmp_path, manifest))["cells"]
    assert cells[0]["inputs"] == {"algorithm.teacher": digest} and "inputs" not in cells[1]
    rows = dict(_lines(provenance.read(tmp_path / "runs" / "opd-s0")))
    assert rows["hashes.input algorithm.teacher /teachers/t"] == digest
