"""``rllab compare``: arms labelled by their shortest distinguishing settings, the report written
beside the runs (not into the working directory), and no warnings from the plots."""

from __future__ import annotations

import json
import warnings

from rllab_suite.report import label_runs, shortest_distinguishing


def _run(path, *, seed, acc, **config):
    path.mkdir(parents=True)
    sections = {"task": {"name": "addition"}, "train": {"seed": seed}}
    for key, value in config.items():
        sec, _, knob = key.partition("__")
        sections.setdefault(sec, {})[knob] = value
    text = "".join(f"[{sec}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in knobs.items()) for sec, knobs in sections.items())
    (path / "config.toml").write_text(text)
    rows = [{"step": s, "eval/accuracy": a, "eval/reward": a} for s, a in zip((0, 5, 10), acc)]
    rows.insert(1, {"step": 1, "rollout/reward": 0.5})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "final.json").write_text("{}")
    return path


def test_shortest_distinguishing_keys_by_hand():
    flat = [{"a": 1, "b": 1, "c": 1}, {"a": 2, "b": 2, "c": 1}, {"a": 3, "b": 2, "c": 2}]
    assert shortest_distinguishing(["a", "b", "c"], flat, ["a", "b", "c"]) == ["a"]  # a alone tells all three apart
    assert shortest_distinguishing(["b", "c"], flat, ["a", "b", "c"]) == ["b", "c"]  # neither alone does
    same = [{"a": 1, "b": 5}, {"a": 1, "b": 5}]
    assert shortest_distinguishing(["a", "b"], same, ["a", "b"]) == []
    # two seeds of one config and one other: the grouping, not the runs, is what must be told apart
    seeds = [{"lr": 1, "x": 1}, {"lr": 1, "x": 1}, {"lr": 2, "x": 3}]
    assert shortest_distinguishing(["lr", "x"], seeds, ["lr", "x"]) == ["lr"]


def test_labels_name_only_what_tells_the_arms_apart(tmp_path):
    runs = [
        _run(tmp_path / "a0", seed=0, acc=[0.1, 0.2, 0.3], policy_loss__name="ppo_clip", train__lr=1e-3, rollout__max_new_tokens=8),
        _run(tmp_path / "a1", seed=1, acc=[0.1, 0.2, 0.3], policy_loss__name="ppo_clip", train__lr=1e-3, rollout__max_new_tokens=8),
        _run(tmp_path / "b0", seed=0, acc=[0.1, 0.3, 0.4], policy_loss__name="cispo", train__lr=2e-3, rollout__max_new_tokens=6),
    ]
    # every setting differs between the arms; the component's name alone tells them apart
    assert label_runs(runs) == ["policy_loss=ppo_clip", "policy_loss=ppo_clip", "policy_loss=cispo"]
    runs.append(_run(tmp_path / "c0", seed=0, acc=[0.1, 0.3, 0.5], policy_loss__name="cispo", train__lr=3e-3, rollout__max_new_tokens=6))
    assert label_runs(runs) == ["train.lr=0.001"] * 2 + ["train.lr=0.002", "train.lr=0.003"]


def test_compare_writes_beside_the_runs_without_warnings(tmp_path, monkeypatch, capsys):
    from rllab.cli import main

    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    args = []
    for v, lr in (("a", 1e-3), ("b", 2e-3)):
        for s in range(2):
            args.append(str(_run(runs / f"{v}{s}", seed=s, acc=[0.1, 0.2 + lr * 100, 0.3 + s / 100], train__lr=lr,
                                 rollout__system_prompt="a long setting that makes a long label " * 4)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["compare", *args]) == 0
    assert [str(w.message) for w in caught if "matplotlib" in w.filename or "plots" in w.filename] == []
    out = capsys.readouterr().out
    assert (runs / "compare" / "report.md").is_file() and not (tmp_path / "compare").exists()
    assert f"report written to {runs / 'compare' / 'report.md'}" in " ".join(out.split())
    assert "train.lr=0.001" in out and "system_prompt" not in out
    assert main(["compare", *args, str(runs / "compare")]) == 1  # the report directory is no run
    assert "holds a comparison's report" in capsys.readouterr().err
