"""provenance.json: what it records, data and starting models hashed by content, the model.sha256
pin, and the comparison of two records."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from rllab.records import hashing, provenance
from rllab.config import load_config
from rllab.errors import ConfigError

from .tiny import TINY, overrides


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


pytestmark = pytest.mark.usefixtures("fixed_checkout")


def _model_dir(root, weights=b"\x01\x02", config='{"a": 1}'):
    root.mkdir(parents=True)
    (root / "model.safetensors").write_bytes(weights)
    (root / "config.json").write_text(config)
    (root / "tokenizer.json").write_text("{}")
    return root


# --------------------------------------------------------------------------- hashes


def test_the_start_hash_covers_the_model_files_only_and_not_where_they_lie(tmp_path):
    a = _model_dir(tmp_path / "a")
    h = provenance.model_sha256(a)
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    (b / "rllab_warm_start.json").write_text('{"metrics": {"warm/seconds": 3.2}}')  # how it was made, timings: not the model
    (b / ".cache").mkdir()
    (b / ".cache" / "lock").write_text("x")
    assert provenance.model_sha256(b) == h
    (b / "model.safetensors").write_bytes(b"\x01\x03")  # one byte of the weights
    assert provenance.model_sha256(b) != h
    shutil.copyfile(a / "model.safetensors", b / "model.safetensors")
    (b / "tokenizer.json").rename(b / "tokenizer2.json")  # a renamed file: another model
    assert provenance.model_sha256(b) != h


def test_the_tree_hash_is_the_hash_of_names_and_file_hashes_in_order(tmp_path):
    import hashlib

    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "x.txt").write_bytes(b"x")
    (d / "sub" / "y.txt").write_bytes(b"yy")
    by_hand = hashlib.sha256(
        f"sub/y.txt\0{hashlib.sha256(b'yy').hexdigest()}\nx.txt\0{hashlib.sha256(b'x').hexdigest()}\n".encode()
    ).hexdigest()
    assert provenance.sha256_tree(d) == by_hand
    assert provenance.sha256_data(d / "x.txt") == hashlib.sha256(b"x").hexdigest()


def test_a_pinned_start_that_hashes_otherwise_is_refused_naming_both(tmp_path):
    d = _model_dir(tmp_path / "m")
    h = provenance.model_sha256(d)
    assert provenance.check_start(d, None) == h
    assert provenance.check_start(d, h[:12].upper()) == h  # a prefix, any case
    assert provenance.check_start(d, "sha256:" + h) == h
    wrong = "ab" * 32
    with pytest.raises(ConfigError) as e:
        provenance.check_start(d, wrong)
    assert h in str(e.value) and wrong in str(e.value) and "model.sha256" in str(e.value)


def test_model_sha256_setting_refuses_what_is_not_a_hash():
    with pytest.raises(ConfigError, match=r"\[model\]: sha256 = .12ab. is not a sha256"):
        load_config(None, ["model.sha256=12ab"])
    with pytest.raises(ConfigError, match="not a sha256"):
        load_config(None, ["model.sha256=zzzzzzzzzz"])
    assert load_config(None, ["model.sha256=abcdef0123"]).model.sha256 == "abcdef0123"


def test_data_named_by_a_knob_is_found_and_keyed_by_content_wherever_it_lies(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    b = tmp_path / "copy" / "b.jsonl"
    b.parent.mkdir()
    shutil.copyfile(a, b)
    reward = tmp_path / "rw.py"
    reward.write_text("def f(x): return 1\n")
    (tmp_path / "train").mkdir()
    section = {"name": "jsonl", "path": str(a), "reward_fn": f"{reward}:f", "note": "not a file", "seed": 0, "split": "train"}
    import os

    here = os.getcwd()
    os.chdir(tmp_path)  # a directory named like a bare word knob value is not data
    try:
        found = provenance.config_files(section)
    finally:
        os.chdir(here)
    assert found == [a.resolve(), reward.resolve()]
    hashes = provenance.data_hashes(found)
    keyed = provenance.content_keyed(section, hashes)
    assert keyed["path"] == f"sha256:{provenance.sha256_file(a)}" and keyed["note"] == "not a file"
    moved = provenance.content_keyed({**section, "path": str(b)}, provenance.data_hashes([b.resolve()]))
    assert moved["path"] == keyed["path"]  # the same contents elsewhere: the same key


def test_note_data_file_records_only_inside_recording_data(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("x\n")
    provenance.note_data_file(f)  # outside: nothing to record into, no error
    with provenance.recording_data() as read:
        provenance.note_data_file(f)
        provenance.note_data_file(str(f))
    assert read == [f.resolve()]


# --------------------------------------------------------------------------- records


def _record(**changes):
    rec = {
        "format": 1, "recorded_at": "t0", "code": {"rllab": "0.1.0", "git": None}, "python": {"version": "3.11.7"},
        "libraries": {"torch": "2.13.0", "numpy": "2.4.6"}, "environment": {"sha256": "e1", "distributions": 3},
        "machine": {"cpu": {"model": "X", "isa": ["avx2"], "cores": 2, "machine": "x86_64"}, "host": "h1", "platform": "p1",
                    "torch": {"threads": 2, "interop_threads": 2, "cpu_capability": "AVX2"}},
        "hashes": {"config": "c1", "data": [{"path": "/a/x.jsonl", "sha256": "d1"}], "plugins": [],
                   "start": {"kind": "warm_start", "path": "/cache/m1", "sha256": "s1"}},
        "seeds": {"train.seed": 0},
    }
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = rec
        for p in parents:
            node = node[p]
        node[last] = value
    return rec


def test_two_records_differ_in_what_computes_not_in_where_or_when():
    a = _record()
    b = _record(**{"recorded_at": "t1", "machine.host": "h2", "machine.platform": "p2", "machine.cpu.cores": 64,
                   "hashes.data": [{"path": "/elsewhere/y.jsonl", "sha256": "d1"}],
                   "hashes.start": {"kind": "warm_start", "path": "/other/cache/m1", "sha256": "s1"}})
    assert provenance.differences(a, b) == []
    c = _record(**{"machine.torch.threads": 1, "libraries.torch": "2.12.0", "libraries.scipy": "1.0", "hashes.start": {"kind": "warm_start", "path": "/cache/m1", "sha256": "s2"}})
    fields = provenance.differences(a, c)
    assert [f[0] for f in fields] == ["hashes.start", "libraries.torch", "machine.torch.threads"]
    assert fields[2] == ("machine.torch.threads", 2, 1)
    assert "thread" in provenance.explain("machine.torch.threads") and "library" in provenance.explain("libraries.torch")
    d = _record(**{"hashes.data": [{"path": "/a/x.jsonl", "sha256": "d2"}]})
    assert [f[0] for f in provenance.differences(a, d)] == ["hashes.data"]


def test_the_config_hash_leaves_out_names_loggers_and_the_pin():
    cfg = load_config(None, []).to_dict()
    h = provenance.config_sha256(cfg)
    same = copy.deepcopy(cfg)
    same.update(name="other", output_dir="elsewhere", loggers=["jsonl", "tensorboard"])
    same["model"]["sha256"] = "ab" * 32
    assert provenance.config_sha256(same) == h
    changed = copy.deepcopy(cfg)
    changed["train"]["lr"] = cfg["train"]["lr"] * 2
    assert provenance.config_sha256(changed) != h
    assert provenance.seeds(cfg)["train.seed"] == 0


def test_the_environment_names_libraries_cpu_and_threads():
    import torch

    env = provenance.environment()
    assert env["libraries"]["torch"] == torch.__version__
    assert "transformers" not in env["libraries"] or env["libraries"]["transformers"]
    assert len(env["environment"]["sha256"]) == 64 and env["environment"]["distributions"] > 10
    assert env["machine"]["torch"]["threads"] == torch.get_num_threads()
    cpu = env["machine"]["cpu"]
    assert isinstance(cpu["isa"], list) and all(f.startswith(("avx", "amx", "sse", "fma", "f16c")) for f in cpu["isa"])


# --------------------------------------------------------------------------- runs

RUN = [*overrides(TINY), "model.warm_start.steps=5", "train.steps=1", "train.eval_size=4", "rollout.prompts_per_step=2",
       "rollout.group_size=2"]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in rows))
    return path


def test_a_run_records_its_provenance_and_an_edited_data_file_gives_a_new_start(tmp_path):
    from rllab.training.trainer import run_experiment

    data = _jsonl(tmp_path / "sums.jsonl", [(a, b) for a in range(6) for b in range(6)])
    args = [*RUN, "task=jsonl", f"task.path={data}", "task.eval_fraction=0.2"]
    run_experiment(load_config(None, args), run_dir=tmp_path / "one", progress=False)
    rec = provenance.read(tmp_path / "one")
    assert rec["code"]["git"]["commit"] == "c0ffee" and rec["code"]["rllab"]
    assert rec["libraries"]["torch"] and rec["libraries"]["transformers"] and rec["python"]["version"]
    assert rec["machine"]["torch"]["threads"] >= 1 and "isa" in rec["machine"]["cpu"]
    assert rec["hashes"]["data"] == [{"path": str(data.resolve()), "sha256": provenance.sha256_file(data)}]
    start = rec["hashes"]["start"]
    assert start["kind"] == "warm_start" and start["sha256"] == provenance.model_sha256(start["path"])
    assert rec["hashes"]["config"] == provenance.config_sha256(load_config(tmp_path / "one" / "config.toml").to_dict())
    assert rec["seeds"]["train.seed"] == 0 and rec["seeds"]["task.seed"] == 0

    _jsonl(data, [(a, b) for a in range(6) for b in range(6) if (a, b) != (5, 5)] + [(7, 8)])  # one row edited, same path
    run_experiment(load_config(None, args), run_dir=tmp_path / "two", progress=False)
    again = provenance.read(tmp_path / "two")
    assert again["hashes"]["data"][0]["sha256"] != rec["hashes"]["data"][0]["sha256"]
    assert again["hashes"]["start"]["path"] != start["path"]  # a new warm start, not the cached one
    assert again["hashes"]["start"]["sha256"] != start["sha256"]
    assert [f[0] for f in provenance.differences(rec, again)] == ["hashes.data", "hashes.start"]

    # the pin: the first start is refused for the edited data, naming both hashes
    with pytest.raises(ConfigError, match=f"{again['hashes']['start']['sha256']}.*not {start['sha256']}"):
        run_experiment(load_config(None, [*args, f"model.sha256={start['sha256']}"]), run_dir=tmp_path / "pinned", progress=False)
    assert not (tmp_path / "pinned").exists()


def test_a_resume_that_runs_differently_is_recorded_beside_the_record(tmp_path):
    provenance.write(tmp_path, _record())
    assert provenance.note_resume(tmp_path, _record(**{"recorded_at": "t9", "hashes.config": "c2"}), step=4) is None  # train.steps extended
    assert "resumes" not in provenance.read(tmp_path)
    entry = provenance.note_resume(tmp_path, _record(**{"machine.torch.threads": 1}), step=4)
    assert entry == {"step": 4, "recorded_at": "t0", "differences": {"machine.torch.threads": [2, 1]}}
    rec = provenance.read(tmp_path)
    assert rec["resumes"] == [entry] and rec["machine"]["torch"]["threads"] == 2  # the run's own record is kept
    assert provenance.differences(rec, _record()) == []  # the resumes are not a field of the record
    assert "thread" in provenance.explain("resumed at step 4: machine.torch.threads")
    assert provenance.note_resume(tmp_path / "none", _record(), step=1) is None


def test_a_large_models_hash_is_remembered_until_a_file_changes(tmp_path, monkeypatch):
    d = _model_dir(tmp_path / "m")
    h = provenance.model_sha256(d)
    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hashing, "MEMO_BYTES", 1)  # every model counts as large
    assert provenance.model_sha256(d) == h
    assert len(list((tmp_path / "cache" / ".hashes").iterdir())) == 1
    real = provenance.sha256_tree
    monkeypatch.setattr(hashing, "sha256_tree", lambda *a, **k: pytest.fail("hashed again"))
    assert provenance.model_sha256(d) == h  # remembered
    monkeypatch.setattr(hashing, "sha256_tree", real)
    (d / "model.safetensors").write_bytes(b"\x01\x02\x03")  # rewritten: another size (and time)
    assert provenance.model_sha256(d) != h


_GIT_STATE = provenance.git_state  # the real one: this module's tests see a fixed checkout


def test_git_state_by_default_is_the_checkout_rllab_runs_from():
    from pathlib import Path

    import rllab

    root = Path(rllab.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("rllab is not running from a git checkout")
    state = _GIT_STATE()
    assert state is not None and len(state["commit"]) == 40
    assert state["commit"] == _GIT_STATE(root)["commit"]
