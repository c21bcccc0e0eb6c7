"""Built-in tasks: rewards on right / wrong / garbage completions, the held-out split, jsonl."""

import json

import pytest
import torch

import rllab
from rllab.types import Example, Task

TASKS = ["addition", "chain", "countdown", "sort", "reverse"]
GARBAGE = ["", " ", "\n", "<eos>", "abc", "1+1", "9" * 500, "é∂ƒ", "((((", "-", "0x10"]


def make(lab, name, **knobs):
    return lab.get("task", name, **knobs)()


def gen(seed):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- every generated task


def test_registered_names(lab):
    assert {"addition", "chain", "countdown", "sort", "reverse", "jsonl"} <= set(lab.names("task"))


@pytest.mark.parametrize("name", TASKS)
def test_follows_the_protocol_and_demonstrations_are_right(lab, name):
    task = make(lab, name)
    assert isinstance(task, Task)
    for ex in task.train_examples(64, gen(0)) + task.eval_examples()[:64]:
        assert isinstance(ex, Example)
        demo = task.demonstration(ex)
        assert task.reward(ex, demo) == 1.0
        assert task.reward(ex, f"  {demo}\n") == 1.0  # surrounding whitespace is not an error
        assert task.reward(ex, demo + "0") == 0.0
        for junk in GARBAGE:
            if junk == demo:  # "1+1" is countdown's answer to "make 2 from 1 1:"
                continue
            assert task.reward(ex, junk) == 0.0, (ex, junk)


@pytest.mark.parametrize("name", TASKS)
def test_train_draws_are_deterministic_given_the_generator(lab, name):
    task = make(lab, name)
    a = task.train_examples(50, gen(3))
    b = task.train_examples(50, gen(3))
    c = task.train_examples(50, gen(4))
    assert [e.prompt for e in a] == [e.prompt for e in b]
    assert [e.prompt for e in a] != [e.prompt for e in c]
    g = gen(5)
    assert [e.prompt for e in task.train_examples(20, g)] != [e.prompt for e in task.train_examples(20, g)]


@pytest.mark.parametrize("name", TASKS)
def test_eval_split_is_fixed_distinct_and_disjoint_from_training(lab, name):
    task = make(lab, name)
    ev = task.eval_examples()
    assert 0 < len(ev) <= 200
    prompts = [e.prompt for e in ev]
    assert len(set(prompts)) == len(prompts)
    assert prompts == [e.prompt for e in make(lab, name).eval_examples()]  # a fresh instance agrees
    train = {e.prompt for e in task.train_examples(5000, gen(0))}
    assert not train & set(prompts)
    other = [e.prompt for e in make(lab, name, seed=1).eval_examples()]
    assert other != prompts


def test_eval_size_and_fraction_knobs(lab):
    assert len(make(lab, "addition", eval_size=17).eval_examples()) == 17
    # one-digit addition has 100 instances; the split keeps about eval_fraction of them
    small = make(lab, "addition", digits=1, eval_fraction=0.3)
    ev = {e.prompt for e in small.eval_examples()}
    assert 15 <= len(ev) <= 45
    train = {e.prompt for e in small.train_examples(3000, gen(0))}
    assert not ev & train and len(ev) + len(train) == 100


@pytest.mark.parametrize(
    "name,bad",
    [
        ("addition", {"digits": 0}),
        ("countdown", {"count": 1}),
        ("chain", {"terms": 1}),
        ("sort", {"min_length": 4, "max_length": 3}),
        ("reverse", {"alphabet": "greek"}),
        ("addition", {"eval_fraction": 1.0}),
    ],
)
def test_invalid_configs(lab, name, bad):
    with pytest.raises(rllab.ConfigError) as e:
        lab.get("task", name, **bad)
    assert next(iter(bad)) in str(e.value)


# --------------------------------------------------------------------------- addition


def test_addition_prompts_and_rewards(lab):
    task = make(lab, "addition")
    ex = Example(prompt="12+34=", answer="46", meta={"a": 12, "b": 34})
    assert task.reward(ex, "46") == 1.0
    assert task.reward(ex, "46 ") == 1.0
    assert task.reward(ex, "45") == 0.0
    assert task.reward(ex, "4 6") == 0.0
    assert task.reward(ex, "046") == 0.0
    for e in task.train_examples(200, gen(0)):
        a, b = e.meta["a"], e.meta["b"]
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert e.prompt == f"{a}+{b}=" and e.answer == str(a + b)


def test_addition_digits_knob(lab):
    for e in make(lab, "addition", digits=4).train_examples(50, gen(0)):
        assert 1000 <= e.meta["a"] <= 9999 and e.answer == str(e.meta["a"] + e.meta["b"])
    one = make(lab, "addition", digits=1).train_examples(300, gen(0))
    assert {e.meta["a"] for e in one} == set(range(10))


# --------------------------------------------------------------------------- countdown


def test_countdown_accepts_any_valid_expression(lab):
    task = make(lab, "countdown")
    ex = Example(prompt="make 22 from 3 5 7:", answer="3*5+7", meta={"numbers": [3, 5, 7], "target": 22})
    for ok in ["3*5+7", "7+3*5", "7+5*3", "(3*5)+7", " 5 * 3 + 7 ", "((7))+3*5"]:
        assert task.reward(ex, ok) == 1.0, ok
    for bad in [
        "3*5+6",  # wrong number
        "3*5+7+0",  # extra number
        "3*7+1",  # wrong numbers
        "22",  # no numbers used
        "3*5+7*1",  # extra number
        "5*5-3",  # 5 twice, 7 unused
        "-3+5*5",  # unary minus
        "3*5+7=22",  # not an expression
        "15+7",  # not the given numbers
        "3**5+7",  # power
        "(3*5+7",  # unbalanced
        "3/5+7",  # division
    ]:
        assert task.reward(ex, bad) == 0.0, bad


def test_countdown_instances(lab):
    from rllab_tasks.tasks.arithmetic import evaluate_countdown

    task = make(lab, "countdown", count=4, max_number=6)
    for e in task.train_examples(100, gen(0)):
        nums, target = e.meta["numbers"], e.meta["target"]
        assert len(nums) == 4 and all(1 <= n <= 6 for n in nums) and 0 <= target <= 100
        assert e.prompt == f"make {target} from {' '.join(map(str, nums))}:"
        value, used = evaluate_countdown(e.answer)
        assert value == target and sorted(used) == nums
    assert evaluate_countdown("2*(3-5)") == (-4, [2, 3, 5])
    assert evaluate_countdown("abs(3)") is None


# --------------------------------------------------------------------------- sort and reverse


def test_sort_and_reverse(lab):
    s = make(lab, "sort", alphabet="mixed", min_length=2, max_length=8)
    r = make(lab, "reverse", alphabet="letters")
    for e in s.train_examples(100, gen(0)):
        x = e.meta["input"]
        assert e.prompt == f"sort {x}:" and e.answer == "".join(sorted(x)) and 2 <= len(x) <= 8
    for e in r.train_examples(100, gen(0)):
        x = e.meta["input"]
        assert e.prompt == f"reverse {x}:" and e.answer == x[::-1] and x.isalpha()
    assert s.reward(Example(prompt="sort 3a1:", answer="13a"), "13a") == 1.0
    assert s.reward(Example(prompt="sort 3a1:", answer="13a"), "a31") == 0.0
    assert r.reward(Example(prompt="reverse abc:", answer="cba"), "cba") == 1.0
    assert r.reward(Example(prompt="reverse abc:", answer="cba"), "abc") == 0.0


# --------------------------------------------------------------------------- jsonl


@pytest.fixture
def rows_file(tmp_path):
    rows = [{"prompt": f"q{i}?", "answer": str(i * 2)} for i in range(200)]
    rows[0]["split"] = "eval"
    rows[1]["split"] = "train"
    rows[2]["demonstration"] = "four"
    rows[3]["answer"] = 6.5
    rows[4]["source"] = "extra key"
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


def test_jsonl_reads_rows_and_splits(lab, rows_file):
    task = make(lab, "jsonl", path=str(rows_file))
    ev, train = task.eval_examples(), task.train
    assert len(ev) + len(train) == 200 and 5 <= len(ev) <= 40
    assert "q0?" in {e.prompt for e in ev} and "q1?" in {e.prompt for e in train}
    assert not {e.prompt for e in ev} & {e.prompt for e in train}
    drawn = task.train_examples(500, gen(0))
    assert {e.prompt for e in drawn} <= {e.prompt for e in train}
    assert [e.prompt for e in drawn] == [e.prompt for e in task.train_examples(500, gen(0))]
    by_prompt = {e.prompt: e for e in ev + train}
    assert task.demonstration(by_prompt["q2?"]) == "four" and task.demonstration(by_prompt["q5?"]) == "10"
    assert by_prompt["q3?"].answer == "6.5" and by_prompt["q4?"].meta == {"source": "extra key"}
    assert len(make(lab, "jsonl", path=str(rows_file), eval_size=2).eval_examples()) == 2


def test_jsonl_reward_functions(lab, rows_file):
    ex = Example(prompt="q", answer="42")
    exact = make(lab, "jsonl", path=str(rows_file))
    contains = make(lab, "jsonl", path=str(rows_file), reward="contains")
    numeric = make(lab, "jsonl", path=str(rows_file), reward="numeric", tolerance=0.001)
    cases = {
        "42": (1, 1, 1),
        " 42\n": (1, 1, 1),
        "the answer is 42.": (0, 1, 1),
        "420": (0, 1, 0),
        "42.3": (0, 1, 0),
        "42.004": (0, 1, 1),
        "4.2e1": (0, 0, 1),
        "41 then 42": (0, 1, 0),
        "": (0, 0, 0),
        "forty-two": (0, 0, 0),
    }
    for text, want in cases.items():
        got = (exact.reward(ex, text), contains.reward(ex, text), numeric.reward(ex, text))
        assert got == want, (text, got)
    big = Example(prompt="q", answer="-1000")
    assert numeric.reward(big, "-1000.9") == 1.0 and numeric.reward(big, "-1001.1") == 0.0  # relative beyond 1
    assert numeric.reward(big, "1000") == 0.0


def test_jsonl_errors(lab, tmp_path):
    with pytest.raises(rllab.ConfigError, match="path"):
        lab.get("task", "jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        make(lab, "jsonl", path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(rllab.ConfigError, match="'exact', 'contains', 'numeric'"):
        lab.get("task", "jsonl", path="x.jsonl", reward="fuzzy")
    bad = tmp_path / "bad.jsonl"
    for content, match in [
        ('{"prompt": "a", "answer": "b"}\nnot json\n', "bad.jsonl:2: not valid JSON"),
        ('{"prompt": "a"}\n', "missing key 'answer'"),
        ('[1, 2]\n', "expected an object"),
        ('{"prompt": "a", "answer": "b", "split": "test"}\n', "split must be"),
        ('\n\n', r"has no rows \(it is empty or holds only blank lines\)"),
    ]:
        bad.write_text(content)
        with pytest.raises(ValueError, match=match):
            make(lab, "jsonl", path=str(bad))
    bad.write_text('{"prompt": "a", "answer": "seven", "split": "train"}\n')
    make(lab, "jsonl", path=str(bad))  # fine for exact match
    with pytest.raises(ValueError, match="not a number"):
        make(lab, "jsonl", path=str(bad), reward="numeric")


# --------------------------------------------------------------------------- chain


def test_chain_prompts_and_rewards(lab):
    task = make(lab, "chain", terms=4, digits=2)
    exs = task.train_examples(200, gen(0))
    for ex in exs:
        terms = ex.prompt[:-1]
        assert ex.prompt.endswith("=") and terms.count("+") + terms.count("-") == 3
        assert int(ex.answer) == eval(terms) >= 0  # noqa: S307 - digits and +/- only
        assert all(10 <= n <= 99 for n in ex.meta["terms"])
    assert any("-" in ex.prompt for ex in exs)
    assert not any("-" in ex.prompt for ex in make(lab, "chain", subtract=False).train_examples(50, gen(0)))
    ex = Example(prompt="12+34-7+58=", answer="97", meta={})
    assert task.reward(ex, "97") == 1.0 and task.reward(ex, "96") == 0.0 and task.reward(ex, "097") == 0.0


def test_countdown_default_is_two_numbers_with_a_real_held_out_split(lab):
    task = make(lab, "countdown")
    ex = task.train_examples(20, gen(0))
    assert all(len(e.meta["numbers"]) == 2 and max(e.meta["numbers"]) <= 20 for e in ex)
    assert len(task.eval_examples()) >= 50


@pytest.mark.slow
@pytest.mark.parametrize("name", ["addition", "countdown", "sort", "reverse"])
def test_every_builtin_task_learns_visibly_with_the_default_grpo_run(name, tmp_path):
    """The default preset and budget lift held-out accuracy by at least 15 points (minutes each)."""
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    summary = run_experiment(load_config(None, [f"task={name}", "train.checkpoint_every=0"], preset="grpo"), run_dir=tmp_path / name, progress=False)
    assert summary["final/accuracy"] - summary["initial/accuracy"] >= 0.15, summary


def test_sort_asks_for_its_own_warm_start_and_a_config_still_wins(lab):
    from rllab.models.tiny import WarmStartConfig, task_warm_start

    sort = make(lab, "sort")
    assert task_warm_start(sort, WarmStartConfig()) == WarmStartConfig(target_accuracy=0.2, check_every=2)
    assert task_warm_start(sort, WarmStartConfig(target_accuracy=0.3)) == WarmStartConfig(target_accuracy=0.3, check_every=2)
    assert task_warm_start(make(lab, "addition"), WarmStartConfig()) == WarmStartConfig()

    class Odd:
        name = "odd"
        warm_start_defaults = {"target_acc": 0.1}

    with pytest.raises(ValueError, match="target_acc"):
        task_warm_start(Odd(), WarmStartConfig())
