"""``opd`` with its teacher served by SGLang (``algorithm.teacher = "http://…"``), against the stand-in
server (tests/sglang_standin.py) serving the same model directory as a local teacher: the
teacher's log-probs and the distillation loss match; a server down or a wrong setting is named."""

from __future__ import annotations

import math

import pytest
import torch

from rllab.config import load_config
from rllab.errors import ConfigError
from rllab.training.trainer import Trainer
from rllab_algorithms.teacher_server import TeacherError, rows_to_score
from rllab_backends.sglang import SGLangBackend, SGLangBackendConfig, SGLangProtocolError
from rllab_backends.sglang.score import parse_scores

from tests.sglang_standin import StandIn
from .tiny import TINY, overrides


@pytest.fixture(scope="module", autouse=True)
def _cache(model_cache):
    yield


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return Trainer(_cfg(), run_dir=tmp_path_factory.mktemp("teacher"), progress=False).model_dir


@pytest.fixture(scope="module")
def server(teacher):
    with StandIn(teacher) as s:
        yield s


def _cfg(*extra):
    return load_config(None, [*overrides(TINY), *extra])


def test_prompt_logprobs_are_the_models_log_softmax(teacher, server):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32).eval()
    seqs, first = [[3, 7, 9, 4, 5], [2, 6, 8]], [3, 1]
    got = SGLangBackend(SGLangBackendConfig(urls=server.url)).prompt_logprobs(seqs, first)
    for seq, f, lps in zip(seqs, first, got):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([seq])).logits[0], -1)
        assert lps == pytest.approx([lp[p - 1, seq[p]].item() for p in range(f, len(seq))], abs=1e-5)
    body = [b for p, b in server.requests if p == "/generate"][-1]
    assert body["logprob_start_len"] == [2, 0] and body["sampling_params"]["max_new_tokens"] == 0 and body["return_logprob"]


def test_rows_to_score_drop_padding_and_find_the_response():
    from types import SimpleNamespace

    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0], [1, 2, 3, 4, 9, 0, 0]])
    attn = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    batch = SimpleNamespace(input_ids=ids, attention_mask=attn, response_mask=attn[:, -3:])
    assert rows_to_score(batch) == ([[5, 6, 7, 8], [1, 2, 3, 4, 9]], [2, 4], [2, 1])


def test_an_answer_with_wrong_tokens_or_lengths_is_refused():
    ok = b'[{"meta_info": {"input_token_logprobs": [[null, 4, null], [-0.5, 5, null]]}}]'
    assert parse_scores(ok, [[3, 4, 5]], [2], "s") == [[-0.5]]
    with pytest.raises(SGLangProtocolError, match="is not a log-prob of token 5"):
        parse_scores(ok.replace(b"-0.5, 5", b"-0.5, 6"), [[3, 4, 5]], [2], "s")
    with pytest.raises(SGLangProtocolError, match="honour logprob_start_len"):
        parse_scores(b'[{"meta_info": {}}]', [[3, 4, 5]], [2], "s")


def test_the_served_teacher_gives_the_local_teachers_loss(teacher, server, tmp_path):
    common = ("model.warm_start.steps=0", "algorithm=opd", "rollout.temperature=1.0", "algorithm.estimator=k3")
    local = Trainer(_cfg(*common, f"algorithm.teacher={teacher}"), run_dir=tmp_path / "a", progress=False)
    served = Trainer(_cfg(*common, f"algorithm.teacher={server.url}"), run_dir=tmp_path / "b", progress=False)
    for _ in range(2):
        a, b = local.train_step(), served.train_step()
        assert a["distill/k1"] > 0.1 and math.isfinite(b["distill/k1"])
        for key in ("distill/k1", "distill/k3", "loss/distill", "loss/total"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key


def test_a_server_teacher_needs_temperature_one(server, tmp_path):
    # refused when the run is built, before any sampling
    with pytest.raises(ConfigError, match=r"teacher = .* \(a server\) needs rollout.temperature = 1 \(it is 0.7\)") as e:
        Trainer(_cfg("algorithm=opd", f"algorithm.teacher={server.url}", "rollout.temperature=0.7"), run_dir=tmp_path / "s", progress=False)
    assert e.value.key == "rollout.temperature"


def test_a_teacher_server_that_is_down_is_named(tmp_path):
    tr = Trainer(_cfg("algorithm=opd", "algorithm.teacher=http://127.0.0.1:9", "rollout.temperature=1.0"),
                 run_dir=tmp_path / "s", progress=False)
    with pytest.raises(TeacherError, match=r"(?s)the teacher at 'http://127.0.0.1:9' \(algorithm.teacher\) could not score.*cannot connect"):
        tr.train_step()


def test_a_server_teacher_is_told_from_a_directory_by_its_scheme():
    from rllab_algorithms.distill import is_url

    assert is_url("http://127.0.0.1:30000") and is_url("https://teacher.example")
    assert not is_url("/models/teacher") and not is_url("127.0.0.1:30000")


@pytest.mark.parametrize("value, match", [
    ("127.0.0.1:30000", "is not a directory; .* or an SGLang server's URL"),
    ("grpc://127.0.0.1:30000", "a local model directory or an SGLang server's http:// or https:// URL"),
    ("http://", "a URL without a host"),
])
def test_teacher_settings_are_checked(value, match):
    with pytest.raises(ConfigError, match=match) as e:
        _cfg("algorithm=opd", f"algorithm.teacher={value}")
    assert "teacher" in str(e.value)


def test_a_web_server_that_is_not_sglang_is_named_as_the_teacher(tmp_path):
    import http.server
    import threading

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)  # POST: 501, HTML
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        tr = Trainer(_cfg("algorithm=opd", f"algorithm.teacher={url}"), run_dir=tmp_path / "s", progress=False)
        with pytest.raises(TeacherError, match=r"(?s)not an SGLang server.*check the URL and port in algorithm.teacher") as e:
            tr.train_step()
        assert "backend.urls" not in str(e.value)
    finally:
        httpd.shutdown()
