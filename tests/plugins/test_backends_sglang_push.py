"""Weight pushes that do not wait for the requests in flight (sglang ``push = "pause"``), against
the stand-in server (tests/sglang_standin.py): the wire calls and their order, a request that
crosses a push (its oldest version, counted), the push that does not wait where ``"drain"`` does,
asynchronous rollouts that sync without settling, refusals, and a short run."""

from __future__ import annotations

import json
import threading
import time
import types
import urllib.error
import urllib.request

import pytest

import rllab
from rllab import SamplingParams
from rllab.rollout import asynchronous as asyncrollout

import rllab_backends.sglang as S
from rllab_backends.sglang import protocol

from tests.sglang_standin import FLUSH_REFUSED, StandIn

from tests.plugins.test_backends_sglang import close_backends, make  # noqa: F401  (close_backends: an autouse fixture)


def admin_calls(server):
    """The admin routes the server received, in order (no /generate, /health)."""
    return [(p, b) for p, b in server.requests if p not in ("/generate", "/health")]


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


PARAMS = SamplingParams(n=2, max_new_tokens=8, temperature=1.0)


# --------------------------------------------------------------------------- the wire


@pytest.mark.parametrize("mode, flush", [("in_place", False), ("retract", True)])
def test_a_pause_push_is_pause_then_update_then_continue(lab, tmp_path, mode, flush):
    with StandIn(None, instant_tokens=4, weight_version="0") as server:
        b = make(lab, server.url, push="pause", pause_mode=mode)
        assert b.pushes_in_flight
        b.update_weights(str(tmp_path))
        assert admin_calls(server) == [
            ("/pause_generation", {"mode": mode}),
            ("/update_weights_from_disk", {"model_path": str(tmp_path), "weight_version": "1", "flush_cache": flush, "abort_all_requests": False}),
            ("/continue_generation", {}),
        ]
        assert not server.paused and server.weight_version == server.span_version == "1"
        out = b.generate([(1, 2)], PARAMS)
        assert [c.weight_version for c in out] == ["1", "1"]
        assert b.last_metrics()["sglang/mixed_version_samples"] == 0
        # in place, the push could not flush: the next generate does, before its requests
        assert admin_calls(server)[3:] == ([] if flush else [("/flush_cache", None)])
        assert [p for p, _ in server.requests][-2:] == (["/continue_generation", "/generate"] if flush else ["/flush_cache", "/generate"])


def test_a_refused_flush_is_tried_again_before_the_next_batch(lab, tmp_path):
    with StandIn(None, instant_tokens=4, weight_version="0") as server:
        b = make(lab, server.url, push="pause")
        b.update_weights(str(tmp_path))
        server.fail_next(400, "Flush cache failed.", path="/flush_cache")  # another client's requests were running
        b.generate([(1, 2)], PARAMS)
        assert b.last_metrics()["sglang/flush_deferred"] == 1
        b.generate([(1, 2)], PARAMS)
        assert b.last_metrics()["sglang/flush_deferred"] == 0
        b.generate([(1, 2)], PARAMS)  # flushed: nothing more until the next push
        assert [p for p, _ in server.requests if p in ("/flush_cache", "/generate")] == [
            "/flush_cache", "/generate", "/flush_cache", "/generate", "/generate"]


def test_drain_sends_what_it_always_sent(lab, tmp_path):
    with StandIn(None, instant_tokens=4, weight_version="0") as server:
        b = make(lab, server.url)
        assert not b.pushes_in_flight
        b.update_weights(str(tmp_path))
        b.generate([(1, 2)], PARAMS)
        assert admin_calls(server) == [
            ("/update_weights_from_disk", {"model_path": str(tmp_path), "weight_version": "1", "flush_cache": True, "abort_all_requests": False}),
        ]
        assert "sglang/mixed_version_samples" not in b.last_metrics()


def test_a_failed_update_still_continues_the_server(lab, tmp_path):
    with StandIn(None, instant_tokens=4, weight_version="0") as server:
        b = make(lab, server.url, push="pause")
        server.fail_update("Failed to load weights: no such file")
        with pytest.raises(S.SGLangWeightSyncError, match="no such file"):
            b.update_weights(str(tmp_path))
        assert [p for p, _ in admin_calls(server)] == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
        assert not server.paused


def test_a_server_without_pause_generation_is_refused_naming_the_knob(lab, tmp_path):
    with StandIn(None, instant_tokens=4, weight_version="0") as server:
        b = make(lab, server.url, push="pause")
        server.fail_next(404, "Not Found", path="/pause_generation")
        with pytest.raises(S.SGLangWeightSyncError, match=r"has no /pause_generation.*push = 'pause'.*push = 'drain'"):
            b.update_weights(str(tmp_path))
        assert [p for p, _ in admin_calls(server)] == ["/pause_generation"]  # nothing loaded, nothing to continue


def test_pause_mode_without_push_pause_is_refused_by_name(lab):
    with pytest.raises(rllab.ConfigError, match="pause_mode acts only with push = 'pause' \\(push is 'drain'\\)"):
        lab.get("rollout_backend", "sglang", urls="http://127.0.0.1:1", pause_mode="retract")
    with pytest.raises(rllab.ConfigError, match="push.*'wait'.*drain.*pause"):
        lab.get("rollout_backend", "sglang", urls="http://127.0.0.1:1", push="wait")


# --------------------------------------------------------------------------- the stand-in is SGLang 0.5.23


def test_standin_refuses_a_flush_while_requests_run_in_place():
    """SGLang 0.5.23: an update with flush_cache on a server paused in place, with a request in its
    running batch, loads the weights (the spans move) but fails the call; retract can flush."""
    with StandIn(None, instant_tokens=8, token_delay_s=0.05, weight_version="1") as server:
        for mode, ok in (("in_place", False), ("retract", True)):
            t = threading.Thread(target=post, args=(server.url, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}, "return_logprob": True}))
            t.start()
            while not server.running:
                time.sleep(0.01)
            assert post(server.url, "/pause_generation", {"mode": mode}) == (200, {"message": "Generation paused successfully.", "status": "ok"})
            v = str(int(server.span_version) + 1)
            status, body = post(server.url, "/update_weights_from_disk", {"model_path": "x", "weight_version": v, "flush_cache": True})
            if ok:
                assert status == 200 and server.weight_version == v
            else:
                assert (status, body["success"], body["message"]) == (400, False, FLUSH_REFUSED)
                assert server.span_version == v and server.weight_version != v  # the tokenizer's moves only on success
            post(server.url, "/continue_generation", {})
            t.join()
        assert post(server.url, "/pause_generation", {"mode": "later"})[0] == 400


def test_standin_reports_spans_as_sglang_computes_them():
    """A request with 2 of its 8 tokens out when version 2 lands: spans [1: 0-2], [2: 2-8]
    (sglang's compute_weight_version_spans), meta weight_version the one at the end."""
    with StandIn(None, instant_tokens=8, token_delay_s=0.04, weight_version="1") as server:
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", post(server.url, "/generate", {
            "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}, "return_logprob": True})))
        t.start()
        while not server.running:
            time.sleep(0.005)
        time.sleep(0.06)  # a token or two out
        post(server.url, "/pause_generation", {"mode": "in_place"})
        time.sleep(0.1)  # paused: no token comes out meanwhile
        post(server.url, "/update_weights_from_disk", {"model_path": "x", "weight_version": "2", "flush_cache": False})
        post(server.url, "/continue_generation", {})
        t.join()
        status, row = out["r"]
    assert status == 200
    spans = row["meta_info"]["weight_versions"]
    assert [s["version"] for s in spans] == ["1", "2"] and spans[0]["start"] == 0 and spans[-1]["end"] == 8
    assert spans[0]["end"] == spans[1]["start"] and 0 < spans[0]["end"] < 8
    assert row["meta_info"]["weight_version"] == "2"


# --------------------------------------------------------------------------- versions


def _row(spans, version="3"):
    meta = {"finish_reason": {"type": "length"}, "weight_version": version,
            "output_token_logprobs": [[-0.5, 4, None], [-0.5, 5, None]]}
    if spans is not None:
        meta["weight_versions"] = spans
    return {"output_ids": [4, 5], "meta_info": meta}


def test_the_oldest_version_of_a_completion_and_the_mixed_count():
    two = [{"version": "2", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 2}]
    one = [{"version": "3", "start": 0, "end": 2}]
    raw = json.dumps([_row(two), _row(one), _row(None)]).encode()
    mixed: list[int] = []
    comps, _ = protocol.parse_rows(raw, [(1,)], [0, 0, 0], 0, "u", oldest=True, submitted="2", mixed=mixed)
    # the first span's weights made its first tokens; no spans: the version at submission (conservative)
    assert [c.weight_version for c in comps] == ["2", "3", "2"] and mixed == [0]
    comps, _ = protocol.parse_rows(raw, [(1,)], [0, 0, 0], 0, "u")  # drain: as before
    assert [c.weight_version for c in comps] == ["2|3", "3", "3"]


def _in_thread(fn):
    """``fn()`` in a thread: ``(thread, out)``; after ``join``, ``out["v"]`` is its value (or
    ``out["error"]`` what it raised)."""
    out: dict = {}

    def run():
        try:
            out["v"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


@pytest.mark.parametrize("push", ["pause", "drain"])
def test_a_request_in_flight_across_a_push(lab, tmp_path, push):
    """16 tokens at 50 ms: a push 0.25 s in (behind the lock of asynchronous rollouts, as a run
    calls it). 'pause' returns at once and the request finishes with both versions (oldest
    counted, one mixed sample each); 'drain' waits for it to finish."""
    with StandIn(None, instant_tokens=16, token_delay_s=0.05, weight_version="0") as server:
        b = asyncrollout.VersionedBackend(make(lab, server.url, push=push))
        b.update_weights(str(tmp_path))
        t, out = _in_thread(lambda: (b.generate([(1, 2)], SamplingParams(n=2, max_new_tokens=16)), b.last_metrics()))
        while not server.running:
            time.sleep(0.005)
        time.sleep(0.25)
        t0 = time.perf_counter()
        b.update_weights(str(tmp_path))
        push_s = time.perf_counter() - t0
        left = server.running
        t.join()
        if "error" in out:
            raise out["error"]
        got, m = out["v"]
    if push == "pause":
        assert left == 1  # the request was still decoding (~0.55 s left) when the push returned
        assert [c.weight_version for c in got] == ["1", "1"]
        assert m["sglang/mixed_version_samples"] == 2 and m["rollout/stale"] == 0
    else:
        assert left == 0 and push_s > 0.3  # it waited for the request (~0.55 s left)
        assert [c.weight_version for c in got] == ["1", "1"] and m["rollout/stale"] == 0


def test_a_version_older_than_the_generate_is_still_stale(lab, tmp_path):
    """push = 'pause' accepts any version pushed since the generate began; an older one (a server
    that missed a push) is stale as with 'drain': counted, dropped or an error."""
    with StandIn(None, instant_tokens=4, weight_version="0") as server:
        b = make(lab, server.url, push="pause", stale="keep")
        b.update_weights(str(tmp_path))
        b.update_weights(str(tmp_path))
        server.stale_next("1")
        assert [c.weight_version for c in b.generate([(1, 2)], PARAMS)] == ["1", "1"]
        assert b.last_metrics()["rollout/stale"] == 2
        e = make(lab, server.url, push="pause", stale="error")
        e.update_weights(str(tmp_path))
        server.stale_next("0")
        with pytest.raises(S.StaleSampleError, match=r"weight_version \['0'\], not one of \['1'\] \(pushed since this generate began\)"):
            e.generate([(1, 2)], PARAMS)


# --------------------------------------------------------------------------- asynchronous rollouts


class _Stage:
    """The parts of a RolloutStage that AsyncRollout uses: one request per batch."""

    def __init__(self, backend, k):
        self.backend = backend
        self.config = types.SimpleNamespace(max_staleness=k, stale="drop", run_ahead=True)

    def state_dict(self, step):
        return {}

    def sample(self, step):  # a stand-in for Rollouts: its episodes' completions
        comps = self.backend.generate([(1, 2)], SamplingParams(n=2, max_new_tokens=16))
        return types.SimpleNamespace(completions=comps, episodes=[types.SimpleNamespace(completion=c) for c in comps])


@pytest.mark.parametrize("push", ["pause", "drain"])
def test_async_sync_does_not_wait_for_the_batch_in_flight(lab, tmp_path, push):
    with StandIn(None, instant_tokens=16, token_delay_s=0.05, weight_version="0") as server:
        backend = asyncrollout.VersionedBackend(make(lab, server.url, push=push))
        backend.update_weights(str(tmp_path))
        ar = asyncrollout.AsyncRollout(_Stage(backend, 1), limit=lambda: 2, cpu=False)
        try:
            ar._fill(0)  # batches 0 and 1, ~0.8 s each
            while not server.running:
                time.sleep(0.005)
            t0 = time.perf_counter()
            waited = ar.settle(0, {})["time/push_wait"]
            backend.update_weights(str(tmp_path))
            sync_s = time.perf_counter() - t0
            in_flight = server.running  # requests still decoding when the sync returned
            state = ar.state_dict(1)["rollout_ahead"]  # a checkpoint now: batch 1 is not sampled yet
            c0, c1 = (ar.futures[s].result()[0].completions for s in (0, 1))
        finally:
            ar.close()
    if push == "pause":
        assert waited == 0.0 and in_flight >= 1 and backend.version == 2  # (state, not seconds: robust to load)
        assert state["regenerate"] == [1] and state["batches"] == {}
        assert {c.weight_version for c in c0} == {"1"}  # crossed the push: its oldest version
        assert {c.weight_version for c in c1} <= {"1", "2"}
    else:  # settle waits for both batches (~1.6 s), then the update; the checkpoint holds batch 1
        assert waited > 1.0 and sync_s >= waited
        assert state["regenerate"] == [] and list(state["batches"]) == [1]
        assert {c.weight_version for c in c0 + c1} == {"1"}


# --------------------------------------------------------------------------- a run


@pytest.mark.filterwarnings("ignore:.*scored 0")  # the stand-in's fixed tokens (--instant) never answer right
def test_rllab_run_with_pause_pushes_against_the_standin(tmp_path, model_cache):
    """`rllab run backend=sglang rollout.max_staleness=1 backend.push=pause` end to end, its
    requests decoding slowly enough that the pushes land on them."""
    from rllab.cli import main
    from tests.tiny import TINY, overrides

    with StandIn(None, instant_tokens=6, token_delay_s=0.05, lifetime_s=120) as server:
        args = [*overrides(TINY), "train.steps=3", "rollout.max_staleness=1", "backend=sglang",
                f"backend.urls={server.url}", "backend.push=pause", "train.warmup_steps=0", "model.warm_start.steps=0"]
        assert main(["run", *args, "--run-dir", str(tmp_path / "run"), "-q"]) == 0
        routes = [p for p, _ in server.requests if p in ("/pause_generation", "/update_weights_from_disk", "/continue_generation")]
    assert routes == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"] * 4  # the first sync, one per step
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "async/staleness_max" in r]
    assert len(steps) == 3 and all(r["async/staleness_max"] <= 1 and r["async/dropped"] == 0 for r in steps)
    assert all("sglang/mixed_version_samples" in r for r in steps)


@pytest.mark.slow  # two trainers and two slow batches (~15 s on a loaded 2-core machine)
def test_a_checkpoint_with_a_batch_in_flight_resumes_by_sampling_it_again(tmp_path, model_cache):
    """push = 'pause': the checkpoint after step 0 is written while batch 1 decodes (1.8 s at
    0.3 s per token); it holds no batch, and the resumed run samples batch 1 again from the
    checkpoint's weights (async/regenerated, staleness 0)."""
    import torch

    from rllab.config import load_config
    from rllab.training.trainer import Trainer
    from tests.tiny import TINY, overrides

    with StandIn(None, instant_tokens=6, token_delay_s=0.3, lifetime_s=120) as server:
        cfg = load_config(None, [*overrides(TINY), "model.warm_start.steps=0", "rollout.max_staleness=1", "backend=sglang",
                                 f"backend.urls={server.url}", "backend.push=pause"])
        tr = Trainer(cfg, run_dir=tmp_path / "a", progress=False)
        try:
            tr.train_step()
            assert not tr.rollout.futures[1].done()
            ckpt = tr.save_checkpoint()
        finally:
            tr.close()
        ahead = torch.load(ckpt / "state.pt", weights_only=False)["rollout_ahead"]
        assert ahead["regenerate"] == [1] and ahead["batches"] == {}
        again = Trainer(cfg, run_dir=tmp_path / "b", progress=False)
        try:
            again.load_checkpoint(ckpt)
            m = again.train_step()
        finally:
            again.close()
    assert m["async/regenerated"] == 1.0 and m["async/staleness_max"] == 0.0
