import json
import math

import pytest


def test_jsonl_appends_valid_lines(lab, tmp_path):
    lg = lab.get("logger", "jsonl")(run_dir=tmp_path)
    lg.log(0, {"rollout/reward": 0.5, "actor/approx_kl": float("nan")})
    lg.log(1, {"rollout/reward": 0.75})
    lg.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 0, "rollout/reward": 0.5, "actor/approx_kl": "nan"}, {"step": 1, "rollout/reward": 0.75}]


def test_tensorboard_writes_events(lab, tmp_path):
    pytest.importorskip("tensorboard")
    lg = lab.get("logger", "tensorboard")(run_dir=tmp_path)
    lg.log(0, {"rollout/reward": 0.5})
    lg.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    [ev] = acc.Scalars("rollout/reward")
    assert ev.step == 0 and math.isclose(ev.value, 0.5)


def test_loggers_listen_to_their_runs_events_only_until_closed(tmp_path):
    """The trainer never calls a logger: RunLoggers turns on_step_end / on_eval_end of its own run
    directory into log(step, metrics), ahead of the other listeners, and closes them once."""
    import rllab
    from rllab.training.listeners import RunLoggers

    class Memory:
        def __init__(self):
            self.rows, self.closed = [], 0

        def log(self, step, metrics):
            self.rows.append((step, dict(metrics)))

        def close(self):
            self.closed += 1

    lab, memory = rllab.Lab(), Memory()
    listener = RunLoggers(lab=lab, loggers=[memory], run_dir=tmp_path / "a")
    lab.hook.on_eval_end(step=0, metrics={"eval/accuracy": 0.5}, run_dir=tmp_path / "a")
    lab.hook.on_step_end(step=1, metrics={"rollout/reward": 1.0}, run_dir=tmp_path / "a")
    lab.hook.on_step_end(step=1, metrics={"rollout/reward": 2.0}, run_dir=tmp_path / "b")  # another run's
    assert memory.rows == [(0, {"eval/accuracy": 0.5}), (1, {"rollout/reward": 1.0})]
    listener.close()
    listener.close()
    lab.hook.on_step_end(step=2, metrics={"rollout/reward": 3.0}, run_dir=tmp_path / "a")
    assert memory.closed == 1 and len(memory.rows) == 2
