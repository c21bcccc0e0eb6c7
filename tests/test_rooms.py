"""A new algorithm, event listener, logger and CLI command are plugins — no kernel edit needed."""

from __future__ import annotations

import types

import attrs
import pytest
import torch

import rllab
from rllab.cli import main
from rllab.config import load_config
from rllab.models.forward import response_logprobs
from rllab.training.trainer import run_experiment

from .test_trainer import SMALL, _cache  # noqa: F401  (the module-scoped model cache)


@attrs.frozen
class SFTConfig:
    batch_size: int = rllab.knob(8, help="demonstrations per step", ge=1)


class SFT:
    """Supervised fine-tuning on the task's demonstrations: an algorithm written as a plugin."""

    uses = frozenset({"task", "backend"})
    provides: dict = {}

    def __init__(self, *, config):
        self.config = config

    def needs(self, ctx):
        return set()

    def step(self, ctx):
        r = ctx.rollout
        examples = r.task.train_examples(self.config.batch_size, torch.Generator().manual_seed(rllab.algorithm.seed_for(ctx.seed, ctx.step, 9)))
        responses = [r.response_ids(r.task.demonstration(e)) for e in examples]
        comps = [
            rllab.Completion(prompt_ids=tuple(r.encode(e.prompt)), token_ids=tuple(ids), log_probs=(0.0,) * len(ids), finish_reason="stop")
            for e, ids in zip(examples, responses)
        ]
        batch = rllab.RolloutBatch.from_completions(comps, [0.0] * len(comps), pad_token_id=r.tokenizer.pad_token_id)
        lp = response_logprobs(ctx.policy, batch.input_ids, batch.attention_mask, batch.response_length)
        loss = rllab.algorithm.checked_loss(-rllab.ops.masked_mean(lp, batch.response_mask), ctx, "algorithm")
        loss.backward()
        grad = yield rllab.OptimizerStep()
        return {"loss/sft": loss.item(), **grad}


@attrs.frozen
class MemoryLoggerConfig:
    prefix: str = rllab.knob("", help="only keep metrics whose key starts with this")


def room_plugin(events: list, logged: list):
    mod = types.ModuleType("room_plugin")

    @rllab.hookimpl
    def register_algorithms(register):
        def sft(*, config):
            """Supervised fine-tuning on demonstrations."""
            return SFT(config=config)

        register("sft", sft, config=SFTConfig, uses=SFT.uses, provides=SFT.provides)

    @rllab.hookimpl
    def register_loggers(register):
        class Memory:
            def __init__(self, prefix):
                self.prefix = prefix

            def log(self, step, metrics):
                logged.append((step, {k: v for k, v in metrics.items() if k.startswith(self.prefix)}))

            def close(self):
                logged.append(("closed", {}))

        register("memory", lambda *, config, run_dir: Memory(config.prefix), config=MemoryLoggerConfig)

    @rllab.hookimpl
    def on_run_start(run_dir, config, start_step, total_steps, progress):
        events.append(("start", start_step, total_steps))

    @rllab.hookimpl
    def on_step_end(step, metrics):
        events.append(("step", step))

    @rllab.hookimpl
    def on_eval_end(step, metrics):
        events.append(("eval", step, "eval/accuracy" in metrics))

    @rllab.hookimpl
    def on_run_end(run_dir, metrics, history):
        events.append(("end", metrics["steps"], len(history)))

    for name, fn in list(locals().items()):
        if callable(fn) and (name.startswith("register_") or name.startswith("on_")):
            setattr(mod, name, fn)
    return mod


def test_algorithm_logger_and_listener_from_a_plugin(tmp_path):
    events, logged = [], []
    lab = rllab.Lab([room_plugin(events, logged)])
    cfg = load_config(None, [*SMALL, "algorithm=sft", "algorithm.batch_size=4", "train.steps=3", 'loggers=[{name = "memory", prefix = "loss/"}]'], lab=lab)
    # the policy-gradient sections are not this algorithm's: setting one is refused
    assert "policy_loss" in cfg.unused
    summary = run_experiment(cfg, lab=lab, run_dir=tmp_path / "run", progress=False)
    assert summary["steps"] == 3
    assert events[0] == ("start", 0, 3) and events[-1][0] == "end"
    assert [e[1] for e in events if e[0] == "step"] == [1, 2, 3]
    assert ("eval", 0, True) in events and ("eval", 3, True) in events
    losses = [m["loss/sft"] for s, m in logged if isinstance(s, int) and "loss/sft" in m]
    assert len(losses) == 3 and all(v > 0 for v in losses)
    assert all(set(m) <= {"loss/sft"} for s, m in logged if s != "closed")  # the logger's knob took effect
    assert logged[-1][0] == "closed"


def test_cli_command_from_a_plugin_file(tmp_path, capsys):
    plugin = tmp_path / "hello_cmd.py"
    plugin.write_text(
        "import rllab\n"
        "def hello(args):\n"
        "    print('hello', args.who, len(args.lab.names('policy_loss')) > 0)\n"
        "    return 0\n"
        "@rllab.hookimpl\n"
        "def register_commands(subparsers):\n"
        "    p = subparsers.add_parser('hello', help='say hello')\n"
        "    p.add_argument('who')\n"
        "    p.set_defaults(func=hello)\n"
    )
    assert main(["--plugin", str(plugin), "hello", "world"]) == 0
    assert capsys.readouterr().out.strip() == "hello world True"
    assert main(["hello", "world", "--plugin", str(plugin)]) == 0


# --------------------------------------------------------------------------- typed channels


@attrs.frozen
class SteerConfig:
    report: bool = rllab.knob(True, help="return a StepReport (else a dict with the old metric names)")


class Steer:
    """An algorithm that only reports a KL: 1.0 measured on 1000 samples."""

    uses = frozenset({"task", "backend", "kl_controller"})
    provides: dict = {}

    def __init__(self, *, config):
        self.config = config

    def needs(self, ctx):
        return {"reference"}

    def step(self, ctx):
        if self.config.report:
            return rllab.StepReport(metrics={"steer/beta": ctx.kl_coef}, kl=rllab.KLSample(value=1.0, samples=1000))
        return {"steer/beta": ctx.kl_coef, "kl/current": 1.0, "kl/policy_ref": 1.0, "train/rows": 1000.0}
        yield  # a generator with no optimizer step


class Counting:
    """An hf backend that counts its syncs: ``update_weights`` returns the count, ``last_metrics``
    the count the last ``generate`` saw."""

    def __init__(self, inner):
        self.inner, self.syncs, self.seen = inner, 0, -1

    def generate(self, prompts, params):
        self.seen = self.syncs
        return self.inner.generate(prompts, params)

    def last_metrics(self):
        return {"count/seen_by_generate": float(self.seen)}

    def update_weights(self, model):
        self.inner.update_weights(model)
        self.syncs += 1
        return {"count/syncs": float(self.syncs)}

    def close(self):
        self.inner.close()


class Legacy(Counting):
    """A backend written before ``last_metrics`` was part of the protocol."""

    last_metrics = None


def channel_plugin():
    from rllab_backends import hf

    mod = types.ModuleType("channel_plugin")

    @rllab.hookimpl
    def register_algorithms(register):
        def steer(*, config):
            """Reports a KL and nothing else."""
            return Steer(config=config)

        register("steer", steer, config=SteerConfig, uses=Steer.uses, provides=Steer.provides)

    @rllab.hookimpl
    def register_rollout_backends(register):
        register("counting", lambda *, config: Counting(hf.hf(config=config)), config=hf.HFBackendConfig, summary="hf, counting its syncs")
        register("legacy", lambda *, config: Legacy(hf.hf(config=config)), config=hf.HFBackendConfig, summary="hf, no last_metrics")

    mod.register_algorithms, mod.register_rollout_backends = register_algorithms, register_rollout_backends
    return mod


def test_a_step_report_steers_the_kl_controller_and_metric_names_do_not(tmp_path):
    from rllab.training.trainer import Trainer

    lab = rllab.Lab([channel_plugin()])
    knobs = ["algorithm=steer", "kl_controller=adaptive", "kl_controller.kl_coef=0.1", "kl_controller.horizon=1000"]
    tr = Trainer(load_config(None, [*SMALL, *knobs], lab=lab), lab=lab, run_dir=tmp_path / "a", progress=False)
    m = tr.train_step()
    # KL 1.0 ≫ target 0.1: e = +0.2, over 1000 samples / horizon 1000 → β × 1.2
    assert tr.kl_controller.value == pytest.approx(0.12) and m["steer/beta"] == 0.1 and m["train/skipped"] == 1.0
    tr.close()
    # the same numbers under the metric names the trainer once read: β stays
    tr = Trainer(load_config(None, [*SMALL, *knobs, "algorithm.report=false"], lab=lab), lab=lab, run_dir=tmp_path / "b", progress=False)
    tr.train_step()
    assert tr.kl_controller.value == 0.1
    tr.close()


def test_backend_metrics_come_through_the_protocol_and_syncs_land_in_their_step(tmp_path):
    import json

    lab = rllab.Lab([channel_plugin()])
    run_experiment(load_config(None, [*SMALL, "train.steps=2", "backend=counting"], lab=lab), lab=lab, run_dir=tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    # sync 1 precedes step 1; step k's rollout saw k syncs, and the sync after its update (k + 1) is in its own row
    assert [r["count/seen_by_generate"] for r in steps] == [1.0, 2.0]
    assert [r["count/syncs"] for r in steps] == [2.0, 3.0]


def test_a_backend_without_last_metrics_is_refused_by_name(tmp_path):
    from rllab.training.trainer import Trainer

    lab = rllab.Lab([channel_plugin()])
    with pytest.raises(rllab.RllabError, match=r"rollout backend 'legacy' \(plugin channel_plugin\) has no last_metrics\(\).*returns \{\}"):
        Trainer(load_config(None, [*SMALL, "backend=legacy"], lab=lab), lab=lab, run_dir=tmp_path / "run", progress=False)
