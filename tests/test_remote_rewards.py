"""The reward functions that ask a server (``remote``, ``llm_judge``), against a stand-in server
in a thread: the wire contract, retries with backoff, timeouts, the shared rate limit, malformed
answers, batching, and how failures meet ``rollout.reward_errors``."""

from __future__ import annotations

import json
import math
import time

import pytest

from rllab.errors import ConfigError, RewardError
from rllab.rollout.rewards import RewardFunctionError, load_reward_function

from .reward_standin import RewardStandIn, default_answer

pytest.importorskip("requests")

from rllab_tasks.reward_service import (  # noqa: E402
    HttpKnobs, RewardServiceError, TokenBucket, backoff, bucket_for, failing_streak, forget, parse_retry_after,
    post_json, retry_wait,
)

FAST = {"backoff_s": 0.01, "max_backoff_s": 0.02, "timeout_s": 5.0}


@pytest.fixture(autouse=True)
def _forget():
    """Each test starts with no remembered score and no URL down (a port may be used again)."""
    forget()
    yield
    forget()


def _remote_dataset(data, url):
    """The data set task scored by the remote reward at ``url`` (a fifth of its prompts held out)."""
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    return DatasetTask(DatasetConfig(path=str(data), rewards=("remote",), eval_fraction=0.2,
                                     reward_knobs=json.dumps({"remote": {"url": url, **FAST}})))


@pytest.fixture
def server():
    with RewardStandIn() as s:
        yield s


def score(ref, knobs, completions, answers=None, prompts=None):
    fn = load_reward_function(ref, knobs=knobs)
    n = len(completions)
    return fn.batch(prompts=prompts or [f"{i}+1=" for i in range(n)], completions=completions,
                    ground_truth=answers or [str(i + 1) for i in range(n)], columns=[{}] * n,
                    rows=[f"row {i}" for i in range(n)])


# --------------------------------------------------------------------------- remote: the contract


def test_remote_posts_prompt_response_label_and_reads_a_number(server):
    out = score("remote", {"url": server.url + "/score", **FAST}, ["1", "3", "3"])
    assert out == [1.0, 0.0, 1.0]
    assert server.paths == ["/score"] * 3
    assert sorted(server.bodies, key=lambda b: b["prompt"]) == [
        {"prompt": "0+1=", "response": "1", "label": "1"},
        {"prompt": "1+1=", "response": "3", "label": "2"},
        {"prompt": "2+1=", "response": "3", "label": "3"},
    ]


def test_remote_sends_a_chat_prompt_as_its_messages(server):
    msgs = ({"role": "user", "content": "0+1="},)
    out = score("remote", {"url": server.url, **FAST}, ["1"], prompts=[msgs])
    assert out == [1.0]
    assert server.bodies == [{"prompt": [{"role": "user", "content": "0+1="}], "response": "1", "label": "1"}]


def test_score_key_picks_a_nested_field_and_a_bare_object_is_refused():
    with RewardStandIn(lambda path, body: (200, {"result": {"score": 0.25}, "note": "x"})) as s:
        assert score("remote", {"url": s.url, "score_key": "result.score", **FAST}, ["1", "2"]) == [0.25, 0.25]
        with pytest.raises(RewardFunctionError, match=r"JSON object .*set score_key"):
            score("remote", {"url": s.url, **FAST}, ["1"])
        with pytest.raises(RewardFunctionError, match=r"no field 'score'.*keys \['note', 'result'\]"):
            score("remote", {"url": s.url, "score_key": "score", **FAST}, ["1"])


@pytest.mark.parametrize("batching, posts", [("group", [2, 2]), ("step", [4])])
def test_batching_sends_groups_or_the_step_in_one_post(server, batching, posts):
    prompts = ["0+1=", "0+1=", "1+1=", "1+1="]
    out = score("remote", {"url": server.url, "batching": batching, **FAST}, ["1", "7", "2", "2"],
                answers=["1", "1", "2", "2"], prompts=prompts)
    assert out == [1.0, 0.0, 1.0, 1.0]
    assert sorted(len(b) for b in server.bodies) == posts and all(isinstance(b, list) for b in server.bodies)
    if batching == "group":
        assert {tuple(x["prompt"] for x in b) for b in server.bodies} == {("0+1=", "0+1="), ("1+1=", "1+1=")}


def test_a_batch_answer_may_be_an_object_holding_the_list():
    with RewardStandIn(lambda path, body: (200, {"scores": [0.5] * len(body)})) as s:
        assert score("remote", {"url": s.url, "batching": "step", "score_key": "scores", **FAST}, ["a", "b", "c"]) == [0.5] * 3


def test_a_batch_answer_of_the_wrong_length_is_a_reward_error():
    with RewardStandIn(lambda path, body: (200, [1.0])) as s:
        with pytest.raises(RewardFunctionError, match=r"2 completions were sent in one POST.*a list of 1"):
            # each row is then scored alone to name it: one item in, one score out is fine, so the
            # batch error itself is raised
            score("remote", {"url": s.url, "batching": "step", **FAST}, ["a", "b"])


# --------------------------------------------------------------------------- remote: failures


def test_5xx_then_success_is_retried(server):
    server.script = [(500, {"error": "busy"}, 0.0), (503, b"overloaded", 0.0)]
    assert score("remote", {"url": server.url, **FAST}, ["1"]) == [1.0]
    assert len(server.bodies) == 3


def test_the_backoff_doubles_up_to_its_cap(server):
    server.script = [(502, b"", 0.0)] * 4
    waits, slept = [], []
    knobs = HttpKnobs(backoff_s=0.5, max_backoff_s=1.5, retries=4, jitter=0.0)
    assert post_json(server.url, {"response": "1", "label": "1"}, knobs, who="t", sleep=slept.append, waits=waits) == 1.0
    assert [w for _, _, w in waits] == [0.5, 1.0, 1.5, 1.5] and [a for _, a, _ in waits] == [0, 1, 2, 3]
    assert len(slept) == 4 and all(0.0 < s <= w for s, (_, _, w) in zip(slept, waits))  # nothing else in flight: it sleeps
    assert [backoff(k, HttpKnobs(backoff_s=2.0, max_backoff_s=30.0)) for k in range(6)] == [2, 4, 8, 16, 30, 30]


def test_jitter_shortens_each_wait_by_up_to_its_fraction():
    knobs = HttpKnobs(backoff_s=2.0, max_backoff_s=30.0, jitter=0.5)
    assert [retry_wait(k, knobs, None, 0.0) for k in range(3)] == [2.0, 4.0, 8.0]  # u = 0: the full backoff
    assert [retry_wait(k, knobs, None, 0.5) for k in range(3)] == [1.5, 3.0, 6.0]  # 1 − 0.5·0.5 = 0.75 of it
    assert retry_wait(5, knobs, None, 0.999) == pytest.approx(30 * (1 - 0.4995))
    assert retry_wait(0, HttpKnobs(backoff_s=2.0, jitter=0.0), None, 0.9) == 2.0
    # a Retry-After sets the wait, shorter or longer than the backoff (no jitter), at most max_backoff_s
    assert retry_wait(0, knobs, 3.5, 0.9) == 3.5 and retry_wait(4, knobs, 0.1, 0.0) == 0.1
    assert retry_wait(0, knobs, 100.0, 0.0) == 30.0


def test_retry_after_reads_seconds_and_http_dates():
    now = 1_445_412_480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after("120", lambda: now) == 120.0 and parse_retry_after(" 0.5 ", lambda: now) == 0.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:07 GMT", lambda: now) == pytest.approx(7.0)
    assert parse_retry_after("Wednesday, 21-Oct-15 07:29:00 GMT", lambda: now) == pytest.approx(60.0)  # RFC 850 form
    assert parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", lambda: now) == 0.0  # a date past: at once
    assert parse_retry_after("-3", lambda: now) == 0.0
    assert [parse_retry_after(v) for v in (None, "", "soon", "Wed, 99 Foo")] == [None] * 4


def test_retry_after_sets_the_wait_up_to_the_cap(server):
    knobs = HttpKnobs(backoff_s=0.1, max_backoff_s=5.0, retries=3, jitter=0.0)
    server.script = [(429, b"slow down", 0.0, {"Retry-After": "0.3"}), (503, b"", 0.0, {"Retry-After": "100"}),
                     (429, b"", 0.0, {"Retry-After": "0.01"})]
    waits = []
    assert post_json(server.url, {"response": "1", "label": "1"}, knobs, who="t", sleep=lambda s: None, waits=waits) == 1.0
    assert [w for _, _, w in waits] == [0.3, 5.0, 0.01]  # what the server said, at most max_backoff_s


def test_a_server_that_keeps_failing_raises_naming_url_attempts_and_answer(server):
    server.script = [(500, {"error": "grader crashed"}, 0.0)] * 3
    with pytest.raises(RewardFunctionError, match=r"remote.*raised on row 0.*failed 3 attempt\(s\) \(retries = 2\).*HTTP 500.*grader crashed"):
        score("remote", {"url": server.url, "retries": 2, **FAST}, ["1"])
    assert len(server.bodies) == 3


def test_a_url_that_used_up_its_retries_is_down_for_the_cooldown(server, capsys):
    server.script = [(500, {"error": "down"}, 0.0)] * 3
    now = [100.0]
    knobs = HttpKnobs(backoff_s=0.0, retries=2, cooldown_s=30.0)
    with pytest.raises(RewardServiceError, match="failed 3 attempt"):
        post_json(server.url, {"response": "1", "label": "1"}, knobs, who="t", clock=lambda: now[0])
    now[0] += 29.0
    with pytest.raises(RewardServiceError, match=r"failed 3 attempt.*HTTP 500.*not asked again for 1 s: cooldown_s = 30.0"):
        post_json(server.url, {"response": "1", "label": "1"}, knobs, who="t", clock=lambda: now[0])
    assert len(server.bodies) == 3  # failed at once
    now[0] += 1.5
    assert post_json(server.url, {"response": "1", "label": "1"}, knobs, who="t", clock=lambda: now[0]) == 1.0
    err = capsys.readouterr().err
    assert err.count(server.url) == 1 and "HTTP 500" in err and "retrying up to 2 times" in err  # said once


def test_an_outage_costs_a_few_requests_retries_not_every_rows(server):
    server.script = [(503, b"down", 0.0)] * 1000
    with pytest.raises(RewardFunctionError, match="cooldown_s"):
        score("remote", {"url": server.url, "retries": 2, "max_concurrency": 1, **FAST}, [str(i + 1) for i in range(20)])
    # after 4 failed attempts in a row (failing_streak) no new request goes; the first request to use up
    # its 3 attempts marks the URL down, and the other rows fail at once (the row-by-row re-asks too)
    assert failing_streak(HttpKnobs(max_concurrency=1)) == 4 and failing_streak(HttpKnobs(max_concurrency=8)) == 8
    assert failing_streak(HttpKnobs(cooldown_s=0)) == math.inf  # never down: every request its own retries
    assert 4 + 2 <= len(server.bodies) <= 4 * 3
    assert {b["prompt"] for b in server.bodies} <= {"0+1=", "1+1=", "2+1=", "3+1="}  # rows 4…19 never sent


def test_a_4xx_is_not_retried(server):
    server.script = [(422, {"detail": "label missing"}, 0.0)]
    with pytest.raises(RewardFunctionError, match=r"HTTP 422.*label missing"):
        score("remote", {"url": server.url, **FAST}, ["1"])
    assert len(server.bodies) == 1


def test_a_slow_answer_times_out_and_the_retry_succeeds(server):
    server.script = [(200, 1.0, 1.0)]
    t0 = time.monotonic()
    assert score("remote", {"url": server.url, **{**FAST, "timeout_s": 0.2}}, ["7"]) == [0.0]  # the retry's answer
    assert time.monotonic() - t0 < 0.9 and len(server.bodies) == 2


def test_a_server_slower_than_the_timeout_every_time_fails_naming_the_timeout(server):
    server.script = [(200, 1.0, 0.6)] * 2
    with pytest.raises(RewardFunctionError, match=r"no answer within timeout_s = 0.1"):
        score("remote", {"url": server.url, "retries": 1, **{**FAST, "timeout_s": 0.1}}, ["1"])


def test_nobody_listening_is_retried_then_fails():
    with RewardStandIn() as s:
        url = s.url
    with pytest.raises(RewardFunctionError, match=r"failed 2 attempt.*ConnectionError"):
        score("remote", {"url": url, "retries": 1, **FAST}, ["1"])


@pytest.mark.parametrize("body, match", [
    (b"<html>oops</html>", r"not JSON: '<html>oops</html>'"),
    ("0.5", r"the answer \"0.5\" is not a number"),
    ([1.0], r"the answer \[1.0\] is not a number"),
    (True, r"the answer true is not a number"),
    ({"score": None}, r"the field 'score' = null of the answer \{\"score\": null\} is not a number"),
])
def test_a_malformed_answer_is_a_reward_error_without_retries(server, body, match):
    server.script = [(200, body, 0.0)]
    with pytest.raises(RewardFunctionError, match=match):
        score("remote", {"url": server.url, "score_key": "score" if isinstance(body, dict) else None, **FAST}, ["1"])
    assert len(server.bodies) == 1


# --------------------------------------------------------------------------- a service under real conditions


def _rows(n, distinct=None):
    """``n`` rows over ``distinct`` different (prompt, response, label) triples, every other one right."""
    distinct = distinct or n
    prompts = [f"{i % distinct}+1=" for i in range(n)]
    answers = [str(i % distinct + 1) for i in range(n)]
    completions = [a if (i % distinct) % 2 == 0 else "x" for i, a in enumerate(answers)]
    want = [1.0 if (i % distinct) % 2 == 0 else 0.0 for i in range(n)]
    return prompts, answers, completions, want


@pytest.mark.parametrize("flaky", [(7, 503, {}), (7, 500, {}), (7, 502, {}), (7, 504, {}), (5, 429, {"Retry-After": "0.05"})])
def test_a_service_failing_now_and_then_gives_every_row_its_score(flaky):
    prompts, answers, completions, want = _rows(70)
    with RewardStandIn(flaky=flaky) as s:
        out = score("remote", {"url": s.url, "backoff_s": 0.05, "max_backoff_s": 0.2}, completions, answers, prompts)
    assert out == want
    assert s.failed == len(s.bodies) // flaky[0] > 0
    assert sum(s.calls.values()) == 70 + s.failed  # each failure asked again once more, nothing else


def test_identical_requests_of_a_call_are_sent_once_and_every_row_gets_the_score(server):
    prompts, answers, completions, want = _rows(40, distinct=10)
    assert score("remote", {"url": server.url, **FAST}, completions, answers, prompts) == want
    assert len(server.bodies) == 10 and set(server.calls.values()) == {1}
    # remembered: the same rows in a later call send nothing; a new row sends itself alone
    assert score("remote", {"url": server.url, **FAST}, completions[:5], answers[:5], prompts[:5]) == want[:5]
    assert len(server.bodies) == 10
    assert score("remote", {"url": server.url, **FAST}, ["7"], ["7"], ["new"]) == [1.0] and len(server.bodies) == 11


def test_cache_size_0_remembers_nothing_beyond_the_call(server):
    prompts, answers, completions, want = _rows(20, distinct=4)
    knobs = {"url": server.url, "cache_size": 0, **FAST}
    assert score("remote", knobs, completions, answers, prompts) == want and len(server.bodies) == 4
    assert score("remote", knobs, completions, answers, prompts) == want and len(server.bodies) == 8


def test_a_small_cache_forgets_the_least_recently_used(server):
    knobs = {"url": server.url, "cache_size": 2, **FAST}
    for c in ("1", "2", "1", "3", "1", "2"):  # 1 stays recent; 2 is forgotten when 3 comes
        score("remote", knobs, [c], ["1"], ["p"])
    assert [b["response"] for b in server.bodies] == ["1", "2", "3", "2"]


def test_identical_judge_questions_are_asked_once_a_call_and_remembered_only_when_asked():
    with judge_server(["Score: 7"]) as s:
        out = score("llm_judge", {"url": s.url, **FAST}, ["a", "b", "a", "a"], ["1"] * 4, ["q"] * 4)
        assert out == [pytest.approx(0.7)] * 4 and sorted(b["text"].split("Response: ")[1][0] for b in s.bodies) == ["a", "b"]
        score("llm_judge", {"url": s.url, **FAST}, ["a"], ["1"], ["q"])  # a judge may change: asked again
        assert len(s.bodies) == 3
        for _ in range(2):
            score("llm_judge", {"url": s.url, "cache_size": 10, **FAST}, ["a"], ["1"], ["q"])
        assert len(s.bodies) == 4  # remembered when cache_size is set


def test_a_malformed_answer_is_remembered_so_the_row_by_row_reask_sends_nothing(server):
    def answer(path, body):
        return (200, "oops") if body["response"] == "bad" else (200, 1.0)

    server.answer = answer
    with pytest.raises(RewardFunctionError, match=r"raised on row 2: .*the answer \"oops\" is not a number"):
        score("remote", {"url": server.url, **FAST}, ["1", "2", "bad", "3"])
    assert len(server.bodies) == 4  # the search for the failing row was answered from what was remembered


def test_retry_after_in_seconds_is_waited_out_by_that_request_only():
    prompts, answers, completions, want = _rows(12)
    with RewardStandIn() as s:
        s.answer = default_answer
        s.script = [(429, {"error": "slow down"}, 0.0, {"Retry-After": "0.4"})]  # the first request to arrive
        out = score("remote", {"url": s.url, "backoff_s": 0.01, "max_concurrency": 4}, completions, answers, prompts)
    assert out == want
    limited = json.dumps(s.bodies[0], sort_keys=True)
    times = [t for b, t in zip(s.bodies, s.times) if json.dumps(b, sort_keys=True) == limited]
    assert len(times) == 2 and times[1] - times[0] >= 0.4  # waited at least what the header said
    others = [t for b, t in zip(s.bodies, s.times) if json.dumps(b, sort_keys=True) != limited]
    assert len(others) == 11 and max(others) < times[1]  # the other rows did not wait for it


def test_retry_after_as_an_http_date_is_waited_out():
    from email.utils import formatdate

    with RewardStandIn() as s:
        until = math.ceil(time.time()) + 1.0  # HTTP dates count whole seconds
        s.script = [(503, b"maintenance", 0.0, {"Retry-After": formatdate(until, usegmt=True)})]
        assert score("remote", {"url": s.url, "backoff_s": 0.01}, ["1"]) == [1.0]
    assert len(s.times) == 2 and time.time() - (time.monotonic() - s.times[1]) >= until - 0.01  # not asked before then


def test_each_request_backs_off_on_its_own_and_the_others_go_on():
    prompts, answers, completions, want = _rows(28)
    with RewardStandIn(flaky=(7, 503, {})) as s:
        t0 = time.monotonic()
        out = score("remote", {"url": s.url, "backoff_s": 0.3, "jitter": 0.0, "max_concurrency": 1}, completions, answers, prompts)
        took = time.monotonic() - t0
    assert out == want and s.failed == 4
    keys = [json.dumps(b, sort_keys=True) for b in s.bodies]
    failed_at = [k for k in range(len(keys)) if (k + 1) % 7 == 0]
    for k in failed_at:
        again = keys.index(keys[k], k + 1)
        assert s.times[again] - s.times[k] >= 0.3 - 1e-3  # its own backoff …
        assert again > k + 1  # … while the requests after it went out (even one at a time)
    # one request at a time with each failure waited out in line would take 4 × 0.3 s at least
    assert took < 4 * 0.3


# --------------------------------------------------------------------------- the warm start's probes


class CountingTask:
    """A task whose ``reward_batch`` records each call's answers (``reward``: one answer alone)."""

    def __init__(self, fail_batch=False):
        self.batches, self.alone, self.fail_batch = [], [], fail_batch

    def reward_batch(self, examples, completions, *, completion_ids=None):
        self.batches.append(list(completions))
        if self.fail_batch:
            raise RuntimeError("batch refused")
        return [1.0 if c == e.answer else 0.0 for e, c in zip(examples, completions)]

    def reward(self, example, completion):
        self.alone.append(completion)
        if completion == "boom":
            raise RuntimeError("grader crashed")
        return 1.0 if completion == example.answer else 0.0


def test_a_probe_scores_its_answers_in_one_batch_and_only_those_that_changed():
    from rllab.models.supervised import probe_rewards, solved_rates
    from rllab.types import Example

    examples = [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(4)]
    task, scored = CountingTask(), {}
    assert probe_rewards(task, examples, ["1", "0", "3", "0"], scored) == [1.0, 0.0, 1.0, 0.0]
    assert probe_rewards(task, examples, ["1", "2", "3", "0"], scored) == [1.0, 1.0, 1.0, 0.0]
    assert task.batches == [["1", "0", "3", "0"], ["2"]] and task.alone == []  # the second probe: row 1's new answer only
    assert probe_rewards(task, examples, ["1", "2", "3", "0"], scored) == [1.0, 1.0, 1.0, 0.0] and len(task.batches) == 2
    task = CountingTask()  # probes taken while others were scored: scored together, each (example, answer) once
    assert solved_rates(task, examples, [["1", "0", "3", "0"], ["1", "2", "3", "0"], 0.5]) == [0.5, 0.75, 0.5]
    assert task.batches == [["1", "0", "3", "0", "2"]]
    task = CountingTask(fail_batch=True)  # the batch call raises: each answer alone, a failure its own
    out = probe_rewards(task, examples, ["1", "boom", "3", "0"])
    assert out[0::2] == [1.0, 1.0] and out[3] == 0.0 and isinstance(out[1], RuntimeError)
    assert task.alone == ["1", "boom", "3", "0"]


def test_the_warm_start_sends_the_service_each_distinct_answer_once(tmp_path):
    pytest.importorskip("datasets")
    from rllab.models.tiny import TinyModelConfig, WarmStartConfig, build_tiny_model, warm_start
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(40)))
    model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1))
    with RewardStandIn() as s:
        task = DatasetTask(DatasetConfig(path=str(data), rewards=("remote",), eval_fraction=0.2,
                                         reward_knobs=json.dumps({"remote": {"url": s.url, **FAST}})))
        config = WarmStartConfig(steps=6, batch_size=8, check_every=2, probe_size=16, target_accuracy=None, eval_limit=8,
                                 eval_max_new_tokens=3)
        metrics = warm_start(model, tok, task, config)
    assert metrics["warm/steps"] == 6 and "warm/eval_accuracy" in metrics
    # 3 probes of 16 answers and one evaluation of 8: each distinct (prompt, response, label) sent once
    assert set(s.calls.values()) == {1} and len(s.calls) <= 3 * 16 + 8


# --------------------------------------------------------------------------- rate limit


def test_the_token_bucket_by_hand():
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s

    b = TokenBucket(2.0, 2, clock=lambda: now[0], sleep=sleep)
    assert [b.take(), b.take()] == [0.0, 0.0]  # the burst
    assert b.take() == pytest.approx(0.5)  # then one every 1/rate s
    now[0] += 0.25
    assert b.take() == pytest.approx(0.25)
    now[0] += 10.0  # idle: refills up to the capacity, not beyond
    assert [b.take(), b.take(), b.take()] == [0.0, 0.0, pytest.approx(0.5)]


def test_the_rate_limit_is_shared_by_every_caller_of_a_url(server):
    knobs = {"url": server.url, "rate_limit": 20.0, "burst": 1, "max_concurrency": 4, **FAST}
    assert bucket_for(server.url, 20.0, 1) is bucket_for(server.url, 20.0, 1)
    score("remote", knobs, ["1"] * 4)
    score("remote", dict(knobs, batching="group"), ["1"] * 4, prompts=["a", "b", "c", "d"])
    gaps = [b - a for a, b in zip(server.times, server.times[1:])]
    assert len(server.times) == 8 and min(gaps) > 0.035  # 1/20 s apart, threads and calls together


# --------------------------------------------------------------------------- under rollout.reward_errors


def _stage(tmp_path, knobs, policy, ref="remote"):
    pytest.importorskip("datasets")
    from rllab.rollout.stage import build_stage
    from rllab.settings import RolloutConfig
    from rllab.models.tokenizer import build_tokenizer
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    from .test_accuracy_and_failures import Echo

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": "5"}) + "\n" for i in range(8)))
    task = DatasetTask(DatasetConfig(path=str(data), rewards=(ref,), reward_knobs=json.dumps({ref: knobs})))
    tok = build_tokenizer()
    return build_stage(task=task, task_name="dataset", backend=Echo(tok), tokenizer=tok, seed=0,
                        config=RolloutConfig(prompts_per_step=2, group_size=2, reward_errors=policy))


def test_failing_rows_count_as_reward_errors_under_zero(tmp_path):
    first = []

    def answer(path, body):
        if not first:
            first.append(body["prompt"])
        return (500, {"error": "down"}) if body["prompt"] == first[0] else (200, 1.0)

    with RewardStandIn(answer) as s:
        m = _stage(tmp_path, {"url": s.url, "retries": 1, "cooldown_s": 0, **FAST}, "zero").sample(0).metrics
    assert m["rollout/reward_errors"] == 2.0 and m["rollout/accuracy"] == 0.5


def test_a_failing_server_stops_the_run_under_raise(tmp_path):
    with RewardStandIn(lambda path, body: (500, {"error": "down"})) as s:
        with pytest.raises(RewardError, match=r"remote.*failed 1 attempt\(s\).*HTTP 500"):
            _stage(tmp_path, {"url": s.url, "retries": 0, **FAST}, "raise").sample(0)


@pytest.mark.parametrize("how, says", [
    ("500", r"HTTP 500: .*grader crashed"),
    ("502", r"HTTP 502: .*bad gateway"),
    ("504", r"HTTP 504: .*gateway timeout"),
    ("reset", r"ConnectionError: .*Connection (reset by peer|aborted)"),
    ("slow", r"no answer within timeout_s = 0.2"),
])
def test_a_service_that_dies_mid_rollout_stops_the_run_naming_the_url_and_what_it_answered(tmp_path, how, says):
    bodies = {"500": b'{"error": "grader crashed"}', "502": b"bad gateway", "504": b"gateway timeout"}

    def answer(path, body):  # answers the first request, then dies
        if how == "reset":
            s.down = True  # every later request: the connection reset
        elif len(s.bodies) > 1:
            if how == "slow":
                time.sleep(0.5)
            else:
                return int(how), bodies[how]
        return 200, 1.0

    with RewardStandIn(answer) as s:
        knobs = {"url": s.url, "retries": 1, "backoff_s": 0.01, "max_concurrency": 1, "timeout_s": 0.2}
        with pytest.raises(RewardError, match=rf"remote.*{s.url} failed 2 attempt\(s\) \(retries = 1\); last: {says}"):
            _stage(tmp_path, knobs, "raise").sample(0)


@pytest.mark.filterwarnings("ignore:.*nothing to learn from")  # an untrained model: every sample scores 0
def test_a_run_whose_service_dies_stops_clearly_and_resumes_once_it_is_back(tmp_path, model_cache, capsys):
    pytest.importorskip("datasets")
    from rllab.cli import main

    from .tiny import TINY, overrides

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(60)))

    def answer(path, body):
        if len(s.bodies) > 40:  # the evaluation (4) and two steps (16 each) are answered; then the grader dies
            s.down = True
        return default_answer(path, body)

    with RewardStandIn(answer) as s:
        knobs = json.dumps({"remote": {"url": s.url, "retries": 2, "backoff_s": 0.01}})
        run_dir = tmp_path / "run"
        args = ["run", *overrides(TINY), "model.warm_start.steps=0", "train.eval_size=4", "task=dataset", f"task.path={data}",
                "task.rewards=remote", f"task.reward_knobs={knobs}", "train.steps=4", "train.checkpoint_every=1",
                "--run-dir", str(run_dir), "-q"]
        assert main(args) == 1
        err = " ".join(capsys.readouterr().err.split())
        assert f"{s.url} failed 3 attempt(s) (retries = 2); last: ConnectionError" in err
        assert f"keeps its last checkpoint (step_000002); continue it with: rllab run --resume {run_dir}" in err
        s.down, s.answer = False, default_answer
        forget()  # a new process would not remember the URL down
        assert main(["run", "--resume", str(run_dir), "-q"]) == 0
    assert json.loads((run_dir / "final.json").read_text())["steps"] == 4


# --------------------------------------------------------------------------- bad configs


@pytest.mark.parametrize("knobs, key", [
    ({}, "url"),
    ({"url": "localhost:8000"}, "url"),
    ({"url": "http://h", "timeout_s": -1}, "timeout_s"),
    ({"url": "http://h", "timeout_s": 0}, "timeout_s"),
    ({"url": "http://h", "timeout_s": math.inf}, "timeout_s"),  # accepted, then every request an OverflowError
    ({"url": "http://h", "timeout_s": 1e300}, "timeout_s"),
    ({"url": "http://h", "max_backoff_s": math.inf}, "max_backoff_s"),
    ({"url": "http://h", "backoff_s": math.inf}, "backoff_s"),
    ({"url": "http://h", "backoff_s": math.nan}, "backoff_s"),
    ({"url": "http://h", "retries": -1}, "retries"),
    ({"url": "http://h", "backoff_s": -0.5}, "backoff_s"),
    ({"url": "http://h", "rate_limit": 0}, "rate_limit"),
    ({"url": "http://h", "burst": 0}, "burst"),
    ({"url": "http://h", "max_concurrency": 0}, "max_concurrency"),
    ({"url": "http://h", "batching": "groups"}, "batching"),
    ({"url": "http://h", "score_key": ""}, "score_key"),
    ({"url": "http://h", "headers": "Authorization: x"}, "headers"),
    ({"url": "http://h", "headers": '{"X": 1}'}, "headers"),
    ({"url": "http://h", "urll": "http://h"}, "urll"),
])
def test_bad_remote_knobs_are_refused_naming_the_knob(knobs, key):
    with pytest.raises(ConfigError) as e:
        load_reward_function("remote", knobs=knobs)
    assert e.value.key == key and key in str(e.value)
    assert load_reward_function("remote", knobs={"url": "http://h", "timeout_s": 86_400, "max_backoff_s": 86_400}).config.timeout_s == 86_400


def test_headers_given_as_an_object_say_how_to_write_them_as_json_text():
    """Unclear: ``"headers": {"A": "b"}`` inside task.reward_knobs said only "expected a string"."""
    with pytest.raises(ConfigError) as e:
        load_reward_function("remote", knobs={"url": "http://h", "headers": {"Authorization": "Bearer x"}})
    assert str(e.value).endswith('; it takes that as JSON text: headers = "{\\"Authorization\\": \\"Bearer x\\"}"')
    said = str(e.value).rsplit("headers = ", 1)[1]
    knobs = {"url": "http://h", "headers": json.loads(said)}  # what it says to write is taken
    assert json.loads(load_reward_function("remote", knobs=knobs).config.headers) == {"Authorization": "Bearer x"}


def test_a_missing_url_through_the_dataset_task_says_where_knobs_go(tmp_path):
    pytest.importorskip("datasets")
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+1=", "answer": "3"}) + "\n")
    with pytest.raises(ConfigError, match=r"needs knob 'url'.*reward_knobs.*\"remote\": \{\"url\""):
        DatasetTask(DatasetConfig(path=str(data), rewards=("remote",)))


# --------------------------------------------------------------------------- llm_judge


def judge_server(texts):
    """A judge that answers ``texts`` in turn (then the last again)."""
    said = list(texts)

    def answer(path, body):
        return 200, {"text": said.pop(0) if len(said) > 1 else said[0], "meta_info": {}}

    return RewardStandIn(answer)


def test_the_judge_fills_the_template_and_scales_the_last_match():
    with judge_server(["Looks right. Score: 4 ... on reflection, Score: 7"]) as s:
        knobs = {"url": s.url, "template": "Q: {prompt}\nA: {response}\nRef: {label}\n", **FAST}
        assert score("llm_judge", knobs, ["2"]) == [pytest.approx(0.7)]
        assert s.paths == ["/generate"]
        assert s.bodies == [{"text": "Q: 0+1=\nA: 2\nRef: 1\n", "sampling_params": {"max_new_tokens": 64, "temperature": 0.0}}]


@pytest.mark.parametrize("said, knobs, want", [
    ("Score: 15", {}, 1.0),  # clamped to max_score, then scaled
    ("score = -3", {}, 0.0),
    ("Score: 2.5", {"min_score": 1, "max_score": 5, "normalize": False}, 2.5),
    ("Score: 9", {"min_score": 1, "max_score": 5, "normalize": False}, 5.0),
    ("Rating [[3]]", {"pattern": r"\[\[(\d+)\]\]", "min_score": 1, "max_score": 5}, 0.5),
])
def test_the_judges_score_is_clamped_and_scaled(said, knobs, want):
    with judge_server([said]) as s:
        assert score("llm_judge", {"url": s.url + "/generate", **knobs, **FAST}, ["2"]) == [pytest.approx(want)]
        assert s.paths == ["/generate"]


@pytest.mark.parametrize("said, match", [
    ({"text": "I think it is fine."}, r"has no match for pattern"),
    ({"output_ids": [1, 2]}, r"has no 'text'.*--skip-tokenizer-init.*set tokenizer"),
    ({"error": "bad"}, r"has no 'text'"),
])
def test_an_unparseable_judge_answer_is_a_reward_error(said, match):
    with RewardStandIn(lambda path, body: (200, said)) as s:
        with pytest.raises(RewardFunctionError, match=match):
            score("llm_judge", {"url": s.url, **FAST}, ["2"])


def test_an_unparseable_judge_answer_counts_under_reward_errors_zero(tmp_path):
    calls = []

    def answer(path, body):
        calls.append(1)
        return 200, {"text": "Score: 10" if len(calls) % 2 else "no idea"}

    with RewardStandIn(answer) as s:
        m = _stage(tmp_path, {"url": s.url, "max_concurrency": 1, **FAST}, "zero", ref="llm_judge").sample(0).metrics
    assert m["rollout/reward_errors"] == 2.0 and m["rollout/reward"] == 0.5


def test_the_judge_on_a_token_id_server_encodes_and_decodes_with_the_tokenizer(tmp_path):
    from rllab.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    tok.save_pretrained(tmp_path / "judge")
    answer_ids = tok("Score: 8").input_ids
    with RewardStandIn(lambda path, body: (200, {"output_ids": answer_ids, "meta_info": {}})) as s:
        knobs = {"url": s.url, "tokenizer": str(tmp_path / "judge"), "template": "{response}?", **FAST}
        assert score("llm_judge", knobs, ["12"]) == [pytest.approx(0.8)]
    assert s.bodies[0]["input_ids"] == tok("12?").input_ids and "text" not in s.bodies[0]


def test_the_judge_is_retried_through_a_5xx():
    with judge_server(["Score: 10"]) as s:
        s.script = [(503, b"loading", 0.0)]
        assert score("llm_judge", {"url": s.url, **FAST}, ["2"]) == [1.0]
        assert len(s.bodies) == 2


@pytest.mark.parametrize("knobs, key", [
    ({}, "url"),
    ({"url": "ftp://h"}, "url"),
    ({"url": "http://h", "template": "Grade this: {prompt}"}, "template"),
    ({"url": "http://h", "template": "{response} {answer}"}, "template"),
    ({"url": "http://h", "template": "{response} {"}, "template"),
    ({"url": "http://h", "pattern": "Score: \\d+"}, "pattern"),
    ({"url": "http://h", "pattern": "Score: (\\d+"}, "pattern"),
    ({"url": "http://h", "min_score": 10}, "min_score"),
    ({"url": "http://h", "max_new_tokens": 0}, "max_new_tokens"),
    ({"url": "http://h", "temperature": -1}, "temperature"),
    ({"url": "http://h", "tokenizer": "/no/such/model"}, "tokenizer"),
    ({"url": "http://h", "timeout_s": -5}, "timeout_s"),
])
def test_bad_judge_knobs_are_refused_naming_the_knob(knobs, key):
    with pytest.raises(ConfigError) as e:
        load_reward_function("llm_judge", knobs=knobs)
    assert e.value.key == key and key in str(e.value)


# --------------------------------------------------------------------------- scores said as they come


def test_each_rows_score_is_said_as_its_answer_comes_and_equals_what_the_call_returns():
    import threading

    from rllab.rollout.rewards import scores_as_known

    prompts, answers, completions, want = _rows(12, distinct=6)
    release = threading.Event()

    def answer(path, body):
        if body["response"] == "x" and body["label"] == "2":  # one slow row (rows 1 and 7 ask it)
            release.wait(5)
        return default_answer(path, body)

    heard: dict = {}
    with RewardStandIn(answer) as s:
        fn = load_reward_function("remote", knobs={"url": s.url, **FAST})

        def listen(row, value):
            heard[row] = value
            if len(heard) == 10:  # every row but the slow one's two, while its call is still out
                release.set()

        with scores_as_known(listen):
            out = fn.batch(prompts=prompts, completions=completions, ground_truth=answers, columns=[{}] * 12,
                           rows=[f"row {i}" for i in range(12)])
    assert release.is_set() and out == want and heard == dict(enumerate(want))
    assert len(s.bodies) == 6  # each distinct request once


def test_a_reward_set_says_a_rows_weighted_or_combined_score_once_every_function_has_it(server):
    from rllab.rollout.rewards import RewardSet, scores_as_known

    server_url = server.url
    kw = dict(prompts=["1+1=", "1+2="], completions=["2", "5"], ground_truth=["2", "3"], columns=[{}, {}], rows=["r0", "r1"])
    one = RewardSet.load(["remote"], [0.5], knobs={"remote": {"url": server_url, **FAST}})
    heard: list = []
    with scores_as_known(lambda i, v: heard.append((i, v))):
        out = one.score(**kw)
    assert out == [0.5, 0.0] and sorted(heard) == [(0, 0.5), (1, 0.0)]
    forget()
    two = RewardSet.load(["remote", "remote"], knobs={"remote": {"url": server_url, **FAST}, "remote_2": {"url": server_url}})
    heard.clear()
    with scores_as_known(lambda i, v: heard.append((i, v))):
        out = two.score(**kw)
    assert out == [{"remote": 1.0, "remote_2": 1.0}, {"remote": 0.0, "remote_2": 0.0}]
    assert sorted(heard, key=lambda x: x[0]) == list(enumerate(out))  # each row once, as returned
    mixed = RewardSet.load(["exact", "remote"], knobs={"remote": {"url": server_url, **FAST}})
    heard.clear()
    with scores_as_known(lambda i, v: heard.append((i, v))):
        mixed.score(**kw)
    assert heard == []  # exact says nothing: nothing is heard (its caller keeps to its own thread)


def test_a_request_another_thread_is_asking_is_waited_for_not_sent_again():
    import threading

    prompts, answers, completions, want = _rows(8)
    with RewardStandIn(latency_s=0.2) as s:
        knobs = {"url": s.url, **FAST}
        outs: dict = {}

        def call(name, rows):
            outs[name] = score("remote", knobs, [completions[i] for i in rows], [answers[i] for i in rows],
                               [prompts[i] for i in rows])

        a = threading.Thread(target=call, args=("a", range(0, 6)))
        a.start()
        time.sleep(0.05)  # a's requests are out
        call("b", range(3, 8))  # 3, 4, 5 are a's: b sends 6 and 7 only
        a.join()
    assert outs["a"] == want[0:6] and outs["b"] == want[3:8]
    assert sorted(s.calls.values()) == [1] * 8



def test_a_request_another_call_is_asking_is_heard_as_soon_as_its_answer_comes():
    """A call waiting for a request another call is asking hears it when that call has it, not
    when that call's slowest request (one in a long chain of retries) is answered too."""
    import threading
    from dataclasses import dataclass

    from rllab_tasks.reward_service import score_unique

    @dataclass(frozen=True)
    class Config:
        cache_size: int = 16

    config = Config()
    told, release, asked = threading.Event(), threading.Event(), []
    out: dict = {}

    def slow_ask(indices, answered):  # "x" answered at once, "slow" only once released
        asked.append(("a", list(indices)))
        answered(0, 1.0)
        told.set()
        assert release.wait(10)
        answered(1, 2.0)
        return [1.0, 2.0]

    def never(indices, answered):
        raise AssertionError(f"asked again: {indices}")

    a = threading.Thread(target=lambda: out.setdefault("a", score_unique(["x", "slow"], slow_ask, config)))
    a.start()
    try:
        assert told.wait(10)
        b = threading.Thread(target=lambda: out.setdefault("b", score_unique(["x", "x"], never, config, report=lambda i, v: asked.append(("b", i, v)))))
        b.start()
        b.join(5)
        assert not b.is_alive() and out["b"] == [1.0, 1.0]  # not held back by "slow"
        assert ("b", 0, 1.0) in asked and ("b", 1, 1.0) in asked
    finally:
        release.set()
        a.join(10)
    assert out["a"] == [1.0, 2.0]
    assert score_unique(["slow", "x"], never, config) == [2.0, 1.0]  # both remembered
    assert asked[0] == ("a", [0, 1])


class SlowTask:
    """Answers right when equal to the example's; says each score as it goes, the answers in
    ``slow`` only once ``release`` is set (a reward service's slowest answers)."""

    def __init__(self, slow=()):
        import threading

        self.slow, self.release, self.batches = set(slow), threading.Event(), []

    def reward_batch(self, examples, completions, *, completion_ids=None):
        from rllab.rollout.rewards import report_score

        self.batches.append(list(completions))
        out = [1.0 if c == e.answer else 0.0 for e, c in zip(examples, completions)]
        for i, c in enumerate(completions):
            if c not in self.slow:
                report_score(i, out[i])
        assert self.release.wait(5) if self.slow & set(completions) else True
        return out


def test_a_probe_is_known_below_or_at_the_target_before_its_slowest_answer_comes():
    from rllab.models.supervised import ProbeScores, solved_rates
    from rllab.types import Example

    examples = [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(4)]
    task = SlowTask(slow={"slow"})
    scores = ProbeScores(task, examples)
    probes = [["0", "0", "0", "0"], ["1", "0", "0", "slow"], ["1", "2", "3", "slow"]]
    start = scores.submit(probes[0])  # scored in this thread (nothing said yet), saying its rewards
    assert start.thread is None and start.verdict(0.75) == "done" and start.accuracy() == 0.0
    first = scores.submit(probes[1])  # 1 solved, 2 not, 1 out: at most 2/4
    assert first.verdict(0.75) == "below" and not task.release.is_set()
    second = scores.submit(probes[2])  # 3 solved already: reached, whatever the slow one says
    assert second.verdict(0.5) == "reached"
    assert task.batches == [["0", "0", "0", "0"], ["1", "slow"], ["2", "3"]]  # "slow" (row 3) is out: not asked again
    task.release.set()
    assert [first.accuracy(), second.accuracy()] == [0.25, 0.75]
    assert first.verdict(0.75) == "done"
    # the same rates and answers as one probe at a time
    again = SlowTask(slow={"slow"})
    again.release.set()
    scored: dict = {}
    assert [solved_rates(again, examples, [p], scored)[0] for p in probes] == [0.0, 0.25, 0.75]
    assert again.batches == task.batches


def test_a_reward_that_says_nothing_is_scored_in_the_callers_thread():
    import threading

    from rllab.models.supervised import ProbeScores
    from rllab.types import Example

    class MainThreadOnly(CountingTask):  # a timeout by signal works in the main thread only
        def reward_batch(self, examples, completions, *, completion_ids=None):
            assert threading.current_thread() is threading.main_thread()
            return super().reward_batch(examples, completions, completion_ids=completion_ids)

    examples = [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(2)]
    task = MainThreadOnly()
    scores = ProbeScores(task, examples)
    for answers, want in ((["1", "0"], 0.5), (["1", "2"], 1.0), (["0", "2"], 0.5)):
        probe = scores.submit(answers)
        assert probe.thread is None and probe.verdict(0.9) == "done" and probe.accuracy() == want
    assert task.batches == [["1", "0"], ["2"], ["0"]]


def test_a_probe_with_no_answer_yet_waits_and_one_whose_every_answer_fails_raises():
    from rllab.errors import RewardError
    from rllab.models.supervised import ProbeScores
    from rllab.types import Example

    examples = [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(2)]
    task = SlowTask(slow={"a", "b"})
    scores = ProbeScores(task, examples)
    assert scores.submit(["1", "0"]).accuracy() == 0.5  # its rewards said: the next probes in threads of their own
    probe = scores.submit(["a", "b"])
    import threading

    seen = []
    t = threading.Thread(target=lambda: seen.append(probe.verdict(0.5)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not seen  # nothing known: no verdict
    task.release.set()
    t.join(5)
    assert seen == ["done"] and probe.accuracy() == 0.0

    class Broken:
        def reward_batch(self, examples, completions, *, completion_ids=None):
            raise RuntimeError("down")

        def reward(self, example, completion):
            raise RuntimeError("down")

    probe = ProbeScores(Broken(), examples).submit(["1", "2"])
    assert probe.verdict(0.5) == "done"  # never "below": a probe whose every answer fails ends the warm start
    with pytest.raises(RewardError, match="failed on every one of the 2 examples"):
        probe.accuracy()


@pytest.mark.parametrize("target", [None, 0.3])
def test_the_warm_start_against_a_flaky_service_is_the_one_against_a_healthy_one(tmp_path, target):
    """Same model, same metrics, the same requests (and only the failed ones again): probes
    scored while others are out change nothing, with a target reached early or none."""
    pytest.importorskip("datasets")
    import hashlib

    import torch

    from rllab.models.tiny import TinyModelConfig, WarmStartConfig, build_tiny_model, warm_start
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    def answer(path, body):  # about half the answers right, whatever the model says
        return 200, float(hashlib.md5(json.dumps(body, sort_keys=True).encode()).digest()[0] % 2)

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(40)))
    runs = []
    for flaky in (None, (3, 503, {})):
        forget()
        model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1))
        with RewardStandIn(answer, flaky=flaky) as s:
            task = DatasetTask(DatasetConfig(path=str(data), rewards=("remote",), eval_fraction=0.2,
                                             reward_knobs=json.dumps({"remote": {"url": s.url, **FAST}})))
            config = WarmStartConfig(steps=8, batch_size=8, check_every=2, probe_size=16, target_accuracy=target,
                                     eval_limit=8, eval_max_new_tokens=3)
            metrics = warm_start(model, tok, task, config)
        runs.append((metrics, model.state_dict(), s))
    (m0, w0, healthy), (m1, w1, flaky) = runs
    assert m0["warm/steps"] == (8 if target is None else 2)  # 0.3: the first probe (about half right) reaches it
    assert {k: v for k, v in m0.items() if "seconds" not in k} == {k: v for k, v in m1.items() if "seconds" not in k}
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert set(flaky.calls) == set(healthy.calls) and set(healthy.calls.values()) == {1}
    assert flaky.failed > 0 and sum(flaky.calls.values()) == len(healthy.calls) + flaky.failed


def test_a_warm_start_whose_probe_fails_everywhere_stops_naming_it_and_closes_its_bar(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    import contextlib

    import rllab.models.warmstart as warmstart
    from rllab.models.tiny import TinyModelConfig, WarmStartConfig, build_tiny_model, warm_start
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    exits = []

    @contextlib.contextmanager
    def recording(*args):
        try:
            yield lambda step, loss, acc: None
        except BaseException as e:
            exits.append(type(e))
            raise
        else:
            exits.append(None)

    monkeypatch.setattr(warmstart, "warm_start_progress", recording)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(20)))
    model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1))
    with RewardStandIn(lambda path, body: (400, {"error": "no"})) as s:
        task = DatasetTask(DatasetConfig(path=str(data), rewards=("remote",), eval_fraction=0.2,
                                         reward_knobs=json.dumps({"remote": {"url": s.url, **FAST}})))
        config = WarmStartConfig(steps=4, batch_size=4, check_every=2, probe_size=4, eval_limit=0, eval_max_new_tokens=2)
        with pytest.raises(RewardError, match="failed on every one of the 4 examples"):
            warm_start(model, tok, task, config)
    assert exits == [RewardError]


def test_calls_made_at_once_share_the_urls_max_concurrency():
    import threading

    lock, now, most = threading.Lock(), [0], [0]

    def answer(path, body):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return default_answer(path, body)

    prompts, answers, completions, want = _rows(12)
    with RewardStandIn(answer) as s:
        knobs = {"url": s.url, "max_concurrency": 3, "cache_size": 0, **FAST}
        outs = {}

        def call(k):
            outs[k] = score("remote", knobs, completions, answers, prompts)

        threads = [threading.Thread(target=call, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(out == want for out in outs.values()) and len(s.bodies) == 36
    assert most[0] == 3  # three calls of 12 requests, never more than 3 in flight from the process


def test_a_task_whose_rewards_say_their_scores_from_any_thread_has_its_first_probe_in_a_thread(server):
    from rllab.models.supervised import ProbeScores
    from rllab.rollout.rewards import RewardSet
    from rllab.types import Example

    knobs = {"remote": {"url": server.url, **FAST}}
    assert RewardSet.load(["remote"], knobs=knobs).says_scores
    assert RewardSet.load(["llm_judge"], knobs={"llm_judge": {"url": server.url}}).says_scores
    assert not RewardSet.load(["exact", "remote"], knobs=knobs).says_scores  # exact says nothing

    class Served(CountingTask):
        rewards = RewardSet.load(["remote"], knobs=knobs)

    examples = [Example(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(2)]
    probe = ProbeScores(Served(), examples).submit(["1", "0"])
    assert probe.thread is not None and probe.accuracy() == 0.5
    plain = ProbeScores(CountingTask(), examples).submit(["1", "0"])
    assert plain.thread is None and plain.accuracy() == 0.5


# --------------------------------------------------------------------------- an evaluation scored while step 1 samples


def test_an_evaluation_sampled_now_and_scored_in_a_thread_gives_the_plain_evaluations_metrics(tmp_path):
    import threading

    def answer(path, body):  # a grader of varied scores, so that a mix-up would show
        return 200, float(len(body["prompt"]) % 3) / 2

    with RewardStandIn(answer) as s:
        stage = _stage(tmp_path, {"url": s.url, **FAST}, "raise")
        assert stage.scored_elsewhere()
        plain = stage.evaluate(8, samples=2)
        forget()  # nothing remembered: the detached evaluation asks the service again
        sent = len(s.bodies)
        finish = stage.evaluate_sampled(8, samples=2)
        assert len(s.bodies) == sent  # sampled, nothing scored yet
        out = {}
        t = threading.Thread(target=lambda: out.update(finish()))
        t.start()
        t.join()
    assert len(s.bodies) > sent
    drop = lambda m: {k: v for k, v in m.items() if not k.startswith("time/")}  # noqa: E731
    assert drop(out) == drop(plain) and plain["eval/n"] >= 1 and "eval/pass@2" in plain


def test_an_environment_of_several_turns_is_not_scored_elsewhere(tmp_path):
    from rllab.rollout.episodes import EpisodeLimits

    with RewardStandIn() as s:
        stage = _stage(tmp_path, {"url": s.url, **FAST}, "raise")
        stage.limits = attrs_evolve(stage.limits, max_turns=2)
        assert not stage.scored_elsewhere()
        with pytest.raises(Exception, match="plays up to 2 turns: only an environment of one turn"):
            stage.runner().play_sampled(stage.held_out()[:2], stage.sampling_params(0, n=1, greedy=True))
    assert EpisodeLimits  # the limits are EpisodeLimits, evolved


def attrs_evolve(obj, **kw):
    import attrs

    return attrs.evolve(obj, **kw)


def _metric_lines(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in d.items() if not k.startswith(("time/", "perf/")) and k not in ("wall", "timestamp")}
            for d in lines]


@pytest.mark.filterwarnings("ignore:.*nothing to learn from")
def test_the_evaluation_before_step_1_is_scored_while_step_1_samples_and_logged_as_before(tmp_path, model_cache, monkeypatch):
    """The evaluation's answers wait out a Retry-After while step 1's are asked: step 1's first
    request goes out before the evaluation's last answer, and the run logs what the same run
    without the overlap logs, in the same order."""
    pytest.importorskip("datasets")
    from rllab.cli import main
    from rllab.rollout.stage import RolloutStage

    from .tiny import TINY, overrides

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(40)))
    runs = {}
    for overlap in (False, True):
        forget()
        if not overlap:
            monkeypatch.setattr(RolloutStage, "scored_elsewhere", lambda self: False)
        else:
            monkeypatch.undo()
        held_out: set = set()

        def answer(path, body):
            if len(s.bodies) <= 4:  # the evaluation before step 1 (4 held-out answers): the first asked waits 0.4 s
                held_out.add(body["prompt"])
                if len(s.bodies) == 1:
                    return 429, {"error": "busy"}
            return default_answer(path, body)

        with RewardStandIn(answer) as s:
            s.script = []
            knobs = json.dumps({"remote": {"url": s.url, "retries": 2, "backoff_s": 0.4, "jitter": 0.0}})
            run_dir = tmp_path / f"run-{overlap}"
            args = ["run", *overrides(TINY), "model.warm_start.steps=0", "train.eval_size=4", "task=dataset", f"task.path={data}",
                    "task.rewards=remote", f"task.reward_knobs={knobs}", "train.steps=2", "--run-dir", str(run_dir), "-q"]
            assert main(args) == 0
            prompts = [b["prompt"] for b in s.bodies]
        retried = prompts.index(prompts[0], 1)  # the first request, asked again after its wait
        step_1 = next(i for i, p in enumerate(prompts) if p not in held_out)
        runs[overlap] = (step_1 < retried, _metric_lines(run_dir), (run_dir / "eval_problems.jsonl").read_text())
    assert runs[True][0] and not runs[False][0]  # with the overlap, step 1 was asked during the evaluation's wait
    assert runs[True][1] == runs[False][1] and runs[True][2] == runs[False][2]
    assert [("eval/accuracy" in d, d.get("step")) for d in runs[True][1]][:2] == [(True, 0), (False, 1)]


def test_the_warm_starts_held_out_scores_are_not_waited_for_and_reach_the_cached_record(tmp_path):
    """get_or_build returns once the held-out answers are sampled; their scores (held back here
    until released) then complete the cached record with the accuracy warm_start itself gives."""
    pytest.importorskip("datasets")
    import threading

    from rllab.models import tiny
    from rllab.models.tiny import TinyModelConfig, WarmStartConfig, build_tiny_model, warm_start
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(40)))
    model_config = TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1)
    config = WarmStartConfig(steps=4, batch_size=8, check_every=2, probe_size=8, target_accuracy=None, eval_limit=6,
                             eval_max_new_tokens=3)
    release = threading.Event()
    held: list = []
    holding = []

    def answer(path, body):  # about half right; in get_or_build the held-out answers wait to be released
        if holding and body["prompt"] in held_out_prompts:
            held.append(body["prompt"])
            release.wait(30)
        return 200, float(len(body["response"]) % 2)

    with RewardStandIn(answer) as s:
        def task():
            return _remote_dataset(data, s.url)
        held_out_prompts = {e.prompt for e in task().eval_examples()[:6]}
        model, tok = build_tiny_model(model_config)
        want = warm_start(model, tok, task(), config)["warm/eval_accuracy"]  # the plain warm start, waited for
        forget()
        holding.append(True)
        path = tiny.get_or_build(model_config, task(), {"name": "dataset", "path": str(data)}, config,
                                 cache_dir=tmp_path / "cache", progress=False)
        assert "warm/eval_accuracy" not in tiny.warm_start_metrics(path)  # returned while the scores are out
        for _ in range(100):  # the held-out answers reach the service, and wait there
            if held:
                break
            time.sleep(0.05)
        assert held and "warm/eval_accuracy" not in tiny.warm_start_metrics(path)
        release.set()
        for t in [t for t in threading.enumerate() if t.name == "rllab-warm-start-eval"]:
            t.join(30)
    assert tiny.warm_start_metrics(path)["warm/eval_accuracy"] == want
    assert not [p for p in path.iterdir() if p.name.startswith(".")]  # no file left of the record's replacement


@pytest.mark.parametrize("steps, target, says", [
    (8, 0.3, "warm start stopped at step 2 of 8: probe accuracy reached the target 30% (model.warm_start.target_accuracy); "
             "its value goes into the model's record (warm/probe_accuracy) once its last scores are in"),
    (2, 0.99, "warm start ran all 2 steps (model.warm_start.steps) without reaching the target 99%: probe accuracy under 99%; "
              "its value goes into the model's record (warm/probe_accuracy) once its last scores are in; more steps or a "
              "lower model.warm_start.target_accuracy would change that"),
])
def test_a_last_probe_known_to_reach_the_target_is_not_waited_for_and_its_value_reaches_the_cached_record(tmp_path, steps, target,
                                                                                                          says):
    """The probe that ends the warm start reaches its target without its slowest answer (held
    back here until released): get_or_build returns while that answer is out, the progress line
    says the target was reached, and the cached record then gets the probe accuracy warm_start
    itself gives (and the held-out accuracy, each in its own time). So does a last probe known to
    stay below the target at the last step."""
    pytest.importorskip("datasets")
    import hashlib
    import threading

    from rllab.models import tiny
    from rllab.models.tiny import TinyModelConfig, WarmStartConfig, build_tiny_model, warm_start
    from rllab_tasks.tasks.dataset import DatasetConfig, DatasetTask

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(40)))
    model_config = TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1)
    config = WarmStartConfig(steps=steps, batch_size=8, check_every=2, probe_size=16, target_accuracy=target, eval_limit=6,
                             eval_max_new_tokens=3)
    release, lock = threading.Event(), threading.Lock()
    held: list = []
    holding = []

    def answer(path, body):  # about half right, whatever the model says; one probe answer held back
        with lock:
            hold = holding and not held and body["prompt"] not in held_out_prompts
            if hold:
                held.append(body["prompt"])
        if hold:
            release.wait(30)
        return 200, float(hashlib.md5(json.dumps(body, sort_keys=True).encode()).digest()[0] % 2)

    with RewardStandIn(answer) as s:
        def task():
            return _remote_dataset(data, s.url)
        held_out_prompts = {e.prompt for e in task().eval_examples()[:6]}
        model, tok = build_tiny_model(model_config)
        want = warm_start(model, tok, task(), config)  # the plain warm start, waited for
        assert want["warm/steps"] == 2  # its first probe reaches 0.3, or is the last
        forget()
        holding.append(True)
        lines = []
        import rllab.models.progress as progress

        plain_reason = progress.stop_reason
        progress.stop_reason = lambda *a: lines.append(plain_reason(*a)) or lines[-1]
        try:
            path = tiny.get_or_build(model_config, task(), {"name": "dataset", "path": str(data)}, config,
                                     cache_dir=tmp_path / "cache", progress=True)
        finally:
            progress.stop_reason = plain_reason
        record = tiny.warm_start_metrics(path)
        assert held and not release.is_set()  # returned while the probe's held answer is out
        assert record["warm/steps"] == 2 and "warm/probe_accuracy" not in record
        assert lines == [says]
        release.set()
        for t in [t for t in threading.enumerate() if t.name == "rllab-warm-start-eval"]:
            t.join(30)
    record = tiny.warm_start_metrics(path)
    assert (record["warm/probe_accuracy"] == want["warm/probe_accuracy"]) and (want["warm/probe_accuracy"] >= target) == (target < 0.5)
    assert record["warm/eval_accuracy"] == want["warm/eval_accuracy"]
    assert {k: v for k, v in record.items() if "seconds" not in k} == {k: v for k, v in want.items() if "seconds" not in k}
    assert not [p for p in path.iterdir() if p.name.startswith(".")]
