"""``rllab import verl``: a verl ppo_trainer config and its overrides, mapped by hand-checked values."""

import pytest

from rllab.errors import ConfigError
from rllab_referee import verl

A = "actor_rollout_ref.actor."


def imported(tree=None, *overrides):
    t = verl.translate(tree or {}, list(overrides))
    t.finish()
    return {k: v for k, (v, _) in t.values.items()}


def test_flatten_and_overrides():
    flat = verl.flatten({"a": {"b": 1, "c": {"d": [1, 2]}, "e": {}}})
    assert flat == {"a.b": 1, "a.c.d": [1, 2], "a.e": {}}
    out = verl.apply_overrides(flat, ["a.b=0.5", "+a.x=true", "a.c={d: 3}", "a.s='token-mean'"])
    assert out == {"a.b": 0.5, "a.x": True, "a.c.d": 3, "a.e": {}, "a.s": "token-mean"}
    with pytest.raises(ConfigError, match="key=value"):
        verl.apply_overrides({}, ["a.b"])


def test_defaults_are_verls_ppo():
    """An empty config is verl's defaults: gae with a critic, dual-clip PPO at c = 3, token-mean, no KL,
    1024 prompts in minibatches of 256, weight decay 0.01."""
    v = imported()
    assert (v["advantage", "name"], v["policy_loss", "name"], v["policy_loss", "clip_c"]) == ("gae", "ppo_dual_clip", 3.0)
    assert (v["aggregation", "name"], v["algorithm", "kl_in"]) == ("token-mean", "none")
    assert (v["rollout", "prompts_per_step"], v["algorithm", "minibatches"], v["rollout", "group_size"]) == (1024, 4, 1)
    assert (v["train", "weight_decay"], v["train", "critic_lr"], v["value_loss", "value_clip"]) == (0.01, 1e-5, 0.5)


def test_minibatches_follow_verls_actor_shuffle():
    """verl splits a batch into contiguous minibatches, the same every epoch (actor.shuffle = false,
    its default), or reshuffles them every epoch (true); one minibatch has no split to set."""
    assert imported()["algorithm", "minibatch_order"] == "in_order"
    assert imported({}, A + "shuffle=true")["algorithm", "minibatch_order"] == "reshuffle"
    assert ("algorithm", "minibatch_order") not in imported({}, "data.train_batch_size=8", A + "ppo_mini_batch_size=8")


def test_grpo_dapo_style_from_overrides():
    v = imported({}, "algorithm.adv_estimator=grpo", "data.train_batch_size=64", A + "ppo_mini_batch_size=16",
                 "actor_rollout_ref.rollout.n=8", A + "clip_ratio_high=0.28", A + "ppo_epochs=2",
                 A + "loss_agg_mode=seq-mean-token-sum-norm", "data.max_response_length=128", A + "entropy_coeff=0.01")
    assert (v["advantage", "name"], v["advantage", "mask_scores"], v["advantage", "norm_by_std"]) == ("grpo", False, True)
    assert (v["rollout", "prompts_per_step"], v["algorithm", "minibatches"], v["algorithm", "epochs"]) == (64, 4, 2)
    assert (v["policy_loss", "clip_low"], v["policy_loss", "clip_high"]) == (0.2, 0.28)
    assert (v["aggregation", "name"], v["aggregation", "horizon"]) == ("seq-mean-token-sum-norm", 128)
    assert v["algorithm", "entropy_coef"] == 0.01
    assert v["rollout", "max_new_tokens"] == 128


def test_kl_in_reward_or_loss():
    v = imported({"algorithm": {"use_kl_in_reward": True, "kl_penalty": "low_var_kl",
                                "kl_ctrl": {"type": "adaptive", "kl_coef": 0.02, "target_kl": 0.05}}})
    assert (v["algorithm", "kl_in"], v["kl", "name"], v["kl_controller", "name"]) == ("reward", "low_var_kl", "adaptive")
    assert (v["kl_controller", "kl_coef"], v["kl_controller", "target_kl"], v["algorithm", "kl_measure"]) == (0.02, 0.05, "penalty_row_mean")
    v = imported({}, A + "use_kl_loss=true", A + "kl_loss_type=k2+", A + "kl_loss_coef=0.1")
    assert (v["algorithm", "kl_in"], v["kl", "name"], v["kl_controller", "kl_coef"]) == ("loss", "k2+", 0.1)
    with pytest.raises(ConfigError, match="one place"):
        imported({}, A + "use_kl_loss=true", "algorithm.use_kl_in_reward=true")


def test_rollout_correction():
    rc = "algorithm.rollout_correction."
    v = imported({}, rc + "rollout_is=token", rc + "rollout_is_threshold=2.5")
    assert (v["correction", "name"], v["correction", "c_max"]) == ("token_truncate", 2.5)
    v = imported({}, rc + "rollout_is=sequence", rc + "rollout_is_threshold='0.5_2.0'")
    assert (v["correction", "name"], v["correction", "c_min"], v["correction", "c_max"]) == ("sequence_mask", 0.5, 2.0)
    v = imported({}, rc + "rollout_rs='token_k1,seq_max_k3'", rc + "rollout_rs_threshold='0.5_2.0,0.1'", rc + "rollout_is=token")
    assert (v["correction", "name"], v["correction", "criterion"]) == ("rejection", "token_k1,seq_max_k3")
    assert (v["correction", "upper"], v["correction", "lower"], v["correction", "is_level"]) == ([2.0, 0.1], 0.5, "token")
    assert imported()["correction", "name"] == "none"
    with pytest.raises(ConfigError, match="bypass_mode"):
        imported({}, rc + "bypass_mode=true")


def test_interpolations_resolve():
    v = imported({"actor_rollout_ref": {"rollout": {"response_length": "${oc.select:data.max_response_length,512}"}},
                  "data": {"max_response_length": 64}})
    assert v["rollout", "max_new_tokens"] == 64


@pytest.mark.parametrize(
    "overrides, why",
    [
        (["algorithm.adv_estimator=ppo_mystery"], "no counterpart"),
        ([A + "policy_loss.loss_mode=bypass"], "not mapped"),
        ([A + "clip_ratio_hihg=0.3"], "did you mean 'actor_rollout_ref.actor.clip_ratio_high'"),
        ([A + "ppo_mini_batch_size=300"], "multiple"),
        ([A + "loss_agg_mode=token_mean"], "modes"),
        (["actor_rollout_ref.rollout.do_sample=false"], "sampled"),
        ([A + "optim.betas=[0.9,0.95]"], "betas"),
        (["algorithm.use_pf_ppo=true"], "policy-filtration"),
        (["trainer.critic_warmup=5"], "critic-only"),
        (["data.train_batch_size=big"], "data.train_batch_size = \"big\": expected a whole number"),
        (["actor_rollout_ref.rollout.n=2.5"], "expected a whole number, got 2.5"),
        (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=abc"], "lower_upper"),
    ],
)
def test_refusals(overrides, why):
    with pytest.raises(ConfigError) as e:
        imported({}, *overrides)
    assert why in str(e.value)


def test_hardware_knobs_are_listed_as_ignored():
    t = verl.translate({}, [A + "fsdp_config.param_offload=true", "trainer.n_gpus_per_node=8",
                            "actor_rollout_ref.rollout.tensor_model_parallel_size=4", A + "use_dynamic_bsz=true",
                            "actor_rollout_ref.model.enable_gradient_checkpointing=true", "trainer.logger=[console]"])
    t.finish()
    assert len(t.ignored) == 6 and "trainer.n_gpus_per_node" in t.summary()


def test_dapo_example_maps_the_recipe():
    from rllab_referee import read_config_file

    t = verl.translate(read_config_file("examples/frameworks/verl_dapo.yaml", what="verl config"))
    t.finish()
    v = {k: x for k, (x, _) in t.values.items()}
    assert (v["policy_loss", "clip_high"], v["policy_loss", "clip_c"], v["rollout", "dynamic_sampling"]) == (0.28, 10.0, True)
    assert (v["rollout", "overlong_buffer"], v["rollout", "overlong_penalty"], v["train", "weight_decay"]) == (4, 1.0, 0.1)
    assert "algorithm.filter_groups.enable" in t.differs
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" in t.ignored


def test_clip_ratio_is_the_fallback_of_low_and_high():
    """verl reads clip_ratio only where clip_ratio_low/high are null (both default to 0.2)."""
    t = verl.translate({}, [A + "clip_ratio=0.3"])
    t.finish()
    assert t.values["policy_loss", "clip_high"][0] == 0.2 and "take precedence" in t.ignored[A + "clip_ratio"]
    v = imported({}, A + "clip_ratio=0.3", A + "clip_ratio_low=null", A + "clip_ratio_high=null")
    assert (v["policy_loss", "clip_low"], v["policy_loss", "clip_high"]) == (0.3, 0.3)


def test_a_trl_config_is_told_apart():
    with pytest.raises(ConfigError, match="rllab import trl"):
        imported({"loss_type": "dapo", "beta": 0.0})


def test_every_key_written_out_at_its_default_is_the_default_config():
    t = verl.translate({}, [f"{k}={v}" if not isinstance(v, str) else f"{k}='{v}'" for k, v in verl.DEFAULTS.items() if v is not None])
    t.finish()
    assert {k: v for k, (v, _) in t.values.items()} == imported()


def test_exponents_read_as_numbers():
    """verl's scripts write lr=1e-6, which OmegaConf reads as a float (PyYAML alone: a string)."""
    v = imported({"actor_rollout_ref": {"actor": {"optim": {"lr": "3e-6"}}}}, "critic.optim.lr=1e-5", "algorithm.adv_estimator=gae")
    assert (v["train", "lr"], v["train", "critic_lr"]) == (3e-6, 1e-5)


def test_a_warm_up_is_verls_shape():
    """verl's schedules rise as step/w over the warm-up and decay over the rest (transformers'
    shape): train.lr_warmup = "then_decay", not a difference."""
    t = verl.translate({}, [A + "optim.lr_warmup_steps=5", A + "optim.warmup_style=cosine"])
    t.finish()
    got = {k: v for k, (v, _) in t.values.items()}
    assert (got["train", "warmup_steps"], got["train", "lr_warmup"], got["train", "lr_schedule"]) == (5, "then_decay", "cosine")
    assert not t.differs
    assert ("train", "lr_warmup") not in imported()  # no warm-up: nothing to shape
