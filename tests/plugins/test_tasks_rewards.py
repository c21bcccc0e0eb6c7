"""Reward functions: the reward_function kind, TRL's and verl's signatures unchanged, the built-ins,
weights into reward components, and failures under rollout.reward_errors naming function and row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rllab
from rllab.errors import ConfigError, RewardError
from rllab.rollout.rewards import RewardFunctionError, load_reward_function, reward_names
from rllab.rollout.stage import build_stage
from rllab.models.tokenizer import build_tokenizer
from rllab.types import Completion

from . import trl_rewards

TRL = Path(trl_rewards.__file__)
_LAB = rllab.Lab()


def _rows(tmp_path, rows, name="rows.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _task(tmp_path, rows, **knobs):
    return _LAB.get("task", "dataset", path=str(_rows(tmp_path, rows)), **knobs)()


def _score(fn, completions, prompts=None, answers=None):
    n = len(completions)
    return fn.batch(
        prompts=prompts or ["q"] * n, completions=completions, ground_truth=answers or [""] * n,
        columns=[{"answer": a} for a in (answers or [""] * n)], rows=[f"row {i + 1}" for i in range(n)],
    )


def test_the_kind_is_registered_listed_and_checked():
    assert {"exact", "contains", "numeric", "math_verify", "format", "length_penalty"} <= set(_LAB.names("reward_function"))
    assert _LAB.spec("reward_function", "math").name == "math_verify"
    assert _LAB.spec("reward_function", "exact").trait("signature") == "trl"
    from rllab.testing import run_contract

    results = run_contract(_LAB, "reward_function", "numeric")
    assert [r.passed for r in results] == [True, True] and not any(r.skipped for r in results)


def test_the_contract_catches_a_reward_function_that_returns_the_wrong_number_of_values():
    from rllab.testing import run_contract

    class Plugin:
        @staticmethod
        @rllab.hookimpl
        def register_reward_functions(register):
            register("short", lambda *, completions, config, **kw: [1.0] * (len(completions) - 1))
            register("verl_ok", lambda *, data_source, solution_str, ground_truth, extra_info, config: {"score": 1.0}, signature="verl")

    lab = rllab.Lab([Plugin], entry_points=False)
    bad = run_contract(lab, "reward_function", "short")
    assert not bad[-1].passed and "returned 2 values for 3 completions" in bad[-1].message
    assert all(r.passed for r in run_contract(lab, "reward_function", "verl_ok"))


def test_a_bad_signature_trait_is_refused_at_load():
    class Plugin:
        @staticmethod
        @rllab.hookimpl
        def register_reward_functions(register):
            register("odd", lambda **kw: [], signature="openai")

    lab = rllab.Lab([Plugin], entry_points=False, strict=False)
    assert any("trait signature must be 'trl' or 'verl'" in p for p in lab.problems)


def test_trl_reward_functions_from_the_docs_work_unchanged_by_path_and_by_module():
    by_path = load_reward_function(f"{TRL}:reward_len")
    by_module = load_reward_function("tests.plugins.trl_rewards:reward_len")
    assert by_path.style == by_module.style == "trl" and by_path.name == "reward_len"
    texts = ["x" * 20, "x" * 25, ""]
    assert _score(by_path, texts) == _score(by_module, texts) == [0.0, -5.0, -20.0]
    fmt = load_reward_function("tests.plugins.trl_rewards:format_reward_func")
    chat = [({"role": "user", "content": "q"},)] * 2  # conversational prompts: completions arrive as messages
    assert _score(fmt, ["<think>a</think><answer>4</answer>", "4"], prompts=chat) == [1.0, 0.0]


def test_a_verl_compute_score_is_called_per_row_and_its_dict_score_is_the_reward():
    fn = load_reward_function(f"{TRL}:compute_score")
    assert fn.style == "verl"
    out = fn.batch(prompts=["q", "q"], completions=["4 ", "5"], ground_truth=["4", "4"],
                   columns=[{"data_source": "s", "extra_info": {"index": i}} for i in range(2)], rows=["r1", "r2"])
    assert out == [1.0, 0.0]


@pytest.mark.parametrize(
    "name, message",
    [
        ("broken_on_seven", r"reward function 'broken_on_seven' \(.*\) raised on row 2: ZeroDivisionError: seven"),
        ("nan_reward", r"reward function 'nan_reward' .* returned nan on row 1"),
        ("short_reward", r"reward function 'short_reward' .* returned 2 values for 3 completions"),
        ("text_reward", r"reward function 'text_reward' .* returned str 'good' on row 1, not a number or None"),
    ],
)
def test_a_failing_reward_function_names_itself_and_the_row(name, message):
    fn = load_reward_function(f"tests.plugins.trl_rewards:{name}")
    with pytest.raises(RewardFunctionError, match=message):
        _score(fn, ["a", "b", "c"], answers=["1", "7", "3"])


def test_bad_references_are_refused_with_what_was_wrong(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_reward_function(f"{tmp_path}/missing.py:fn")
    with pytest.raises(ConfigError, match=r"has no function 'nope' \(functions: .*reward_len"):
        load_reward_function(f"{TRL}:nope")
    with pytest.raises(ConfigError, match="neither TRL's fn"):
        load_reward_function(f"{TRL}:no_signature")
    with pytest.raises(rllab.UnknownComponentError, match="unknown reward_function 'exakt'. Did you mean 'exact'"):
        load_reward_function("exakt", lab=_LAB)
    assert reward_names(["exact", "m:exact", "a.py:f"]) == ("exact", "exact_2", "f")



def test_a_reward_function_listed_twice_with_the_same_knobs_is_refused():
    """Silently wrong: ``task.rewards=["exact", "exact"]`` scored every answer twice (eval/reward
    twice eval/accuracy). The same function twice needs its own knobs for the second; a weight says
    "double"."""
    from rllab.rollout.rewards import RewardSet

    with pytest.raises(ConfigError, match=r"task: reward function 'exact' is listed twice with the same knobs \('exact' and 'exact_2'\).*reward_weights entry of 2"):
        RewardSet.load(["exact", "exact"])
    with pytest.raises(ConfigError, match=r"listed twice"):
        RewardSet.load(["exact", "math_verify", "exact"], knobs={"exact": {}, "exact_2": {}})
    assert len(RewardSet.load(["exact"], [2.0]).functions) == 1

def test_builtins_score_as_documented():
    get = lambda name: load_reward_function(name, lab=_LAB)  # noqa: E731
    assert _score(get("exact"), [" 12 ", "13"], answers=["12", "12"]) == [1.0, 0.0]
    assert _score(get("contains"), ["so 12.", "1 2"], answers=["12", "12"]) == [1.0, 0.0]
    assert _score(get("numeric"), ["x=12.0000000001", "11"], answers=["12", "12"]) == [1.0, 0.0]
    assert _score(get("format"), ["<think>hm</think> <answer>4</answer>", "<answer>4</answer>"]) == [1.0, 0.0]
    assert _score(get("length_penalty"), ["x" * 200, "x" * 300, "x" * 900]) == [0.0, -0.5, -1.0]


def test_math_verify_accepts_boxed_plain_and_equivalent_latex():
    pytest.importorskip("math_verify")
    fn = load_reward_function("math_verify", lab=_LAB)
    texts = ["so the answer is \\boxed{\\frac{1}{2}}", "The answer is 0.5", "\\boxed{3}", "no idea"]
    assert _score(fn, texts, answers=["0.5", "\\frac12", "3", "3"]) == [1.0, 1.0, 1.0, 0.0]


def test_math_verify_scores_alike_outside_the_main_thread():
    """Asynchronous rollouts score in a thread of their own, where math-verify's signal-based time
    limit cannot be set: the reward must score there as in the main thread, not fail every row."""
    pytest.importorskip("math_verify")
    import threading

    fn = load_reward_function("math_verify", lab=_LAB)
    texts, answers = ["\\boxed{\\frac{1}{2}}", "The answer is 0.5", "no idea"], ["0.5", "\\frac12", "3"]
    got = {}
    worker = threading.Thread(target=lambda: got.update(scores=_score(fn, texts, answers=answers)))
    worker.start()
    worker.join()
    assert got["scores"] == _score(fn, texts, answers=answers) == [1.0, 1.0, 0.0]


def test_several_functions_become_weighted_reward_components(tmp_path):
    rows = [{"prompt": f"{i}?", "answer": str(i)} for i in range(20)]
    task = _task(tmp_path, rows, rewards=["exact", "tests.plugins.trl_rewards:reward_len"], reward_weights=[1.0, 0.5])
    assert task.reward_components == ("exact", "reward_len") and task.reward_weights == (1.0, 0.5)
    assert _LAB.spec("task", "dataset").trait("reward_components", task.config) == ("exact", "reward_len")
    ex = task.train[0]
    assert task.reward(ex, ex.answer) == {"exact": 1.0, "reward_len": -(20 - len(ex.answer))}
    from rllab.rollout.accuracy import scalar_reward

    assert scalar_reward(task, task.reward(ex, ex.answer)) == 1.0 - 0.5 * (20 - len(ex.answer))
    one = _task(tmp_path, rows, rewards="exact", reward_weights=[2.0])
    from rllab.members import member

    assert not member(one, "task", "reward_components") and one.reward(ex, ex.answer) == 2.0  # one reward: no components
    with pytest.raises(ConfigError, match="1 reward_weights for the 2 reward functions"):
        _task(tmp_path, rows, rewards=["exact", "contains"], reward_weights=[1.0])


def test_gdpo_reads_the_components_of_a_config_with_two_reward_functions(tmp_path):
    from rllab.config import load_config

    path = _rows(tmp_path, [{"prompt": f"{i}?", "answer": str(i)} for i in range(20)])
    cfg = load_config(None, ["task=dataset", f"task.path={json.dumps(str(path))}", 'task.rewards=["exact", "format"]', "advantage=gdpo"])
    assert cfg.component("advantage").name == "gdpo"
    with pytest.raises(ConfigError, match="has one reward"):
        load_config(None, ["task=dataset", f"task.path={json.dumps(str(path))}", "advantage=gdpo"])


# --------------------------------------------------------------------------- in the rollout stage


class _Backend:
    """Answers prompt i with the texts given for it, one per sample."""

    def __init__(self, tok, texts):
        self.tok, self.texts = tok, texts

    def generate(self, prompts, params):
        out = []
        for i, p in enumerate(prompts):
            for j in range(params.n):
                ids = tuple(self.tok(self.texts[i][j], add_special_tokens=False).input_ids)
                out.append(Completion(prompt_ids=tuple(p), token_ids=ids, log_probs=(0.0,) * len(ids), finish_reason="length", prompt_index=i))
        return out

    def last_metrics(self):
        return {}


def _stage(task, texts, policy):
    tok = build_tokenizer()
    from rllab.settings import RolloutConfig

    config = RolloutConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=-1,
                           dynamic_sampling=False, overlong_buffer=0, overlong_penalty=1.0, reward_errors=policy, system_prompt=None)
    return build_stage(task=task, task_name="dataset", backend=_Backend(tok, texts), tokenizer=tok, config=config, seed=0)


def test_the_rollout_stage_calls_a_trl_function_once_per_batch(tmp_path):
    task = _task(tmp_path, [{"prompt": f"{i}?", "answer": str(i)} for i in range(20)],
                 rewards="tests.plugins.trl_rewards:accuracy_reward")
    examples = task.train[:2]
    stage = _stage(task, [[examples[0].answer, "x"], ["y", examples[1].answer]], "raise")
    comps = stage.generate(examples, stage.sampling_params(0, n=2))
    trl_rewards.CALLS.clear()
    rewards, keep, errors = stage.score(examples, comps)
    assert rewards == [1.0, 0.0, 0.0, 1.0] and errors == 0 and trl_rewards.CALLS == [4]


@pytest.mark.parametrize("policy", ["raise", "zero", "skip"])
def test_a_failing_row_follows_reward_errors_and_only_that_row_fails(tmp_path, policy):
    task = _task(tmp_path, [{"prompt": f"{i}?", "answer": str(i)} for i in range(20)],
                 rewards="tests.plugins.trl_rewards:broken_on_seven", eval_fraction=0.5, seed=1)
    seven = next(e for e in task.train + task.eval if e.answer == "7")
    other = next(e for e in task.train + task.eval if e.answer == "3")
    stage = _stage(task, [["a", "b"], ["c", "d"]], policy)
    examples = [other, seven]
    comps = stage.generate(examples, stage.sampling_params(0, n=2))
    if policy == "raise":
        with pytest.raises(RewardError, match=r"reward function 'broken_on_seven' .* raised on rows.jsonl row 8: ZeroDivisionError"):
            stage.score(examples, comps)
        return
    rewards, keep, errors = stage.score(examples, comps)
    assert rewards == [1.0, 1.0, 0.0, 0.0] and errors == 2
    assert keep == [True, True, policy == "zero", policy == "zero"]


def test_reward_knobs_configure_registered_functions_and_bad_ones_are_refused(tmp_path):
    rows = [{"prompt": f"{i}?", "answer": str(i)} for i in range(20)]
    task = _task(tmp_path, rows, rewards=["exact", "format"], reward_knobs='{"format": {"pattern": "<a>.*</a>"}}')
    ex = task.train[0]
    assert task.reward(ex, "<a>x</a>") == {"exact": 0.0, "format": 1.0}
    with pytest.raises(ConfigError, match=r"reward_knobs names \['formt'\], which are not among its reward functions"):
        _task(tmp_path, rows, rewards=["exact", "format"], reward_knobs='{"formt": {}}')
    with pytest.raises(ConfigError, match=r"format' \(plugin rllab_tasks\) has no knob 'patern'"):
        _task(tmp_path, rows, rewards="format", reward_knobs='{"format": {"patern": "x"}}')
    with pytest.raises(ConfigError, match="are for registered reward functions; this one has none"):
        _task(tmp_path, rows, rewards=f"{TRL}:reward_len", reward_knobs='{"reward_len": {"x": 1}}')
    with pytest.raises(ConfigError, match="must be a JSON object of objects"):
        _task(tmp_path, rows, reward_knobs='{"format": 3}')


def test_names_resolve_in_the_run_s_lab_with_its_plugins():
    from rllab.rollout.rewards import resolving_with

    class Plugin:
        @staticmethod
        @rllab.hookimpl
        def register_reward_functions(register):
            register("only_here", lambda *, completions, config, **kw: [0.5] * len(completions))

    lab = rllab.Lab([Plugin], entry_points=False)
    with pytest.raises(rllab.UnknownComponentError):
        load_reward_function("only_here")
    with resolving_with(lab):
        assert _score(load_reward_function("only_here"), ["a"]) == [0.5]


def test_rllab_plugins_lists_and_rllab_check_checks_reward_functions(capsys):
    from rllab.cli import main

    assert main(["plugins", "--kind", "reward_function"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in ("math_verify", "length_penalty", "max_length=200"))
    assert main(["check", "format", "--knob", 'pattern="a+"']) == 0
    assert "one finite float (or None) per completion" in capsys.readouterr().out


def test_a_run_passes_completion_ids_as_trl_does(tmp_path):
    task = _task(tmp_path, [{"prompt": f"{i}?", "answer": str(i)} for i in range(20)],
                 rewards=["tests.plugins.trl_rewards:token_count", "tests.plugins.trl_rewards:broken_on_seven"])
    seven = next(e for e in task.train + task.eval if e.answer == "7")
    other = next(e for e in task.train + task.eval if e.answer == "3")
    stage = _stage(task, [["ab", "abc"], ["a", "abcd"]], "zero")
    comps = stage.generate([other, seven], stage.sampling_params(0, n=2))
    rewards, comp_values, keep, errors = stage.score_components([other, seven], comps)
    assert [v[0] for v in comp_values[:2]] == [2.0, 3.0] and errors == 2  # the batch failed; each row alone
    task2 = _task(tmp_path, [{"prompt": f"{i}?", "answer": str(i)} for i in range(20)], rewards="tests.plugins.trl_rewards:token_count")
    stage2 = _stage(task2, [["ab", "abc"], ["a", "abcd"]], "raise")
    rewards, _, _ = stage2.score([other, seven], stage2.generate([other, seven], stage2.sampling_params(0, n=2)))
    assert rewards == [2.0, 3.0, 1.0, 4.0]
