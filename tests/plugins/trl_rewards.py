"""Reward functions written exactly as TRL's documentation writes them (TRL's signature, no rllab
import), loaded by the tests as ``tests.plugins.trl_rewards:NAME`` or by file path."""

import re

CALLS = []


def reward_len(completions, **kwargs):
    """Reward completions close to 20 characters (TRL's length example)."""
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    """Reward chat completions in the <think>…</think><answer>…</answer> format (TRL's format example)."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def accuracy_reward(completions, answer, **kwargs):
    """1.0 when the completion equals the data set's answer column; None when the row has no answer."""
    CALLS.append(len(completions))
    return [None if a is None else float(c.strip() == a) for c, a in zip(completions, answer)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature: a dict with the score and more."""
    return {"score": float(solution_str.strip() == ground_truth), "source": data_source, "index": extra_info["index"]}


def broken_on_seven(completions, answer, **kwargs):
    """Raises on the row whose answer is "7"."""
    if "7" in answer:
        raise ZeroDivisionError("seven")
    return [1.0] * len(completions)


def nan_reward(completions, **kwargs):
    return [float("nan")] * len(completions)


def short_reward(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def text_reward(completions, **kwargs):
    return ["good"] * len(completions)


def no_signature(x):
    return x


def token_count(completion_ids, **kwargs):
    """TRL passes the sampled token ids as completion_ids."""
    return [float(len(ids)) for ids in completion_ids]
