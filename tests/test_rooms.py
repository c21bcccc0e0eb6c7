"""A new algorithm, event listener, logger and CLI command are plugins — no kernel edit needed."""

from __future__ import annotations

import types

import attrs
import torch

import rllab
from rllab.cli import main
from rllab.config import load_config
from rllab.models import response_logprobs
from rllab.trainer import run_experiment

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
