"""Data parallel with FSDP2 on CPU (gloo, 2 spawned processes): the 2-rank step equals the 1-rank step.

One fixed batch of 4 prompts × 2 samples; rank r owns the rows of prompts 2r and 2r + 1. The rl
step (REINFORCE++ advantages, whitened over the whole batch; token-mean aggregation; micro-batches
of 2 rows) runs once with ``model.strategy = "single"`` in this process, and once on 2 ranks with
``fsdp2``: the loss, the gradient norm, every gradient and every parameter after the AdamW step
agree within float tolerance. A sharded checkpoint is written, reloaded and refused for a
different world size.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch

from rllab import distributed, placement
from rllab.algorithm import RunContext
from rllab.config import validate
from rllab.lab import Lab
from rllab.optimizer import Optimizers
from rllab.rollout import RecordedRollout
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
                 rollout_log_prob=-torch.rand(B, T, generator=g), index=index, scores=scores)
    if rows is not None:
        batch = {k: v[rows] for k, v in batch.items()}
        batch["index"] = batch["index"] - batch["index"].min()
    return RolloutBatch(**batch)


def _config(strategy: str, advantage: str = "reinforce_plus_plus"):
    return validate({**SETTINGS, "advantage": {"name": advantage}, "model": {"strategy": strategy}}, lab=Lab(), where="test")


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _run(place, batch: RolloutBatch, cfg) -> dict:
    """One rl step on ``batch`` under ``place``: the metrics (averaged over ranks), the gradients
    of the global loss and the parameters after the AdamW step, all full tensors."""
    from rllab.config import COMPONENT_SECTIONS
    from rllab.specs import Component

    lab = Lab()
    policy = place.build_policy(_model)
    # eps = 1e-3: AdamW's first step, g / (|g| + eps), stays continuous in the gradient (with 1e-8 it is
    # sign(g), and gradients equal within float tolerance can give opposite steps)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, eps=1e-3)

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
        critic = place.build_critic(policy, load)
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.train.critic_lr, eps=1e-3)
    ctx = RunContext(step=0, config=cfg, components=components, rollout=RecordedRollout(batch=batch), policy=policy,
                     critic=critic, hook=lab.hook, reducer=place.reducer)
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
    return {"metrics": metrics, "grads": grads, "params": params, "policy": policy, "optimizer": optimizer}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch.distributed as dist

    from rllab import dcp
    from rllab.errors import NonFiniteError, RllabError

    torch.set_num_threads(1)
    cfg = _config("fsdp2")
    place = placement.for_config(cfg.model, device=torch.device("cpu"), compute_dtype=None)
    half = _run(place, _batch(slice(4 * rank, 4 * rank + 4)), cfg)
    result = {k: half[k] for k in ("metrics", "grads", "params")}
    with_critic = _run(place, _batch(slice(4 * rank, 4 * rank + 4)), _config("fsdp2", "gae"))
    result["gae"] = {k: with_critic[k] for k in ("metrics", "grads", "params")}
    # a sharded checkpoint: written, read back into a fresh model and optimizer, refused on another world size
    policy, optimizer = half["policy"], half["optimizer"]
    state = {"step": 1, "rng": {"torch": torch.get_rng_state(), "python": None},
             **place.model_states(policy=policy, optimizer=optimizer, critic=None, critic_optimizer=None)}
    path = place.save(out, 1, state)
    fresh = place.build_policy(_model)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=cfg.train.lr)
    loaded = place.load(path)
    place.load_model_states(path, loaded, policy=fresh, optimizer=fresh_opt, critic=None, critic_optimizer=None)
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
        place.save(out, 2, {**state, **place.model_states(policy=policy, optimizer=optimizer, critic=None, critic_optimizer=None)})
    except NonFiniteError as e:
        result["nonfinite"] = str(e)
    try:
        placement.FSDP2(device=torch.device("cpu"), reducer=place.reducer, compute_dtype=None, cpu_offload=True)
    except RllabError as e:
        result["offload_refused"] = str(e)
    try:
        distributed.init_from_env(device_type="cpu", expected=4)
    except RllabError as e:
        result["world_refused"] = str(e)
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2")
    torch.multiprocessing.spawn(_worker, args=(2, _port(), str(out)), nprocs=2, join=True)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("advantage", ["reinforce_plus_plus", "gae"])
def test_two_ranks_compute_the_one_rank_loss_gradients_and_update(two_ranks, advantage):
    """REINFORCE++ (whitened returns) and PPO's GAE with a critic (whitened advantages, value loss)."""
    _, results = two_ranks
    cfg = _config("single", advantage)
    one = _run(placement.Single(device=torch.device("cpu")), _batch(), cfg)
    keys = ("loss/policy", "loss/total", "actor/grad_norm") + (("loss/value", "critic/grad_norm") if advantage == "gae" else ())
    if advantage == "gae":
        results = [res["gae"] for res in results]
        assert any(name.startswith("critic.") for name in one["grads"])
    for res in results:
        for key in keys:
            assert res["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-6), key
        assert res["grads"].keys() == one["grads"].keys()
        for name, g in one["grads"].items():
            torch.testing.assert_close(res["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
        for name, p in one["params"].items():
            torch.testing.assert_close(res["params"][name], p, rtol=1e-4, atol=1e-6, msg=name)
    assert one["metrics"]["actor/grad_norm"] > 0


def test_a_sharded_checkpoint_reloads_and_refuses_what_it_must(two_ranks):
    out, results = two_ranks
    assert (out / "checkpoints" / "step_000001" / "state.pt").is_file()
    assert not (out / "checkpoints" / "step_000002").exists()
    from rllab.errors import RllabError

    with pytest.raises(RllabError, match="written by model.strategy = 'fsdp2' on 2 rank"):
        placement.Single(device=torch.device("cpu")).load(out / "checkpoints" / "step_000001")
    for res in results:
        assert res["reloaded_equal"] and res["reloaded_opt_equal"]
        assert "written on 2 rank(s) but this run has 3" in res["other_world"]
        assert "refusing to write the checkpoint after step 2: non-finite" in res["nonfinite"]
        assert "model.world_size = 4 but this run has 2 process(es)" in res["world_refused"]
        assert "model.cpu_offload = true" in res["offload_refused"]


def test_fsdp2_knobs_need_the_fsdp2_strategy():
    from rllab.errors import ConfigError

    with pytest.raises(ConfigError, match="world_size = 2 applies only with strategy = 'fsdp2'"):
        validate({"model": {"world_size": 2}}, lab=Lab(), where="test")
    with pytest.raises(ConfigError, match="cpu_offload = True applies only with strategy = 'fsdp2'"):
        validate({"model": {"cpu_offload": True}}, lab=Lab(), where="test")


def test_data_parallel_refuses_what_would_split_rows_unevenly():
    lab = Lab()

    def validate(data, **kw):
        from rllab.config import validate as plain

        return plain({**data, "model": {"strategy": "fsdp2"}}, **kw)

    with pytest.raises(Exception, match="prompts_per_step = 3 must be a multiple of the world size 2"):
        placement.check_data_parallel(validate({"rollout": {"prompts_per_step": 3}}, lab=lab, where="t"), lab, 2)
    with pytest.raises(Exception, match="dynamic_sampling = true"):
        placement.check_data_parallel(validate({"rollout": {"dynamic_sampling": True}}, lab=lab, where="t"), lab, 2)
    with pytest.raises(Exception, match="advantage 'gpg'.*couples rows"):
        placement.check_data_parallel(validate({"advantage": {"name": "gpg"}}, lab=lab, where="t"), lab, 2)
    placement.check_data_parallel(validate({"advantage": {"name": "reinforce_plus_plus"}}, lab=lab, where="t"), lab, 2)
    placement.check_data_parallel(validate({"rollout": {"prompts_per_step": 3}}, lab=lab, where="t"), lab, 1)
    with pytest.raises(Exception, match="backend 'sglang' does not take the gathered weights"):
        placement.check_data_parallel(validate({"backend": {"name": "sglang", "urls": "http://127.0.0.1:30000"}}, lab=lab, where="t"), lab, 1)


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
