"""The suite files shipped in benchmarks/suites: each expands into validated cells, and the
staleness suites compare what their comments say they compare (cell for cell)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from rllab_suite.spec import _flatten, expand, parse_suite

SUITES = Path(__file__).resolve().parents[2] / "benchmarks" / "suites"
SHIPPED = sorted(SUITES.glob("*.toml"))


def cells(name: str) -> dict:
    """(variant, seed) → cell of the shipped suite file ``name``.toml (one task in these suites), from
    its first start (warm-start seed 0) when the suite runs from several."""
    return {(c.variant, c.seed): c for c in expand(parse_suite(SUITES / f"{name}.toml")) if c.start in (None, 0)}


FIRST_START = {"model.tiny": ({}, {"seed": 0}), "model.warm_start": ({}, {"seed": 0})}
"""What a suite with several starts sets on its first start's cells: the default seed 0, explicit (the same model)."""


def differences(a, b) -> dict:
    """The settings where two cells' resolved configs differ (the run name aside): key → (a, b)."""
    fa, fb = dict(_flatten(a.config)), dict(_flatten(b.config))
    found = {k: (fa.get(k), fb.get(k)) for k in fa.keys() | fb.keys() if k != "name" and fa.get(k) != fb.get(k)}
    return {k: v for k, v in found.items() if FIRST_START.get(k) not in (v, v[::-1])}


def test_suite_files_are_shipped():
    assert {"staleness.toml", "staleness_k4.toml", "staleness_clip.toml", "staleness_k4_bounds.toml",
            "staleness_k4_rejection_is.toml"} <= {
        p.name for p in SHIPPED}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_suite_expands_into_validated_cells(path, tmp_path, monkeypatch, request):
    teachers = sorted(set(re.findall(r"~/\.cache/rllab/teachers/[\w.-]+", path.read_text())))
    if teachers:  # a suite's teacher is built once per machine (its comment says how): a stand-in model here
        from rllab.training.trainer import Trainer

        from ..tiny import TINY, overrides

        request.getfixturevalue("model_cache")
        from rllab.config import load_config

        trainer = Trainer(load_config(None, [*overrides(TINY), "model.warm_start.steps=0"]), run_dir=tmp_path / "t", progress=False)
        model_dir = trainer.model_dir
        trainer.close()
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        for t in teachers:
            shutil.copytree(model_dir, Path(t).expanduser())
    suite = parse_suite(path)
    expanded = expand(suite)  # validates every cell's config
    assert len(expanded) == len(suite.variants) * len(suite.tasks) * max(1, len(suite.starts)) * len(suite.seeds)
    assert len({c.key for c in expanded}) == len(expanded)


def test_staleness_k4_is_the_staleness_suite_at_k_4():
    k2, every = cells("staleness"), cells("staleness_k4")
    controls = ("random_reward", "no_rl")  # staleness_k4's control arms, which staleness lacks
    assert {v for v, _ in every} - {v for v, _ in k2} == set(controls)
    k4 = {key: c for key, c in every.items() if key[0] not in controls}
    assert k2.keys() == k4.keys() and len(k2) == 6 * 5
    k4_start = next(iter(json.loads((SUITES / "results" / "staleness_k4" / "provenance.json").read_text())["starts"]))  # start 0
    for (variant, seed), cell in k4.items():
        assert k2[(variant, seed)].config["model"]["sha256"] == k4_start  # staleness pins the start staleness_k4 recorded
        diff = differences(k2[(variant, seed)], cell)
        diff.pop("model.sha256", None)
        if variant == "sync":  # max_staleness = 0 in both: the same run
            assert diff == {}
        else:
            assert diff == {"rollout.max_staleness": (2, 4)}, (variant, diff)


def test_staleness_clip_controls_differ_from_the_staleness_arms_only_where_they_say():
    k2, control = cells("staleness"), cells("staleness_clip")
    assert {v for v, _ in control} == {"sync", "bypass", "sync_mb4", "bypass_mb4", "bypass_noclip",
                                         "sync_lr_half"}
    for seed in range(5):
        for arm in ("sync", "bypass"):  # the staleness suite's own arms, rerun
            assert differences(control[(arm, seed)], k2[(arm, seed)]) == {}  # the same run, from staleness's start 0
            assert differences(control[(arm, seed)], control[(f"{arm}_mb4", seed)]) == {
                "algorithm.minibatches": (1, 4)}
        assert control[("sync", seed)].config["rollout"]["max_staleness"] == 0
        assert control[("bypass", seed)].config["rollout"]["max_staleness"] == 2
        noclip = differences(control[("bypass", seed)], control[("bypass_noclip", seed)])
        assert differences(control[("sync", seed)], control[("sync_lr_half", seed)]) == {"train.lr": (2e-4, 1e-4)}
        assert noclip == {"policy_loss.clip_low": (0.2, 1.0), "policy_loss.clip_high": (0.2, 1000.0),
                          "policy_loss.clip_c": (3.0, 1e6)}


def test_staleness_k4_bounds_differ_from_the_k4_arms_only_in_the_bound():
    k4, bounds = cells("staleness_k4"), cells("staleness_k4_bounds")
    arms = {"tis": ("tis", {}),  # staleness_k4's own arm, rerun: the same run
            "mis_c5": ("mis", {"correction.c_max": (2.0, 5.0)}),
            "mis_c20": ("mis", {"correction.c_max": (2.0, 20.0)}),
            "rejection_k3_05": ("rejection", {"correction.upper": (0.1, 0.5)}),
            "rejection_k3_2": ("rejection", {"correction.upper": (0.1, 2.0)})}
    assert bounds.keys() == {(arm, seed) for arm in arms for seed in range(5)}
    k4_start = next(iter(json.loads((SUITES / "results" / "staleness_k4" / "provenance.json").read_text())["starts"]))  # start 0
    for (variant, seed), cell in bounds.items():
        reference, expected = arms[variant]
        assert cell.config["rollout"]["max_staleness"] == 4
        assert cell.config["model"]["sha256"] == k4_start  # pinned to the start staleness_k4 recorded
        found = differences(k4[(reference, seed)], cell)
        found.pop("model.sha256", None)
        assert found == expected, variant
        assert (found == {}) == (variant == "tis")
    for arm in ("rejection_k3_05", "rejection_k3_2"):
        assert bounds[(arm, 0)].config["correction"]["criterion"] == "seq_max_k3"


def test_staleness_k4_rejection_is_arms_differ_from_the_unweighted_rejection_arms_only_in_is_level():
    k4, bounds = cells("staleness_k4"), cells("staleness_k4_bounds")
    weighted = cells("staleness_k4_rejection_is")
    arms = {"rejection_is_k3_01": k4, "rejection_is_k3_05": bounds}  # where the unweighted arm ran
    unweighted = {"rejection_is_k3_01": "rejection", "rejection_is_k3_05": "rejection_k3_05"}
    assert weighted.keys() == {(arm, seed) for arm in arms for seed in range(5)}
    for (variant, seed), cell in weighted.items():
        reference = arms[variant][(unweighted[variant], seed)]
        assert cell.config["rollout"]["max_staleness"] == 4
        assert cell.config["correction"]["criterion"] == "seq_max_k3"
        found = differences(reference, cell)
        found.pop("model.sha256", None)  # staleness_k4_bounds pins the start staleness_k4 recorded
        assert found == {"correction.is_level": ("none", "token")}, variant


def test_controls_lowlr_arms_differ_from_controls_only_where_its_comments_say():
    """controls_lowlr is controls at a 10× lower constant rate and 16 minibatches, from the same
    three pinned starts; the random reward is Bernoulli(0.5); the no-clip arm differs from the
    random-reward arm in the clip's bounds alone."""
    every = lambda name: {(c.variant, c.start, c.seed): c for c in expand(parse_suite(SUITES / f"{name}.toml"))}
    base, low = every("controls"), every("controls_lowlr")
    assert {v for v, _, _ in low} == {"grpo", "random_reward", "random_reward_noclip", "no_rl"}
    assert {s for _, s, _ in low} == {0, 1, 2}
    for (variant, start, seed), cell in low.items():
        assert cell.config["model"]["sha256"] == base[("no_rl", start, seed)].config["model"]["sha256"]  # controls' starts
        if variant == "random_reward_noclip":
            assert differences(low[("random_reward", start, seed)], cell) == {
                "policy_loss.clip_low": (0.2, 1.0), "policy_loss.clip_high": (0.2, 1e9)}
            continue
        found = differences(base[(variant, start, seed)], cell)
        if variant == "no_rl":  # the warm start alone: the training settings do not act
            assert found.keys() <= {"train.lr", "train.lr_schedule", "algorithm.minibatches"}
            continue
        assert found == {"train.lr": (2e-4, 2e-5), "train.lr_schedule": ("cosine", "constant"),
                         "algorithm.minibatches": (1, 16)}, (variant, found)
        assert cell.config["rollout"]["random_reward"] == ("given" if variant == "random_reward" else "off")
        assert cell.config["rollout"]["random_reward_p"] == 0.5
