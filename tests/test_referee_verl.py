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


# --------------------------------------------------------------------------- verl 0.9.1's full config, the DAPO recipe

GENERATED_YAML = "verl/trainer/config/_generated_ppo_trainer.yaml"


def _installed_generated():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (pip install --no-deps verl==0.9.1)")
    path = Path(list(spec.submodule_search_locations)[0]).parent / GENERATED_YAML
    if not path.is_file():
        pytest.skip(f"this verl has no {GENERATED_YAML}")
    return path


def test_the_key_table_is_verl_0_9_1s():
    import yaml

    from rllab_referee.verl_fields import GENERATED

    path = _installed_generated()
    from importlib.metadata import version

    if version("verl") != "0.9.1":
        pytest.skip(f"the table is verl 0.9.1's; {version('verl')} installed")
    assert verl.flatten(yaml.safe_load(path.read_text())) == GENERATED


def test_verls_own_full_default_config_imports():
    """Every key of verl 0.9.1's generated default config is read, ignored or accepted at its default."""
    from rllab_referee.verl_fields import GENERATED

    tree: dict = {}
    for key, value in GENERATED.items():  # the table back to its nested form
        node = tree
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    t = verl.translate(tree)
    t.finish()
    v = {k: val for k, (val, _) in t.values.items()}
    assert v == imported() | {("model", "path"): "~/models/deepseek-llm-7b-chat"}
    for key in ("actor_rollout_ref.actor.optim.optimizer", "actor_rollout_ref.actor.optim.optimizer_impl",
                "actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.optim.warmup_style"):
        assert key in t.mapped_from, key
    assert t.ignored["trainer.use_v1"].startswith("at verl 0.9.1's default")
    # another value of a key the importer does not map is refused, naming its default
    with pytest.raises(ConfigError, match=r"trainer.use_v1 = false: a verl 0.9.1 key the importer does not map; only its default \(True\)"):
        imported({}, "trainer.use_v1=false")


def test_the_optimizer_keys_of_verl_0_9_1():
    assert imported({}, A + "optim.clip_grad=0.5")["train", "max_grad_norm"] == 0.5
    assert imported({}, A + "grad_clip=0.5")["train", "max_grad_norm"] == 0.5
    with pytest.raises(ConfigError, match="grad_clip.*set them alike"):
        imported({}, A + "grad_clip=0.5", A + "optim.clip_grad=2.0")
    with pytest.raises(ConfigError, match="optim.optimizer = \"SGD\": rllab trains with AdamW"):
        imported({}, A + "optim.optimizer=SGD")
    with pytest.raises(ConfigError, match="optim.optimizer_impl"):
        imported({}, A + "optim.optimizer_impl=bitsandbytes.optim")
    # the deprecated warmup_style, when set, replaces lr_scheduler_type (verl's OptimizerConfig)
    assert imported({}, A + "optim.warmup_style=cosine")["train", "lr_schedule"] == "cosine"
    assert imported({}, A + "optim.warmup_style=null", A + "optim.lr_scheduler_type=cosine")["train", "lr_schedule"] == "cosine"


@pytest.mark.parametrize("prefix", ["+reward_model.reward_kwargs.", "+reward.reward_kwargs."])
def test_the_dapo_overlong_penalty_in_both_spellings(prefix):
    args = ["data.max_response_length=20", f"{prefix}overlong_buffer_cfg.enable=true", f"{prefix}overlong_buffer_cfg.len=4",
            f"{prefix}overlong_buffer_cfg.penalty_factor=0.5", f"{prefix}overlong_buffer_cfg.log=false", f"{prefix}max_resp_len=20"]
    t = verl.translate({}, args)
    t.finish()
    v = {k: val for k, (val, _) in t.values.items()}
    assert (v["rollout", "overlong_buffer"], v["rollout", "overlong_penalty"]) == (4, 0.5)
    spelled = prefix.lstrip("+")
    assert f"# {spelled}overlong_buffer_cfg.enable = true, {spelled}overlong_buffer_cfg.len = 4" in t.toml()  # as written
    assert t.ignored[f"{spelled}overlong_buffer_cfg.log"] == "logging"
    with pytest.raises(ConfigError, match="max_resp_len = 16: the penalty starts at max_resp_len − len"):
        imported({}, *args[:-1], f"{prefix}max_resp_len=16")
    with pytest.raises(ConfigError, match="needs reward_kwargs.max_resp_len"):
        imported({}, *args[:-1])


def test_reward_model_reward_kwargs_replace_reward_reward_kwargs():
    # verl 0.9.1 copies reward_model.reward_kwargs over reward.reward_kwargs
    t = verl.translate({}, ["data.max_response_length=20", "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=false"])
    t.finish()
    assert ("rollout", "overlong_buffer") not in t.values
    assert t.ignored["reward.reward_kwargs.overlong_buffer_cfg.enable"].startswith("not read: verl 0.9.1 copies")


def test_filter_groups_metric():
    on = ["algorithm.filter_groups.enable=true"]
    t = verl.translate({}, on)  # verl 0.9.1's default metric: 'reward', the pre-KL reward with the overlong penalty
    t.finish()
    assert t.values["rollout", "dynamic_sampling"][0] is True and "algorithm.filter_groups.metric" not in t.differs
    t = verl.translate({}, [*on, "algorithm.filter_groups.metric=acc"])
    assert "accuracy the reward function reports" in t.differs["algorithm.filter_groups.metric"]
    t = verl.translate({}, [*on, "algorithm.filter_groups.metric=acc", "data.max_response_length=20",
                            "+reward.reward_kwargs.overlong_buffer_cfg.enable=true", "+reward.reward_kwargs.overlong_buffer_cfg.len=4",
                            "+reward.reward_kwargs.max_resp_len=20"])
    assert "before the overlong penalty" in t.differs["algorithm.filter_groups.metric"]
    with pytest.raises(ConfigError, match="filter_groups.metric = \"pass_rate\": a field the reward function reports"):
        imported({}, *on, "algorithm.filter_groups.metric=pass_rate")


def test_loss_scale_factor_is_the_horizon():
    agg = A + "loss_agg_mode=seq-mean-token-sum-norm"
    assert imported({}, agg, A + "loss_scale_factor=4096")["aggregation", "horizon"] == 4096
    assert imported({}, agg, "data.max_response_length=64")["aggregation", "horizon"] == 64
    t = verl.translate({}, [A + "loss_scale_factor=4096"])
    assert t.ignored[A + "loss_scale_factor"] == "read only with actor_rollout_ref.actor.loss_agg_mode = 'seq-mean-token-sum-norm'"


def test_keys_verl_0_9_1_no_longer_reads():
    rc = "algorithm.rollout_correction."
    t = verl.translate({}, [f"{rc}rollout_rs=token_k1", f"{rc}rollout_rs_threshold=0.5_2.0", f"+{rc}rollout_rs_threshold_lower=0.1"])
    t.finish()
    assert "lower_upper" in t.ignored[f"{rc}rollout_rs_threshold_lower"] and t.values["correction", "lower"][0] == 0.5


def test_a_recipe_with_a_hydra_defaults_header(tmp_path):
    """A recipe composes verl's ppo_trainer: its header is read, the keys it leaves out take verl's defaults,
    and its interpolations resolve against them."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  train_batch_size: 8\n  gen_batch_size: ${data.train_batch_size}\n  max_response_length: 16\n"
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 4\n  rollout:\n    n: ${oc.select:actor_rollout_ref.rollout.n,4}\n"
        "reward:\n  reward_manager:\n    name: dapo\n  reward_kwargs:\n    overlong_buffer_cfg:\n      enable: true\n      len: 4\n"
        "      penalty_factor: 1.0\n      log: false\n    max_resp_len: ${data.max_response_length}\n"
        "algorithm:\n  adv_estimator: grpo\n  filter_groups:\n    enable: true\n    metric: acc\n    max_num_gen_batches: 10\n"
    )
    from rllab_referee.source import read_config_file

    t = verl.translate(read_config_file(str(recipe), what="verl config"))
    t.finish()
    v = {k: val for k, (val, _) in t.values.items()}
    assert (v["rollout", "prompts_per_step"], v["rollout", "group_size"], v["rollout", "overlong_buffer"]) == (8, 1, 4)
    assert v["advantage", "name"] == "grpo" and "algorithm.filter_groups.metric" in t.differs
    assert "ppo_trainer defaults" in t.ignored["defaults"] and "search path" in t.ignored["hydra.searchpath"]
    recipe.write_text(recipe.read_text().replace("  - ppo_trainer\n", "  - ppo_megatron_trainer\n"))
    with pytest.raises(ConfigError, match="defaults = .*ppo_megatron_trainer.*ppo_trainer defaults only"):
        verl.translate(read_config_file(str(recipe), what="verl config")).finish()


def test_the_recipes_earlier_overlong_spelling_and_a_null_metric():
    # the DAPO recipe's own defaults: overlong_buffer under reward_model, filter_groups.metric null (both off)
    t = verl.translate({"reward_model": {"reward_manager": "dapo", "overlong_buffer": {"enable": False, "len": 0, "penalty_factor": 0.0,
                                                                                       "log": False}},
                        "algorithm": {"filter_groups": {"enable": False, "metric": None, "max_num_gen_batches": 0}}})
    t.finish()
    assert ("rollout", "overlong_buffer") not in t.values and ("rollout", "dynamic_sampling") not in t.values
    t = verl.translate({}, ["data.max_response_length=16", "+reward_model.overlong_buffer.enable=true", "+reward_model.overlong_buffer.len=4",
                            "+reward_model.overlong_buffer.log=true"])
    t.finish()
    assert t.values["rollout", "overlong_buffer"][0] == 4 and t.ignored["reward_model.overlong_buffer.log"] == "logging"
    assert "# reward_model.overlong_buffer.enable = true, reward_model.overlong_buffer.len = 4" in t.toml()
    with pytest.raises(ConfigError, match="metric = null: verl 0.9.1 refuses group filtering without a metric"):
        imported({}, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=null")
