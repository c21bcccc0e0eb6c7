"""Sampled evaluation: the unbiased pass@k estimator, mean@n, and their place in an eval."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rllab.rollout.evalmetrics import pass_at_k, report_ks, sampled_metrics
from rllab.rollout.stage import build_stage
from rllab.models.tokenizer import build_tokenizer
from rllab.settings import RolloutConfig
from rllab.types import Completion, Example


@pytest.mark.parametrize(
    "n, c, k, want",
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 − C(3,2)/C(5,2)
        (10, 3, 1, 0.3),
        (10, 5, 3, 1 - 10 / 120),  # 1 − C(5,3)/C(10,3)
        (4, 0, 2, 0.0),
        (4, 3, 2, 1.0),  # only one wrong sample: any two include a right one
        (4, 4, 4, 1.0),
        (8, 1, 8, 1.0),
        (8, 1, 4, 0.5),  # 1 − C(7,4)/C(8,4) = 1 − 35/70
        (20, 2, 5, 1 - 8568 / 15504),  # 1 − C(18,5)/C(20,5)
    ],
)
def test_pass_at_k_by_hand(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_binomial_formula_and_behaves(nck):
    n, c, k = nck
    p = pass_at_k(n, c, k)
    assert p == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-9)
    assert 0.0 <= p <= 1.0
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    if c < n:
        assert pass_at_k(n, c + 1, k) >= p - 1e-12  # more right samples never lower it
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p - 1e-12  # more tries never lower it
    assert (p == 0.0) == (c == 0)


@pytest.mark.parametrize("bad", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_impossible_counts(bad):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(*bad)


def test_reported_ks_and_metric_names():
    assert report_ks(1) == [] and report_ks(2) == [2] and report_ks(6) == [2, 4, 6] and report_ks(8) == [2, 4, 8]
    m = sampled_metrics([0, 2, 4], 4)
    assert set(m) == {"eval/mean@4", "eval/pass@2", "eval/pass@4"}
    assert m["eval/mean@4"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert m["eval/pass@4"] == pytest.approx(2 / 3)
    assert m["eval/pass@2"] == pytest.approx((0 + (1 - 1 / 6) + 1) / 3)  # c=2 of 4: 1 − C(2,2)/C(4,2)
    assert sampled_metrics([], 4) == {}


class _Backend:
    """Answers prompt i's j-th sample with "1" when j < right[i] (else "0"); greedy gives "1"."""

    def __init__(self, tok, right):
        self.tok, self.right, self.calls = tok, right, []

    def generate(self, prompts, params):
        self.calls.append(params)
        out = []
        for i, p in enumerate(prompts):
            for j in range(params.n):
                text = "1" if (params.temperature == 0 or j < self.right[i]) else "0"
                ids = tuple(self.tok(text, add_special_tokens=False).input_ids)
                out.append(Completion(prompt_ids=tuple(p), token_ids=ids, log_probs=(0.0,) * len(ids), finish_reason="length", prompt_index=i))
        return out

    def last_metrics(self):
        return {}


def _stage(right):
    tok = build_tokenizer()
    examples = [Example(prompt=f"q{i}", answer="1") for i in range(len(right))]
    task = SimpleNamespace(eval_examples=lambda: examples, reward=lambda e, c: float(c == e.answer))
    config = RolloutConfig(max_new_tokens=2, temperature=0.7, top_p=0.9, top_k=5)
    backend = _Backend(tok, right)
    return build_stage(task=task, task_name="t", backend=backend, tokenizer=tok, config=config, seed=3), backend


def test_evaluate_reports_greedy_only_by_default_and_sampled_metrics_when_asked():
    stage, backend = _stage([0, 1, 4, 2])
    plain = stage.evaluate(10)
    assert set(plain) == {"eval/accuracy", "eval/reward", "eval/n", "time/eval"} and plain["eval/accuracy"] == 1.0
    assert len(backend.calls) == 1
    m = stage.evaluate(10, samples=4)
    assert m["eval/accuracy"] == 1.0 and m["eval/n"] == 4.0
    assert m["eval/mean@4"] == pytest.approx((0 + 1 + 4 + 2) / 16)
    assert m["eval/pass@4"] == pytest.approx(3 / 4)
    assert m["eval/pass@2"] == pytest.approx(sum(pass_at_k(4, c, 2) for c in (0, 1, 4, 2)) / 4)
    sampled = backend.calls[-1]
    assert (sampled.n, sampled.temperature, sampled.top_p, sampled.top_k) == (4, 0.7, 0.9, 5)  # the rollout's sampling
    stage.evaluate(10, samples=4)
    assert backend.calls[-1].seed == sampled.seed  # every evaluation draws alike


def test_evaluate_keeps_each_held_out_problem_in_order():
    stage, _ = _stage([0, 1, 4, 2])
    stage.evaluate(10)
    assert stage.eval_problems == {"solved": [1, 1, 1, 1], "reward": [1.0, 1.0, 1.0, 1.0]}  # greedy answers "1"
    stage.evaluate(3, samples=4)
    assert stage.eval_problems == {"solved": [1, 1, 1], "reward": [1.0, 1.0, 1.0], "sampled_correct": [0, 1, 4], "samples": 4}


def test_held_out_order_merges_rank_shares_back():
    from rllab.rollout.stage import held_out_order

    # 5 problems over 2 ranks: rank 0 held 0, 2, 4 and rank 1 held 1, 3
    assert held_out_order([["a", "c", "e"], ["b", "d"]]) == ["a", "b", "c", "d", "e"]
    assert held_out_order([[1, 2]]) == [1, 2]


def test_a_run_evaluates_a_separate_file_with_samples(tmp_path, model_cache):
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    from .tiny import TINY, overrides

    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(10) for b in range(10)))
    held.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(10, 16)))
    cfg = load_config(None, [*overrides(TINY), "task=jsonl", f"task.path={json.dumps(str(train))}",
                             f"task.eval_path={json.dumps(str(held))}", "train.steps=1", "train.eval_samples=3",
                             "model.warm_start.steps=10"])
    run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert len(evals) == 2
    for r in evals:
        assert r["eval/n"] == 6.0  # the eval_path file's rows
        assert {"eval/mean@3", "eval/pass@2", "eval/pass@3"} <= set(r)
        assert 0.0 <= r["eval/mean@3"] <= r["eval/pass@2"] <= r["eval/pass@3"] <= 1.0
    problems = [json.loads(x) for x in (tmp_path / "run" / "eval_problems.jsonl").read_text().splitlines()]
    assert [p["step"] for p in problems] == [r["step"] for r in evals]
    for p, r in zip(problems, evals):  # the per-problem record averages to the logged means
        assert len(p["solved"]) == len(p["sampled_correct"]) == 6 and p["samples"] == 3
        assert sum(p["solved"]) / 6 == pytest.approx(r["eval/accuracy"])
        assert sum(p["reward"]) / 6 == pytest.approx(r["eval/reward"])
        assert sum(c / 3 for c in p["sampled_correct"]) / 6 == pytest.approx(r["eval/mean@3"])


def test_jsonl_eval_path_holds_out_that_file_and_names_contradicting_rows(lab, tmp_path):
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(30)))
    held.write_text(json.dumps({"prompt": "5+5=", "answer": "10"}) + "\n" + json.dumps({"prompt": "6+6=", "answer": "12", "split": "eval"}) + "\n")
    task = lab.get("task", "jsonl", path=str(train), eval_path=str(held))()
    assert len(task.train) == 30 and [e.prompt for e in task.eval_examples()] == ["5+5=", "6+6="]
    assert len(lab.get("task", "jsonl", path=str(train))().train) < 30  # without it, the hash split holds some out
    held.write_text(json.dumps({"prompt": "5+5=", "answer": "10", "split": "train"}) + "\n")
    with pytest.raises(ValueError, match=r"held.jsonl:1: split 'train' in the eval_path file"):
        lab.get("task", "jsonl", path=str(train), eval_path=str(held))()
    with pytest.raises(FileNotFoundError, match=r"missing.jsonl \(eval_path\)"):
        lab.get("task", "jsonl", path=str(train), eval_path=str(tmp_path / "missing.jsonl"))()
