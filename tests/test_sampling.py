"""Prompt samplers in a run (rllab.sampling, rllab.rollout.gate): the stage's draw, feedback and
gate, the default sampler's equivalence with the task's own draw, checkpoints, and refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from rllab import Lab, Sampler
from rllab import hookimpl as rllab_hookimpl
from rllab.config import load_config
from rllab.errors import ConfigError
from rllab.rollout.stage import build_stage
from rllab.checks.run import check_sampler
from rllab.settings import RolloutConfig
from rllab.types import Completion, Example

from .test_accuracy_and_failures import Echo, Task, char  # noqa: F401  (char: a fixture)
from .tiny import TINY, overrides


class Alternating:
    """A fake backend: sample j of a prompt starting with "v" answers "1" or "2" by j's parity;
    any other prompt is always answered "1" (a flat group under a reward of text == "1")."""

    def __init__(self, tok):
        self.tok = tok

    def ids(self, text):
        return tuple(self.tok(text, add_special_tokens=False).input_ids) + (self.tok.eos_token_id,)

    def generate(self, prompts, params):
        out = []
        for i, p in enumerate(prompts):
            varies = "v" in self.tok.decode(list(p))
            for j in range(params.n):
                ids = self.ids("2" if varies and j % 2 else "1")
                out.append(Completion(prompt_ids=tuple(p), token_ids=ids, log_probs=(-0.1,) * len(ids), finish_reason="stop",
                                      prompt_index=i))
        return out

    def last_metrics(self):
        return {}


class Sequence(Sampler):
    """Draws the next prompts of a fixed list, whatever the generator; records its feedback."""

    def __init__(self, prompts):
        self.prompts = list(prompts)
        self.fed: list[tuple[list[str], list]] = []

    def draw(self, *, n, rng, step, source):
        out, self.prompts = self.prompts[:n], self.prompts[n:]
        return [Example(prompt=p, answer="1") for p in out]

    def feedback(self, *, step, examples, rewards):
        self.fed.append(([e.prompt for e in examples], list(rewards)))

    def metrics(self):
        return {"sampler/left": float(len(self.prompts))}


def one(ex, text):
    return 1.0 if text.strip() == "1" else 0.0


def gated_stage(tok, sampler, retries, **rollout):
    return build_stage(task=Task(one), task_name="t", backend=Alternating(tok), tokenizer=tok, seed=0, sampler=sampler,
                       sampler_name="seq", gate_retries=retries,
                       config=RolloutConfig(**{"prompts_per_step": 3, "group_size": 2, **rollout}))


def test_the_gate_replaces_flat_groups_round_by_round(char):  # noqa: F811
    s = Sequence(["f0", "v1", "f2", "f3", "v4", "v5"])
    r = gated_stage(char, s, 2).sample(1)
    # round 1: f3 into f0's place (still flat), v4 into f2's; round 2: v5 into f0's
    assert [e.prompt for e in r.examples] == ["v5", "v1", "v4"]
    assert [e.example.prompt for e in r.episodes] == ["v5", "v5", "v1", "v1", "v4", "v4"]
    assert [e.completion.prompt_index for e in r.episodes] == [0, 0, 1, 1, 2, 2]
    m = r.metrics
    assert (m["sampler/gate_flat"], m["sampler/gate_replaced"], m["sampler/gate_left"]) == (2, 2, 0)
    assert (m["sampler/gate_rounds"], m["sampler/gate_prompts"]) == (2, 3)
    assert m["rollout/groups_all_equal"] == 0 and m["rollout/reward"] == 0.5 and m["sampler/left"] == 0
    # feedback: the step's prompts, then every replacement played, each with its group's mean reward
    assert s.fed == [(["v5", "v1", "v4", "f3", "v4", "v5"], [0.5, 0.5, 0.5, 1.0, 0.5, 0.5])]


def test_groups_still_flat_when_the_rounds_run_out_stay_unless_dynamic_sampling_drops_them(char):  # noqa: F811
    r = gated_stage(char, Sequence(["f0", "v1", "f2", "f3", "f4"]), 1).sample(1)
    assert [e.prompt for e in r.examples] == ["f0", "v1", "f2"]  # f3 and f4 were flat too: nothing swapped
    assert r.metrics["sampler/gate_left"] == 2 and r.metrics["sampler/gate_replaced"] == 0
    assert all(e.keep for e in r.episodes)  # kept: a group baseline gives them advantage 0
    r = gated_stage(char, Sequence(["f0", "v1", "f2", "f3", "f4"]), 1, dynamic_sampling=True).sample(1)
    assert [e.keep for e in r.episodes] == [False, False, True, True, False, False]
    assert r.metrics["rollout/kept_frac"] == pytest.approx(1 / 3)


def test_without_a_gate_the_sampler_draws_and_hears_back_and_a_short_draw_is_refused(char):  # noqa: F811
    s = Sequence(["f0", "v1", "f2"])
    r = gated_stage(char, s, 0).sample(1)
    assert [e.prompt for e in r.examples] == ["f0", "v1", "f2"] and "sampler/gate_flat" not in r.metrics
    assert s.fed == [(["f0", "v1", "f2"], [1.0, 0.5, 1.0])]
    with pytest.raises(Exception, match="sampler 'seq' drew 1 examples where step 1 asked for 3"):
        gated_stage(char, Sequence(["f0"]), 0).sample(1)


def test_the_default_sampler_samples_what_the_stage_without_one_samples(char):  # noqa: F811
    lab = Lab()
    task = lab.get("task", "addition")()

    def sample(sampler):
        s = build_stage(task=task, task_name="addition", backend=Echo(char, "46"), tokenizer=char, seed=5, sampler=sampler,
                        sampler_name="default", config=RolloutConfig(prompts_per_step=8, group_size=2))
        r = s.sample(3)
        return [e.prompt for e in r.examples], r.rewards().tolist(), {k: v for k, v in r.metrics.items() if not k.startswith(("time/", "perf/"))}

    assert sample(lab.get("sampler", "default")()) == sample(None)


def test_what_a_sampler_cannot_run_with_is_refused_naming_it():
    lab = Lab()
    with pytest.raises(ConfigError, match="difficulty_pool.*max_staleness = 0 \\(it is 1\\)"):  # at load
        load_config(None, ["sampler=difficulty_pool", "rollout.max_staleness=1"], lab=lab)
    with pytest.raises(ConfigError, match="difficulty_pool.*2 data-parallel ranks"):
        check_sampler(load_config(None, ["sampler=difficulty_pool"]), lab, world_size=2)
    with pytest.raises(ConfigError, match="advantage_gate.*random_reward = 'given'"):
        load_config(None, ["sampler=advantage_gate", "rollout.random_reward=given"], lab=lab)
    check_sampler(load_config(None, ["rollout.max_staleness=1"]), lab, world_size=2)  # the default draw: stateless
    for name in ("difficulty_pool", "advantage_gate"):  # partial rollouts draw more than a step trains on
        with pytest.raises(ConfigError, match=f"{name}.*rollout.over_sample = 0.5.*over_sample = 0"):
            load_config(None, [f"sampler={name}", "rollout.over_sample=0.5"], lab=lab)
    check_sampler(load_config(None, ["rollout.over_sample=0.5"]), lab)  # the default draw takes any number of prompts
    with pytest.raises(ConfigError, match=r"\[sampler\] is set, but algorithm 'dpo' does not use it"):
        load_config(None, ["algorithm=dpo", "sampler=difficulty_pool"])


@pytest.fixture(scope="module")
def _cache(model_cache):
    yield


def test_a_resumed_run_draws_and_logs_what_the_uninterrupted_one_does(tmp_path, _cache):
    from rllab.training.runs import resume_run
    from rllab.training.trainer import Trainer, run_experiment

    args = [*overrides(TINY), "train.steps=4", "train.checkpoint_every=2", "task.digits=1", "sampler=difficulty_pool",
            "sampler.pool_size=6"]
    run_experiment(load_config(None, args), run_dir=tmp_path / "full", progress=False)
    state = torch.load(tmp_path / "full" / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert state["sampler"]["pool_size"] == 6 and sum(m is not None for m in state["sampler"]["means"]) > 0
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    (cut / "final.json").unlink()
    resume_run(cut, progress=False)

    def rows(run):
        return [{k: v for k, v in json.loads(x).items() if not k.startswith(("time/", "perf/"))}
                for x in (run / "metrics.jsonl").read_text().splitlines()]

    full = rows(tmp_path / "full")
    assert rows(cut) == full
    assert [r["sampler/pool_seen"] for r in full if "sampler/pool_seen" in r][-1] > 0
    assert any(r.get("sampler/pool_normal", 6) + r.get("sampler/pool_easy", 0) < 6 for r in full)  # the pools moved
    with pytest.raises(ConfigError, match="difficulty_pool.*max_staleness"):
        Trainer(load_config(None, [*args, "rollout.max_staleness=1"]), run_dir=tmp_path / "async")


class _Forgetful:
    """A plugin whose sampler learns from feedback but saves nothing, and claims to be stateless."""

    @staticmethod
    def sampler(*, config):
        class Forgets(Sampler):
            def __init__(self):
                self.seen = 0

            def draw(self, *, n, rng, step, source):
                return source(n + self.seen, rng)[self.seen:]

            def feedback(self, *, step, examples, rewards):
                self.seen += 1

        return Forgets()

    @rllab_hookimpl
    def register_samplers(self, register):
        register("forgets", self.sampler, stateless=True)


def test_the_contract_catches_a_sampler_that_loses_its_state_or_wrongly_claims_to_be_stateless():
    from rllab.testing import run_contract

    lab = Lab(plugins=[_Forgetful()], entry_points=False)
    results = {r.check: r for r in run_contract(lab, "sampler", "forgets")}
    assert not results["a sampler restored from its state_dict draws what the original draws"].passed
    assert not results["a stateless sampler draws the same with and without feedback"].passed
    assert results["draws n examples, the same for the same generator"].passed


def test_a_run_reads_the_gate_from_its_samplers_trait(tmp_path, _cache):
    from rllab.training.trainer import run_experiment

    run_experiment(load_config(None, [*overrides(TINY), "train.steps=1", "task.digits=1", "sampler=advantage_gate",
                                      "sampler.max_retries=3"]), run_dir=tmp_path / "r", progress=False)
    row = next(json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines() if '"rollout/reward"' in x)
    assert row["sampler/gate_rounds"] <= 3 and row["sampler/gate_left"] <= row["sampler/gate_flat"]
    assert row["sampler/gate_flat"] == 0 or row["sampler/gate_rounds"] >= 1
