"""Partial rollouts (``rollout.over_sample``, ``rollout.partial``, ``rollout.mask_stale_tokens``):
the batch stops once P groups are complete, unfinished groups are dropped or continued from their
tokens with per-token versions, and the off default changes nothing."""

from __future__ import annotations

import pytest
import torch

from rllab.errors import RllabError
from rllab.rollout.stage import build_stage
from rllab.settings import RolloutConfig
from rllab.types import Completion

from .test_accuracy_and_failures import Echo, Task, char  # noqa: F401  (char: a fixture)


class Clock:
    """A backend whose ``generate_until`` is a token clock: sample j of prompt ``"i+1="`` needs
    ``lengths[i][j]`` tokens in all (filler tokens, the last one EOS); a continued row's prompt
    ends with the filler tokens it has. Every row advances one token per tick; the clock stops
    at the first tick where ``needed`` groups have all their rows done. A token's log-prob is
    ``-(version + 1)``, so each token tells the weights that sampled it."""

    def __init__(self, tok, lengths):
        self.tok, self.lengths, self.version, self.calls = tok, lengths, 0, []
        self.fill = tok("x", add_special_tokens=False).input_ids[0]

    def generate(self, prompts, params):
        raise AssertionError("partial rollouts sample through generate_until")

    def generate_until(self, prompts, params, *, caps, groups, needed):
        self.calls.append(dict(prompts=[tuple(p) for p in prompts], caps=list(caps), groups=list(groups), needed=needed))
        need, taken = [], {}
        for p, g, k in zip(prompts, groups, range(len(prompts))):
            i = int(self.tok.decode(list(p), skip_special_tokens=True).lstrip()[0])
            have = _trailing(p, self.fill)
            used = taken.setdefault(g, [])
            # a fresh row is its group's next sample; a resumed one the first unused sample longer than what it has
            j = next(j for j, n in enumerate(self.lengths[i]) if j not in used and (have == 0 or n > have))
            used.append(j)
            need.append(min(self.lengths[i][j] - have, caps[k]))
        t = 0
        while True:
            t += 1
            done = [n <= t for n in need]
            full = len({g for g in groups}) - len({g for g, d in zip(groups, done) if not d})
            if all(done) or full >= needed:
                break
        eos, lp = self.tok.eos_token_id, -(self.version + 1.0)
        out = []
        for k, (p, n) in enumerate(zip(prompts, need)):
            m = min(n, t)
            ids = (self.fill,) * (m - 1) + ((eos,) if m == n else (self.fill,)) if m else ()
            out.append(Completion(prompt_ids=tuple(p), token_ids=ids, log_probs=(lp,) * m, prompt_index=k,
                                  finish_reason="abort" if m < n else "stop", weight_version=str(self.version)))
        return out

    def last_metrics(self):
        return {}


def _trailing(p, fill):
    n = 0
    for t in reversed(list(p)):
        if t != fill:
            break
        n += 1
    return n


LENGTHS = {0: [2, 3], 1: [6, 6], 2: [1, 4], 3: [5, 2]}
"""Groups complete at ticks 3, 6, 4, 5: with P = 2 the clock stops at tick 4 (groups 0 and 2)."""


def _stage(tok, backend, **rollout):
    return build_stage(task=Task(), task_name="t", backend=backend, tokenizer=tok, seed=0,
                       config=RolloutConfig(**{"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "over_sample": 1.0,
                                               **rollout}))


def test_the_batch_stops_once_p_groups_are_complete_and_drop_drops_the_rest(char):  # noqa: F811
    clock = Clock(char, LENGTHS)
    s = _stage(char, clock)
    r = s.sample(1)
    (call,) = clock.calls
    assert call["needed"] == 2 and call["groups"] == [0, 0, 1, 1, 2, 2, 3, 3] and call["caps"] == [8] * 8  # 4 = 2 · (1 + 1.0) groups drawn
    assert sorted({c.prompt_index for c in r.completions}) == [0, 2]  # only the complete groups, whole
    assert [len(c.token_ids) for c in r.completions] == [2, 3, 1, 4]
    assert r.metrics["partial/groups_complete"] == 2 and r.metrics["partial/groups_unfinished"] == 2
    assert s.to_batch(r).input_ids.shape[0] == 4
    clock.version = 1
    s.sample(2)
    assert all(_trailing(p, clock.fill) == 0 for p in clock.calls[1]["prompts"])  # nothing resumed: the rest was dropped
    assert s.partial.carried == []


def test_continue_resumes_each_sample_from_its_tokens_with_the_next_weights(char):  # noqa: F811
    clock = Clock(char, LENGTHS)
    s = _stage(char, clock, partial="continue")
    s.sample(1)  # stops at tick 4: group 1 has 4 + 4 tokens, group 3 has 4 (unfinished) and 2 (finished)
    assert [len(c.example.prompt) and c.example.prompt for c in s.partial.carried] == ["1+1=", "3+1="]
    clock.version = 1
    r = s.sample(2)
    call = clock.calls[1]
    # carried groups first: group 1's two rows and group 3's unfinished row resume; its finished row is not sent again
    assert [_trailing(p, clock.fill) for p in call["prompts"][:3]] == [4, 4, 4]
    assert call["caps"][:3] == [4, 4, 4] and call["groups"] == [0, 0, 1, 2, 2, 3, 3]
    by_prompt = {}
    for e in r.episodes:
        by_prompt.setdefault(e.completion.prompt_index, []).append(e)
    # group 1 needs 6 tokens: 4 from step 1, 2 from step 2; group 3: 4 + 1 and the finished 2 from step 1
    (a, b) = by_prompt[0]
    assert a.token_versions == (1, 1, 1, 1, 2, 2) and a.completion.log_probs == (-1.0,) * 4 + (-2.0,) * 2
    assert a.completion.token_ids[-1] == char.eos_token_id and a.completion.finish_reason == "stop"
    (c, d) = by_prompt[1]
    assert c.token_versions == (1, 1, 1, 1, 2) and d.token_versions == (1, 1)
    ages = [2 - v for e in r.episodes for v in e.token_versions]
    assert r.metrics["partial/stale_token_frac"] == pytest.approx(sum(x > 0 for x in ages) / len(ages))
    assert r.metrics["partial/token_staleness"] == pytest.approx(sum(ages) / len(ages))
    assert r.metrics["partial/groups_carried"] == 2


def test_the_correction_weighs_a_continued_token_by_the_policy_that_sampled_it(char):  # noqa: F811
    from rllab_corrections.tis import CorrectionConfig, token_truncate

    clock = Clock(char, LENGTHS)
    s = _stage(char, clock, partial="continue")
    s.sample(1)
    clock.version = 1
    r = s.sample(2)
    batch = s.to_batch(r)
    row = [k for k, e in enumerate([e for e in r.episodes if e.keep]) if e.completion.prompt_index == 0][0]
    mask = batch.response_mask
    old = torch.full_like(batch.rollout_log_prob, -1.5)  # the trainer's log-prob of every token
    w, _ = token_truncate(old_log_prob=old, rollout_log_prob=batch.rollout_log_prob, mask=mask, config=CorrectionConfig(c_max=10.0))
    # by hand: a step-1 token (rollout log-prob -1) weighs exp(-1.5 + 1) = 0.6065; a step-2 token exp(-1.5 + 2) = 1.6487
    assert w[row, :6].tolist() == pytest.approx([0.60653] * 4 + [1.64872] * 2, abs=1e-4)
    # the batch carries each token's step beside it (-1 on padding)
    assert batch.token_versions[row].tolist() == [1, 1, 1, 1, 2, 2] + [-1] * (batch.response_length - 6)
    assert batch.select(torch.tensor([row])).token_versions.shape == (1, batch.response_length)


def test_mask_stale_tokens_keeps_older_tokens_out_of_the_loss(char):  # noqa: F811
    clock = Clock(char, LENGTHS)
    s = _stage(char, clock, partial="continue", mask_stale_tokens=True)
    s.sample(1)
    r = s.sample(2)
    batch = s.to_batch(r)
    kept = [e for e in r.episodes if e.keep]
    row = [k for k, e in enumerate(kept) if e.completion.prompt_index == 0][0]
    assert batch.response_mask[row, :6].tolist() == [False] * 4 + [True] * 2
    assert batch.attention_mask[row].sum() == len(kept[row].completion.prompt_ids) + 6  # still context
    assert batch.token_rewards[row, 5] == batch.rewards[row]


def test_off_by_default_the_step_is_value_for_value_the_same(char):  # noqa: F811
    base = build_stage(task=Task(), task_name="t", backend=Echo(char), tokenizer=char, seed=0,
                       config=RolloutConfig(prompts_per_step=2, group_size=2))
    assert base.partial is None
    r = base.sample(1)
    assert all(e.token_versions is None for e in r.episodes) and not any(k.startswith("partial/") for k in r.metrics)
    assert base.to_batch(r).token_versions is None


def test_a_backend_without_generate_until_is_refused_by_name(char):  # noqa: F811
    with pytest.raises(RllabError, match="over_sample = 0.5 needs a backend that stops a batch early.*Echo"):
        _stage(char, Echo(char), over_sample=0.5)


def test_an_algorithm_that_does_not_train_on_sample_is_refused_by_name():
    from types import SimpleNamespace

    from rllab import Lab
    from rllab.checks.run import check_partial
    from rllab.config import load_config
    from rllab.errors import ConfigError

    lab = Lab()
    algorithm = lambda name: lambda sec: SimpleNamespace(name=name, config=None)  # noqa: E731
    cfg = SimpleNamespace(rollout=RolloutConfig(over_sample=0.25), component=algorithm("online_dpo"))
    with pytest.raises(ConfigError, match="over_sample = 0.25: algorithm 'online_dpo'.*async_rollouts=True"):
        check_partial(cfg, lab)  # online_dpo's registration declares no async_rollouts
    check_partial(SimpleNamespace(rollout=RolloutConfig(over_sample=0.25), component=algorithm("rl")), lab)  # rl's does
    check_partial(SimpleNamespace(rollout=RolloutConfig(), component=algorithm("online_dpo")), lab)  # off: nothing to refuse
    with pytest.raises(ConfigError, match="over_sample = 0.25: algorithm 'online_dpo'"):  # at load
        load_config(None, ["algorithm=online_dpo", "rollout.over_sample=0.25"], lab=lab)


def test_the_carried_groups_survive_a_checkpoint(char, tmp_path):  # noqa: F811
    """A stage restored from the saved state (written and read as a checkpoint is) resumes the same
    rows from the same tokens as the stage that never stopped."""
    runs = []
    for restore in (False, True):
        clock = Clock(char, LENGTHS)
        s = _stage(char, clock, partial="continue")
        s.sample(1)
        if restore:
            torch.save({"partial_rollouts": s.partial.state_dict()}, tmp_path / "state.pt")
            s = _stage(char, clock, partial="continue")
            assert s.partial.carried == []
            s.partial.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False)["partial_rollouts"])
        clock.version = 1
        r = s.sample(2)
        runs.append((clock.calls[1], [(e.completion.token_ids, e.token_versions) for e in r.episodes]))
    assert runs[0] == runs[1]
    assert [_trailing(p, Clock(char, LENGTHS).fill) for p in runs[1][0]["prompts"][:3]] == [4, 4, 4]  # resumed, not fresh


def test_the_trainer_checkpoints_its_carried_groups_and_a_schedule_keeps_them(tmp_path, model_cache):
    from rllab.config import load_config
    from rllab.rollout.partial import Carried
    from rllab.training.trainer import Trainer
    from rllab.types import Example

    from .tiny import TINY, overrides

    knobs = [*overrides(TINY), "train.steps=3", "rollout.over_sample=1.0", "rollout.partial=continue", "rollout.max_new_tokens=6",
             "rollout.temperature=1.5"]
    tr = Trainer(load_config(None, knobs), run_dir=tmp_path / "r", progress=False)
    try:
        tr.train_step()
        # a group left unfinished: two tokens sampled at step 1 for each of its 4 rows
        tok = tr.tokenizer("12", add_special_tokens=False).input_ids[:1] * 2
        tr.rollout.partial.carried = [Carried(example=Example(prompt="1+1=", answer="2"), rows=[(tuple(tok), (-1.0, -1.0), (1, 1), None)] * 4)]
        carried = tr.rollout.partial.state_dict()
        tr.swap("policy_loss", "cispo")  # rebuilds the rollout stage: the carried groups stay
        assert tr.rollout.partial.state_dict() == carried
        path = tr.save_checkpoint()
    finally:
        tr.close()
    again = Trainer(load_config(None, knobs), run_dir=tmp_path / "r", progress=False)
    try:
        again.load_checkpoint(path)
        assert again.rollout.partial.state_dict() == carried
        assert again.train_step()["partial/groups_carried"] == 1.0  # resumed first in the next step
    finally:
        again.close()


def test_an_environment_is_refused_when_the_config_loads():
    from rllab.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="over_sample = 0.5: partial rollouts stop and resume single-turn samples; environment 'guess'") as e:
        load_config(None, ["env=guess", "rollout.over_sample=0.5"])
    assert e.value.key == "over_sample"
    load_config(None, ["env=guess"])  # off: accepted


def test_a_schedule_entry_is_checked_at_load_as_the_run_config_is(tmp_path):
    """The checks of rllab.checks run on the config each [[schedule]] entry makes, at load."""
    from rllab.config import load_config
    from rllab.errors import ConfigError

    toml = tmp_path / "c.toml"
    toml.write_text('[algorithm]\nname = "online_dpo"\n\n[[schedule]]\nstep = 2\nset = { "rollout.over_sample" = 0.5 }\n')
    with pytest.raises(ConfigError, match=r"schedule at step 2: rollout.over_sample = 0.5: algorithm 'online_dpo'"):
        load_config(toml)
    toml.write_text('[[schedule]]\nstep = 2\nset = { "rollout.over_sample" = 0.5 }\n')
    assert load_config(toml).schedule[0].set == {"rollout.over_sample": 0.5}  # rl trains on the groups it samples
