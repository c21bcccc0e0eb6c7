"""What the progress output says: why the warm start stopped, the training bar's last evaluation,
its mean seconds per step, its time fields at 80 columns, and the done line's next steps."""

import io
from pathlib import Path

from rich.console import Console

import rllab_console as rc
from rllab.config import load_config
from rllab.models.progress import stop_reason


def test_warm_start_says_why_it_stopped():
    assert stop_reason(330, 600, 0.26, 0.25) == (
        "warm start stopped at step 330 of 600: probe accuracy 26% reached the target 25% (model.warm_start.target_accuracy)")
    assert stop_reason(600, 600, 0.30, 0.25).startswith("warm start stopped at its last step (600): probe accuracy 30%")
    assert stop_reason(600, 600, 0.10, 0.25).startswith(
        "warm start ran all 600 steps (model.warm_start.steps) without reaching the target 25%: probe accuracy 10%")
    assert stop_reason(50, 50, 0.10, None) == "warm start ran all 50 steps (no target accuracy set): probe accuracy 10%"
    # the last probe's place against the target known before its last scores: said, its value to come
    later = "; its value goes into the model's record (warm/probe_accuracy) once its last scores are in"
    assert stop_reason(330, 600, None, 0.25, "reached") == (
        "warm start stopped at step 330 of 600: probe accuracy reached the target 25% (model.warm_start.target_accuracy)" + later)
    assert stop_reason(600, 600, None, 0.25, "below") == (
        "warm start ran all 600 steps (model.warm_start.steps) without reaching the target 25%: probe accuracy under 25%"
        + later + "; more steps or a lower model.warm_start.target_accuracy would change that")
    assert stop_reason(330, 600, 0.26, 0.25, "reached").startswith("warm start stopped at step 330 of 600: probe accuracy 26%")


def test_bar_text_shows_the_mean_step_time_before_the_metrics():
    m = {"rollout/reward": 0.5, "time/step": 0.16}
    assert rc.describe(m, 0.55, mean_step=0.38) == "eval 55.0%  0.38s/step (mean)  reward 0.500"
    assert rc.describe(m, None) == "0.16s/step (last)  reward 0.500"


def _reporter():
    cfg = load_config(None, [])
    return rc._Reporter(Path("unused"), cfg, start=0, total=4, progress=False)


def test_bar_ends_on_the_final_evaluation_and_averages_the_steps():
    r = _reporter()
    r.eval({"eval/accuracy": 0.2})  # before training
    for seconds in (0.1, 0.2, 0.6):
        r.step({"time/step": seconds, "rollout/reward": 0.25})
    assert r.describe().startswith("eval 20.0%  0.30s/step (mean)")
    r.eval({"eval/accuracy": 0.58})  # the final evaluation, after the last step
    assert r.describe().startswith("eval 58.0%  0.30s/step (mean)")


def test_bar_keeps_its_counts_and_times_at_80_columns():
    for width in (80, 100):
        buf = io.StringIO()
        con = Console(file=buf, width=width, force_terminal=True, color_system=None)
        bar = rc.training_bar(con, 400)
        task = bar.add_task("", total=400)
        long = rc.describe({"rollout/reward": 0.4, "actor/entropy": 0.8, "actor/approx_kl": 0.01, "actor/clipfrac": 0.02}, 0.58, 0.38)
        bar.update(task, completed=399, description=long)
        con.print(bar.get_renderable())
        line = buf.getvalue().rstrip("\n")
        assert len(line) <= width and "\n" not in line
        assert "399/400" in line and "0:00:00" in line and "-:--:--" in line and "eval 58.0%  0.38s/step" in line
        assert line.endswith("…")  # the metrics are cut, not the times


def test_done_line_names_what_to_open_next(tmp_path):
    assert rc.next_steps(tmp_path) == f"next: score the model: rllab eval {tmp_path}"
    (tmp_path / "curves.png").write_bytes(b"")
    (tmp_path / "traces.jsonl").write_text("")
    (tmp_path / "model").mkdir()
    assert rc.next_steps(tmp_path) == (
        f"next: the curves {tmp_path / 'curves.png'}; the samples: rllab traces {tmp_path}; "
        f"score the model: rllab eval {tmp_path}; the model (Hugging Face): {tmp_path / 'model'}")
