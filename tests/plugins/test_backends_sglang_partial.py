"""The sglang backend's ``generate_until`` (partial rollouts) against the stand-in: one request per
group, and ``/abort_request`` for the rows still running once enough groups are complete."""

from __future__ import annotations

import pytest

from rllab import SamplingParams
from tests.sglang_standin import StandIn

from .test_backends_sglang import close_backends, make  # noqa: F401  (close_backends: a fixture)


def test_rows_still_running_are_aborted_once_enough_groups_are_complete(lab):
    # instant_tokens: every row samples token 5 up to its cap, one token per 0.05 s: group g ends after max(its caps) ticks
    with StandIn(None, instant_tokens=16, token_delay_s=0.05, lifetime_s=120) as server:
        b = make(lab, server.url)
        caps, groups = [2, 3, 16, 16, 1, 4, 16, 2], [0, 0, 1, 1, 2, 2, 3, 3]
        got = b.generate_until([[1, 2, 3]] * 8, SamplingParams(n=1, max_new_tokens=16), caps=caps, groups=groups, needed=2)
        assert [c.prompt_index for c in got] == list(range(8))
        assert [c.finish_reason for c in got] == ["length", "length", "abort", "abort", "length", "length", "abort", "length"]
        assert [len(c.token_ids) for c in got[:2] + got[4:6] + got[7:]] == [2, 3, 1, 4, 2]
        for c in (got[2], got[3], got[6]):  # stopped where they were: some tokens, never their 16
            assert 4 <= len(c.token_ids) < 16 and len(c.log_probs) == len(c.token_ids)
        rids = [body["rid"] for body in server.abort_requests]
        assert len(rids) == 4 and len(set(rids)) == 4  # the four rows of groups 1 and 3, each by its own rid
        assert b.last_metrics()["sglang/aborted"] == 3 and b.last_metrics()["sglang/requests"] == 4


def test_generate_until_refuses_mismatched_columns(lab):
    with StandIn(None, instant_tokens=4, lifetime_s=60) as server:
        b = make(lab, server.url)
        with pytest.raises(ValueError, match="n = 1"):
            b.generate_until([[1, 2]], SamplingParams(n=2), caps=[4], groups=[0], needed=1)
