"""The wandb and MLflow loggers, against the libraries themselves (offline: wandb's run files,
MLflow's local file store), read back with wandb's own record format and ``MlflowClient``."""

from __future__ import annotations

import json
import math
import struct
import sys
import time
from pathlib import Path

import pytest

import rllab

from ..tiny import TINY, overrides

wandb = pytest.importorskip("wandb")
mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


def wandb_records(run_dir: Path, timeout: float = 30.0) -> list:
    """Every record of the run's offline ``.wandb`` files, oldest run first, once each file holds
    its run's exit record (wandb's service process may still be flushing when ``finish`` returns)."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.parent.name)
        per_file = [_read_records(f) for f in files]
        if (files and all(any(r.WhichOneof("record_type") == "exit" for r in recs) for recs in per_file)) or time.monotonic() > deadline:
            return [r for recs in per_file for r in recs]
        time.sleep(0.2)


def _read_records(path: Path) -> list:
    """wandb's log format (a ':W&B' header, then LevelDB-style 32 KiB blocks of chunks) holding its protobuf records."""
    out = []
    data, pos, buf = path.read_bytes(), 7, b""
    if len(data) < 7:
        return out
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (n == 0 and kind == 0):  # block padding
            pos += left
            continue
        if pos + 7 + n > len(data):  # a chunk still being written
            break
        buf, pos = buf + data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a full record, or the last chunk of one
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def _items(updates) -> dict:
    return {(u.key or "/".join(u.nested_key)): json.loads(u.value_json) for u in updates}


def wandb_history(records) -> list[dict]:
    return [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]


def wandb_of(records, kind: str) -> dict:
    """The merged config or summary updates of the records."""
    out: dict = {}
    for r in records:
        if r.WhichOneof("record_type") == kind:
            out.update(_items(getattr(r, kind).update))
        if kind == "config" and r.WhichOneof("record_type") == "run":
            out.update(_items(r.run.config.update))
    return out


def mlflow_run(run_dir: Path):
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    return client, client.get_run((run_dir / "mlflow_run_id").read_text().strip())


def test_a_run_logged_to_jsonl_wandb_and_mlflow_reads_back_the_same(tmp_path):
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    cfg = load_config(None, [*overrides(TINY), "train.steps=2", "train.lr=3e-4", 'loggers=["jsonl", "wandb", "mlflow"]'])
    run = tmp_path / "run"
    summary = run_experiment(cfg, run_dir=run, progress=False)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rewards = {r["step"]: r["rollout/reward"] for r in rows if "rollout/reward" in r}
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    assert sorted(rewards) == [1, 2] and sorted(evals) == [0, 2]
    final_ckpt = str(run / "checkpoints" / "step_000002")

    records = wandb_records(run)
    history = wandb_history(records)
    assert {h["_step"]: h["rollout/reward"] for h in history if "rollout/reward" in h} == pytest.approx(rewards)
    assert {h["_step"]: h["eval/accuracy"] for h in history if "eval/accuracy" in h} == pytest.approx(evals)
    config = wandb_of(records, "config")
    assert config["train"]["lr"] == 3e-4 and config["train"]["steps"] == 2
    wsum = wandb_of(records, "summary")
    assert wsum["final/checkpoint"] == final_ckpt and wsum["final/accuracy"] == pytest.approx(summary["final/accuracy"])
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [0]

    client, mrun = mlflow_run(run)
    assert mrun.info.status == "FINISHED" and mrun.info.run_name == "run"
    got = {m.step: m.value for m in client.get_metric_history(mrun.info.run_id, "rollout/reward")}
    assert got == pytest.approx(rewards)
    got = {m.step: m.value for m in client.get_metric_history(mrun.info.run_id, "eval/accuracy")}
    assert got == pytest.approx(evals)
    assert mrun.data.params["train.lr"] == "0.0003" and mrun.data.params["train.steps"] == "2"
    assert mrun.data.tags["final/checkpoint"] == final_ckpt
    assert math.isclose(mrun.data.metrics["final/accuracy"], summary["final/accuracy"])
    # the samples, by default 4 a step in both (traces = 4)
    assert [(h["_step"], h["traces/nrows"]) for h in history if "traces/nrows" in h] == [(1, 4), (2, 8)]
    table = json.loads(Path(client.download_artifacts(mrun.info.run_id, "traces.json", str(tmp_path / "dl"))).read_text())
    assert [r[0] for r in table["data"]] == [1, 1, 1, 1, 2, 2, 2, 2]


def _finished(run_dir: Path, *, adapter: bool) -> None:
    """What a finished LoRA run leaves for its loggers: final.json, a checkpoint, the adapter."""
    (run_dir / "final.json").write_text(json.dumps({"final/accuracy": 0.75, "final/reward": 0.5, "steps": 3, "solved_when": "reward ≥ 1"}))
    ckpt = run_dir / "checkpoints" / "step_000003"
    ckpt.mkdir(parents=True)
    (ckpt / "state.pt").write_bytes(b"x")
    if adapter:
        (run_dir / "adapter").mkdir()
        (run_dir / "adapter" / "adapter_config.json").write_text("{}")


def test_log_model_stores_the_adapter_in_both_trackers(lab, tmp_path):
    for name in ("wandb", "mlflow"):
        lg = lab.get("logger", name, log_model=True)(run_dir=tmp_path)
        lg.log(1, {"rollout/reward": 0.25})
        if name == "wandb":
            _finished(tmp_path, adapter=True)
        lg.close()
    [art] = [r.artifact for r in wandb_records(tmp_path) if r.WhichOneof("record_type") == "artifact"]
    assert art.type == "model" and "final" in art.aliases
    assert [c.path for c in art.manifest.contents] == ["adapter_config.json"]
    client, mrun = mlflow_run(tmp_path)
    assert [a.path for a in client.list_artifacts(mrun.info.run_id, "model")] == ["model/adapter_config.json"]
    assert mrun.data.tags["final/adapter"] == str(tmp_path / "adapter")


def test_without_log_model_no_files_are_copied(lab, tmp_path):
    _finished(tmp_path, adapter=True)
    for name in ("wandb", "mlflow"):
        lab.get("logger", name)(run_dir=tmp_path).close()
    assert not [r for r in wandb_records(tmp_path) if r.WhichOneof("record_type") == "artifact"]
    client, mrun = mlflow_run(tmp_path)
    assert not client.list_artifacts(mrun.info.run_id, "model") and mrun.data.tags["final/adapter"] == str(tmp_path / "adapter")


def test_a_run_that_stops_early_ends_failed(lab, tmp_path):
    for name in ("wandb", "mlflow"):
        lg = lab.get("logger", name)(run_dir=tmp_path)
        lg.log(1, {"rollout/reward": 0.25})
        lg.close()  # no final.json: the run stopped on an error
    assert [r.exit.exit_code for r in wandb_records(tmp_path) if r.WhichOneof("record_type") == "exit"] == [1]
    assert mlflow_run(tmp_path)[1].info.status == "FAILED"


def test_a_resumed_run_continues_the_same_tracker_runs(lab, tmp_path):
    first = {name: lab.get("logger", name)(run_dir=tmp_path) for name in ("wandb", "mlflow")}
    for lg in first.values():
        lg.start({"train": {"steps": 2, "lr": 0.1}})
        lg.log(1, {"rollout/reward": 0.25})
        lg.close()
    again = {name: lab.get("logger", name)(run_dir=tmp_path) for name in ("wandb", "mlflow")}
    for lg in again.values():
        lg.start({"train": {"steps": 4, "lr": 0.1}})  # train.steps raised on resume: not an error
        lg.log(3, {"rollout/reward": 0.5})
    _finished(tmp_path, adapter=False)
    for lg in again.values():
        lg.close()
    assert again["wandb"].run.id == first["wandb"].run.id
    client, mrun = mlflow_run(tmp_path)
    assert again["mlflow"].run_id == first["mlflow"].run_id and mrun.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(mrun.info.run_id, "rollout/reward")] == [(1, 0.25), (3, 0.5)]
    assert json.loads(Path(client.download_artifacts(mrun.info.run_id, "rllab_config.json", str(tmp_path / "dl"))).read_text())["train"]["steps"] == 4


def test_wandb_offline_sets_wandb_mode_and_tracking_uri_is_honoured(lab, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")  # the knob says offline: no network, whatever the environment says
    lab.get("logger", "wandb")(run_dir=tmp_path / "w").close()
    import os

    assert os.environ["WANDB_MODE"] == "offline"
    store = tmp_path / "elsewhere"
    lg = lab.get("logger", "mlflow", tracking_uri=store.as_uri(), experiment="exp")(run_dir=tmp_path / "m")
    lg.log(1, {"rollout/reward": 1.0})
    lg.close()
    client = MlflowClient(tracking_uri=store.as_uri())
    assert client.get_experiment_by_name("exp") is not None and not (tmp_path / "m" / "mlruns").exists()
    assert client.get_metric_history(lg.run_id, "rollout/reward")[0].value == 1.0


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_missing_library_names_the_extra(lab, tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(rllab.RllabError, match=rf"pip install 'rllab\[{name}\]'"):
        lab.get("logger", name)(run_dir=tmp_path)


def test_run_loggers_hand_the_config_to_loggers_that_start(tmp_path):
    from rllab.config import load_config
    from rllab.training.listeners import RunLoggers

    class Starts:
        def __init__(self):
            self.configs = []

        def start(self, config):
            self.configs.append(config)

        def log(self, step, metrics):
            pass

        def close(self):
            pass

    lab, lg = rllab.Lab(), Starts()
    listener = RunLoggers(lab=lab, loggers=[lg, object.__new__(type("Plain", (), {"log": lambda *a: None, "close": lambda s: None}))], run_dir=tmp_path)
    cfg = load_config(None, ["train.lr=0.01"])
    common = dict(config=cfg, start_step=0, total_steps=1, progress=False, solved_when="reward ≥ 1")
    lab.hook.on_run_start(run_dir=tmp_path / "other", **common)
    lab.hook.on_run_start(run_dir=tmp_path, **common)
    listener.close()
    assert lg.configs == [cfg.to_dict()] and lg.configs[0]["train"]["lr"] == 0.01


def test_a_relative_run_dir_records_absolute_paths_and_a_tag_string_is_one_tag(lab, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = Path("rel")
    lg = lab.get("logger", "wandb", tags="ablation")(run_dir=run)
    run.mkdir(exist_ok=True)
    _finished(run, adapter=False)
    lg.close()
    records = wandb_records(tmp_path / "rel")
    [tags] = {tuple(r.run.tags) for r in records if r.WhichOneof("record_type") == "run"}
    assert tags == ("ablation",)
    assert wandb_of(records, "summary")["final/checkpoint"] == str(tmp_path / "rel" / "checkpoints" / "step_000003")


def test_wandb_online_without_a_key_says_how_to_log_in(lab, tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings: no key anywhere
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(rllab.RllabError, match=r"wandb' logger could not start a run \(mode = 'online'\).*wandb login"):
        lab.get("logger", "wandb", mode="online")(run_dir=tmp_path / "run")


def test_traces_become_a_wandb_table_and_an_mlflow_table_that_keep_every_step(tmp_path):
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment
    from rllab_loggers.traces import TABLE_COLUMNS

    loggers = 'loggers=["jsonl", {name="traces", per_step=2}, {name="wandb", traces=2}, {name="mlflow", traces=2}]'
    run = tmp_path / "run"
    run_experiment(load_config(None, [*overrides(TINY), "train.steps=2", loggers]), run_dir=run, progress=False)
    file_rows = [r for r in map(json.loads, (run / "traces.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert [r["step"] for r in file_rows] == [1, 1, 2, 2]

    # wandb: the incremental table logged at each step, its rows read back from the offline run's files
    history = wandb_history(wandb_records(run))
    tables = [h for h in history if "traces/_type" in h]
    assert [(t["_step"], t["traces/_type"], t["traces/nrows"]) for t in tables] == [(1, "incremental-table-file", 2), (2, "incremental-table-file", 4)]
    parts = sorted(run.glob("wandb/offline-run-*/files/media/table/traces_*.table.json"), key=lambda p: int(p.name.split("_")[1]))
    rows = [row for p in parts for row in json.loads(p.read_text())["data"]]
    cols = json.loads(parts[0].read_text())["columns"]
    assert cols == list(TABLE_COLUMNS) and [r[0] for r in rows] == [1, 1, 2, 2]
    assert [r[cols.index("prompt")] for r in rows] == [r["prompt"] for r in file_rows]  # the same samples as the traces file

    # mlflow: traces.json holds every step's rows
    client, mrun = mlflow_run(run)
    table = json.loads(Path(client.download_artifacts(mrun.info.run_id, "traces.json", str(tmp_path / "dl"))).read_text())
    assert table["columns"] == list(TABLE_COLUMNS) and [r[0] for r in table["data"]] == [1, 1, 2, 2]
    assert [r[table["columns"].index("reward")] for r in table["data"]] == pytest.approx([r["reward"] for r in file_rows])


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_negative_traces_count_is_refused(name):
    from rllab.config import load_config
    from rllab.errors import ConfigError

    with pytest.raises(ConfigError, match="traces"):
        load_config(None, [f'loggers=[{{name="{name}", traces=-1}}]'])


# --------------------------------------------------------------------------- Trackio, against its local store


@pytest.fixture
def trackio_store(tmp_path, monkeypatch):
    """Trackio's SQLite store in tmp_path (TRACKIO_DIR is read when trackio is imported: set for
    subprocesses, patched where this process reads and writes it)."""
    trackio = pytest.importorskip("trackio")
    import trackio.sqlite_storage as storage

    store = tmp_path / "trackio"
    store.mkdir()
    monkeypatch.setenv("TRACKIO_DIR", str(store))
    monkeypatch.setattr(storage, "TRACKIO_DIR", store)
    return trackio, storage.SQLiteStorage


def test_a_run_logged_to_trackio_reads_back_from_its_store(tmp_path, trackio_store, capsys):
    from rllab.cli import main

    _, storage = trackio_store
    run = tmp_path / "run"
    args = ["run", *overrides(TINY), "train.steps=2", "train.lr=3e-4", 'loggers=["jsonl", "trackio"]', "--run-dir", str(run), "-q"]
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rewards = {r["step"]: r["rollout/reward"] for r in rows if "rollout/reward" in r}
    name = (run / "trackio_run").read_text().strip()
    assert name.startswith("run-") and storage.get_runs("rllab") == [name]
    assert storage.get_run_config("rllab", name)["train.lr"] == 3e-4
    logs = storage.get_logs("rllab", name)
    assert {r["step"]: r["rollout/reward"] for r in logs if "rollout/reward" in r} == pytest.approx(rewards)
    final = json.loads((run / "final.json").read_text())
    last = [r for r in logs if "final/checkpoint" in r]
    assert [r["step"] for r in last] == [2] and last[0]["final/checkpoint"] == str(run / "checkpoints" / "step_000002")
    assert last[0]["final/accuracy"] == pytest.approx(final["final/accuracy"])
    assert [r["step"] for r in logs if "traces" in r] == [1, 2]  # 4 samples a step by default


def test_a_resumed_run_continues_its_trackio_run_and_runs_of_one_name_do_not_share(lab, tmp_path, trackio_store):
    _, storage = trackio_store
    first = lab.get("logger", "trackio")(run_dir=tmp_path / "a" / "run")
    first.start({"train": {"steps": 2}})
    first.log(1, {"rollout/reward": 0.25, "note": "text is left out"})
    first.close()  # no final.json: no summary
    again = lab.get("logger", "trackio")(run_dir=tmp_path / "a" / "run")
    again.start({"train": {"steps": 4}})
    again.log(3, {"rollout/reward": 0.5})
    _finished(tmp_path / "a" / "run", adapter=True)
    again.close()
    other = lab.get("logger", "trackio")(run_dir=tmp_path / "b" / "run")  # another run directory named "run"
    other.log(1, {"rollout/reward": 1.0})
    other.close()
    assert again.name == first.name != other.name and sorted(storage.get_runs("rllab")) == sorted([first.name, other.name])
    logs = storage.get_logs("rllab", first.name)
    assert [(r["step"], r["rollout/reward"]) for r in logs if "rollout/reward" in r] == [(1, 0.25), (3, 0.5)]
    assert not any("note" in r for r in logs)
    assert [r["final/adapter"] for r in logs if "final/adapter" in r] == [str(tmp_path / "a" / "run" / "adapter")]


def test_trackio_missing_names_the_extra_and_bad_knobs_are_refused(lab, tmp_path, monkeypatch):
    with pytest.raises(rllab.ConfigError, match="traces"):
        lab.get("logger", "trackio", traces=-1)
    monkeypatch.setitem(sys.modules, "trackio", None)
    with pytest.raises(rllab.RllabError, match=r"pip install 'rllab\[trackio\]'"):
        lab.get("logger", "trackio")(run_dir=tmp_path)
