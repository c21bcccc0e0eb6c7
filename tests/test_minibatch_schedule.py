"""How one training step's optimizer steps are laid out: the learning-rate schedule's unit
(``train.lr_schedule_unit``), the minibatch split (``algorithm.minibatch_order``) and the token
count a token-mean loss divides by (``algorithm.token_count``)."""

from __future__ import annotations

import attrs
import pytest
import torch

from rllab.config import ConfigError, TrainConfig, load_config
from rllab.training.optimizer import advance_per_step, lr_scheduler
from rllab.training.trainer import Trainer

from .tiny import TINY, overrides

SMALL = [*overrides(TINY), "train.steps=2", "train.warmup_steps=0"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def _optimizer(lr=1.0):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _lrs(opt, scheduler, t, optimizer_steps, training_steps=1):
    """The lr each optimizer step ran at, over ``training_steps`` of ``optimizer_steps`` each."""
    seen = []
    for _ in range(training_steps):
        for _ in range(optimizer_steps):
            seen.append(opt.param_groups[0]["lr"])
            opt.step()
        advance_per_step(scheduler, t)
    return seen


def test_a_schedule_per_optimizer_step_by_hand():
    # linear over 8 optimizer steps, 2 of them warm-up: factor (k+1)/2 · (1 − k/8)
    t = TrainConfig(lr=1.0, lr_schedule="linear", warmup_steps=2, lr_schedule_unit="optimizer_step", lr_schedule_steps=8)
    opt = _optimizer()
    seen = _lrs(opt, lr_scheduler(opt, t), t, optimizer_steps=4, training_steps=2)
    assert seen == pytest.approx([0.5, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])


def test_a_schedule_per_training_step_shares_one_rate_among_its_optimizer_steps():
    t = TrainConfig(lr=1.0, lr_schedule="linear", warmup_steps=0, steps=4)
    opt = _optimizer()
    seen = _lrs(opt, lr_scheduler(opt, t), t, optimizer_steps=2, training_steps=3)
    assert seen == pytest.approx([1.0, 1.0, 0.75, 0.75, 0.5, 0.5])


def test_cosine_per_optimizer_step_and_a_skipped_update_does_not_count():
    t = TrainConfig(lr=2.0, lr_schedule="cosine", warmup_steps=0, lr_schedule_unit="optimizer_step", lr_schedule_steps=4)
    opt = _optimizer(2.0)
    scheduler = lr_scheduler(opt, t)
    opt.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(2.0 * 0.5 * (1 + 0.7071067811865476))  # cos(π/4)
    advance_per_step(scheduler, t)  # the training step's end: this schedule counts optimizer steps only
    assert scheduler.last_epoch == 1


def test_the_unit_needs_the_decays_length_and_names_it():
    with pytest.raises(ConfigError, match=r"lr_schedule_steps = 0 with lr_schedule_unit = 'optimizer_step'.*train.steps × epochs × minibatches"):
        load_config(None, ["train.lr_schedule_unit=optimizer_step", "train.lr_schedule=linear"])
    cfg = load_config(None, ["train.lr_schedule_unit=optimizer_step", "train.lr_schedule=constant"])
    assert cfg.train.lr_schedule_steps == 0
    with pytest.raises(ConfigError, match="lr_schedule_unit"):
        load_config(None, ["train.lr_schedule_unit=optimiser_step"])
    with pytest.raises(ConfigError, match="schedule"):
        load_config(None, [*SMALL, "train.lr_schedule_unit=optimizer_step", "train.lr_schedule=linear", "train.lr_schedule_steps=4",
                           "schedule=[{step = 1, set = {'train.lr_schedule_steps' = 8}}]"])


def test_the_trainer_moves_the_rate_every_optimizer_step_and_resumes_it(tmp_path):
    knobs = [*SMALL, "algorithm.minibatches=2", "train.lr=0.01", "train.lr_schedule=linear", "train.lr_schedule_unit=optimizer_step",
             "train.lr_schedule_steps=4"]
    tr = Trainer(load_config(None, knobs), run_dir=tmp_path / "a", progress=False)
    seen = []
    tr.optimizer.register_step_pre_hook(lambda opt, *_: seen.append(opt.param_groups[0]["lr"]))
    m1 = tr.train_step()
    tr.save_checkpoint()
    m2 = tr.train_step()
    tr.close()
    assert seen == pytest.approx([0.01, 0.0075, 0.005, 0.0025])  # 1 − k/4, k = 0 … 3
    assert m1["optim/lr"] == pytest.approx(0.005) and m2["optim/lr"] == pytest.approx(0.0)  # the next step's rate
    again = Trainer(load_config(None, knobs), run_dir=tmp_path / "a", progress=False)
    again.load_checkpoint(sorted((tmp_path / "a").glob("checkpoints/*"))[-1])
    resumed = []
    again.optimizer.register_step_pre_hook(lambda opt, *_: resumed.append(opt.param_groups[0]["lr"]))
    again.train_step()
    again.close()
    assert resumed == pytest.approx([0.005, 0.0025])


def _record_rows(monkeypatch):
    """Every micro-batch's rows, and the token count its aggregation divides by."""
    from rllab_algorithms import rl

    seen = []
    micro_loss = rl.RL.micro_loss

    def recording(self, ctx, p, rows, agg, **extra):
        seen.append((rows.tolist(), agg.keywords["global_tokens"], int(p.mask[rows].sum()), int(p.mask.sum())))
        return micro_loss(self, ctx, p, rows, agg, **extra)

    monkeypatch.setattr(rl.RL, "micro_loss", recording)
    return seen


def _one_step(tmp_path, *knobs):
    tr = Trainer(load_config(None, [*SMALL, "algorithm.epochs=2", "algorithm.minibatches=2", *knobs]), run_dir=tmp_path, progress=False)
    try:
        tr.train_step()
    finally:
        tr.close()


@pytest.mark.parametrize("order", ["reshuffle", "once", "in_order"])
def test_minibatch_orders(tmp_path, monkeypatch, order):
    seen = _record_rows(monkeypatch)
    _one_step(tmp_path, f"algorithm.minibatch_order={order}")
    rows = [r for r, *_ in seen]
    assert len(rows) == 4  # 2 epochs × 2 minibatches, one micro-batch each
    first, second = rows[:2], rows[2:]
    for epoch in (first, second):  # every row once per epoch
        assert sorted(epoch[0] + epoch[1]) == list(range(16))
    if order == "in_order":
        assert first == second == [list(range(8)), list(range(8, 16))]
    elif order == "once":
        assert first == second and first != [list(range(8)), list(range(8, 16))]
    else:  # the seed draws a different split for the second epoch
        assert first != second


def test_token_count_batch_mean_is_the_steps_tokens_over_its_minibatches(tmp_path, monkeypatch):
    seen = _record_rows(monkeypatch)
    _one_step(tmp_path, "algorithm.token_count=batch_mean")
    total = seen[0][3]
    assert [count for _, count, _, _ in seen] == pytest.approx([total / 2] * 4)
    seen.clear()
    _one_step(tmp_path / "own", "algorithm.token_count=minibatch")
    assert [count for _, count, _, _ in seen] == [own for _, _, own, _ in seen]  # each minibatch's own tokens
    assert sum(own for _, _, own, _ in seen[:2]) == seen[0][3]


def test_batch_mean_divides_a_token_sum_as_trl_does_by_hand():
    """Two minibatches of 3 and 1 valid tokens, per-token losses 1: TRL's dapo divides each
    optimizer step's sum by 4 tokens / 2 steps = 2, so the steps' losses are 1.5 and 0.5 (their
    own token means would be 1 and 1)."""
    import rllab

    agg = rllab.Lab().get("loss_aggregation", "token-mean")
    mask_a = torch.tensor([[True, True, True]])
    mask_b = torch.tensor([[True, False, False]])
    ones = torch.ones(1, 3)
    assert float(agg(loss_mat=ones, mask=mask_a, global_tokens=4 / 2)) == pytest.approx(1.5)
    assert float(agg(loss_mat=ones, mask=mask_b, global_tokens=4 / 2)) == pytest.approx(0.5)
    assert float(agg(loss_mat=ones, mask=mask_b, global_tokens=1)) == pytest.approx(1.0)


def test_bad_values_are_refused_by_name():
    for knob, bad in (("minibatch_order", "shuffle"), ("token_count", "batch")):
        with pytest.raises(ConfigError, match=knob):
            load_config(None, [f"algorithm.{knob}={bad}"])
    assert attrs.fields_dict(TrainConfig)["lr_schedule_unit"].default == "step"


@pytest.mark.parametrize("schedule, want", [
    # transformers' get_linear_schedule_with_warmup(W = 2, T = 6): k/2, then (6 − k)/4
    ("linear", [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]),
    # get_cosine_schedule_with_warmup: k/2, then ½(1 + cos(π (k − 2)/4))
    ("cosine", [0.0, 0.5, 1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0]),
    # get_constant_schedule_with_warmup
    ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]),
])
def test_then_decay_is_transformers_warm_up_by_hand(schedule, want):
    t = TrainConfig(lr_schedule=schedule, warmup_steps=2, steps=6, lr_warmup="then_decay")
    from rllab.training.optimizer import lr_factor

    assert [lr_factor(t, k) for k in range(7)] == pytest.approx(want)


def test_scaled_warm_up_multiplies_the_decay_by_hand():
    from rllab.training.optimizer import lr_factor

    t = TrainConfig(lr_schedule="linear", warmup_steps=2, steps=4)
    assert [lr_factor(t, k) for k in range(4)] == pytest.approx([0.5 * 1.0, 1.0 * 0.75, 0.5, 0.25])


@pytest.mark.parametrize("schedule, hf", [("linear", "linear"), ("cosine", "cosine"), ("constant", "constant_with_warmup")])
def test_then_decay_matches_transformers_schedulers(schedule, hf):
    from transformers import get_scheduler

    from rllab.training.optimizer import lr_factor

    opt = _optimizer()
    ref = get_scheduler(hf, opt, num_warmup_steps=3, num_training_steps=10)
    t = TrainConfig(lr=1.0, lr_schedule=schedule, warmup_steps=3, lr_schedule_unit="optimizer_step",
                    lr_schedule_steps=0 if schedule == "constant" else 10, lr_warmup="then_decay")  # a constant has no decay length
    ours = lr_scheduler(_optimizer(), t)
    for k in range(11):  # to the horizon (past it transformers' cosine rises again; rllab's stays at 0)
        assert ours.get_last_lr()[0] == pytest.approx(ref.get_last_lr()[0], abs=1e-12), k
        assert lr_factor(t, k) == pytest.approx(ref.get_last_lr()[0], abs=1e-12)
        opt.step()
        ref.step()
        ours.optimizer.step()


def test_a_replayed_step_goes_on_with_the_schedule_per_optimizer_step():
    from rllab_suite.replay import _schedule_from

    t = TrainConfig(lr=1.0, lr_schedule="linear", warmup_steps=0, lr_schedule_unit="optimizer_step", lr_schedule_steps=10)
    opt = _optimizer(0.123)  # as built from a record: at the recorded step's rate, which this replaces
    _schedule_from(opt, t, 4)
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
    assert seen == pytest.approx([0.6, 0.5, 0.4])


def test_token_count_micro_batch_is_each_micro_batchs_own_tokens_times_their_number(tmp_path, monkeypatch):
    seen = _record_rows(monkeypatch)
    _one_step(tmp_path, "algorithm.token_count=micro_batch", "algorithm.micro_batch_size=3")
    # 16 rows, 2 minibatches of 8, micro-batches of 3, 3, 2: each divides by its own tokens × 3
    assert [len(r) for r, *_ in seen[:3]] == [3, 3, 2]
    assert [count for _, count, _, _ in seen] == [max(1, own) * 3 for _, _, own, _ in seen]


def test_micro_batch_token_means_averaged_by_hand():
    """Two micro-batches of 3 and 1 valid tokens with per-token losses 1 and 3: their own means are
    1 and 3, averaged 2 (TRL's bnpo under gradient accumulation 2); one mean over the 4 tokens
    would be 1.5."""
    import rllab

    agg = rllab.Lab().get("loss_aggregation", "token-mean")
    a = agg(loss_mat=torch.ones(1, 3), mask=torch.ones(1, 3, dtype=torch.bool), global_tokens=3 * 2)
    b = agg(loss_mat=torch.full((1, 3), 3.0), mask=torch.tensor([[True, False, False]]), global_tokens=1 * 2)
    assert float(a + b) == pytest.approx(2.0)


def test_entropy_mean_micro_batch_is_a_token_mean_whatever_the_aggregation(tmp_path, monkeypatch):
    from rllab_algorithms import rl

    seen = []
    micro_loss = rl.RL.micro_loss

    def recording(self, ctx, p, rows, agg, entropy_agg=None):
        seen.append((int(p.mask[rows].sum()), entropy_agg))
        return micro_loss(self, ctx, p, rows, agg, entropy_agg=entropy_agg)

    monkeypatch.setattr(rl.RL, "micro_loss", recording)
    _one_step(tmp_path, "algorithm.entropy_coef=0.01", "algorithm.entropy_mean=micro_batch", "algorithm.micro_batch_size=4",
              "aggregation=seq-mean-token-mean")
    assert [e.keywords["tokens"] for _, e in seen] == [max(1, own) * 2 for own, _ in seen]  # 2 micro-batches a minibatch
    ent, mask = torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[True, True, False]])
    assert float(seen[0][1](ent, mask)) == pytest.approx(3.0 / seen[0][1].keywords["tokens"])
    seen.clear()
    _one_step(tmp_path / "b", "algorithm.entropy_coef=0.01")
    assert all(e is None for _, e in seen)  # the default: the run's aggregation (not passed)
    with pytest.raises(ConfigError, match="entropy_mean = 'micro_batch' applies only with an entropy bonus"):
        load_config(None, ["algorithm.entropy_mean=micro_batch"])


def test_a_token_count_an_aggregation_would_ignore_is_refused_when_the_run_is_built(tmp_path):
    for agg in ("seq-mean-token-mean", "token-sum"):
        with pytest.raises(ConfigError, match=rf"token_count = 'batch_mean'.*aggregation '{agg}' does not divide by tokens") as e:
            Trainer(load_config(None, [*SMALL, "algorithm.token_count=batch_mean", f"aggregation={agg}"]), run_dir=tmp_path / agg,
                    progress=False)
        assert e.value.key == "token_count"
    import rllab

    lab = rllab.Lab()
    assert lab.get("loss_aggregation", "token-mean").trait("divides_by_tokens") is True


def test_schedule_settings_that_would_change_nothing_are_refused():
    for knobs, words in (
        (["train.lr_warmup=then_decay", "train.warmup_steps=0"], "lr_warmup = 'then_decay' shapes the warm-up, but warmup_steps is 0"),
        (["train.lr_schedule=constant", "train.lr_schedule_steps=100"], "lr_schedule_steps = 100: a constant schedule has no decay"),
        (["train.lr_schedule=constant", "train.warmup_steps=0", "train.lr_schedule_unit=optimizer_step"],
         "a constant schedule without warm-up never moves the rate"),
    ):
        with pytest.raises(ConfigError, match=words):
            load_config(None, knobs)
    load_config(None, ["train.lr_warmup=then_decay"])  # the default warm-up of 10 steps: it shapes them
