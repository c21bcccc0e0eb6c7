"""LoRA through peft: what trains, the reference, the rollout side's merged weights, checkpoints."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from rllab.models import lora
from rllab.config import ConfigError, load_config
from rllab.errors import RllabError
from rllab.models.forward import response_logprobs
from rllab.training.runs import resume_run
from rllab.training.trainer import Trainer, run_experiment

from .tiny import TINY, overrides

pytest.importorskip("peft")

# entropy_coef > 0: a gradient at every step whatever the rewards (the small warm start scores ~0)
SMALL = [*overrides(TINY), "train.steps=2", "model.lora.r=4", "algorithm.entropy_coef=0.05", "train.lr=1e-2", "train.warmup_steps=0"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def small_cfg(*extra):
    return load_config(None, [*SMALL, *extra])


def random_qwen(tie: bool = True):
    """A small randomly initialised Qwen2 causal LM (no warm start)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg).float()


def batch(vocab: int = 40, B: int = 4, L: int = 10, T: int = 4):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (B, L), generator=g)
    attn = torch.ones(B, L, dtype=torch.bool)
    attn[0, :2] = False
    return ids, attn, T


def base_and_adapter_params(model):
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    return base, adapters


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.lora.r=0", ["r = 0", "≥ 1"]),
        ("model.lora.dropout=1.0", ["dropout = 1.0", "< 1.0"]),
        ("model.lora.target_modules=[]", ["target_modules", "non-empty"]),
        ("model.lora.rank=4", ["no knob 'rank'"]),
    ],
)
def test_bad_lora_knobs_are_refused_at_load(override, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    for w in words:
        assert w in str(e.value)
    assert "[model] lora" in str(e.value)


def test_lora_with_a_reference_device_is_refused():
    with pytest.raises(ConfigError, match="reference_device.*lora"):
        load_config(None, ["model.lora.r=4", "model.reference_device=cpu"])


def test_an_empty_lora_table_is_full_fine_tuning():
    assert lora.lora_config(load_config(None, []).model) is None
    cfg = lora.lora_config(load_config(None, ["model.lora.r=4"]).model)
    assert cfg == lora.LoraConfig(r=4)


def test_missing_peft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(RllabError, match=r"rllab\[lora\]"):
        lora.require_peft()


def test_unknown_target_module_is_refused_listing_the_linear_layers():
    with pytest.raises(RllabError) as e:
        lora.LoraPolicy.attach(random_qwen(), lora.LoraConfig(target_modules=("q_proj", "qkv")))
    msg = str(e.value)
    assert "'qkv' matches no linear layer" in msg
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert name in msg


def test_unknown_target_module_is_refused_when_the_config_loads(tmp_path):
    with pytest.raises(ConfigError, match="'qkv' matches no linear layer.*q_proj"):
        load_config(None, ['model.lora.target_modules=["qkv"]'])
    # a model directory's architecture is read from its config.json (no weights loaded)
    random_qwen(tie=False).save_pretrained(tmp_path / "m")
    with pytest.raises(ConfigError, match="'lm_head' is the output head"):
        load_config(None, [f"model.path={tmp_path / 'm'}", 'model.lora.target_modules=["lm_head"]'])
    assert load_config(None, [f"model.path={tmp_path / 'm'}", 'model.lora.target_modules=["layers.1.mlp.up_proj"]']).model.lora


def test_a_bad_target_module_is_refused_by_rllab_run_before_any_weights_load(tmp_path, monkeypatch, capsys):
    """``rllab run``: the tiny model's layers come from ``[model] tiny``, a model directory's from its
    config.json alone (the directory has no weights); nothing is built, loaded or written."""
    import transformers

    import rllab.models.tiny
    import rllab.training.trainer
    from rllab.cli import main

    def built(*a, **k):
        raise AssertionError("a model was built or loaded")

    monkeypatch.setattr(rllab.models.tiny, "get_or_build", built)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", built)
    monkeypatch.setattr(rllab.training.trainer.Trainer, "__init__", built)
    run = tmp_path / "run"
    assert main(["run", "--steps", "1", "model.tiny.num_layers=3", 'model.lora.target_modules=["qkv"]', "--run-dir", str(run)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "'qkv' matches no linear layer" in err and "q_proj" in err and not run.exists()
    random_qwen(tie=False).config.save_pretrained(tmp_path / "m")  # config.json only
    assert main(["run", f"model.path={tmp_path / 'm'}", 'model.lora.target_modules=["lm_head"]', "--run-dir", str(run)]) == 1
    assert "'lm_head' is the output head" in " ".join(capsys.readouterr().err.split()) and not run.exists()


def test_a_target_modules_string_is_refused_not_read_as_its_characters():
    with pytest.raises(ConfigError, match=r"target_modules = 'q_proj' is a string; give a list.*\['q_proj'\]"):
        load_config(None, ["model.lora.target_modules=q_proj"])


def test_lora_without_peft_is_refused_when_the_config_loads(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ConfigError, match=r"\[model\] lora needs peft.*rllab\[lora\]"):
        load_config(None, ["model.lora.r=4"])
    assert load_config(None, []).model.lora == {}  # no adapters asked for: peft is not needed


def test_the_output_head_is_refused():
    with pytest.raises(RllabError, match="'lm_head' is the output head"):
        lora.LoraPolicy.attach(random_qwen(tie=False), lora.LoraConfig(target_modules=("lm_head",)))


def test_targets_resolve_by_suffix_and_all_linear_skips_the_head():
    model = random_qwen(tie=False)
    assert lora.resolve_targets(model, lora.LoraConfig(target_modules=("q_proj",))) == [
        "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"]
    every = lora.resolve_targets(model, lora.LoraConfig())
    assert len(every) == 14 and "lm_head" not in every


# --------------------------------------------------------------------------- the model's views


def test_reference_and_merged_views_share_or_merge_the_right_tensors(tmp_path):
    model = random_qwen()
    lp = lora.LoraPolicy.attach(model, lora.LoraConfig(r=2, target_modules=("q_proj", "down_proj")))
    with torch.no_grad():  # adapters away from their zero start
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ids, attn, T = batch()
    model.eval()
    with torch.no_grad():
        policy_lp = response_logprobs(model, ids, attn, T)
        with lp.peft_model.disable_adapter():
            disabled_lp = response_logprobs(model, ids, attn, T)
        ref = lp.reference()
        ref_lp = response_logprobs(ref, ids, attn, T)
        merged = lp.merged()
        merged_lp = response_logprobs(merged, ids, attn, T)
    # the reference is the base model with the adapters disabled, over the same tensors
    torch.testing.assert_close(ref_lp, disabled_lp, rtol=0, atol=1e-6)
    assert not torch.allclose(ref_lp, policy_lp, atol=1e-3)
    base_ptrs = {p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n}
    assert {p.data_ptr() for p in ref.parameters()} <= base_ptrs
    assert not any("lora" in n for n, _ in ref.named_modules())
    # the rollout side samples the adapted policy: W + (alpha/r)·B A, targeted weights its own
    torch.testing.assert_close(merged_lp, policy_lp, rtol=1e-5, atol=1e-5)
    own = [n for n, p in merged.named_parameters() if p.data_ptr() not in base_ptrs]
    assert sorted(own) == sorted(f"{t}.weight" for t in lp.targets)
    # a full plain checkpoint (what the sglang backend's disk route writes), base names
    merged.save_pretrained(tmp_path / "m")
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(response_logprobs(again, ids, attn, T), merged_lp, rtol=0, atol=1e-6)


def test_the_single_strategy_syncs_the_merged_view_and_keeps_no_base_copy():
    """``single``: every sync hands the backend the one merged view, refreshed (its targeted
    weights follow the adapters), its untargeted tensors the policy's own: nothing is gathered or
    cached (the fsdp2 base cache is tests/test_distributed.py's)."""
    from rllab.parallel.single import Single

    model = random_qwen()
    lp = lora.LoraPolicy.attach(model, lora.LoraConfig(r=2, target_modules=("q_proj",)))
    handed = []

    class Backend:
        def update_weights(self, m):
            handed.append((m, m.model.layers[0].self_attn.q_proj.weight.detach().clone()))

    place = Single(device=torch.device("cpu"))
    place.sync_weights(Backend(), lp)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.lora_B.default.weight.fill_(0.5)
    place.sync_weights(Backend(), lp)
    (first, w0), (second, w1) = handed
    assert first is second is lp.merged()
    base = model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(w0, base) and not torch.equal(w1, base)  # B = 0 at the start, then 0.5
    base_ptrs = {p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n}
    assert {n for n, p in first.named_parameters() if p.data_ptr() not in base_ptrs} == {f"{t}.weight" for t in lp.targets}
    assert vars(place).keys() == {"device", "reducer"} and not lp._bases


def test_gradient_checkpointing_gives_the_same_adapter_gradients():
    ids, attn, T = batch()
    grads = []
    for checkpointing in (False, True):
        model = random_qwen()
        if checkpointing:
            model.activation_checkpointing_enable()
        torch.manual_seed(5)
        lora.LoraPolicy.attach(model, lora.LoraConfig(r=2))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.fill_(0.01)
        model.train()
        response_logprobs(model, ids, attn, T).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-6)
        assert grads[0][n].abs().sum() > 0, n


# --------------------------------------------------------------------------- the trainer


def test_a_step_changes_only_the_adapters_and_the_reference_is_the_base(tmp_path):
    tr = Trainer(small_cfg("algorithm.kl_in=loss"), run_dir=tmp_path, progress=False)
    try:
        base0, adapters0 = base_and_adapter_params(tr.policy)
        opt_params = [p for g in tr.optimizer.param_groups for p in g["params"]]
        assert {id(p) for p in opt_params} == {id(p) for n, p in tr.policy.named_parameters() if "lora_" in n}
        m = tr.train_step()
        assert m["model/trainable_params"] == sum(p.numel() for p in adapters0.values())
        assert m["model/params"] == sum(p.numel() for p in (*base0.values(), *adapters0.values()))
        base1, adapters1 = base_and_adapter_params(tr.policy)
        for n in base0:
            assert torch.equal(base0[n], base1[n]), f"base weight {n} changed"
        assert any(not torch.equal(adapters0[n], adapters1[n]) for n in adapters0)
        # the reference: the base model as loaded from the model directory, adapters disabled
        from transformers import AutoModelForCausalLM

        fresh = AutoModelForCausalLM.from_pretrained(tr.model_dir, dtype=torch.float32).eval()
        ids, attn, T = batch(vocab=fresh.config.vocab_size)
        with torch.no_grad():
            ref_lp = response_logprobs(tr.reference, ids, attn, T)
            torch.testing.assert_close(ref_lp, response_logprobs(fresh, ids, attn, T), rtol=0, atol=1e-6)
            assert not torch.allclose(response_logprobs(tr.policy, ids, attn, T), ref_lp, atol=1e-4)
            # the hf backend samples the adapted policy (its copy holds the merged weights)
            sampler = tr.backend.model
            torch.testing.assert_close(response_logprobs(sampler, ids, attn, T), response_logprobs(tr.policy.eval(), ids, attn, T),
                                       rtol=1e-5, atol=1e-5)
    finally:
        tr.close()


def test_a_sharing_hf_backend_samples_the_merged_policy(tmp_path):
    tr = Trainer(small_cfg("backend.share_weights=true"), run_dir=tmp_path, progress=False)
    try:
        tr.train_step()
        sampler = tr.backend.model
        assert sampler is tr.policy_handle.merged() and sampler is not tr.policy
        ids, attn, T = batch(vocab=sampler.config.vocab_size)
        with torch.no_grad():
            torch.testing.assert_close(response_logprobs(sampler, ids, attn, T), response_logprobs(tr.policy.eval(), ids, attn, T),
                                       rtol=1e-5, atol=1e-5)
    finally:
        tr.close()


def test_checkpoints_hold_the_adapters_and_resume_continues_exactly(tmp_path):
    run = tmp_path / "run"
    run_experiment(small_cfg("train.steps=4", "train.checkpoint_every=2"), run_dir=run, progress=False)
    state = torch.load(run / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert state["policy"] and all(".lora_A." in k or ".lora_B." in k for k in state["policy"])
    opt_state = state["optimizer"]["state"]
    assert len(opt_state) == len(state["policy"])
    final = torch.load(run / "checkpoints" / "step_000004" / "state.pt", weights_only=False)

    tr = Trainer(small_cfg("train.steps=4", "train.checkpoint_every=2"), run_dir=tmp_path / "again", progress=False)
    try:
        tr.load_checkpoint(run / "checkpoints" / "step_000002")
        rows = [tr.train_step() for _ in range(2)]
        for k, v in tr.policy_handle.state_dict().items():
            assert torch.equal(v, final["policy"][k]), k
    finally:
        tr.close()
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in logged if r["step"] in (3, 4) and "loss/policy" in r]
    for a, b in zip(rows, logged):
        for k in ("loss/policy", "loss/entropy", "actor/grad_norm", "rollout/reward"):
            assert a[k] == b[k], k
    # a checkpoint of another adapter shape is refused, naming the checkpoint
    other = Trainer(small_cfg("train.steps=4", "model.lora.r=2"), run_dir=tmp_path / "other", progress=False)
    try:
        with pytest.raises(RllabError, match="LoRA adapters"):
            other.policy_handle.load_state_dict(state["policy"])
    finally:
        other.close()


def test_a_two_step_lora_job_runs_and_saves_its_adapter(tmp_path):
    run = tmp_path / "run"
    summary = run_experiment(small_cfg(), run_dir=run, progress=False)
    assert 0 < summary["lora/trainable_params"] < summary["lora/params"]
    assert (run / "adapter" / "adapter_config.json").is_file()
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert "lora = {" in (run / "config.toml").read_text()
    # the saved adapter on its base model is the trained policy, merged
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = json.loads((run / "adapter" / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(cfg["base_model_name_or_path"], dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, run / "adapter").merge_and_unload().eval()
    last = torch.load(run / "checkpoints" / "step_000002" / "state.pt", weights_only=False)["policy"]
    tr = Trainer(small_cfg(), run_dir=tmp_path / "check", progress=False)
    try:
        tr.policy_handle.load_state_dict(last)
        ids, attn, T = batch(vocab=base.config.vocab_size)
        with torch.no_grad():
            torch.testing.assert_close(response_logprobs(merged, ids, attn, T), response_logprobs(tr.policy.eval(), ids, attn, T),
                                       rtol=1e-5, atol=1e-5)
    finally:
        tr.close()
    # the recorded config resumes (extends) the run
    extended = resume_run(run, overrides=["train.steps=3"], progress=False)
    assert extended["steps"] == 3


def test_a_critic_trains_all_its_parameters_beside_lora(tmp_path):
    tr = Trainer(load_config(None, [*SMALL], preset="ppo"), run_dir=tmp_path, progress=False)
    try:
        assert tr.critic is not None
        assert all(p.requires_grad for p in tr.critic.parameters())
        assert not any("lora" in n for n, _ in tr.critic.named_modules())
        before = [p.detach().clone() for p in tr.critic.parameters()]
        m = tr.train_step()
        assert m["critic/grad_norm"] > 0
        assert any(not torch.equal(a, p) for a, p in zip(before, tr.critic.parameters()))
    finally:
        tr.close()


def test_dpo_trains_the_adapters_against_the_base_as_reference(tmp_path):
    extra = [*overrides(TINY), "train.steps=2", "model.lora.r=4", "train.lr=1e-2", "train.warmup_steps=0",
             "algorithm.pairs=16", "algorithm.batch_size=4"]
    tr = Trainer(load_config(None, extra, preset="dpo"), run_dir=tmp_path, progress=False)
    try:
        base0, adapters0 = base_and_adapter_params(tr.policy)
        m = tr.train_step()
        assert m["model/trainable_params"] < m["model/params"]
        base1, adapters1 = base_and_adapter_params(tr.policy)
        assert all(torch.equal(base0[n], base1[n]) for n in base0)
        assert any(not torch.equal(adapters0[n], adapters1[n]) for n in adapters0)
        assert not any("lora" in n for n, _ in tr.reference.named_modules())
    finally:
        tr.close()


def test_a_non_finite_adapter_is_never_checkpointed(tmp_path):
    from rllab.errors import NonFiniteError

    tr = Trainer(small_cfg(), run_dir=tmp_path, progress=False)
    try:
        name, p = next((n, p) for n, p in tr.policy.named_parameters() if "lora_B" in n)
        with torch.no_grad():
            p[0, 0] = float("nan")
        with pytest.raises(NonFiniteError, match=re.escape(name)):
            tr.save_checkpoint()
        assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").glob("step_*"))
    finally:
        tr.close()


def test_record_refuses_lora(tmp_path):
    from rllab_suite.replay import record

    with pytest.raises(RllabError, match="lora"):
        record(None, overrides=list(SMALL), steps=1, out=tmp_path / "r.pt")


def test_fsdp2_lets_a_gathered_copy_be_kept_only_where_it_costs_no_device_memory():
    """A kept base sits in rank 0's CPU memory (shared servers) or in CPU memory; a per-rank hf
    sampler on an accelerator gathers in full each sync instead of doubling device memory."""
    from types import SimpleNamespace

    from rllab.parallel.fsdp2 import FSDP2

    for device, shared, keeps in (("cpu", False, True), ("cpu", True, True), ("cuda", True, True), ("cuda", False, False)):
        assert FSDP2.keeps_full_copy(SimpleNamespace(device=torch.device(device)), shared) is keeps, (device, shared)
