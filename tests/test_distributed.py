"""Data parallel with FSDP2 on CPU (gloo, 2 spawned processes): the 2-rank step equals the 1-rank step.

One fixed batch of 4 prompts × 2 samples; rank r owns the rows of prompts 2r and 2r + 1. The rl
step (REINFORCE++ advantages, whitened over the whole batch; token-mean aggregation; micro-batches
of 2 rows) runs once with ``model.strategy = "single"`` in this process, and once on 2 ranks with
``fsdp2``: the loss, the gradient norm, every gradient and every parameter after the AdamW step
agree within float tolerance; so do they with LoRA adapters and a KL term to the reference (the
base, adapters off), and the merged weights a sync hands the sampler. A sharded checkpoint is
written, reloaded and refused for a different world size; a LoRA one holds the adapters only.
A LoRA sync gathers the frozen base once and the adapters after, pushing what a full gather gives.

A short trainer run (3 steps) on 2 ranks, each fed its groups of the batches the one-process run
sampled, ends with the one-process run's weights. Each rank evaluates its share of the held-out
set and reports the whole set's metrics. Slow: a 2-rank run whose rollouts come from the SGLang
stand-in server (rank 0 pushes the weights), and kill -9 of one rank, then resume.
"""

from __future__ import annotations

import os
import socket

import attrs
import pytest
import torch

from rllab.parallel import placement
from rllab.parallel import distributed
from rllab.training import parts
from rllab.parallel.fsdp2 import FSDP2
from rllab.parallel.single import Single
from rllab.algorithm import RunContext
from rllab.config import validate
from rllab.lab import Lab
from rllab.training.optimizer import Optimizers
from rllab.rollout.recorded import RecordedRollout
from rllab.types import RolloutBatch

SETTINGS = {
    "algorithm": {"name": "rl", "micro_batch_size": 2},
    "advantage": {"name": "reinforce_plus_plus"},
    "aggregation": {"name": "token-mean"},
    "train": {"max_grad_norm": 1.0, "lr": 1e-2},
}


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def _batch(rows: slice | None = None) -> RolloutBatch:
    """8 rows (prompts 0..3, 2 samples each), prompts of 3 tokens, responses of up to 5."""
    g = torch.Generator().manual_seed(1)
    B, P, T = 8, 3, 5
    ids = torch.randint(1, 48, (B, P + T), generator=g)
    lengths = torch.tensor([5, 3, 4, 1, 5, 2, 4, 5])
    response_mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    attention = torch.cat([torch.ones(B, P, dtype=torch.bool), response_mask], dim=1)
    index = torch.arange(B) // 2
    scores = torch.rand(B, generator=g)
    batch = dict(input_ids=ids, attention_mask=attention, response_mask=response_mask,
                 rollout_log_prob=-torch.rand(B, T, generator=g), index=index, rewards=scores)
    if rows is not None:
        batch = {k: v[rows] for k, v in batch.items()}
        batch["index"] = batch["index"] - batch["index"].min()
    return RolloutBatch(**batch)


LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _config(strategy: str, advantage: str = "reinforce_plus_plus", lora: bool = False):
    data = {**SETTINGS, "advantage": {"name": advantage}, "model": {"strategy": strategy, **({"lora": LORA} if lora else {})}}
    if lora:  # a KL term in the loss: the reference (adapters off) takes part
        data["algorithm"] = {**data["algorithm"], "kl_in": "loss"}
    return validate(data, lab=Lab(), where="test")


def _lora_prepare(cfg, out: dict):
    """``prepare`` for ``build_policy``: LoRA adapters with nonzero B (drawn from seed 7), so that
    the adapters change the forward, the merge and A's gradient."""
    from rllab.models import lora

    def prepare(model):
        out["lora"] = lora.LoraPolicy.attach(model, lora.lora_config(cfg.model))
        torch.manual_seed(7)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.2)
        return model

    return prepare


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _run(place, batch: RolloutBatch, cfg) -> dict:
    """One rl step on ``batch`` under ``place``: the metrics (averaged over ranks), the gradients
    of the global loss and the parameters after the AdamW step, all full tensors."""
    from rllab.config import COMPONENT_SECTIONS
    from rllab.specs import Component

    lab = Lab()
    held: dict = {}
    lora = None
    if cfg.model.lora:
        policy = place.build_policy(_model, _lora_prepare(cfg, held))
        lora = held["lora"]
    else:
        policy = place.build_policy(_model)
    handle = lora if lora is not None else parts.FullPolicy(policy)
    # eps = 1e-3: AdamW's first step, g / (|g| + eps), stays continuous in the gradient (with 1e-8 it is
    # sign(g), and gradients equal within float tolerance can give opposite steps)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, eps=1e-3)

    def component(section):
        ref = cfg.component(section)
        return Component(spec=lab.spec(COMPONENT_SECTIONS[section][0], ref.name), config=ref.config)

    components = {s: component(s) for s in cfg.components if s not in {"task", "env", "algorithm", "kl_controller", "backend"}}
    critic = critic_optimizer = None
    if cfg.component("advantage").name == "gae":  # the same value head on both sides: drawn from seed 5

        def load():
            model = _model()
            torch.manual_seed(5)
            return model

        torch.manual_seed(5)
        critic = place.build_critic(load, handle.critic)
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.train.critic_lr, eps=1e-3)
    reference = lora.reference() if lora is not None else None
    merged = {}

    class Backend:  # what a weight sync hands an hf backend (full weights, adapters merged)
        def update_weights(self, model):
            merged.update({k: v.detach().clone() for k, v in (model if isinstance(model, dict) else model.state_dict()).items()})

    if lora is not None:
        place.sync_weights(Backend(), lora)
    ctx = RunContext(step=0, config=cfg, components=components, rollout=RecordedRollout(batch=batch), policy=policy,
                     reference=reference, kl_coef=0.5 if lora is not None else 0.0, critic=critic, hook=lab.hook, reducer=place.reducer)
    grads = {}
    named = [("", policy)] + ([("critic.", critic)] if critic is not None else [])

    def observe(request):  # FSDP averages over ranks; the placement scales to the sum when it clips
        grads.update({k + n: _full(p.grad) * place.reducer.world_size for k, m in named for n, p in m.named_parameters() if p.grad is not None})

    optimizers = Optimizers(policy=policy, optimizer=optimizer, critic=critic, critic_optimizer=critic_optimizer,
                            max_grad_norm=cfg.train.max_grad_norm, observe=observe, clip=place.clip_grad_norm)
    with distributed.reducing(place.reducer):
        outcome = optimizers.drive(component("algorithm")().step(ctx), step=0, algorithm="rl", nonfinite="raise")
    metrics = place.reducer.mean_metrics(outcome.metrics)
    params = {k + n: _full(p) for k, m in named for n, p in m.named_parameters()}
    return {"metrics": metrics, "grads": grads, "params": params, "policy": policy, "handle": handle, "optimizer": optimizer, "lora": lora,
            "merged": merged}


class _KeyedBackend:
    """Answers by prompt, whatever batch it is in: prompt "k" greedily gives "1" when k is even,
    and its j-th sample "1" when j < k mod 4 (else "0")."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, params):
        from rllab.types import Completion

        out = []
        for i, p in enumerate(prompts):
            k = int("".join(ch for ch in self.tok.decode(p) if ch.isdigit()))
            for j in range(params.n):
                right = k % 2 == 0 if params.temperature == 0 else j < k % 4
                ids = tuple(self.tok("1" if right else "0", add_special_tokens=False).input_ids)
                out.append(Completion(prompt_ids=tuple(p), token_ids=ids, log_probs=(0.0,) * len(ids), finish_reason="length", prompt_index=i))
        return out

    def last_metrics(self):
        return {}


def _evaluate(reducer) -> dict:
    """Greedy and sampled (n = 4) evaluation of 7 held-out examples under ``reducer``."""
    from types import SimpleNamespace

    from rllab.rollout.stage import build_stage
    from rllab.models.tokenizer import build_tokenizer
    from rllab.settings import RolloutConfig
    from rllab.types import Example

    tok = build_tokenizer()
    examples = [Example(prompt=str(k), answer="1") for k in range(7)]
    task = SimpleNamespace(eval_examples=lambda: examples, reward=lambda e, c: float(c == e.answer))
    config = RolloutConfig(max_new_tokens=2, temperature=0.7, top_p=1.0, top_k=-1)
    stage = build_stage(task=task, task_name="t", backend=_KeyedBackend(tok), tokenizer=tok, config=config, seed=3, reducer=reducer)
    metrics = stage.evaluate(7, samples=4)
    metrics.pop("time/eval")
    return metrics


RUN = {"train.steps": 3, "train.warmup_steps": 1, "task.format_weight": 0.5, "algorithm.entropy_coef": 0.01}
"""A short run of the trainer (tests/tiny.py's settings): 3 steps, LR warm-up and cosine decay,
gradient clipping, AdamW state carried from step to step; a format reward and an entropy bonus, so that
the few-step-old tiny model gets a gradient."""


def _trainer(strategy: str, run_dir, **settings):
    from rllab.config import load_config
    from rllab.training.trainer import Trainer
    from tests.tiny import TINY, overrides

    config = load_config(None, overrides({**TINY, **RUN, "model.strategy": strategy, **settings}))
    return Trainer(config, run_dir=run_dir, progress=False)


class _Replay:
    """The rollout stage of a replayed run: step k trains on this rank's rows (whole groups) of the
    k-th batch the one-process run sampled."""

    def __init__(self, batches, rank: int, world: int):
        self.batches, self.rank, self.world = batches, rank, world

    def sample(self, step: int, **_):
        batch = self.batches[step]
        P = int(batch.index.max()) + 1
        mine = (batch.index >= self.rank * P // self.world) & (batch.index < (self.rank + 1) * P // self.world)
        part = batch.select(mine)
        self.current = RecordedRollout(batch=attrs.evolve(part, index=part.index - part.index.min()))
        return self.current.sample(step)

    def to_batch(self, scored):
        return self.current.to_batch(scored)


def _one_process_run(out) -> None:
    """The short run in this process: its batches (replayed by the ranks) and final weights."""
    trainer = _trainer("single", out / "single")
    initial = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    batches, to_batch = [], trainer.rollout.to_batch
    trainer.rollout.to_batch = lambda scored: batches.append(to_batch(scored)) or batches[-1]
    for _ in range(RUN["train.steps"]):
        trainer.train_step()
    trainer.close()
    weights = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    torch.save({"batches": batches, "weights": weights, "initial": initial}, out / "single.pt")


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch.distributed as dist

    from rllab.parallel import dcp
    from rllab.errors import NonFiniteError, RllabError

    torch.set_num_threads(1)
    # the short run, its rollouts replayed: every rank trains on its groups of the one-process batches
    recorded = torch.load(os.path.join(out, "single.pt"), weights_only=False)
    trainer = _trainer("fsdp2", os.path.join(out, "fsdp2"))
    replay = _Replay(recorded["batches"], rank, world)
    trainer.rollout.sample, trainer.rollout.to_batch = replay.sample, replay.to_batch
    for _ in range(RUN["train.steps"]):
        trainer.train_step()
    trainer.close()
    run_weights = {n: _full(p) for n, p in trainer.policy.named_parameters()}
    # what a finished sharded run writes as RUN_DIR/model: gathered on every rank, written by rank 0
    trainer.policy_handle.save_final(os.path.join(out, "fsdp2"), trainer.placement, tokenizer=trainer.tokenizer)
    cfg = _config("fsdp2")
    place = placement.for_config(cfg.model, device=torch.device("cpu"), compute_dtype=None)
    half = _run(place, _batch(slice(4 * rank, 4 * rank + 4)), cfg)
    result = {k: half[k] for k in ("metrics", "grads", "params")}
    result["eval"] = _evaluate(place.reducer)
    result["run_weights"] = run_weights
    with_critic = _run(place, _batch(slice(4 * rank, 4 * rank + 4)), _config("fsdp2", "gae"))
    result["gae"] = {k: with_critic[k] for k in ("metrics", "grads", "params")}
    lora_cfg = _config("fsdp2", lora=True)
    adapted = _run(place, _batch(slice(4 * rank, 4 * rank + 4)), lora_cfg)
    result["lora"] = {k: adapted[k] for k in ("metrics", "grads", "params", "merged")}
    # the adapters' checkpoint: only they (and their AdamW state) are written, and they load back
    lora, lora_opt = adapted["lora"], adapted["optimizer"]
    lora_state = {"step": 1, "rng": {"torch": torch.get_rng_state(), "python": None},
                  **place.model_states(policy=lora, optimizer=lora_opt, critic=None, critic_optimizer=None)}
    lora_path = place.save(os.path.join(out, "lora"), 1, lora_state)
    held: dict = {}
    place.build_policy(_model, _lora_prepare(lora_cfg, held))
    fresh_lora = held["lora"]
    fresh_lora_opt = torch.optim.AdamW([p for p in fresh_lora.policy.parameters() if p.requires_grad], lr=1.0)
    place.load_model_states(lora_path, place.load(lora_path), policy=fresh_lora, optimizer=fresh_lora_opt, critic=None, critic_optimizer=None)
    result["lora_reloaded"] = {n: _full(p) for n, p in fresh_lora.policy.named_parameters() if p.requires_grad}
    result["lora_opt_reloaded"] = all(
        torch.equal(_full(lora_opt.state[p]["exp_avg"]), _full(fresh_lora_opt.state[q]["exp_avg"]))
        for p, q in zip(lora_opt.param_groups[0]["params"], fresh_lora_opt.param_groups[0]["params"])
    )
    lora.save_final(out, place)  # OUT/adapter
    # a sharded checkpoint: written, read back into a fresh model and optimizer, refused on another world size
    policy, optimizer = half["policy"], half["optimizer"]
    state = {"step": 1, "rng": {"torch": torch.get_rng_state(), "python": None},
             **place.model_states(policy=half["handle"], optimizer=optimizer, critic=None, critic_optimizer=None)}
    path = place.save(out, 1, state)
    fresh = place.build_policy(_model)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=cfg.train.lr)
    loaded = place.load(path)
    place.load_model_states(path, loaded, policy=parts.FullPolicy(fresh), optimizer=fresh_opt, critic=None, critic_optimizer=None)
    result["reloaded_equal"] = all(torch.equal(_full(a), _full(b)) for a, b in zip(policy.parameters(), fresh.parameters()))
    exp_avg = [_full(fresh_opt.state[p]["exp_avg"]) for p in fresh.parameters()]
    result["reloaded_opt_equal"] = all(torch.equal(_full(optimizer.state[p]["exp_avg"]), e) for p, e in zip(policy.parameters(), exp_avg))
    try:
        dcp.load(path, reducer=distributed.Reducer(rank=0, world_size=3))
    except RllabError as e:
        result["other_world"] = str(e)
    try:  # a non-finite shard on rank 1 only: every rank refuses, nothing is written
        with torch.no_grad():
            if rank == 1:
                next(policy.parameters()).to_local().fill_(float("nan"))
        place.save(out, 2, {**state, **place.model_states(policy=half["handle"], optimizer=optimizer, critic=None, critic_optimizer=None)})
    except NonFiniteError as e:
        result["nonfinite"] = str(e)
    try:
        FSDP2(device=torch.device("cpu"), reducer=place.reducer, compute_dtype=None, cpu_offload=True)
    except RllabError as e:
        result["offload_refused"] = str(e)
    try:
        distributed.init_from_env(device_type="cpu", expected=4)
    except RllabError as e:
        result["world_refused"] = str(e)
    result["lora_sync"] = _lora_syncs(adapted["policy"], lora, adapted["optimizer"], place.reducer, without=with_critic["handle"])
    result["gather_full"] = _gather_full_cases(place)
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


class _Recorder:
    """A rollout backend that keeps copies of the weights each sync hands it (``hf``: a module, then
    state dicts; ``shared``: a module from rank 0, ``follow_weights`` on the others)."""

    def __init__(self, shared: bool):
        self.pushed: list[dict] = []
        if shared:
            self.follow_weights = lambda: self.pushed.append({})

    def update_weights(self, model):
        self.pushed.append({k: v.detach().clone() for k, v in (model if isinstance(model, dict) else model.state_dict()).items()})


def _lora_syncs(policy, lora, optimizer, reducer, *, without) -> dict:
    """Syncs of a sharded LoRA policy through a placement that caches the base, between AdamW steps,
    each against a fresh placement's full gather + merge; the full gathers each made; and syncs
    of the policy ``without`` LoRA, which never cache."""
    from torch.distributed.checkpoint import state_dict as sd

    full_gathers = []
    real = sd.get_model_state_dict
    sd.get_model_state_dict = lambda *a, **k: full_gathers.append(1) or real(*a, **k)
    try:
        out: dict = {}

        def fresh():
            return FSDP2(device=torch.device("cpu"), reducer=reducer, compute_dtype=None, cpu_offload=False)

        for route in ("hf", "shared"):
            cached, recorder, reference = fresh(), _Recorder(route == "shared"), []
            full_gathers.clear()
            for step in range(3):
                cached.sync_weights(recorder, lora)
                again = _Recorder(route == "shared")
                fresh().sync_weights(again, lora)
                reference.append(again.pushed[-1])
                ids = torch.randint(1, 48, (2, 6), generator=torch.Generator().manual_seed(10 * reducer.rank + step))
                policy(input_ids=ids).logits.float().pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            out[route] = {"pushed": recorder.pushed, "reference": reference, "full_gathers": len(full_gathers) - len(reference)}
            out[route]["cached"] = cached in lora._bases and lora._bases[cached][0] == (route == "shared")
        full_gathers.clear()
        plain = fresh()
        attributes = set(vars(plain))
        for _ in range(2):
            plain.sync_weights(_Recorder(False), without)
        # nothing kept: the placement holds no new state, and a full handle has no place for any
        out["without_lora"] = {"full_gathers": len(full_gathers), "cached": set(vars(plain)) != attributes or hasattr(without, "__dict__")}
        return out
    finally:
        sd.get_model_state_dict = real


def _gather_full_cases(place) -> dict:
    """``FSDP2.gather_full`` on tensors sharded unevenly (5 and 1 rows over 2 ranks: one rank's
    shard is empty), a 1-D one, a replicated one (gathered by ``full_tensor``), and to rank 0's CPU only."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    wholes = [torch.arange(15.0).view(5, 3), torch.arange(3.0).view(1, 3), torch.arange(7.0), torch.arange(4.0).view(2, 2)]
    placed = [distribute_tensor(w, place.mesh, [Shard(0)]) for w in wholes[:3]] + [distribute_tensor(wholes[3], place.mesh, [Replicate()])]
    return {"wholes": wholes, "full": place.gather_full(placed), "cpu": place.gather_full(placed, cpu=True)}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, model_cache):
    out = tmp_path_factory.mktemp("fsdp2")
    _one_process_run(out)
    torch.multiprocessing.spawn(_worker, args=(2, _port(), str(out)), nprocs=2, join=True)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("advantage", ["reinforce_plus_plus", "gae", "lora"])
def test_two_ranks_compute_the_one_rank_loss_gradients_and_update(two_ranks, advantage):
    """REINFORCE++ (whitened returns), PPO's GAE with a critic (whitened advantages, value loss), and
    REINFORCE++ with LoRA adapters and a KL term to the reference (the base, adapters off)."""
    _, results = two_ranks
    lora = advantage == "lora"
    cfg = _config("single", "reinforce_plus_plus" if lora else advantage, lora=lora)
    one = _run(Single(device=torch.device("cpu")), _batch(), cfg)
    keys = ("loss/policy", "loss/total", "actor/grad_norm") + (("loss/value", "critic/grad_norm") if advantage == "gae" else ())
    if advantage == "gae":
        results = [res["gae"] for res in results]
        assert any(name.startswith("critic.") for name in one["grads"])
    if lora:
        results = [res["lora"] for res in results]
        keys += ("loss/kl",)
        assert one["grads"] and all("lora_" in name for name in one["grads"])  # only the adapters train
        assert one["metrics"]["loss/kl"] > 0  # the adapters moved the policy away from the base
        for res in results:  # the merged weights a weight sync hands the rollout side
            assert res["merged"].keys() == one["merged"].keys()
            for name, w in one["merged"].items():
                torch.testing.assert_close(res["merged"][name], w, rtol=1e-5, atol=1e-6, msg=name)
    for res in results:
        for key in keys:
            assert res["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-6), key
        assert res["grads"].keys() == one["grads"].keys()
        for name, g in one["grads"].items():
            torch.testing.assert_close(res["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
        for name, p in one["params"].items():
            torch.testing.assert_close(res["params"][name], p, rtol=1e-4, atol=1e-6, msg=name)
    assert one["metrics"]["actor/grad_norm"] > 0


def test_a_short_run_ends_with_the_one_process_runs_weights(two_ranks):
    """Three trainer steps on 2 ranks, each on its groups of the batches the one-process run sampled
    (replayed): the final weights are the one-process run's."""
    out, results = two_ranks
    single = torch.load(out / "single.pt", weights_only=False)
    moved = max(float((single["weights"][n] - p).abs().max()) for n, p in single["initial"].items())
    assert moved > 1e-4  # the run trained
    for res in results:
        assert res["run_weights"].keys() == single["weights"].keys()
        for name, w in single["weights"].items():
            torch.testing.assert_close(res["run_weights"][name], w, rtol=1e-4, atol=1e-5, msg=name)


def test_a_sharded_full_fine_tune_writes_its_final_model_whole(two_ranks):
    """``RUN_DIR/model`` of a sharded run: the full weights (gathered from the shards), loadable by
    transformers alone, equal to the weights the ranks trained."""
    from transformers import AutoModelForCausalLM

    out, results = two_ranks
    model = AutoModelForCausalLM.from_pretrained(out / "fsdp2" / "model", dtype=torch.float32)
    state = model.state_dict()
    for name, w in results[0]["run_weights"].items():
        torch.testing.assert_close(state[name], w, rtol=0, atol=0, msg=name)


def test_each_rank_evaluates_its_share_and_reports_the_whole_sets_metrics(two_ranks):
    _, results = two_ranks
    one = _evaluate(distributed.SINGLE)
    assert one["eval/n"] == 7 and one["eval/accuracy"] == pytest.approx(4 / 7)  # prompts 0, 2, 4, 6
    assert one["eval/mean@4"] == pytest.approx(sum(k % 4 for k in range(7)) / 28)
    for res in results:
        assert res["eval"] == pytest.approx(one)


def test_a_sharded_checkpoint_reloads_and_refuses_what_it_must(two_ranks):
    out, results = two_ranks
    assert (out / "checkpoints" / "step_000001" / "state.pt").is_file()
    assert not (out / "checkpoints" / "step_000002").exists()
    from rllab.errors import RllabError

    with pytest.raises(RllabError, match="written by model.strategy = 'fsdp2' on 2 rank"):
        Single(device=torch.device("cpu")).load(out / "checkpoints" / "step_000001")
    for res in results:
        assert res["reloaded_equal"] and res["reloaded_opt_equal"]
        assert "written on 2 rank(s) but this run has 3" in res["other_world"]
        assert "refusing to write the checkpoint after step 2: non-finite" in res["nonfinite"]
        assert "model.world_size = 4 but this run has 2 process(es)" in res["world_refused"]
        assert "model.cpu_offload = true" in res["offload_refused"]


def test_a_sharded_lora_checkpoint_and_adapter_hold_the_adapters_only(two_ranks):
    """The sharded checkpoint of a LoRA policy holds the adapters and their AdamW state, which load
    back exactly; the final adapter directory (rank 0, gathered) is peft's format."""
    import torch.distributed.checkpoint as dcp
    from peft import PeftModel

    out, results = two_ranks
    meta = dcp.FileSystemReader(str(out / "lora" / "checkpoints" / "step_000001" / "model")).read_metadata()
    policy_keys = [k for k in meta.state_dict_metadata if k.startswith("policy.")]
    assert policy_keys and all(".lora_A." in k or ".lora_B." in k for k in policy_keys), policy_keys[:5]
    trained = {n: p for n, p in results[0]["lora"]["params"].items() if "lora_" in n}
    assert trained.keys() == results[0]["lora_reloaded"].keys()
    for res in results:
        assert res["lora_opt_reloaded"]
        for name, p in res["lora_reloaded"].items():
            assert torch.equal(p, trained[name]), name
    loaded = PeftModel.from_pretrained(_model(), str(out / "adapter"))
    saved = {n.removeprefix("base_model.model."): p for n, p in loaded.named_parameters() if "lora_" in n}
    assert saved.keys() == trained.keys()
    for name, p in saved.items():
        assert torch.equal(p, trained[name]), name


def test_a_lora_sync_gathers_the_base_once_and_pushes_the_full_gathers_merge(two_ranks):
    """Three syncs of the sharded LoRA policy between AdamW steps, through the ``hf`` route (every
    rank) and the shared-servers route (rank 0): one full gather, then the adapters only, merged
    into the cached base; each push equals exactly what a fresh placement's full gather + merge
    pushes at that point. Without LoRA every sync gathers in full and nothing is cached."""
    _, results = two_ranks
    for rank, res in enumerate(results):
        syncs = res["lora_sync"]
        for route in ("hf", "shared"):
            got = syncs[route]
            assert got["cached"] and got["full_gathers"] == 1, (route, got["full_gathers"])
            if route == "shared" and rank == 1:  # rank 1 follows the pushes of rank 0
                assert got["pushed"] == [{}] * 3 and got["reference"] == [{}] * 3
                continue
            assert len(got["pushed"]) == 3
            for pushed, reference in zip(got["pushed"], got["reference"]):
                assert pushed.keys() == reference.keys() and any(k.endswith("q_proj.weight") for k in pushed)
                for name, w in reference.items():
                    assert torch.equal(pushed[name], w), (route, rank, name)
            q = next(k for k in got["pushed"][0] if k.endswith("q_proj.weight"))
            assert not torch.equal(got["pushed"][0][q], got["pushed"][-1][q])  # the adapters moved between syncs
        assert syncs["without_lora"] == {"full_gathers": 2, "cached": False}


def test_gather_full_gives_full_tensors_of_uneven_and_replicated_shards(two_ranks):
    _, results = two_ranks
    for rank, res in enumerate(results):
        cases = res["gather_full"]
        assert len(cases["full"]) == 4
        for got, whole in zip(cases["full"], cases["wholes"]):
            assert torch.equal(got, whole)
        assert len(cases["cpu"]) == (4 if rank == 0 else 0)
        for got, whole in zip(cases["cpu"], cases["wholes"]):
            assert got.device.type == "cpu" and torch.equal(got, whole)


def test_fsdp2_knobs_need_the_fsdp2_strategy():
    from rllab.errors import ConfigError

    with pytest.raises(ConfigError, match="world_size = 2 applies only with strategy = 'fsdp2'"):
        validate({"model": {"world_size": 2}}, lab=Lab(), where="test")
    with pytest.raises(ConfigError, match="cpu_offload = True applies only with strategy = 'fsdp2'"):
        validate({"model": {"cpu_offload": True}}, lab=Lab(), where="test")


def test_data_parallel_refuses_what_would_split_rows_unevenly():
    from rllab.checks.run import check_data_parallel

    lab = Lab()

    def validate(data, **kw):
        from rllab.config import validate as plain

        return plain({**data, "model": {"strategy": "fsdp2"}}, **kw)

    with pytest.raises(Exception, match="prompts_per_step = 3 must be a multiple of the world size 2"):
        check_data_parallel(validate({"rollout": {"prompts_per_step": 3}}, lab=lab, where="t"), lab, 2)
    with pytest.raises(Exception, match="dynamic_sampling = true"):
        check_data_parallel(validate({"rollout": {"dynamic_sampling": True}}, lab=lab, where="t"), lab, 2)
    with pytest.raises(Exception, match="advantage 'gpg'.*couples rows"):
        check_data_parallel(validate({"advantage": {"name": "gpg"}}, lab=lab, where="t"), lab, 2)
    check_data_parallel(validate({"advantage": {"name": "reinforce_plus_plus"}}, lab=lab, where="t"), lab, 2)
    check_data_parallel(validate({"rollout": {"prompts_per_step": 3}}, lab=lab, where="t"), lab, 1)
    sglang = {"name": "sglang", "urls": "http://127.0.0.1:30000"}
    check_data_parallel(validate({"backend": sglang}, lab=lab, where="t"), lab, 2)  # disk: rank 0 pushes
    with pytest.raises(Exception, match="backend 'sglang' .*cannot take a sharded policy's weights: weight_sync = 'distributed'"):
        validate({"backend": {**sglang, "weight_sync": "distributed"}}, lab=lab, where="t")  # at load, on any number of ranks
    with pytest.raises(Exception, match="launch = true starts a server on rank 0"):
        check_data_parallel(validate({"backend": {"name": "sglang", "launch": True}}, lab=lab, where="t"), lab, 2)


def _sglang_worker(rank: int, world: int, port: int, url: str, run_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch.distributed as dist

    from rllab.config import load_config
    from rllab.training.trainer import run_experiment
    from tests.tiny import TINY, overrides

    torch.set_num_threads(1)
    settings = {**TINY, "model.strategy": "fsdp2", "train.steps": 2, "train.eval_size": 8, "backend": "sglang",
                "backend.urls": url, "backend.backoff_s": 0.01, "backend.stale": "error"}
    run_experiment(load_config(None, overrides(settings)), run_dir=run_dir, progress=False)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_sample_from_sglang_servers_that_rank_0_alone_updates(tmp_path, model_cache):
    """backend = "sglang" (weight_sync = "disk") under fsdp2 on 2 ranks, against the stand-in server:
    rank 0 gathers the full weights and pushes each version once; both ranks sample their share
    from the server and every completion carries the version just pushed (stale = "error")."""
    import json

    from tests.sglang_standin import StandIn

    run_dir = tmp_path / "run"
    with StandIn(None, lifetime_s=300) as server:
        torch.multiprocessing.spawn(_sglang_worker, args=(2, _port(), server.url, str(run_dir)), nprocs=2, join=True)
        versions = [u["weight_version"] for u in server.updates]
        prompts = sum(len(ids) if isinstance(ids[0], list) else 1
                      for ids in (body["input_ids"] for path, body in server.requests if path == "/generate"))
    assert versions == ["1", "2", "3"]  # the first sync, then one per step: rank 0's push alone
    # rows: each step's 4 prompts × 4 samples (2 prompts per rank); the 8 held-out prompts at the evaluations
    # before and after, 4 per rank (each rank evaluates its share)
    assert prompts == 2 * 4 * 4 + 2 * 8
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    assert [r["sglang/weight_version"] for r in steps] == [2.0, 3.0] and all(r["rollout/stale"] == 0 for r in steps)
    assert json.loads((run_dir / "final.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_killing_one_rank_stops_the_run_and_it_resumes_from_the_sharded_checkpoint(tmp_path, model_cache):
    """torchrun, 2 CPU processes: kill -9 rank 1 after the step-2 checkpoint; torchrun stops rank 0;
    ``--resume`` on 2 processes continues from step 2 and finishes."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from tests.tiny import TINY, overrides

    run_dir = tmp_path / "run"
    settings = {**TINY, "model.strategy": "fsdp2", "train.steps": 40, "train.checkpoint_every": 2, "train.eval_size": 8}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port())]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*torchrun, "-m", "rllab", "run", *overrides(settings), "--run-dir", str(run_dir), "-q"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpt = run_dir / "checkpoints" / "step_000002" / "state.pt"
    deadline = time.time() + 240
    while not ckpt.is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert ckpt.is_file(), proc.communicate()[0][-3000:] if proc.poll() is not None else "no checkpoint in time"
    def environ(pid: int) -> dict:
        try:
            raw = open(f"/proc/{pid}/environ").read()
        except OSError:
            return {}
        return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)

    workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]
    rank1 = next(p for p in workers if environ(p).get("RANK") == "1")
    os.kill(rank1, signal.SIGKILL)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out[-2000:]
    assert "rank      : 1 (local_rank: 1)" in out and "Signal 9" in out, out[-2000:]  # torchrun names the rank that died
    assert not (run_dir / "final.json").exists()
    resumed = subprocess.run([*torchrun, "-m", "rllab", "run", "--resume", str(run_dir), "-q"], env=env, capture_output=True,
                             text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert json.loads((run_dir / "final.json").read_text())["steps"] == 40
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(3) == 1 and max(steps) == 40  # the metrics after the checkpoint were truncated, not doubled


def test_a_config_asking_for_more_ranks_than_processes_is_refused(tmp_path, one_rank):
    """``rllab run model.strategy=fsdp2 model.world_size=2`` started as one process (no torchrun)."""
    from rllab.config import load_config
    from rllab.errors import RllabError
    from rllab.training.trainer import run_experiment

    with pytest.raises(RllabError, match=r"model.world_size = 2 but this run has 1 process\(es\).*torchrun --nproc-per-node 2"):
        run_experiment(load_config(None, ["model.strategy=fsdp2", "model.world_size=2"]), run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.fixture
def one_rank(monkeypatch):
    """This process as the one rank of a torchrun world (its process group destroyed afterwards)."""
    import torch.distributed as dist

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_port()))
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_trainer_builds_its_critic_through_the_placement(tmp_path, one_rank, model_cache):
    """fsdp2 on one rank: PPO's critic is sharded like the policy (built from the model's weights on
    disk), not copied from the sharded policy (an FSDP module cannot be deep-copied)."""
    trainer = _trainer("fsdp2", tmp_path / "run", **{"advantage": "gae", "train.steps": 1})
    try:
        metrics = trainer.train_step()
        assert distributed.is_sharded(trainer.critic.backbone) and distributed.is_sharded(trainer.critic.value_head)
        assert metrics["loss/value"] > 0 and metrics["critic/grad_norm"] > 0
    finally:
        trainer.close()


def test_the_output_of_ranks_other_than_0_is_prefixed(monkeypatch):
    import io
    import sys

    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    distributed.prefix_output(distributed.Reducer(rank=0, world_size=2))
    assert sys.stdout is out  # rank 0 owns the console
    distributed.prefix_output(distributed.Reducer(rank=1, world_size=2))
    distributed.prefix_output(distributed.Reducer(rank=1, world_size=2))  # once
    print("a warning\nover two lines")
    sys.stderr.write("part ")
    sys.stderr.write("of a line\n\nerror: boom\n")
    assert out.getvalue() == "[rank 1] a warning\n[rank 1] over two lines\n"
    assert err.getvalue() == "[rank 1] part of a line\n\n[rank 1] error: boom\n"


def test_an_error_on_one_rank_names_it():
    from rllab.errors import NonFiniteError, RllabError

    err = NonFiniteError("the policy's gradient is non-finite", step=3)
    distributed.name_rank(err, distributed.Reducer(rank=1, world_size=2))
    assert str(err) == "rank 1 of 2: the policy's gradient is non-finite" and err.step == 3
    distributed.name_rank(err, distributed.Reducer(rank=1, world_size=2))  # named once
    assert str(err).count("rank 1 of 2") == 1
    plain = RllabError("boom")
    distributed.name_rank(plain, distributed.SINGLE)
    assert str(plain) == "boom"
