"""The dataset task: local files through `datasets` (JSONL, JSON, Parquet, CSV, save_to_disk), TRL and
verl formats, column mapping, splits, and errors that name the file, row and column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rllab

datasets = pytest.importorskip("datasets")

from . import trl_rewards  # noqa: E402

_LAB = rllab.Lab()
TRL = Path(trl_rewards.__file__)


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _task(path, **knobs):
    return _LAB.get("task", "dataset", path=str(path), **knobs)()


def _sums(n=40):
    return [{"prompt": f"{i}+1=", "answer": i + 1, "level": i % 3} for i in range(n)]


def test_trl_rows_hold_out_a_seeded_shuffled_fraction(tmp_path):
    path = _jsonl(tmp_path / "sums.jsonl", _sums())
    task = _task(path, eval_fraction=0.25)
    assert task.format == "trl" and len(task.eval) == 10 and len(task.train) == 30
    assert {e.prompt for e in task.eval}.isdisjoint(e.prompt for e in task.train)
    again, other = _task(path, eval_fraction=0.25), _task(path, eval_fraction=0.25, seed=1)
    assert [e.prompt for e in again.eval] == [e.prompt for e in task.eval] != [e.prompt for e in other.eval]
    ex = task.train[0]
    assert ex.answer == str(int(ex.prompt.split("+")[0]) + 1)  # a number is kept as its text
    assert ex.meta["columns"]["level"] == int(ex.prompt.split("+")[0]) % 3 and ex.meta["row"].startswith("sums.jsonl row ")
    import torch

    draw = lambda: [e.prompt for e in task.train_examples(8, torch.Generator().manual_seed(3))]  # noqa: E731
    assert draw() == draw()
    assert task.reward(ex, ex.answer) == 1.0 and task.reward(ex, "x") == 0.0  # default reward: exact


def test_other_columns_reach_the_reward_functions_as_lists(tmp_path):
    path = _jsonl(tmp_path / "sums.jsonl", _sums())
    seen = {}

    def spy(completions, level, answer, **kwargs):
        seen.update(level=level, answer=answer, keys=set(kwargs))
        return [0.0] * len(completions)

    task = _task(path, rewards=f"{TRL}:reward_len")
    task.rewards = rllab.rollout.rewards.RewardSet(
        functions=(rllab.rollout.rewards.RewardFunction(name="spy", ref="spy", fn=spy, style="trl"),), weights=(1.0,)
    )
    task.reward_batch(task.train[:2], ["a", "b"])
    assert seen["level"] == [e.meta["columns"]["level"] for e in task.train[:2]]
    assert seen["answer"] == [e.meta["columns"]["answer"] for e in task.train[:2]]
    assert {"prompts", "ground_truth"} <= seen["keys"] and "prompt" not in seen["keys"]


def test_chat_prompts_are_kept_as_messages(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{i}+1?"}], "answer": str(i + 1)} for i in range(10)]
    task = _task(_jsonl(tmp_path / "chat.jsonl", rows))
    ex = task.train[0]
    assert isinstance(ex.prompt, tuple) and ex.prompt[1]["role"] == "user" and ex.prompt[1]["content"].endswith("+1?")


def test_verl_parquet_reads_ground_truth_and_uses_math_verify_by_default(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("math_verify")
    rows = [
        {"data_source": "sums", "prompt": [{"role": "user", "content": f"What is {i}/2?"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": f"\\frac{{{i}}}{{2}}"}, "extra_info": {"index": i}}
        for i in range(1, 21)
    ]
    path = tmp_path / "verl.parquet"
    pd.DataFrame(rows).to_parquet(path)
    task = _task(path)
    assert task.format == "verl" and task.rewards.names == ("math_verify",)
    ex = next(e for e in task.train if e.meta["columns"]["extra_info"]["index"] == 3)
    assert ex.answer == "\\frac{3}{2}" and ex.meta["columns"]["data_source"] == "sums"
    assert task.reward(ex, "so \\boxed{1.5}") == 1.0 and task.reward(ex, "2") == 0.0
    own = _task(path, rewards=f"{TRL}:compute_score")
    assert own.reward(ex, "\\frac{3}{2}") == 1.0


def test_json_csv_and_save_to_disk_read_alike(tmp_path):
    rows = _sums(20)
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    import csv

    with open(tmp_path / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["prompt", "answer", "level"])
        w.writeheader()
        w.writerows(rows)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    prompts = {str(tmp_path / n): sorted(e.prompt for e in _task(tmp_path / n).train + _task(tmp_path / n).eval)
               for n in ("rows.json", "rows.csv", "saved")}
    assert len(set(map(tuple, prompts.values()))) == 1 and len(next(iter(prompts.values()))) == 20


def test_a_saved_dataset_dict_uses_its_test_split_for_evaluation(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(_sums(12)), "test": datasets.Dataset.from_list(_sums(3))})
    dd.save_to_disk(str(tmp_path / "dd"))
    task = _task(tmp_path / "dd")
    assert len(task.train) == 12 and [e.prompt for e in task.eval] == ["0+1=", "1+1=", "2+1="]


def test_a_split_column_and_an_eval_file_choose_the_evaluation_rows(tmp_path):
    rows = [{**r, "split": "test" if i < 4 else "train"} for i, r in enumerate(_sums(12))]
    task = _task(_jsonl(tmp_path / "split.jsonl", rows))
    assert [e.prompt for e in task.eval] == ["0+1=", "1+1=", "2+1=", "3+1="] and len(task.train) == 8
    task = _task(_jsonl(tmp_path / "a.jsonl", _sums(5)), eval_path=str(_jsonl(tmp_path / "b.jsonl", _sums(2))))
    assert len(task.train) == 5 and len(task.eval) == 2
    with pytest.raises(ValueError, match=r"split.jsonl row 1, column 'split': 'test' in the training file while eval_path is set"):
        _task(tmp_path / "split.jsonl", eval_path=str(tmp_path / "b.jsonl"))
    with pytest.raises(ValueError, match=r"split.jsonl row 1, column 'split': expected 'train' or one of eval, test, validation, got 'dev'"):
        _task(_jsonl(tmp_path / "split.jsonl", [{**r, "split": "dev"} for r in _sums(4)]))


def test_column_mapping_reads_other_and_nested_columns(tmp_path):
    rows = [{"question": f"{i}+1=", "meta": {"solution": str(i + 1)}, "worked": f"{i}+1={i + 1}"} for i in range(10)]
    task = _task(_jsonl(tmp_path / "m.jsonl", rows), prompt_column="question", answer_column="meta.solution",
                 demonstration_column="worked")
    ex = task.train[0]
    n = int(ex.prompt.split("+")[0])
    assert ex.answer == str(n + 1) and task.demonstration(ex) == f"{n}+1={n + 1}"


@pytest.mark.parametrize(
    "rows, knobs, message",
    [
        ([{"prompt": "a", "answer": "1"}, {"answer": "2"}], {}, r"bad.jsonl row 2: missing column 'prompt'"),
        ([{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}] * 3, {"answer_column": "answer"},
         r"bad.jsonl row 2: missing column 'answer'"),
        ([{"prompt": "a", "answer": [1]}, {"prompt": "b", "answer": [2]}], {},
         r"bad.jsonl row 1, column 'answer': expected a string or a number, got list"),
        ([{"prompt": 3, "answer": "1"}, {"prompt": 4, "answer": "2"}], {},
         r"bad.jsonl row 1, column 'prompt': the prompt must be a string or a list of \{role, content\} messages, got int"),
        ([{"prompt": [{"role": "wizard", "content": "x"}], "answer": "1"}] * 2, {}, r"bad.jsonl row 1, column 'prompt'.*role 'wizard'"),
        ([{"prompt": "a", "answer": "1", "split": "train"}] * 3, {}, r"bad.jsonl has no evaluation rows \(3 training, 0 evaluation\)"),
        ([{"prompt": "a"}, {"prompt": "b"}], {}, r"bad.jsonl row \d has no 'answer' column for the reward 'exact' \(the default\)"),
        ([{"prompt": "a", "answer": "1"}, {"prompt": "b"}], {"rewards": ["format", "numeric"]},
         r"bad.jsonl row 2 has no 'answer' column for the reward 'numeric', which compares"),
    ],
)
def test_malformed_data_is_an_error_naming_file_row_and_column(tmp_path, rows, knobs, message):
    with pytest.raises(ValueError, match=message):
        _task(_jsonl(tmp_path / "bad.jsonl", rows), **knobs)


def test_a_missing_path_is_refused_without_asking_a_hub(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file or directory: .*gsm8k \(data sets are read from local paths only\)"):
        _task("openai/gsm8k")
    with pytest.raises(ValueError, match=r"unknown file type '.txt'"):
        (tmp_path / "rows.txt").write_text("x")
        _task(tmp_path / "rows.txt")


def test_the_warm_start_uses_the_demonstration_else_the_answer_else_refuses(tmp_path):
    rows = [{"prompt": f"{i}?", "answer": str(i), **({"demonstration": f"it is {i}"} if i % 2 else {})} for i in range(10)]
    task = _task(_jsonl(tmp_path / "d.jsonl", rows))
    for e in task.train:
        n = int(e.answer)
        assert task.demonstration(e) == (f"it is {n}" if n % 2 else str(n))
    bare = _task(_jsonl(tmp_path / "bare.jsonl", [{"prompt": f"{i}?"} for i in range(10)]), rewards=f"{TRL}:reward_len")
    with pytest.raises(rllab.RllabError, match=r"bare.jsonl row \d+ has no 'demonstration' column and no answer .* model.warm_start.steps = 0"):
        bare.demonstration(bare.train[0])
