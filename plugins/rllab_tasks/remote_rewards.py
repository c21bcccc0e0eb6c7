"""Reward functions that ask a server: ``remote`` (a reward service) and ``llm_judge`` (a model).

``remote`` POSTs ``{"prompt", "response", "label"}`` as JSON (slime's ``remote_rm`` contract:
the prompt as the data set gives it, a string or a message list; the completion's text; the
reference answer) and reads the score from the answer: the JSON number itself, or the field
``score_key`` names in a JSON object (dotted for a nested one: ``"result.score"``). With
``batching = "group"`` each prompt's completions go in one POST as a JSON list (slime's
``--group-rm``), with ``"step"`` all of a call's completions; the answer is then a list with one
score (or object) per item, or an object whose ``score_key`` holds that list.

``llm_judge`` fills ``template`` with ``{prompt}`` (a chat prompt's last user message),
``{response}`` and ``{label}``, asks an SGLang-compatible server's ``/generate`` for a greedy
answer (``max_new_tokens``, ``temperature``), reads the number that ``pattern``'s first group
captures (its last match), clamps it to ``[min_score, max_score]`` and, with ``normalize``,
maps that range onto [0, 1]. A server started with ``--skip-tokenizer-init`` (as the policy's
own server is) takes token ids: name a model directory in ``tokenizer`` to encode the question
and decode the answer.

Both share :class:`~rllab_tasks.reward_service.HttpKnobs` (timeout, retries with exponential
backoff and jitter, each request on its own, a process-wide rate limit per URL, concurrency,
headers, the remembered scores). Identical requests of a call are sent once and their score given
to every row that asked it; a request the process has scored before (``cache_size``; by default
``remote`` remembers, ``llm_judge`` does not), or that another thread is asking at that moment
(when it remembers), is not sent again. Each row's score is said as soon as its answer is in
(:func:`rllab.rollout.rewards.report_score`), to a caller that listens. An answer without a usable score raises, naming the function, the URL and the answer, and
counts as a reward error under ``rollout.reward_errors``.
"""

from __future__ import annotations

import functools
import json
import math
import re
import string
import threading
from pathlib import Path
from typing import Any, Sequence

import attrs

import rllab

from rllab.rollout.rewards import report_score

from .reward_service import HttpKnobs, RewardServiceError, ask_all, check_url, installed, score_unique
from .rewards import text_of

BATCHING = ("none", "group", "step")


def _json_safe(value: Any) -> Any:
    """``value`` as JSON would carry it (objects JSON cannot hold become their ``str``)."""
    return json.loads(json.dumps(value, default=str))


@attrs.frozen(kw_only=True)
class RemoteConfig(HttpKnobs):
    """Knobs of the remote reward."""

    url: str = rllab.knob(help="where the POSTs go, e.g. http://127.0.0.1:8000/score (required)", validator=check_url)
    score_key: str | None = rllab.knob(
        None, help="the field of a JSON-object answer that holds the score (dotted for nested objects); None: the answer "
        "is the number itself",
    )
    batching: str = rllab.knob(
        "none", help="'none': one POST per completion; 'group': one per prompt's completions; 'step': one per call, "
        "all completions (the answer is then a list)", choices=BATCHING,
    )

    def __attrs_post_init__(self):
        if self.score_key is not None and (not self.score_key.strip() or any(not p for p in self.score_key.split("."))):
            raise ValueError(f"score_key = {self.score_key!r} is not a field name (dotted for nested objects: 'result.score'); None reads a bare number")


def _pick(answer: Any, key: str | None, where: str) -> float:
    """The score in one item of an answer: the number itself, or the ``key`` field of an object."""
    value = answer
    if key is not None:
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                have = f"keys {sorted(value)!r}" if isinstance(value, dict) else f"a {type(value).__name__}"
                raise RewardServiceError(f"{where}: the answer {_short(answer)} has no field {key!r} (score_key; it has {have})")
            value = value[part]
    elif isinstance(value, dict):
        raise RewardServiceError(f"{where}: the answer is a JSON object {_short(answer)}; set score_key to the field that holds the score")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        what = f"the field {key!r} = {_short(value)} of the answer {_short(answer)}" if key is not None else f"the answer {_short(answer)}"
        raise RewardServiceError(f"{where}: {what} is not a number")
    return float(value)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:200] + "…"


def _groups(prompts: Sequence[Any], batching: str) -> list[list[int]]:
    """Row indices per POST: each alone, each prompt's rows together (first-seen order), or all."""
    n = len(prompts)
    if batching == "none":
        return [[i] for i in range(n)]
    if batching == "step":
        return [list(range(n))] if n else []
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(json.dumps(p, sort_keys=True, default=str), []).append(i)
    return list(groups.values())


def remote(*, prompts, completions, ground_truth, config: RemoteConfig, **columns) -> list[float]:
    """The score a reward server gives each completion (POST {prompt, response, label})."""
    where = f"remote reward ({config.url})"
    items = [
        _json_safe({"prompt": p, "response": text_of(c), "label": a})
        for p, c, a in zip(prompts, completions, ground_truth)
    ]
    groups = _groups(list(prompts), config.batching)
    bodies = [items[rows[0]] if config.batching == "none" else [items[i] for i in rows] for rows in groups]

    def scores(rows: list[int], answer: Any) -> list[float]:
        if config.batching == "none":
            return [_pick(answer, config.score_key, where)]
        if isinstance(answer, dict) and config.score_key is not None and isinstance(answer.get(config.score_key), list):
            answer = [{config.score_key: v} for v in answer[config.score_key]]
        if not isinstance(answer, list) or len(answer) != len(rows):
            got = f"a list of {len(answer)}" if isinstance(answer, list) else f"{_short(answer)}"
            raise RewardServiceError(f"{where}: {len(rows)} completions were sent in one POST (batching = {config.batching!r}) but the answer is {got}, not a list of {len(rows)} scores")
        return [_pick(a, config.score_key, where) for a in answer]

    def ask(indices: list[int], answered) -> list[Any]:
        def parsed(k: int, answer: Any) -> Any:
            return answer if isinstance(answer, RewardServiceError) else _parsed(scores, groups[indices[k]], answer)

        answers = ask_all(config.url, [bodies[j] for j in indices], config, who="remote reward",
                          on_answer=lambda k, answer: answered(k, parsed(k, answer)))
        return [parsed(k, a) for k, a in enumerate(answers)]

    def said(j: int, got: Any) -> None:  # a request's scores, as soon as known, to a caller that listens
        if not isinstance(got, RewardServiceError):
            for i, x in zip(groups[j], got):
                report_score(i, x)

    out = [0.0] * len(items)
    for rows, got in zip(groups, score_unique([_key(b) for b in bodies], ask, config, report=said)):
        if isinstance(got, RewardServiceError):
            raise got
        for i, s in zip(rows, got):
            out[i] = s
    return out


def _key(body: Any) -> str:
    """A request's identity: its JSON with sorted keys (identical requests are asked once)."""
    return json.dumps(body, sort_keys=True, ensure_ascii=False)


def _parsed(parse, *args) -> Any:
    """``parse(*args)``, or the :class:`RewardServiceError` it raised (a malformed answer, kept for its row)."""
    try:
        return parse(*args)
    except RewardServiceError as e:
        return e


# --------------------------------------------------------------------------- LLM as judge

DEFAULT_TEMPLATE = (
    "Grade the response to the question against the reference answer, from 0 (wrong) to 10 (fully correct).\n"
    "Question: {prompt}\nReference answer: {label}\nResponse: {response}\n"
    "Reply with one line: Score: <0-10>\n"
)
FIELDS = ("prompt", "response", "label")


def check_template(inst, attribute, value):
    """A ``str.format`` template with ``{response}`` and no fields but ``prompt``, ``response``, ``label``."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except (ValueError, TypeError) as e:
        raise ValueError(f"{attribute.name} = {value!r} is not a template: {e}; write literal braces as {{{{ and }}}}") from None
    bad = [n for n in names if n not in FIELDS]
    if bad:
        raise ValueError(f"{attribute.name} = {value!r} has fields {bad!r}; it may use only {{prompt}}, {{response}} and {{label}} (literal braces: {{{{ }}}})")
    if "response" not in names:
        raise ValueError(f"{attribute.name} = {value!r} has no {{response}}: the judge would never see the completion")


def check_pattern(inst, attribute, value):
    """A regular expression with a group (the score)."""
    try:
        rx = re.compile(value)
    except (re.error, TypeError) as e:
        raise ValueError(f"{attribute.name} = {value!r} is not a regular expression: {e}") from None
    if rx.groups < 1:
        raise ValueError(f"{attribute.name} = {value!r} has no group; put the score's number in parentheses, e.g. 'Score: (\\d+)'")


def check_tokenizer(inst, attribute, value):
    """None, or an existing directory."""
    if value is not None and not Path(value).expanduser().is_dir():
        raise ValueError(f"{attribute.name} = {value!r} is not a directory; name the judge model's directory (its tokenizer files), or None to send text")


@attrs.frozen(kw_only=True)
class JudgeConfig(HttpKnobs):
    """Knobs of the LLM-as-judge reward."""

    url: str = rllab.knob(
        help="an SGLang-compatible server (its /generate is asked; the policy's own server or another), e.g. "
        "http://127.0.0.1:30000 (required)", validator=check_url,
    )
    template: str = rllab.knob(DEFAULT_TEMPLATE, help="the question to the judge: {prompt}, {response} and {label} are filled in", validator=check_template)
    pattern: str = rllab.knob(r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)", help="a regular expression whose first group is the score (its last match counts)", validator=check_pattern)
    min_score: float = rllab.knob(0.0, help="scores below are clamped up to this")
    max_score: float = rllab.knob(10.0, help="scores above are clamped down to this")
    normalize: bool = rllab.knob(True, help="map [min_score, max_score] onto [0, 1] (so a top score counts as solved)")
    max_new_tokens: int = rllab.knob(64, help="the longest answer the judge may give", ge=1)
    temperature: float = rllab.knob(0.0, help="the judge's sampling temperature (0: greedy)", ge=0.0)
    tokenizer: str | None = rllab.knob(
        None, help="a model directory whose tokenizer encodes the question and decodes the answer, for a server that "
        "takes token ids (--skip-tokenizer-init, as the policy's own server); None: send and read text", validator=check_tokenizer,
    )
    cache_size: int = rllab.knob(
        0, help="distinct questions whose grades the process remembers across calls; 0 (the default): none, for a "
        "judge may change (the policy judging itself) or sample (temperature > 0); a fixed greedy judge may set it "
        "(identical questions within one call are always asked once)", ge=0,
    )

    def __attrs_post_init__(self):
        if not (math.isfinite(self.min_score) and math.isfinite(self.max_score)) or self.min_score >= self.max_score:
            raise ValueError(f"min_score = {self.min_score!r} must be finite and below max_score = {self.max_score!r}")


_TOKENIZER_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(path).expanduser()))


def _question_text(prompt: Any) -> str:
    """A string prompt, or a chat prompt's last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if m.get("role") == "user"]
    return str((users or list(prompt) or [{"content": ""}])[-1]["content"])


def judge_score(text: str, config: JudgeConfig, where: str) -> float:
    """The score in the judge's answer: ``pattern``'s last match, clamped and (with ``normalize``) scaled to [0, 1]."""
    found = re.findall(config.pattern, text)
    if not found:
        raise RewardServiceError(f"{where}: the judge's answer {text[:200]!r} has no match for pattern = {config.pattern!r}")
    raw = found[-1][0] if isinstance(found[-1], tuple) else found[-1]
    try:
        x = float(raw)
    except ValueError:
        raise RewardServiceError(f"{where}: pattern = {config.pattern!r} captured {raw!r} in the judge's answer, not a number") from None
    if not math.isfinite(x):
        raise RewardServiceError(f"{where}: the judge's score {raw!r} is not finite")
    x = min(config.max_score, max(config.min_score, x))
    return (x - config.min_score) / (config.max_score - config.min_score) if config.normalize else x


def _generate_url(url: str) -> str:
    return url if url.rstrip("/").endswith("/generate") else url.rstrip("/") + "/generate"


def llm_judge(*, prompts, completions, ground_truth, config: JudgeConfig, **columns) -> list[float]:
    """A model's grade of each completion: the template asked of an SGLang-compatible server, the score parsed."""
    url = _generate_url(config.url)
    where = f"llm_judge reward ({url})"
    tok = _tokenizer(config.tokenizer) if config.tokenizer is not None else None
    params = {"max_new_tokens": config.max_new_tokens, "temperature": config.temperature}
    questions = [
        config.template.format(prompt=_question_text(p), response=text_of(c), label="" if a is None else str(a))
        for p, c, a in zip(prompts, completions, ground_truth)
    ]

    def body(question: str) -> dict:
        if tok is None:
            return {"text": question, "sampling_params": params}
        with _TOKENIZER_LOCK:  # a fast tokenizer is not to be called from two threads at once
            return {"input_ids": tok(question).input_ids, "sampling_params": params}

    def score(answer: Any) -> float:
        if isinstance(answer, list) and len(answer) == 1:
            answer = answer[0]
        if isinstance(answer, dict) and isinstance(answer.get("text"), str):
            text = answer["text"]
        elif isinstance(answer, dict) and isinstance(answer.get("output_ids"), list) and tok is not None:
            with _TOKENIZER_LOCK:
                text = tok.decode(answer["output_ids"], skip_special_tokens=True)
        else:
            need = "'text'" if tok is None else "'text' or 'output_ids'"
            hint = " (a server started with --skip-tokenizer-init answers token ids: set tokenizer)" if tok is None and isinstance(answer, dict) and "output_ids" in answer else ""
            raise RewardServiceError(f"{where}: the answer {_short(answer)} has no {need}{hint}")
        return judge_score(text, config, where)

    def ask(indices: list[int], answered) -> list[Any]:
        def parsed(answer: Any) -> Any:
            return answer if isinstance(answer, RewardServiceError) else _parsed(score, answer)

        answers = ask_all(url, [body(questions[j]) for j in indices], config, who="llm_judge reward",
                          on_answer=lambda k, answer: answered(k, parsed(answer)))
        return [parsed(a) for a in answers]

    out = score_unique(questions, ask, config,
                       report=lambda i, got: None if isinstance(got, RewardServiceError) else report_score(i, got))
    for got in out:
        if isinstance(got, RewardServiceError):
            raise got
    return out


remote.says_scores = llm_judge.says_scores = True  # each row's score said as its answer comes, from any thread
remote.check_installed = llm_judge.check_installed = installed  # requests, asked before a run creates anything


def register(register):
    """Register ``remote`` and ``llm_judge`` with ``register`` (the hook's callable)."""
    register("remote", remote, config=RemoteConfig, aliases=("remote_rm",))
    register("llm_judge", llm_judge, config=JudgeConfig, aliases=("judge",))
