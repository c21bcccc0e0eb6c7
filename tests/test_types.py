"""RolloutBatch.from_completions against a row-by-row reference."""

from __future__ import annotations

import attrs
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab


def reference(completions, scores, pad):
    B = len(completions)
    P = max(len(c.prompt_ids) for c in completions)
    T = max(1, max(len(c.token_ids) for c in completions))
    ids = torch.full((B, P + T), pad, dtype=torch.long)
    attn = torch.zeros(B, P + T, dtype=torch.bool)
    resp = torch.zeros(B, T, dtype=torch.bool)
    lp = torch.zeros(B, T)
    for i, c in enumerate(completions):
        p, t = len(c.prompt_ids), len(c.token_ids)
        ids[i, P - p : P] = torch.tensor(c.prompt_ids, dtype=torch.long)
        attn[i, P - p : P] = True
        if t:
            ids[i, P : P + t] = torch.tensor(c.token_ids, dtype=torch.long)
            attn[i, P : P + t] = True
            resp[i, :t] = True
            lp[i, :t] = torch.tensor(c.log_probs)
    return ids, attn, resp, lp


rows = st.lists(
    st.tuples(st.lists(st.integers(1, 50), min_size=1, max_size=6), st.lists(st.integers(1, 50), min_size=0, max_size=5)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(rows)
def test_from_completions_matches_row_by_row_padding(data):
    comps = [
        rllab.Completion(prompt_ids=tuple(p), token_ids=tuple(r), log_probs=tuple(-0.5 * (j + 1) for j in range(len(r))), finish_reason="stop", prompt_index=i // 2)
        for i, (p, r) in enumerate(data)
    ]
    scores = [float(i) for i in range(len(comps))]
    batch = rllab.RolloutBatch.from_completions(comps, scores, pad_token_id=0)
    ids, attn, resp, lp = reference(comps, scores, 0)
    assert torch.equal(batch.input_ids, ids) and torch.equal(batch.attention_mask, attn)
    assert torch.equal(batch.response_mask, resp) and torch.equal(batch.rollout_log_prob, lp)
    assert batch.index.tolist() == [c.prompt_index for c in comps] and batch.rewards.tolist() == scores
    assert batch.scores is batch.rewards  # the former name
    from_tensor = rllab.RolloutBatch.from_completions(comps, torch.tensor(scores, dtype=torch.float64), pad_token_id=0)
    assert from_tensor.rewards.dtype == torch.float32 and from_tensor.rewards.tolist() == scores


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2**40), min_size=0, max_size=5), min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 2), st.lists(st.floats(-50, 0, width=64), max_size=4), st.booleans()), min_size=1, max_size=8),
    st.integers(0, 99),
)
def test_rows_sharing_a_prompt_tuple_or_an_equal_copy_pad_alike(pool, picks, pad):
    """A group's rows share one prompt tuple (the backends pass it on); other rows hold equal
    copies; both pad as the row-by-row reference does, with any pad id and any float log-prob."""
    prompts = [tuple(p) for p in pool]
    comps = []
    for k, (i, lps, copy) in enumerate(picks):
        p = prompts[i % len(prompts)]
        comps.append(rllab.Completion(
            prompt_ids=tuple(list(p)) if copy else p, token_ids=tuple(range(7, 7 + len(lps))), log_probs=tuple(lps),
            finish_reason="length", prompt_index=i % len(prompts),
        ))
    batch = rllab.RolloutBatch.from_completions(comps, [0.0] * len(comps), pad_token_id=pad)
    ids, attn, resp, lp = reference(comps, None, pad)
    assert torch.equal(batch.input_ids, ids) and torch.equal(batch.attention_mask, attn)
    assert torch.equal(batch.response_mask, resp) and torch.equal(batch.rollout_log_prob, lp)


def test_a_missing_pad_token_is_named():
    import pytest

    c = rllab.Completion(prompt_ids=(1,), token_ids=(2,), log_probs=(-1.0,), finish_reason="stop")
    with pytest.raises(ValueError, match="pad_token_id is None"):
        rllab.RolloutBatch.from_completions([c], [0.0], pad_token_id=None)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(
    st.lists(st.integers(0, 2**33), max_size=4), st.lists(st.floats(allow_nan=True), max_size=4),
    st.sampled_from(["stop", "length", "abort"]), st.integers(0, 9), st.none() | st.text(max_size=3),
), max_size=6))
def test_completion_columns_builds_what_the_class_builds(rows):
    cols = (
        [tuple(p) for p, *_ in rows], [tuple(range(len(lp))) for _, lp, *_ in rows], [tuple(lp) for _, lp, *_ in rows],
        [r[2] for r in rows], [r[3] for r in rows], [r[4] for r in rows],
    )
    built = rllab.Completion.columns(*cols)
    one_by_one = [
        rllab.Completion(prompt_ids=p, token_ids=t, log_probs=lp, finish_reason=f, prompt_index=i, weight_version=w)
        for p, t, lp, f, i, w in zip(*cols)
    ]
    assert all(type(c) is rllab.Completion for c in built)
    assert [repr(c) for c in built] == [repr(c) for c in one_by_one]  # repr: NaN log-probs compare unequal
    assert [hash(c) for c in built] == [hash(c) for c in one_by_one]


def test_completion_columns_checks_as_the_class_does():
    import pytest

    with pytest.raises(ValueError, match=r"2 token_ids but 1 log_probs \(row 1\)"):
        rllab.Completion.columns([(1,), (1,)], [(2,), (2, 3)], [(-1.0,), (-1.0,)], ["stop"] * 2, [0, 0], [None, None])
    with pytest.raises(ValueError, match=r"columns of lengths \[2, 2, 2, 1, 2, 2\]"):
        rllab.Completion.columns([(1,), (1,)], [(2,), (2,)], [(-1.0,), (-1.0,)], ["stop"], [0, 0], [None, None])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rllab.Completion.columns([(1,)], [(2,)], [(-1.0,)], ["stop"], [0], [None])[0].prompt_index = 3
