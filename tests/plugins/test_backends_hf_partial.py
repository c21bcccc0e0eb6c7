"""The hf backend's ``generate_until`` (partial rollouts): a batch stops once enough groups are complete."""

import pytest
import torch

from rllab import SamplingParams

from .test_backends_hf import make, prompts_of, tiny  # noqa: F401  (tiny: a fixture)


def _oracle(ref, caps, groups, needed):
    """What generate_until must give, from each row's unstopped greedy tokens ``ref``: a row ends
    after min(its natural length, its cap) tokens; sampling stops at the first token count t where
    ``needed`` groups have every row ended; a row not ended by then is cut at t and aborted."""
    ends = [min(len(r), c) for r, c in zip(ref, caps)]
    done_at = {g: max(e for e, h in zip(ends, groups) if h == g) for g in set(groups)}
    t = min(t for t in range(1, max(ends) + 1) if sum(d <= t for d in done_at.values()) >= needed or t == max(ends))
    return [(tuple(r[:min(e, t)]), "abort" if e > t else None) for r, e in zip(ref, ends)]


@pytest.mark.parametrize("max_batch_size", [1024, 3])
def test_greedy_rows_stop_once_enough_groups_are_complete(lab, tiny, max_batch_size):  # noqa: F811
    model, tok = tiny
    b = make(lab, max_batch_size=max_batch_size)
    b.update_weights(model)
    texts = ("1+2=", "12+34=", "999+1=", "7=")
    base = prompts_of(tok, texts)
    rows = [p for p in base for _ in range(2)]
    caps, groups = [2, 3, 6, 6, 1, 4, 5, 2], [0, 0, 1, 1, 2, 2, 3, 3]
    params = SamplingParams(n=1, max_new_tokens=8, temperature=0.0)
    ref = [c.token_ids for c in b.generate(rows, params)]
    got = b.generate_until(rows, params, caps=caps, groups=groups, needed=2)
    want = _oracle(ref, caps, groups, 2)
    if max_batch_size == 3:  # chunks of whole groups: {0, 1}, {2}, {3}; once 2 groups are complete the rest is never sampled
        first = _oracle(ref[:4], caps[:4], groups[:4], 2)
        done = sum(all(f is None for _, f in first[k:k + 2]) for k in (0, 2))
        second = _oracle(ref[4:6], caps[4:6], groups[4:6], 2 - done) if done < 2 else [((), "abort")] * 2
        want = first + second + [((), "abort")] * 2
    assert [c.token_ids for c in got] == [t for t, _ in want]
    for c, (t, f) in zip(got, want):
        assert c.finish_reason == (f or ("stop" if t and t[-1] in b.eos_ids else "length"))
    assert [c.prompt_index for c in got] == list(range(8))
    assert sum(c.finish_reason == "abort" for c in got) > 0  # the case stops early


def test_generate_until_refuses_n_above_one_and_mismatched_columns(lab, tiny):  # noqa: F811
    model, tok = tiny
    b = make(lab)
    b.update_weights(model)
    p = prompts_of(tok, ("1+2=",))
    with pytest.raises(ValueError, match="n = 1"):
        b.generate_until(p, SamplingParams(n=2), caps=[4], groups=[0], needed=1)
    with pytest.raises(ValueError, match="1 caps, 2 groups"):
        b.generate_until(p, SamplingParams(), caps=[4], groups=[0, 0], needed=1)


def test_continue_resumes_a_stopped_sample_from_its_tokens_with_the_next_weights(lab, tiny):  # noqa: F811
    import attrs

    from rllab.rollout.stage import build_stage
    from rllab.settings import RolloutConfig
    from tests.test_accuracy_and_failures import Task

    model, tok = tiny
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    b = make(lab)
    b.update_weights(model)
    s = build_stage(task=Task(), task_name="t", backend=b, tokenizer=tok, seed=0,
                    config=RolloutConfig(prompts_per_step=2, group_size=2, max_new_tokens=10, over_sample=1.0, partial="continue"))
    stops = tuple(range(0, len(tok), 4))  # a quarter of the vocabulary stops a row: lengths vary
    plain = s.sampling_params
    s.sampling_params = lambda step, **kw: attrs.evolve(plain(step, **kw), stop_token_ids=stops)
    s.sample(1)
    carried = {c.example.prompt: c.rows for c in s.partial.carried}
    assert carried, "the case must leave a group unfinished"
    with torch.no_grad():  # the next step's weights
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    b.update_weights(model)
    r = s.sample(2)
    resumed = [e for e in r.episodes if e.example.prompt in carried and any(v == 1 for v in e.token_versions)]
    assert resumed and any(len(e.completion.token_ids) > e.token_versions.count(1) > 0 for e in resumed)
    for e in resumed:
        k = e.token_versions.count(1)
        old = [row for row in carried[e.example.prompt] if row[0] == e.completion.token_ids[:k]]
        assert old and old[0][1] == e.completion.log_probs[:k]  # the step-1 tokens and log-probs, as they were
        assert e.token_versions == (1,) * k + (2,) * (len(e.completion.token_ids) - k)
        if len(e.completion.token_ids) > k:  # the new tokens: log-probs of the step-2 weights, given the prefix
            from .test_backends_hf import teacher_forced

            want = teacher_forced(model, e.completion.prompt_ids, e.completion.token_ids)[k:]
            assert list(e.completion.log_probs[k:]) == pytest.approx(want.tolist(), abs=1e-4)
