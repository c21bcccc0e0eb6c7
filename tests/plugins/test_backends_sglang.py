"""The sglang rollout backend against a stand-in SGLang server (tests/sglang_standin.py).

Shapes of what goes over the wire (checked by SGLang's own contract in the stand-in), parity with
the hf backend, n > 1 ordering, every fault, weight sync and staleness, launch, the backend
contract suite, and a short training run.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch

import rllab
from rllab import SamplingParams
from rllab.testing import contract_cases
from rllab.models.tiny import TinyModelConfig, build_tiny_model

from tests import sglang_standin
from tests.sglang_standin import StandIn

needs_contract = pytest.mark.skipif(
    sglang_standin.contract() is None,
    reason="needs SGLang's JSON contract: pip install --no-deps sglang==0.5.23 (without it the stand-in "
    "answers unvalidated)",
)


@needs_contract
def test_the_standin_checks_sglangs_contract(server):
    assert server.validate

import rllab_backends.sglang as S  # noqa: E402
from rllab_backends.sglang import launch, protocol, sync  # noqa: E402

CFG = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = build_tiny_model(CFG)
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok, path


@pytest.fixture(scope="module")
def server(tiny):
    with StandIn(tiny[2], lifetime_s=600) as s:
        yield s


@pytest.fixture
def fresh(tiny):
    """A stand-in of its own, for tests that inject faults or change weights."""
    with StandIn(tiny[2], lifetime_s=120) as s:
        yield s


_OPEN: list = []


@pytest.fixture(autouse=True)
def close_backends():
    yield
    while _OPEN:
        _OPEN.pop().close()


def make(lab, url, **knobs):
    b = lab.get("rollout_backend", "sglang", **{"urls": url, "backoff_s": 0.01, **knobs})()
    _OPEN.append(b)
    return b


@pytest.fixture
def backend(lab, server):
    b = make(lab, server.url)
    yield b
    b.close()


def prompts_of(tok, texts=("1+2=", "12+34=", "999+1=", "7=")):
    return [tok(t).input_ids for t in texts]


def hf(lab, model):
    b = lab.get("rollout_backend", "hf", num_threads=1)()
    b.update_weights(model)
    return b


@torch.no_grad()
def teacher_forced(model, prompt, tokens, temperature=1.0):
    ids = torch.tensor([list(prompt) + list(tokens)])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def generates(server):
    return [b for p, b in server.requests if p == "/generate"]


# --------------------------------------------------------------------------- shapes


launch_knobs = sglang_standin.launch_knobs


def test_registered_and_follows_the_protocol(lab, backend):
    assert "sglang" in lab.names("rollout_backend")
    assert isinstance(backend, rllab.RolloutBackend)


def test_urls_as_a_list_or_a_string(lab, tmp_path):
    from rllab.config import load_config

    cfg = load_config(None, ["backend=sglang", 'backend.urls=["http://127.0.0.1:30000", "http://127.0.0.1:30001/"]'])
    assert cfg.component("backend").config.urls == ("http://127.0.0.1:30000", "http://127.0.0.1:30001/")
    b = lab.get("rollout_backend", "sglang", **cfg.component("backend").knobs)()
    _OPEN.append(b)
    assert b.urls == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert make(lab, "http://a:1, http://b:2").urls == ["http://a:1", "http://b:2"]
    with pytest.raises(rllab.ConfigError, match="expected a string or a list of strings, got list \\[1, 2\\]"):
        lab.get("rollout_backend", "sglang", urls=[1, 2])
    with pytest.raises(rllab.ConfigError, match="'ftp://x' is not an http"):
        lab.get("rollout_backend", "sglang", urls=["http://a:1", "ftp://x"])


def test_config_errors(lab):
    with pytest.raises(rllab.ConfigError, match="not an http"):
        lab.get("rollout_backend", "sglang", urls="localhost:30000")
    with pytest.raises(rllab.ConfigError, match="set urls"):  # refused with the config, before anything starts
        lab.get("rollout_backend", "sglang")
    with pytest.raises(rllab.ConfigError, match="distributed_port acts only with"):
        lab.get("rollout_backend", "sglang", urls="http://127.0.0.1:1", distributed_port=29500)


def test_request_body_seeded_fans_out_with_distinct_seeds(lab, server, tiny):
    tok = tiny[1]
    backend = make(lab, server.url, prompts_per_request=1)
    server.requests.clear()
    prompts = prompts_of(tok)[:2]
    backend.generate(prompts, SamplingParams(n=3, max_new_tokens=4, temperature=0.9, top_p=0.95, top_k=20,
                                             stop_token_ids=(tok.eos_token_id,), seed=11))
    bodies = sorted(generates(server), key=lambda b: b["input_ids"][0])
    assert len(bodies) == 2  # one request per prompt (prompts_per_request = 1)
    seeds = set()
    for body in bodies:
        assert body["return_logprob"] is True and body["logprob_start_len"] == -1
        assert "text" not in body and len(body["input_ids"]) == 3 and body["input_ids"][0] in prompts
        for sp in body["sampling_params"]:
            seeds.add(sp.pop("sampling_seed"))
            assert sp == {"n": 1, "max_new_tokens": 4, "temperature": 0.9, "top_p": 0.95, "top_k": 20,
                          "stop_token_ids": [tok.eos_token_id]}
    assert len(seeds) == 6


def test_the_seeded_body_is_one_row_per_sample_with_its_own_seed(lab):
    """The seeded body repeats each prompt n times, each row with the shared params and its own
    ``sampling_seed`` (prompt-major), and encodes to exactly that JSON."""
    import json

    b = make(lab, "http://127.0.0.1:1")
    prompts = [(1, 2, 3), (4,), (5, 6)]
    params = SamplingParams(n=3, max_new_tokens=4, temperature=0.7, top_p=0.9, top_k=5, stop_token_ids=(2, 9), seed=123)
    body, rows = b.request_body(prompts, 7, params)
    base = protocol.sampling_params_json(params, n=1)
    seeds = [protocol.sample_seed(123, 7 + i, j) for i in range(3) for j in range(3)]
    assert json.loads(protocol.encode(body)) == {
        "input_ids": [list(p) for p in prompts for _ in range(3)],
        "sampling_params": [{**base, "sampling_seed": x} for x in seeds],
        "return_logprob": True, "logprob_start_len": -1,
    }
    assert rows == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    b.close()


def test_request_body_unseeded_asks_for_n(backend, server, tiny):
    server.requests.clear()
    out = backend.generate(prompts_of(tiny[1])[:1], SamplingParams(n=4, max_new_tokens=3))
    [body] = generates(server)
    assert body["sampling_params"] == {"n": 4, "max_new_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    assert len(out) == 4 and {c.prompt_index for c in out} == {0}


@needs_contract
def test_unknown_sampling_key_is_rejected_with_sglangs_message(backend, server, tiny, monkeypatch):
    orig = protocol.sampling_params_json
    monkeypatch.setattr(protocol, "sampling_params_json", lambda *a, **k: {**orig(*a, **k), "seed": 3})
    server.requests.clear()
    with pytest.raises(S.SGLangRequestError, match=r"HTTP 400.*unknown field `seed`") as e:
        backend.generate(prompts_of(tiny[1])[:1], SamplingParams(max_new_tokens=2))
    assert e.value.status == 400 and "unknown field" in e.value.message
    assert len(generates(server)) == 1  # a 400 is not retried


@pytest.mark.parametrize("per_request", [1, 3])
@pytest.mark.parametrize("seed", [None, 5])
def test_grouping_order_and_log_probs(lab, server, tiny, per_request, seed):
    model, tok, _ = tiny
    b = make(lab, server.url, prompts_per_request=per_request, max_in_flight=2)
    prompts = prompts_of(tok)
    out = b.generate(prompts, SamplingParams(n=3, max_new_tokens=6, temperature=1.3, seed=seed,
                                             stop_token_ids=(tok.eos_token_id,)))
    b.close()
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    for c in out:
        assert list(c.prompt_ids) == prompts[c.prompt_index]
        assert c.weight_version == "default"
        assert 1 <= len(c.token_ids) <= 6
        assert all(lp <= 0.0 for lp in c.log_probs)  # log-probabilities, as parsed from the server
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == tok.eos_token_id
        else:
            assert c.finish_reason == "length" and len(c.token_ids) == 6
        want = teacher_forced(model, c.prompt_ids, c.token_ids, 1.3)
        assert torch.allclose(torch.tensor(c.log_probs, dtype=torch.float64), want, atol=1e-5)


def test_seeded_sampling_repeats_and_samples_differ(backend, tiny):
    prompts = prompts_of(tiny[1])
    params = SamplingParams(n=4, max_new_tokens=8, temperature=1.5, seed=3)
    a, b = backend.generate(prompts, params), backend.generate(prompts, params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert len({c.token_ids for c in a[:4]}) > 1  # n copies of one seed would all be equal


def test_greedy_is_indistinguishable_from_the_hf_backend(lab, backend, tiny):
    model, tok, _ = tiny
    prompts = prompts_of(tok)
    params = SamplingParams(n=2, max_new_tokens=8, temperature=0, stop_token_ids=(tok.eos_token_id,))
    ours, theirs = backend.generate(prompts, params), hf(lab, model).generate(prompts, params)
    assert [type(c) for c in ours] == [type(c) for c in theirs]
    for a, b in zip(ours, theirs):
        assert (a.prompt_ids, a.token_ids, a.finish_reason, a.prompt_index) == (b.prompt_ids, b.token_ids, b.finish_reason, b.prompt_index)
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-6)


def test_generate_from_inside_a_running_event_loop(backend, tiny):
    import asyncio

    params = SamplingParams(n=2, max_new_tokens=4, seed=2)
    plain = backend.generate(prompts_of(tiny[1]), params)

    async def caller():
        return backend.generate(prompts_of(tiny[1]), params)

    assert [c.token_ids for c in asyncio.run(caller())] == [c.token_ids for c in plain]
    assert [c.token_ids for c in backend.generate(prompts_of(tiny[1]), params)] == [c.token_ids for c in plain]


# --------------------------------------------------------------------------- parsing


def row(ids, fr, lps=None, version="3"):
    meta = {"finish_reason": fr, "weight_version": version}
    meta["output_token_logprobs"] = [[-0.5, t, None] for t in ids] if lps is None else lps
    return {"text": "", "output_ids": ids, "meta_info": meta}


@pytest.mark.parametrize(
    "fr, want",
    [
        ({"type": "stop", "matched": 2}, "stop"),  # a stop token id
        ({"type": "stop", "matched": "</s>"}, "stop"),  # a stop string
        ({"type": "stop", "matched": [2, 7]}, "stop"),  # token ids
        ({"type": "stop", "matched": None}, "stop"),
        ({"type": "length", "length": 2}, "length"),
        ("length", "length"),  # older servers: a bare string
    ],
)
def test_finish_reasons_in_every_shape(fr, want):
    api = sglang_standin.contract()
    r = row([4, 2], fr)
    if isinstance(fr, dict) and api is not None:
        api.decode_GenerateResponse(r)  # the shapes are SGLang's
    c, abort, _ = protocol.parse_row(r, (1,), 0, "t")
    assert (c.finish_reason, abort, c.token_ids, c.log_probs, c.weight_version) == (want, None, (4, 2), (-0.5, -0.5), "3")


def test_abort_and_malformed_rows():
    c, msg, status = protocol.parse_row(row([4], {"type": "abort", "message": "Abort by pause", "status_code": None}), (1,), 0, "t")
    assert c.finish_reason == "abort" and msg == "Abort by pause" and status is None
    with pytest.raises(S.SGLangProtocolError, match="unfinished"):
        protocol.parse_row(row([4], None), (1,), 0, "t")
    with pytest.raises(S.SGLangProtocolError, match=r"\[-0.1, 9, None\] is not a log-prob of token 4"):
        protocol.parse_row(row([4], {"type": "length"}, lps=[[-0.1, 9, None]]), (1,), 0, "t")
    with pytest.raises(S.SGLangProtocolError, match=r"\[1\] = \[None, 5, None\] is not a log-prob of token 5"):
        protocol.parse_row(row([4, 5], {"type": "length"}, lps=[[-0.1, 4, None], [None, 5, None]]), (1,), 0, "t")
    with pytest.raises(S.SGLangProtocolError, match="1 output_ids but no output_token_logprobs"):
        protocol.parse_row({"output_ids": [4], "meta_info": {"finish_reason": {"type": "length"}}}, (1,), 0, "t")
    spans = row([4, 5], {"type": "length"})
    spans["meta_info"]["weight_versions"] = [{"version": "2", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 2}]
    assert protocol.parse_row(spans, (1,), 0, "t")[0].weight_version == "2|3"


def test_processed_logprobs_are_the_truncated_distributions(lab, server, tiny):
    """logprobs = "processed": return_sampling_mask goes over the wire (SGLang's contract checks it)
    and each log-prob is the token's under the top-k / top-p renormalised distribution it was
    drawn from, computed here by teacher forcing; the default stays log_softmax(z / T)."""
    from rllab_backends.hf import _top_k_top_p

    model, tok, _ = tiny
    prompts = prompts_of(tok)[:2]
    params = SamplingParams(n=3, max_new_tokens=5, temperature=0.8, top_k=6, top_p=0.9, seed=4)
    sampled = make(lab, server.url, logprobs="processed").generate(prompts, params)
    plain = make(lab, server.url).generate(prompts, params)
    assert [c.token_ids for c in sampled] == [c.token_ids for c in plain]  # the same draws (same seeds)
    assert generates(server)[-2].get("return_sampling_mask") is True and "return_sampling_mask" not in generates(server)[-1]
    gaps = []
    for c, d in zip(sampled, plain):
        if not c.token_ids:
            continue
        with torch.no_grad():
            ids = torch.tensor([list(c.prompt_ids) + list(c.token_ids)])
            z = model(ids).logits[0, len(c.prompt_ids) - 1 : -1].double() / 0.8
            s = _top_k_top_p(z, 6, 0.9)
            want = torch.log_softmax(s, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(c.log_probs, dtype=torch.float64), want, atol=1e-5)
        assert torch.allclose(torch.tensor(d.log_probs, dtype=torch.float64), teacher_forced(model, c.prompt_ids, c.token_ids, 0.8), atol=1e-5)
        gaps += [a - b for a, b in zip(c.log_probs, d.log_probs)]
    assert min(gaps) >= -1e-6 and max(gaps) > 1e-3  # renormalising a truncated distribution raises each log-prob
    greedy = make(lab, server.url, logprobs="processed").generate(prompts, SamplingParams(n=1, max_new_tokens=3, temperature=0))
    assert all(lp == 0.0 for c in greedy for lp in c.log_probs)


def test_processed_logprobs_need_a_server_that_sends_them():
    r = row([4, 5], {"type": "length"})
    with pytest.raises(S.SGLangProtocolError, match="2 output_ids but none output_token_sampling_logprobs.*return_sampling_mask"):
        protocol.parse_rows(json.dumps([r]).encode(), [(1,)], [0], 0, "u/generate", sampled=True)
    r["meta_info"]["output_token_sampling_logprobs"] = [-0.25, -0.5]
    (c,), aborts = protocol.parse_rows(json.dumps([r]).encode(), [(1,)], [0], 0, "u/generate", sampled=True)
    assert aborts == []
    assert c.log_probs == (-0.25, -0.5)


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**40 + 7, 2**63 + 5, -3])
def test_seeds_are_per_sample_prompt_major_and_int64(seed):
    seeds = protocol.sample_seeds(seed, 5, 4, 3)
    assert seeds == [protocol.sample_seed(seed, i, j) for i in range(5, 9) for j in range(3)]
    assert len(set(seeds)) == 12 and all(0 <= x < 2**63 for x in seeds)
    assert protocol.sample_seed(seed, 5, 0) == protocol.sample_seed(seed + 2**64, 5, 0)  # taken modulo 2**64


def test_parse_rows():
    answer = [row([4, 5], {"type": "stop", "matched": 5}), row([], {"type": "length", "length": 0}),
              row([6], {"type": "length", "length": 1}, lps=[[0, 6, "x"]])]
    answer[0]["meta_info"]["weight_version"] = 3  # an int version is taken as its string
    raw = json.dumps(answer).encode()
    comps, aborts = protocol.parse_rows(raw, [(1,), (2, 3)], [0, 1, 1], 4, "u/generate")
    assert comps == [protocol.parse_row(r, p, i, "t")[0] for r, p, i in zip(answer, [(1,), (2, 3), (2, 3)], [4, 5, 5])]
    assert aborts == []
    assert [c.prompt_index for c in comps] == [4, 5, 5] and comps[0].weight_version == "3"
    assert comps[2].log_probs == (0.0,) and comps[1].token_ids == ()
    abort = json.dumps([row([4], {"type": "length"}), row([], {"type": "abort", "message": "Abort by pause", "status_code": 503})]).encode()
    comps, aborts = protocol.parse_rows(abort, [(1,)], [0, 0], 0, "u/generate")
    assert [c.finish_reason for c in comps] == ["length", "abort"] and aborts == [(1, "Abort by pause", 503)]
    with pytest.raises(S.SGLangProtocolError, match="u/generate returned 3 results for 2 samples"):
        protocol.parse_rows(raw, [(1,)], [0, 0], 0, "u/generate")
    with pytest.raises(S.SGLangProtocolError, match="u/generate answered with invalid JSON"):
        protocol.parse_rows(b"[{", [(1,)], [0], 0, "u/generate")
    bad = json.dumps([row([4], {"type": "length"}, lps=[[-0.1, 9, None]])]).encode()
    with pytest.raises(S.SGLangProtocolError, match=r"u/generate result: output_token_logprobs\[0\]"):
        protocol.parse_rows(bad, [(1,)], [0], 0, "u/generate")


def test_error_messages():
    assert protocol.error_message(b'{"error": {"message": "Input is too long"}}') == "Input is too long"
    assert protocol.error_message(b'{"error": "unknown field `seed`"}') == "unknown field `seed`"
    assert protocol.error_message(b"Internal Server Error") == "Internal Server Error"


def test_a_web_server_that_is_not_sglang_is_named_not_dumped(lab, tiny):
    """Unclear message: a URL that answers HTTP but is not SGLang (here Python's http.server,
    which answers POST with HTTP 501 and an HTML page) must say so, never echo the raw HTML."""
    import http.server
    import threading

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        b = make(lab, f"http://127.0.0.1:{httpd.server_address[1]}", retries=0)
        with pytest.raises(S.SGLangRequestError, match=r"HTTP 501\): an HTML page .*this is not an SGLang server") as e:
            b.generate(prompts_of(tiny[1])[:1], SamplingParams(max_new_tokens=2))
        assert "<" not in str(e.value)
        b.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    long = protocol.error_message(b"x " * 1000)
    assert len(long) < 400 and long.endswith("more characters)")


# --------------------------------------------------------------------------- faults


def test_connection_refused(lab, tiny):
    url = f"http://127.0.0.1:{launch.free_port()}"  # nothing listens there
    b = make(lab, url, retries=2)
    t0 = time.monotonic()
    with pytest.raises(S.SGLangUnavailableError, match=r"(?s)failed after 3 tries.*cannot connect.*no server answered") as e:
        b.generate(prompts_of(tiny[1])[:1], SamplingParams(max_new_tokens=2))
    # the backend cannot know whether a checkpoint exists: rllab.training.runs says how the run continues, if it can
    assert isinstance(e.value, rllab.RllabError) and "the run stops here" in str(e.value) and "resume" not in str(e.value)
    assert time.monotonic() - t0 < 5
    b.close()


def test_timeout_then_retry(lab, fresh, tiny):
    prompts = prompts_of(tiny[1])[:1]
    b = make(lab, fresh.url, timeout_s=0.3, retries=0)
    fresh.delay_next(1.0)
    with pytest.raises(S.SGLangTimeoutError, match="no answer within 0.3 s"):
        b.generate(prompts, SamplingParams(max_new_tokens=2))
    b.close()
    b = make(lab, fresh.url, timeout_s=0.3, retries=1)
    fresh.delay_next(1.0)
    fresh.requests.clear()
    assert len(b.generate(prompts, SamplingParams(n=2, max_new_tokens=2, seed=0))) == 2
    assert b.last_metrics()["sglang/retries"] == 1
    first = generates(fresh)[0]["rid"]
    aborted = [body["rid"] for p, body in fresh.requests if p == "/abort_request"]
    assert aborted == [f"{first}_0", f"{first}_1"]  # the abandoned rows are stopped before the retry
    b.close()


def test_http_400_shows_sglangs_message(lab, fresh, tiny):
    b = make(lab, fresh.url)
    fresh.fail_next(400, "The input (300 tokens) is longer than the model's context length (256 tokens).")
    with pytest.raises(S.SGLangRequestError, match=r"HTTP 400\): The input \(300 tokens\) is longer"):
        b.generate(prompts_of(tiny[1])[:1], SamplingParams(max_new_tokens=2))
    b.close()


def test_503_is_retried_then_reported(lab, fresh, tiny):
    prompts = prompts_of(tiny[1])
    b = make(lab, fresh.url, retries=2)
    fresh.fail_next(503, "Service Unavailable", count=2)
    assert len(b.generate(prompts[:1], SamplingParams(max_new_tokens=2))) == 1
    assert b.last_metrics()["sglang/retries"] == 2
    fresh.fail_next(503, "still loading", count=3)
    with pytest.raises(S.SGLangRequestError, match="HTTP 503: still loading") as e:
        b.generate(prompts[:1], SamplingParams(max_new_tokens=2))
    assert e.value.status == 503
    b.close()


def test_503_during_a_weight_update_is_retried(lab, fresh, tiny):
    b = make(lab, fresh.url, retries=2)
    fresh.fail_next(503, "Service Unavailable", count=2, path="/update_weights_from_disk")
    b.update_weights(tiny[0])
    assert b.version == fresh.weight_version == "1" and len(fresh.updates) == 1
    fresh.fail_next(503, "still loading", count=3, path="/update_weights_from_disk")
    with pytest.raises(S.SGLangWeightSyncError, match=r"(?s)failed after 3 tries.*HTTP 503: still loading"):
        b.update_weights(tiny[0])
    assert b.version == "1"  # not advanced: completions still have to carry version 1


def test_503_just_after_a_weight_update(lab, fresh, tiny):
    model = tiny[0]
    b = make(lab, fresh.url, retries=4, backoff_s=0.1)
    fresh.unavailable_after_update(0.3)
    b.update_weights(model)
    out = b.generate(prompts_of(tiny[1]), SamplingParams(n=2, max_new_tokens=3, seed=0))
    assert len(out) == 8 and all(c.weight_version == "1" for c in out)
    assert b.last_metrics()["sglang/retries"] >= 1
    b.close()


def test_aborted_samples_are_retried_or_raise(lab, fresh, tiny):
    prompts = prompts_of(tiny[1])[:2]
    b = make(lab, fresh.url, abort_retries=1)
    fresh.abort_next("Abort in waiting queue")
    out = b.generate(prompts, SamplingParams(n=2, max_new_tokens=3, seed=0))
    assert len(out) == 4 and all(c.finish_reason in ("stop", "length") for c in out)
    assert b.last_metrics()["sglang/aborted"] == 4 and b.last_metrics()["sglang/retries"] == 0
    fresh.abort_next("Abort in waiting queue", count=2)
    with pytest.raises(S.SGLangAbortError, match="2 of 2 samples of prompts 0..0 were aborted on every one of 2 tries "
                                                 r"\(abort_retries = 1\).*: Abort in waiting queue"):
        b.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=3, seed=0))
    fresh.requests.clear()
    fresh.clear_faults()
    fresh.abort_next("The input is too long", status_code=400)
    with pytest.raises(S.SGLangAbortError, match=r"status 400\): The input is too long"):
        b.generate(prompts[:1], SamplingParams(max_new_tokens=3, seed=0))
    assert len(generates(fresh)) == 1  # a client error is not retried
    b.close()


def test_a_server_that_dies_mid_rollout(lab, tiny):
    prompts = prompts_of(tiny[1]) * 2
    params = SamplingParams(n=2, max_new_tokens=3, seed=0)
    with StandIn(tiny[2]) as a:
        b = make(lab, a.url, retries=2, max_in_flight=1, prompts_per_request=1)
        a.die_after(3)
        with pytest.raises(S.SGLangUnavailableError, match="dropped the connection mid-request"):
            b.generate(prompts, params)
        b.close()
    with StandIn(tiny[2]) as a, StandIn(tiny[2]) as c:
        b = make(lab, f"{a.url},{c.url}", retries=2, max_in_flight=1, prompts_per_request=1)
        want = make(lab, c.url).generate(prompts, params)
        a.die_after(2)
        got = b.generate(prompts, params)  # the other server finishes the batch
        assert [(x.prompt_index, x.token_ids) for x in got] == [(x.prompt_index, x.token_ids) for x in want]
        b.close()


def test_a_server_that_dies_under_a_steps_single_request(lab, tiny):
    """The default step is one request, whose first try runs on a blocking socket outside the
    event loop: a server dying under it hands over to the retries, which finish on the other."""
    prompts = prompts_of(tiny[1])
    params = SamplingParams(n=2, max_new_tokens=3, seed=0)
    with StandIn(tiny[2]) as a, StandIn(tiny[2]) as c:
        b = make(lab, f"{a.url},{c.url}", retries=1, backoff_s=0.05)
        want = make(lab, c.url).generate(prompts, params)
        assert len(b.generate(prompts, params)) == len(want)  # first try on a, connection kept
        a.die_after(0)
        b._rr = 0  # the next first try goes to a again
        got = b.generate(prompts, params)
        assert [(x.prompt_index, x.token_ids) for x in got] == [(x.prompt_index, x.token_ids) for x in want]
        assert b.last_metrics()["sglang/retries"] == 1 and b.last_metrics()["sglang/requests"] == 1
        b.close()


# --------------------------------------------------------------------------- weights and staleness


def test_disk_sync_is_atomic_and_versions_every_completion(lab, fresh, tiny, tmp_path):
    model, tok, _ = tiny
    changed, _ = build_tiny_model(TinyModelConfig(**{**{f: getattr(CFG, f) for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")}, "seed": 9}))
    b = make(lab, fresh.url, sync_dir=str(tmp_path))
    prompts = prompts_of(tok)
    params = SamplingParams(n=2, max_new_tokens=6, temperature=0, stop_token_ids=(tok.eos_token_id,))
    for version, m in (("1", model), ("2", changed)):
        synced = b.update_weights(m)
        assert fresh.weight_version == version and b.version == version
        assert synced["sglang/weight_version"] == float(version) and synced["time/weight_sync"] >= 0
        body = fresh.updates[-1]
        assert body["weight_version"] == version and body["flush_cache"] is True
        assert Path(body["model_path"]) == tmp_path / f"v{version}"
        assert (tmp_path / f"v{version}" / "model.safetensors").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"v{version}"]  # no temp dir, old ones pruned
        out = b.generate(prompts, params)
        want = hf(lab, m).generate(prompts, params)
        assert [c.token_ids for c in out] == [c.token_ids for c in want]
        assert {c.weight_version for c in out} == {version}
    assert "sglang/weight_version" not in b.last_metrics()  # the sync's metrics are update_weights' return value
    b.close()


def test_disk_sync_prints_no_bar_per_step(lab, fresh, tiny, capfd):
    from transformers.utils import logging as hf_logging

    b = make(lab, fresh.url)
    capfd.readouterr()
    b.update_weights(tiny[0])
    assert "Writing model shards" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # restored for everything else


def test_every_server_gets_the_weights(lab, tiny):
    with StandIn(tiny[2]) as a, StandIn(tiny[2]) as c, StandIn(tiny[2]) as router:
        # requests go to the "router"; its workers, listed in admin_urls, receive the weights
        b = make(lab, router.url, admin_urls=f"{a.url}, {c.url}")
        b.update_weights(tiny[0])
        assert (a.weight_version, c.weight_version, router.weight_version) == ("1", "1", "default")
        assert router.updates == []
        snapshots = b.sync_dir
        assert snapshots.is_dir()
        b.close()
        assert not snapshots.exists()  # a private snapshot directory goes with the backend


def test_failed_weight_update_shows_sglangs_message(lab, fresh, tiny):
    b = make(lab, fresh.url)
    fresh.fail_update("Failed to update weights: out of memory. Rolling back to the previous weights.")
    with pytest.raises(S.SGLangWeightSyncError, match="out of memory. Rolling back"):
        b.update_weights(tiny[0])
    assert b.version is None
    b.close()


@pytest.mark.parametrize("spans", [False, True])
def test_stale_samples_are_dropped_kept_or_refused_and_always_counted(lab, fresh, tiny, spans):
    prompts = prompts_of(tiny[1])[:2]
    params = SamplingParams(n=2, max_new_tokens=3, seed=0)
    backends = {m: make(lab, fresh.url, stale=m, max_in_flight=1, prompts_per_request=1) for m in ("drop", "keep", "error")}
    for b in backends.values():
        b.update_weights(tiny[2])  # a model directory is sent as it is
    fresh.weight_version = "1"
    fresh.stale_next("0", spans=spans)
    out = backends["drop"].generate(prompts, params)
    m = backends["drop"].last_metrics()
    assert len(out) == 2 and {c.prompt_index for c in out} == {1} and all(c.weight_version == "1" for c in out)
    assert (m["rollout/stale"], m["rollout/stale_dropped"], m["rollout/stale_total"]) == (2.0, 2.0, 2.0)
    fresh.stale_next("0", spans=spans)
    out = backends["keep"].generate(prompts, params)
    m = backends["keep"].last_metrics()
    assert len(out) == 4 and sum(c.weight_version != "1" for c in out) == 2
    assert (m["rollout/stale"], m["rollout/stale_dropped"]) == (2.0, 0.0)
    fresh.stale_next("0", spans=spans)
    with pytest.raises(S.StaleSampleError, match="not the last pushed '1'"):
        backends["error"].generate(prompts, params)
    fresh.stale_next("0", count=2, spans=spans)
    with pytest.raises(S.StaleSampleError, match="every completion was stale"):
        backends["drop"].generate(prompts, params)
    for b in backends.values():
        b.close()


def test_tensor_sync_refuses_a_cpu_policy(lab, fresh, tiny):
    b = make(lab, fresh.url, weight_sync="tensor")
    with pytest.raises(S.SGLangWeightSyncError, match="needs the policy on CUDA"):
        b.update_weights(tiny[0])
    assert fresh.updates == []


def test_tensor_sync_runs_inside_a_weight_update_session(lab, fresh, tiny, monkeypatch):
    monkeypatch.setattr(sync, "tensor_payload", lambda model: "UEFZTE9BRA==")  # CUDA-IPC needs a GPU
    b = make(lab, fresh.url, weight_sync="tensor", tp_size=2)
    b.update_weights(tiny[0])
    routes = [u["route"] for u in fresh.updates]
    assert routes == ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]
    body = fresh.updates[1]
    assert body["serialized_named_tensors"] == ["UEFZTE9BRA=="] * 2 and body["weight_version"] == "1"
    assert b.version == fresh.weight_version == "1"


def test_tensor_sync_skips_sessions_on_servers_without_them(lab, fresh, tiny, monkeypatch):
    monkeypatch.setattr(sync, "tensor_payload", lambda model: "UEFZTE9BRA==")
    fresh.fail_next(404, "Not Found", path="/begin_weight_update")  # a server from before the session routes
    fresh._session_open = True  # such a server takes updates without a session
    b = make(lab, fresh.url, weight_sync="tensor")
    b.update_weights(tiny[0])
    assert [u["route"] for u in fresh.updates] == ["/update_weights_from_tensor"]
    b.update_weights(tiny[0])  # remembered: no second try of the missing route
    assert [p for p, _ in fresh.requests].count("/begin_weight_update") == 1


def _changed_model(seed=9):
    return build_tiny_model(TinyModelConfig(**{**{f: getattr(CFG, f) for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")}, "seed": seed}))[0]


def test_a_lora_policy_reaches_the_server_merged(lab, fresh, tiny, tmp_path):
    """With LoRA the trainer hands the backend the merged model (``W + (alpha/r)·B A``, plain names):
    the server then samples exactly what the adapted policy samples."""
    import copy

    pytest.importorskip("peft")
    from rllab.models import lora

    _, tok, path = tiny
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lp = lora.LoraPolicy.attach(policy, lora.LoraConfig(r=2))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(3))
    b = make(lab, fresh.url, sync_dir=str(tmp_path))
    b.update_weights(lp.merged())
    prompts = prompts_of(tok)
    params = SamplingParams(n=2, max_new_tokens=6, temperature=0, stop_token_ids=(tok.eos_token_id,))
    out = b.generate(prompts, params)
    adapted = hf(lab, copy.deepcopy(policy)).generate(prompts, params)  # the adapters active, not merged
    base = hf(lab, path).generate(prompts, params)
    assert [c.token_ids for c in out] == [c.token_ids for c in adapted]
    assert [c.token_ids for c in out] != [c.token_ids for c in base]
    b.close()


def _weights_on(b, name):
    async def get():
        return await b._call("POST", b.admin_urls[0] if b.admin_urls else b.urls[0], "/get_weights_by_name", {"name": name, "truncate_size": 10**9})

    status, raw = b._loop.run(get())
    assert status == 200, raw
    return torch.tensor(json.loads(raw))


@pytest.mark.parametrize("dtype", ["model", "bfloat16"])
def test_distributed_sync_broadcasts_every_tensor_to_a_server_in_another_process(lab, tiny, dtype):
    """The whole distributed route over gloo: the stand-in (a separate process, as a launched server
    is) joins the trainer's group, receives each broadcast tensor and loads it; completions then
    come from the new weights and carry the new version."""
    _, tok, path = tiny
    b = lab.get("rollout_backend", "sglang", **launch_knobs(
        model_path=str(path), weight_sync="distributed", distributed_backend="gloo", distributed_dtype=dtype))()
    _OPEN.append(b)
    prompts = prompts_of(tok)
    params = SamplingParams(n=2, max_new_tokens=6, temperature=0, stop_token_ids=(tok.eos_token_id,))
    for version, seed in (("1", 9), ("2", 10)):
        policy = _changed_model(seed)
        m = b.update_weights(policy)
        assert b.version == version and b._group is not None
        for name, p in policy.named_parameters():
            got = _weights_on(b, name)
            want = p.detach().flatten() if dtype == "model" else p.detach().flatten().bfloat16().float()
            assert torch.equal(got, want), name
        out = b.generate(prompts, params)
        assert {c.weight_version for c in out} == {version}
        if dtype == "model":
            assert [c.token_ids for c in out] == [c.token_ids for c in hf(lab, policy).generate(prompts, params)]
        assert m["sglang/weight_version"] == float(version) and m["sglang/sync_mib"] > 0
    group = b._group.group_name
    b.close()
    assert b._group is None and group


def test_distributed_sync_errors_name_the_fix(lab, fresh, tiny):
    with pytest.raises(rllab.ConfigError, match="distributed_backend acts only with weight_sync = 'distributed'"):
        lab.get("rollout_backend", "sglang", urls=fresh.url, distributed_backend="gloo")
    b = make(lab, fresh.url, weight_sync="distributed")  # nccl, the default, with a CPU policy
    with pytest.raises(S.SGLangWeightSyncError, match="needs the policy on CUDA.*distributed_backend"):
        b.update_weights(tiny[0])
    assert fresh.updates == [] and b.version is None


def test_distributed_sync_checks_the_servers_parallelism_first(lab, fresh, tiny):
    b = make(lab, fresh.url, weight_sync="distributed", distributed_backend="gloo", tp_size=2)
    with pytest.raises(S.SGLangWeightSyncError, match="runs with tp_size 1 but the backend's tp_size is 2: set backend.tp_size = 1"):
        b.update_weights(tiny[0])
    fresh.dp_size = 2
    b = make(lab, fresh.url, weight_sync="distributed", distributed_backend="gloo")
    with pytest.raises(S.SGLangWeightSyncError, match="dp_size 2.*one server per replica"):
        b.update_weights(tiny[0])
    assert not [p for p, _ in fresh.requests if p == "/init_weights_update_group"]  # nobody was left waiting


def test_distributed_sync_shows_the_servers_refusal(lab, fresh, tiny):
    fresh.fail_next(400, "Failed to initialize custom process group: cannot reach 10.0.0.9:1234.", path="/init_weights_update_group")
    b = make(lab, fresh.url, weight_sync="distributed", distributed_backend="gloo", timeout_s=5.0)
    t0 = time.monotonic()
    with pytest.raises(S.SGLangWeightSyncError, match="init_weights_update_group failed.*cannot reach 10.0.0.9"):
        b.update_weights(tiny[0])
    assert time.monotonic() - t0 < 4.0  # the refusal ends the wait; the trainer does not sit out the timeout
    assert b.version is None and b._group is None


# --------------------------------------------------------------------------- launch and contract





def test_launch_prints_the_command_waits_for_health_and_stops(lab, tiny, capfd):
    b = lab.get("rollout_backend", "sglang", **launch_knobs(model_path=str(tiny[2])))()
    proc = b._process
    assert proc is not None and b.version == "0"
    assert "rllab sglang: launching" in capfd.readouterr().err
    out = b.generate(prompts_of(tiny[1])[:1], SamplingParams(n=2, max_new_tokens=3, seed=0))
    assert [c.weight_version for c in out] == ["0", "0"]
    b.close()
    assert proc.poll() is not None


def test_launch_failure_is_clear(lab, tiny):
    knobs = launch_knobs(model_path=str(tiny[2]))
    knobs["launch_command"] = f"{sys.executable} -c 'raise SystemExit(3)'"
    with pytest.raises(S.SGLangUnavailableError, match="exited with code 3 before answering /health"):
        lab.get("rollout_backend", "sglang", **knobs)()


@pytest.mark.parametrize("case", contract_cases(names=["sglang"], knobs=launch_knobs()), ids=str)
def test_contract(case):
    case.run()


# --------------------------------------------------------------------------- end to end


SMALL = [
    "model.tiny.hidden_size=64", "model.tiny.intermediate_size=128", "model.warm_start.eval_limit=0",
    "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=6", "train.eval_size=16",
    "train.checkpoint_every=0",
]


@pytest.fixture(scope="module")
def warm_cache(model_cache):
    """The module's model cache, which the end-to-end runs below share: their warm start (SMALL's
    model, 60 steps) is built once, not once per test (or copied in, tests/conftest.py)."""
    import os

    return Path(os.environ["RLLAB_CACHE"])


def train_both(tmp_path, monkeypatch, warm_cache, *extra):
    """The same config and seed trained with rollouts from the stand-in and from the hf backend."""
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    monkeypatch.setenv("RLLAB_CACHE", str(warm_cache))
    cfg = [*SMALL, *extra]
    with StandIn(None, lifetime_s=300) as server:
        sg = run_experiment(load_config(None, [*cfg, "backend=sglang", f"backend.urls={server.url}"]),
                            run_dir=tmp_path / "sglang", progress=False)
        versions = [u["weight_version"] for u in server.updates]
        generated = sum(p == "/generate" for p, _ in server.requests)
    ref = run_experiment(load_config(None, cfg), run_dir=tmp_path / "hf", progress=False)

    def steps(name):
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "rollout/reward" in r]

    assert sg.keys() == ref.keys()
    return steps("sglang"), steps("hf"), versions, generated


def test_random_aborts_resubmit_only_the_aborted_samples(lab, tiny):
    """A server that aborts samples at random (here 30%, to see several in a few rows): only the
    aborted samples go out again, each with the seed it had, so a seeded step gets exactly the
    samples an abort-free server gives; every abort is counted, none is a whole-request retry."""
    prompts = prompts_of(tiny[1])
    seeded = SamplingParams(n=3, max_new_tokens=4, seed=5)
    with StandIn(tiny[2], abort_rate=0.3, abort_seed=1) as flaky, StandIn(tiny[2]) as clean:
        want = make(lab, clean.url, prompts_per_request=2).generate(prompts, seeded)
        for per_request in (2, 16):  # two requests in the event loop; one on the blocking path
            b = make(lab, flaky.url, prompts_per_request=per_request)
            before = start = flaky.aborted
            flaky.requests[:] = []
            got = b.generate(prompts, seeded)
            m = b.last_metrics()
            aborted = flaky.aborted - before
            assert aborted > 0 and m["sglang/aborted"] == aborted and m["sglang/retries"] == 0
            assert [(c.prompt_index, c.token_ids, c.log_probs) for c in got] == [
                (c.prompt_index, c.token_ids, c.log_probs) for c in want]
            # the first round sends all 12 samples; each resubmission only the samples aborted before it
            # (counted, not ordered: under load a resubmission may reach the server before the first
            # round's other request)
            first = -(-4 // per_request)  # requests of the first round
            bodies = generates(flaky)
            assert len(bodies) > first and sum(len(body["input_ids"]) for body in bodies) == 12 + aborted
            assert all(sp["n"] == 1 for body in bodies for sp in body["sampling_params"])
        # unseeded n > 1: resubmitted one row per aborted sample; every group complete, in order
        before = flaky.aborted
        out = b.generate(prompts, SamplingParams(n=3, max_new_tokens=4))
        assert [c.prompt_index for c in out] == [i for i in range(4) for _ in range(3)]
        assert all(c.finish_reason in ("stop", "length") for c in out)
        assert b.last_metrics()["sglang/aborted"] == flaky.aborted - before
        assert b.last_metrics()["sglang/aborted_total"] == flaky.aborted - start  # this backend's two calls


def test_short_training_run_through_the_standin(tmp_path, monkeypatch, warm_cache):
    ours, theirs, versions, generated = train_both(tmp_path, monkeypatch, warm_cache, "model.warm_start.steps=60", "train.steps=3")
    assert versions == ["1", "2", "3", "4"]  # the first sync, then one per optimizer step
    assert generated >= 3  # every rollout came from the server (4 prompts: one request a step)
    assert len(ours) == len(theirs) == 3
    # the same metrics, plus the sglang backend's own counters
    extra = set(ours[0]) - set(theirs[0])
    assert set(theirs[0]) <= set(ours[0]) and all(k.startswith(("sglang/", "rollout/stale", "time/")) for k in extra), extra
    assert "rollout/stale" in extra and "sglang/requests" in extra
    for r in ours:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float)), r


@pytest.mark.slow
def test_short_training_run_learns_as_the_hf_backend_does(tmp_path, monkeypatch, warm_cache):
    """A warm-started policy that is sometimes right: with rollouts from the stand-in the run gets
    rewards and makes updates, and its rewards stay close to the hf backend's under the same
    seed (the samples differ: seeds are drawn per sample here)."""
    ours, theirs, versions, _ = train_both(tmp_path, monkeypatch, warm_cache, "model.warm_start.steps=400", "train.steps=4")
    assert versions == ["1", "2", "3", "4", "5"]
    for rows in (ours, theirs):
        assert any(r["rollout/reward"] > 0 for r in rows) and any(r["loss/policy"] != 0 for r in rows)
    mean = lambda rows: sum(r["rollout/reward"] for r in rows) / len(rows)  # noqa: E731
    assert abs(mean(ours) - mean(theirs)) < 0.2


def test_a_run_with_distributed_weight_sync(tmp_path, monkeypatch, warm_cache):
    """The trainer's own loop with weight_sync = "distributed" (over gloo, the server a separate
    process the backend launches): the first sync starts the server from a snapshot, every later
    one is a broadcast, and every rollout comes from the weights just pushed."""
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    monkeypatch.setenv("RLLAB_CACHE", str(warm_cache))
    knobs = launch_knobs(weight_sync="distributed", distributed_backend="gloo")
    over = [f"backend.{k}={json.dumps(v)}" for k, v in knobs.items()]
    run_experiment(load_config(None, [*SMALL, "model.warm_start.steps=60", "train.steps=2", "backend=sglang", *over]),
                   run_dir=tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    assert len(steps) == 2
    assert all(r["rollout/stale"] == 0 for r in steps)
    # a step's row holds the sync after its update (the launch from a snapshot, version 1, came
    # before step 1 and has no row): a broadcast each, versions 2 and 3
    assert [r.get("sglang/sync_mib", 0) > 0 for r in steps] == [True, True]
    assert [r["sglang/weight_version"] for r in steps] == [2.0, 3.0]


# --------------------------------------------------------------------------- no litter


@pytest.mark.parametrize("fault", ["first_sync", "generate"])
def test_a_failed_run_leaves_no_weight_snapshot_behind(tmp_path, monkeypatch, fault):
    """Class: litter. A run with backend=sglang that fails — at its first weight sync (while the
    trainer is still being built) or in a step's rollout — removes its private
    rllab-sglang-* snapshot directory (model-sized in general), as a successful run does."""
    import tempfile

    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with StandIn(None, lifetime_s=120) as server:
        if fault == "first_sync":
            server.fail_update("Failed to update weights: out of memory.")
        else:
            server.fail_next(400, "bad request", count=50)
        cfg = load_config(None, [*SMALL, "model.warm_start.steps=0", "train.steps=2", "backend=sglang", f"backend.urls={server.url}", "backend.retries=0"])
        with pytest.raises(S.SGLangError):
            run_experiment(cfg, run_dir=tmp_path / "run", progress=False)
    assert not list((tmp_path / "tmp").glob("rllab-sglang-*"))


def test_close_removes_the_snapshot_directory_even_when_closing_connections_fails(lab, tiny, monkeypatch):
    """Class: litter. A failed launch, or a close() whose first steps raise, still removes the
    backend's private snapshot directory; a directory the user gave (sync_dir) is never removed."""
    knobs = launch_knobs(model_path=str(tiny[2]))
    knobs["launch_command"] = f"{sys.executable} -c 'raise SystemExit(3)'"
    made = []
    real = S.backend.tempfile.mkdtemp
    monkeypatch.setattr(S.backend.tempfile, "mkdtemp", lambda **kw: made.append(real(**kw)) or made[-1])
    with pytest.raises(S.SGLangUnavailableError):
        lab.get("rollout_backend", "sglang", **knobs)()
    assert made and not Path(made[-1]).exists()
    b = make(lab, "http://127.0.0.1:9")
    assert b.sync_dir.is_dir()
    monkeypatch.setattr(b._loop, "close", lambda: (_ for _ in ()).throw(RuntimeError("loop")))
    with pytest.raises(RuntimeError, match="loop"):
        b.close()
    assert not b.sync_dir.exists()
    monkeypatch.undo()
    b.close()


def test_a_run_survives_a_server_that_aborts_6_percent_of_samples(tmp_path, monkeypatch, warm_cache):
    """What ended runs before: about 6% of samples aborted, so nearly every request held one. The
    run completes; the aborted samples are resubmitted and counted, step by step."""
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    monkeypatch.setenv("RLLAB_CACHE", str(warm_cache))
    with StandIn(None, lifetime_s=300, abort_rate=0.06, abort_seed=3) as server:
        run_experiment(load_config(None, [*SMALL, "model.warm_start.steps=60", "train.steps=3", "rollout.group_size=8",
                                          "train.eval_size=32", "backend=sglang", f"backend.urls={server.url}",
                                          "backend.backoff_s=0.01"]),
                       run_dir=tmp_path / "run", progress=False)
        total = server.aborted
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    assert len(steps) == 3 and total > 0
    totals = [r["sglang/aborted_total"] for r in steps]
    assert totals == sorted(totals) and totals[-1] <= total
    assert all(r["sglang/retries"] == 0 for r in steps)  # no whole request was sent again
    assert sum(r["sglang/aborted"] for r in steps) <= totals[-1]


def test_a_run_resumes_on_a_server_that_came_back_at_another_address(tmp_path, monkeypatch, warm_cache, capsys):
    """The server died after a checkpoint and came back elsewhere: ``--resume RUN
    backend.urls=NEW`` continues the run from its checkpoint on the new server and records the
    change; the recorded config now names the new address."""
    import tomllib

    from rllab.config import load_config
    from rllab.training.runs import RESUME_LOG, resume_run
    from rllab.training.trainer import run_experiment

    monkeypatch.setenv("RLLAB_CACHE", str(warm_cache))
    run = tmp_path / "run"
    with StandIn(None, lifetime_s=300) as first:
        run_experiment(load_config(None, [*SMALL, "model.warm_start.steps=60", "train.steps=1", "backend=sglang",
                                          f"backend.urls={first.url}", "backend.backoff_s=0.01"]),
                       run_dir=run, progress=False)
        old = first.url
    with StandIn(None, lifetime_s=300) as second:
        summary = resume_run(run, overrides=["train.steps=2", f"backend.urls=[\"{second.url}\"]", "backend.retries=5"],
                             progress=False)
        assert generates(second)  # the new step's rollout and the final evaluation came from here
    assert summary["steps"] == 2
    (entry,) = [json.loads(line) for line in (run / RESUME_LOG).read_text().splitlines()]
    assert entry["from_step"] == 1
    assert entry["changes"] == {"backend.urls": {"from": old, "to": [second.url]},
                                "backend.retries": {"from": 3, "to": 5}}
    out = capsys.readouterr().out
    assert f"resume at step 1: backend.urls changed from {old!r} to ['{second.url}']" in out
    assert "backend.retries changed from 3 to 5" in out
    recorded = tomllib.loads((run / "config.toml").read_text())["backend"]
    assert recorded["urls"] == [second.url] and recorded["retries"] == 5


@pytest.mark.parametrize("env", ["guess", pytest.param("calculator", marks=pytest.mark.slow),
                                 pytest.param("search", marks=pytest.mark.slow)])
def test_a_multi_turn_environment_trains_through_the_standin(env, tmp_path, monkeypatch):
    """Each built-in environment's episodes through the sglang backend: every turn after the
    first is a request continuing the episode's ids (prompt, turns, observations), the steps train
    on finite metrics and the episode counters reach the run's metrics."""
    from rllab.config import load_config
    from rllab.training.trainer import run_experiment

    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "cache"))
    small = [k for k in SMALL if not k.startswith("rollout.max_new_tokens")]
    with StandIn(None, lifetime_s=300) as server:
        run_experiment(load_config(None, [*small, f"env={env}", "model.warm_start.steps=40", "train.steps=2",
                                          "backend=sglang", f"backend.urls={server.url}"]),
                       run_dir=tmp_path / "run", progress=False)
        bodies = generates(server)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["env/turns"] >= 1 and all(math.isfinite(v) for v in r.values() if isinstance(v, float)), r
    if env == "guess":  # higher/lower takes several turns
        assert any(r["env/turns"] > 1 for r in steps)
    if any(r["env/turns"] > 1 for r in steps):  # a later turn: n = 1 per live episode, longer ids than any prompt
        later = [b for b in bodies if all(sp["n"] == 1 for sp in b["sampling_params"])]
        assert later and max(len(ids) for b in later for ids in b["input_ids"]) > min(
            len(ids) for b in bodies for ids in b["input_ids"])
