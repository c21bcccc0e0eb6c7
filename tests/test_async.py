"""Asynchronous rollouts (rollout.max_staleness): versions, staleness, dropping, schedule, resume, refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import attrs
import pytest
import torch

import rllab
from rllab.rollout import asynchronous as asyncrollout
from rllab.config import load_config
from rllab.errors import ConfigError
from rllab.rollout.episodes import EpisodeResult
from rllab.rollout.stage import Rollouts, RolloutStage
from rllab.training.trainer import Trainer

from .tiny import TINY, overrides

# entropy bonus and no warm-up: every step changes the weights, whatever the (tiny) rewards
SMALL = [*overrides(TINY), "train.steps=4", "train.seed=2", "algorithm.entropy_coef=0.05", "train.warmup_steps=0", "train.lr=3e-3"]


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def cfg(*extra, rl=True):
    return load_config(None, [*(SMALL if rl else SMALL[:-3]), *extra])


def strip(rows):
    """What must be reproducible: everything but timings and memory."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


# --------------------------------------------------------------------------- versions and staleness


def test_hf_backend_counts_its_syncs_and_tags_every_completion():
    from transformers import LlamaConfig, LlamaForCausalLM

    from rllab_backends.hf import HFBackend, HFBackendConfig

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, eos_token_id=1, pad_token_id=0))
    b = HFBackend(HFBackendConfig(device="cpu"))
    assert b.version == 0
    params = rllab.SamplingParams(n=2, max_new_tokens=3, temperature=1.0, seed=1)
    b.update_weights(model)
    assert {c.weight_version for c in b.generate([[2, 3]], params)} == {"1"}
    b.update_weights(model)
    b.update_weights(model.state_dict())
    assert {c.weight_version for c in b.generate([[2, 3], [4]], params)} == {"3"}


def _scored(keep, versions):
    n = len(keep)
    comps = [rllab.Completion(prompt_ids=(1,), token_ids=(2,), log_probs=(0.0,), finish_reason="stop", weight_version=v)
             for v in versions]
    episodes = [EpisodeResult(example=rllab.Example(prompt="p", answer=""), completion=c, token_rewards=(0.0,), reward=0.0, keep=k)
                for c, k in zip(comps, keep)]
    assert len(episodes) == n
    return Rollouts(examples=[], episodes=episodes, metrics={"rollout/reward": 0.5})


def test_sample_versions_read_the_backend_else_the_batch_version():
    s = _scored([True] * 3, ["5", None, "bad"])
    assert asyncrollout.sample_versions(s, produced_at=7).tolist() == [5, 7, 7]


def test_staleness_dropped_samples_and_their_counts():
    # trainer at version 4, k = 1: staleness 0, 1, 2, 3, 2 (the last was already dropped for a reward error)
    s = _scored([True, True, True, True, False], ["4", "3", "2", "1", "2"])
    versions = asyncrollout.sample_versions(s, produced_at=0)
    out = asyncrollout.apply_staleness(s, versions, 4, max_staleness=1, stale="drop")
    assert [e.staleness for e in out.episodes] == [0, 1, 2, 3, 2]
    assert out.keep.tolist() == [True, True, False, False, False]
    m = out.metrics
    assert m["async/dropped"] == 2.0 and m["async/stale_trained"] == 0.0  # the reward error's sample is not counted twice
    assert m["async/staleness_mean"] == pytest.approx(8 / 5) and m["async/staleness_max"] == 3.0
    assert [m[f"async/staleness_{j}"] for j in range(4)] == [1.0, 1.0, 2.0, 1.0]
    assert m["rollout/kept_frac"] == pytest.approx(2 / 5) and m["rollout/reward"] == 0.5

    kept = asyncrollout.apply_staleness(s, versions, 4, max_staleness=1, stale="train")
    assert kept.keep.tolist() == [True, True, True, True, False]
    assert kept.metrics["async/dropped"] == 0.0 and kept.metrics["async/stale_trained"] == 2.0


def test_versioned_backend_counts_syncs_and_keeps_each_threads_metrics():
    class Inner:
        calls = 0

        def generate(self, prompts, params):
            Inner.calls += 1
            return []

        def last_metrics(self):
            return {"n": float(Inner.calls)}

        def update_weights(self, model):
            return {"time/weight_sync": 0.0}

        def close(self):
            pass

    b = asyncrollout.VersionedBackend(Inner())
    b.update_weights(None)
    b.update_weights(None)
    assert b.version == 2
    b.generate([], None)
    import threading

    other = {}
    t = threading.Thread(target=lambda: (b.generate([], None), other.update(b.last_metrics())))
    t.start()
    t.join()
    assert other == {"n": 2.0} and b.last_metrics() == {"n": 1.0}


# --------------------------------------------------------------------------- the loop


def test_k0_is_the_synchronous_loop_untouched(tmp_path):
    tr = Trainer(cfg("rollout.max_staleness=0"), run_dir=tmp_path, progress=False)
    try:
        assert not tr.rollout.samples_ahead and type(tr.rollout) is RolloutStage and type(tr.context().rollout) is RolloutStage
        assert not isinstance(tr.backend, asyncrollout.VersionedBackend)
        m = tr.train_step()
        assert not any(k.startswith("async/") for k in m) and "time/rollout_wait" not in m
    finally:
        tr.close()


def _batches(tr, steps):
    """Train ``steps`` steps; each step's (token ids, staleness) as the algorithm received them."""
    seen = []
    original = tr.algorithm.step

    def spy(ctx):
        scored = ctx.rollout.sample(ctx.step)
        seen.append(([c.token_ids for c in scored.completions], [e.staleness for e in scored.episodes]))
        ctx.rollout.sample = lambda step, _s=scored: _s  # the step's own call gets this batch
        try:
            return (yield from original(ctx))
        finally:
            del ctx.rollout.sample

    tr.algorithm.step = spy
    rows = [tr.train_step() for _ in range(steps)]
    return seen, rows


def test_batch_of_step_s_is_sampled_from_step_s_prompts_with_the_weights_of_step_s_minus_k(tmp_path):
    torch.set_num_threads(1)  # the async trainer's share on this machine: both runs compute alike
    k = 2
    tr = Trainer(cfg(f"rollout.max_staleness={k}"), run_dir=tmp_path / "a", progress=False)
    sync = Trainer(cfg(), run_dir=tmp_path / "s", progress=False)
    try:
        seen, rows = _batches(tr, 4)
        assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 2.0, 2.0]
        assert [st for _, st in seen] == [[min(s, k)] * 16 for s in range(4)]
        assert rows[2]["async/staleness_2"] == 16.0 and rows[3]["async/dropped"] == 0.0
        assert all("time/rollout_wait" in r for r in rows)
        # the synchronous trainer's weights before step s − k sample the same batch s
        expected = [sync.rollout.sample(s) for s in range(k + 1)]  # W(0) for batches 0 … k
        from_w0 = sync.rollout.sample(3)
        sync.train_step()
        expected.append(sync.rollout.sample(3))  # W(1): the weights after step 0
        assert [c.token_ids for c in from_w0.completions] != [c.token_ids for c in expected[3].completions]  # the check can tell
        for (ids, _), want in zip(seen, expected):
            assert ids == [c.token_ids for c in want.completions]
    finally:
        tr.close()
        sync.close()
        torch.set_num_threads(2)


def test_async_run_is_deterministic_and_resumes_exactly_from_a_checkpoint(tmp_path):
    def run(path, steps, resume_from=None):
        tr = Trainer(cfg("rollout.max_staleness=2"), run_dir=path, progress=False)
        try:
            if resume_from is not None:
                tr.load_checkpoint(resume_from)
            rows = [tr.train_step() for _ in range(steps)]
            ckpt = tr.save_checkpoint() if resume_from is None else None
            return rows, ckpt, {k: v.clone() for k, v in tr.policy.state_dict().items()}
        finally:
            tr.close()

    a, _, wa = run(tmp_path / "a", 4)
    b, ckpt, _ = run(tmp_path / "b", 2)
    state = torch.load(ckpt / "state.pt", weights_only=False)
    assert sorted(state["rollout_ahead"]["batches"]) == [2, 3]  # the k batches sampled ahead travel with it
    c, _, wc = run(tmp_path / "c", 2, resume_from=ckpt)
    assert strip(b) == strip(a[:2])
    assert strip(c) == strip(a[2:])  # the same batches, staleness included, after the resume
    assert all(torch.equal(wa[k], wc[k]) for k in wa)


def test_a_batch_the_checkpoint_cannot_hold_is_sampled_again_and_counted(tmp_path):
    tr = Trainer(cfg("rollout.max_staleness=1"), run_dir=tmp_path / "a", progress=False)
    try:
        tr.train_step()
        scored, at = tr.rollout.futures[1].result()
        tr.rollout.futures[1] = _done((attrs.evolve(scored, metrics={**scored.metrics, "x": lambda: 0}), at))
        ckpt = tr.save_checkpoint()
    finally:
        tr.close()
    assert torch.load(ckpt / "state.pt", weights_only=False)["rollout_ahead"]["regenerate"] == [1]
    again = Trainer(cfg("rollout.max_staleness=1"), run_dir=tmp_path / "b", progress=False)
    try:
        again.load_checkpoint(ckpt)
        m = again.train_step()
        assert m["async/regenerated"] == 1.0 and m["async/staleness_max"] == 0.0  # sampled with the checkpoint's weights
    finally:
        again.close()


def _done(value):
    import concurrent.futures

    f = concurrent.futures.Future()
    f.set_result(value)
    return f


def test_stale_samples_are_dropped_or_trained_and_counted_in_a_run(tmp_path):
    class Lagging(asyncrollout.VersionedBackend):
        """Reports every completion two syncs older than it is (a server that lags)."""

        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            return [attrs.evolve(c, weight_version=str(int(c.weight_version) - 2)) for c in out]

    for stale, kept in (("drop", 0.0), ("train", 1.0)):
        tr = Trainer(cfg("rollout.max_staleness=1", f"rollout.stale={stale}"), run_dir=tmp_path / stale, progress=False)
        try:
            tr.backend.__class__ = Lagging
            m = tr.train_step()  # staleness 2 > k = 1 for all 16 samples
            assert m["async/staleness_max"] == 2.0 and m["rollout/kept_frac"] == kept
            assert m["async/dropped" if stale == "drop" else "async/stale_trained"] == 16.0
            assert m.get("train/skipped", 0.0) == (1.0 if stale == "drop" else 0.0)
        finally:
            tr.close()


@pytest.mark.slow  # two CLI runs and a resume (~20 s quiet, ~55 s under load); the in-process resume test above is fast
def test_kill_9_then_resume_with_k2_matches_the_uninterrupted_run(tmp_path):
    args = [*SMALL, "train.steps=6", "train.checkpoint_every=2", "rollout.max_staleness=2", "train.eval_every=0"]
    cmd = [sys.executable, "-m", "rllab.cli", "run", *args, "-q"]
    full = subprocess.run([*cmd, "--run-dir", str(tmp_path / "full")], capture_output=True, text=True)
    assert full.returncode == 0, full.stderr
    run = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--run-dir", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run / "checkpoints" / "step_000002" / "state.pt").exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run([sys.executable, "-m", "rllab.cli", "run", "--resume", str(run), "-q"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [r["step"] for r in a]
    assert strip(b) == strip(a)
    assert max(r.get("async/staleness_max", 0) for r in b) == 2.0


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "extra, named",
    [
        (["backend.share_weights=true"], ["backend.share_weights", "rollout.max_staleness = 1"]),
        (["algorithm=online_dpo"], ["'online_dpo'", "rollout.max_staleness = 1"]),
        (["algorithm=dpo"], ["'dpo'"]),
        (["advantage=remax"], ["'remax'", "ReMax"]),
        (["model.strategy=fsdp2"], ["model.strategy = 'fsdp2'"]),
    ],
    ids=["share_weights", "online_dpo", "dpo", "remax", "fsdp2"],
)
def test_combinations_that_cannot_run_ahead_are_refused_by_name(tmp_path, extra, named):
    with pytest.raises(ConfigError) as e:  # at load, before anything is built
        cfg("rollout.max_staleness=1", *extra, rl=False)
    for word in named:
        assert word in str(e.value)


def test_stale_without_max_staleness_is_refused():
    with pytest.raises(ConfigError, match=r"stale = 'train' applies only with max_staleness > 0"):
        load_config(None, ["rollout.stale=train"])


def test_a_schedule_that_changes_rollout_settings_is_refused(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[rollout]\nmax_staleness = 2\n\n[[schedule]]\nstep = 3\nset = { "rollout.temperature" = 0.5 }\n')
    with pytest.raises(ConfigError, match=r"step 3 changes rollout.temperature"):
        load_config(toml, SMALL)


@pytest.mark.slow  # starts a stand-in server process (~40 s on a loaded 2-core machine)
def test_sglang_backend_samples_ahead_from_the_server_with_its_reported_versions(tmp_path):
    """backend = sglang (the stand-in server): the producer's requests for step t+1 run while step
    t trains; staleness comes from the versions the server reports."""
    from tests.sglang_standin import StandIn

    with StandIn(None, lifetime_s=300) as server:
        tr = Trainer(cfg("rollout.max_staleness=1", "backend=sglang", f"backend.urls={server.url}"), run_dir=tmp_path, progress=False)
        try:
            seen, rows = _batches(tr, 3)
        finally:
            tr.close()
        versions = [u["weight_version"] for u in server.updates]
    assert versions == ["1", "2", "3", "4"]  # the first sync, then one per step
    assert [st for _, st in seen] == [[0] * 16, [1] * 16, [1] * 16]
    assert all(r["rollout/stale"] == 0 for r in rows)  # no sync ever landed in the middle of a request


# --------------------------------------------------------------------------- learning (minutes each)


@pytest.mark.slow
def test_the_default_job_still_learns_with_max_staleness_2(tmp_path):
    """`rllab run rollout.max_staleness=2`: the default job's budget lifts held-out accuracy by
    at least 15 points, as the synchronous run does (tests/plugins/test_tasks_builtin.py)."""
    from rllab.training.trainer import run_experiment

    c = load_config(None, ["rollout.max_staleness=2", "train.checkpoint_every=0"])
    summary = run_experiment(c, run_dir=tmp_path / "run", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("async/staleness_max", 0) for r in rows) == 2.0
    assert summary["final/accuracy"] - summary["initial/accuracy"] >= 0.15, summary


@pytest.mark.slow  # spawns a process that imports torch and transformers (~40 s on a loaded 2-core machine)
def test_the_sampler_in_a_child_process_samples_as_in_process_and_follows_each_sync():
    """backend.process = true: the same completions as the in-process sampler, before and after
    a sync that changes the weights (CPU float32 weights are shared, a sync copies into them)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rllab_backends.hf import HFBackendConfig, hf

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, eos_token_id=1, pad_token_id=0))
    here, child = hf(config=HFBackendConfig(device="cpu")), hf(config=HFBackendConfig(device="cpu", process=True))
    params = rllab.SamplingParams(n=3, max_new_tokens=5, temperature=1.0, seed=4)
    torch.set_num_threads(1)  # the child's (OMP_NUM_THREADS=1): the same arithmetic
    try:
        samples = []
        for _ in range(2):
            here.update_weights(model)
            child.update_weights(model)
            a, b = here.generate([[2, 3], [4]], params), child.generate([[2, 3], [4]], params)
            # the same samples; their log-probs to float32 rounding (the child's kernels may round a
            # last bit otherwise: 2.4e-7 apart on one token was seen)
            assert [{**attrs.asdict(c), 'log_probs': None} for c in a] == [{**attrs.asdict(c), 'log_probs': None} for c in b]
            assert all(torch.allclose(torch.tensor(x.log_probs), torch.tensor(y.log_probs), rtol=0, atol=1e-5) for x, y in zip(a, b))
            assert {c.weight_version for c in b} == {str(child.version)}
            samples.append([c.token_ids for c in b])
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p))
        assert samples[0] != samples[1]  # the second sync reached the child
    finally:
        here.close()
        child.close()
        torch.set_num_threads(2)


def test_a_sampler_process_cannot_share_the_trainers_module():
    from rllab_backends.hf import HFBackendConfig

    with pytest.raises(ValueError, match="share_weights"):
        HFBackendConfig(process=True, share_weights=True)


def test_an_environments_batches_follow_the_same_schedule(tmp_path):
    """env = retry_addition (multi-turn episodes): batch s is step s's episodes played with W(s − k)."""
    from pathlib import Path

    lab = rllab.Lab([str(Path(__file__).resolve().parents[1] / "examples" / "retry_env.py")])
    k = 1
    env = ["env=retry_addition", "env.tries=2"]
    torch.set_num_threads(1)
    tr = Trainer(load_config(None, [*SMALL, *env, f"rollout.max_staleness={k}"], lab=lab), lab=lab, run_dir=tmp_path / "a", progress=False)
    sync = Trainer(load_config(None, [*SMALL, *env], lab=lab), lab=lab, run_dir=tmp_path / "s", progress=False)
    try:
        seen, rows = _batches(tr, 3)
        assert [st for _, st in seen] == [[0] * 16, [1] * 16, [1] * 16]
        assert all(r["env/turns"] >= 1 for r in rows)
        expected = [sync.rollout.sample(0), sync.rollout.sample(1)]
        sync.train_step()
        expected.append(sync.rollout.sample(2))
        for (ids, _), want in zip(seen, expected):
            assert ids == [c.token_ids for c in want.completions]
    finally:
        tr.close()
        sync.close()
        torch.set_num_threads(2)


def test_k1_equals_the_synchronous_loop_with_weights_pushed_one_step_late(tmp_path):
    """An oracle without threads: the synchronous loop whose backend always receives the weights
    of one sync before (so step s samples with W(s − 1)) trains exactly as max_staleness = 1."""

    class OneLate:
        def __init__(self, inner, first):
            self.inner, self.prev = inner, {k: v.clone() for k, v in first.items()}

        def update_weights(self, model):
            new = {k: v.clone() for k, v in model.state_dict().items()}
            self.inner.update_weights(self.prev)
            self.prev = new

        def __getattr__(self, name):
            return getattr(self.inner, name)

    torch.set_num_threads(1)
    try:
        late = Trainer(cfg(), run_dir=tmp_path / "late", progress=False)
        late.backend = late.rollout.backend = OneLate(late.backend, late.policy.state_dict())
        ahead = Trainer(cfg("rollout.max_staleness=1"), run_dir=tmp_path / "ahead", progress=False)
        try:
            a = [late.train_step() for _ in range(4)]
            b = [ahead.train_step() for _ in range(4)]
            drop = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("async/", "time/", "perf/"))} for r in rows]  # noqa: E731
            assert drop(a) == drop(b)
            assert all(torch.equal(x, y) for x, y in zip(late.policy.state_dict().values(), ahead.policy.state_dict().values()))
        finally:
            late.close()
            ahead.close()
    finally:
        torch.set_num_threads(2)


@pytest.mark.slow
def test_an_environment_learns_with_max_staleness_2_and_tis(tmp_path):
    """env = retry_addition, max_staleness = 2 with token_truncate (TIS): the training reward of
    the last 20 of 100 steps is above the first 20 by 0.05 (2026-11-26, seed 1: 0.167 → 0.298;
    without a correction it fell to 0.092, the synchronous run rose to 0.288: docs/async.md)."""
    from pathlib import Path

    from rllab.training.trainer import run_experiment

    lab = rllab.Lab([str(Path(__file__).resolve().parents[1] / "examples" / "retry_env.py")])
    c = load_config(None, ["env=retry_addition", "env.tries=3", "train.steps=100", "train.seed=1", "rollout.max_staleness=2",
                           "correction=token_truncate", "train.eval_every=0", "train.checkpoint_every=0"], lab=lab)
    run_experiment(c, lab=lab, run_dir=tmp_path / "run", progress=False)
    rewards = [json.loads(x)["rollout/reward"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "rollout/reward" in x]
    assert sum(rewards[-20:]) / 20 - sum(rewards[:20]) / 20 >= 0.05, rewards


def test_an_async_batch_selects_every_per_row_field_its_staleness_included(tmp_path):
    """A sub-batch of an asynchronous batch keeps each row's staleness (and every other per-row
    field): ``select`` indexes every tensor field, not a hand-kept list of them."""
    tr = Trainer(cfg("rollout.max_staleness=1"), run_dir=tmp_path, progress=False)
    try:
        seen = []
        original = tr.algorithm.step

        def spy(ctx):
            scored = ctx.rollout.sample(ctx.step)
            seen.append(ctx.rollout.to_batch(scored))
            ctx.rollout.sample = lambda step, _s=scored: _s  # the step's own call gets this batch
            try:
                return (yield from original(ctx))
            finally:
                del ctx.rollout.sample

        tr.algorithm.step = spy
        tr.train_step()
        tr.train_step()
        batch = seen[-1]
        assert batch.staleness is not None and batch.staleness.shape == (batch.input_ids.shape[0],)
        batch = attrs.evolve(batch, staleness=torch.arange(batch.input_ids.shape[0]))  # tell the rows apart
        rows = torch.tensor([2, 0, 5])
        sub = batch.select(rows)
        for f in attrs.fields(type(batch)):
            value = getattr(batch, f.name)
            if isinstance(value, torch.Tensor):
                assert torch.equal(getattr(sub, f.name), value[rows]), f.name
            else:
                assert getattr(sub, f.name) == value, f.name
        assert sub.staleness.tolist() == [2, 0, 5]
        mask = torch.zeros(batch.input_ids.shape[0], dtype=torch.bool)
        mask[[1, 3]] = True
        assert batch.select(mask).staleness.tolist() == [1, 3]
    finally:
        tr.close()
