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
