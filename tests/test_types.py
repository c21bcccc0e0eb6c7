"""RolloutBatch.from_completions against a row-by-row reference."""

from __future__ import annotations

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
    assert batch.index.tolist() == [c.prompt_index for c in comps] and batch.scores.tolist() == scores
