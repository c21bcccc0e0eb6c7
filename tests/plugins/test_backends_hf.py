"""The hf rollout backend: grouping, finish reasons, greedy and log-prob exactness, seeding, weights."""

import attrs
import pytest
import torch

import rllab
from rllab import SamplingParams
from rllab.models.tiny import TinyModelConfig, build_tiny_model

CFG = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(autouse=True)
def one_thread():
    """The reference computations here run on one thread too (see ``make``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny_model(CFG)
    return model, tok


@pytest.fixture
def backend(lab, tiny):
    b = make(lab)
    b.update_weights(tiny[0])
    yield b
    b.close()


def make(lab, **knobs):
    """A backend on one thread: a model this small gains nothing from more, and on shared cores
    a two-thread barrier per op can cost milliseconds."""
    return lab.get("rollout_backend", "hf", **{"num_threads": 1, **knobs})()


def prompts_of(tok, texts=("1+2=", "12+34=", "999+1=", "7=")):
    return [tok(t).input_ids for t in texts]


@torch.no_grad()
def teacher_forced(model, prompt, tokens, temperature=1.0):
    """log_softmax(logits / T) of each generated token, from one unpadded full forward."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@torch.no_grad()
def manual_greedy(model, prompt, steps, eos):
    """Argmax decoding by recomputing the whole sequence each step (no cache, no padding)."""
    ids = list(prompt)
    out = []
    for _ in range(steps):
        tok = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
        if tok == eos:
            break
    return out


# --------------------------------------------------------------------------- shape of the output


def test_registered_and_follows_the_protocol(lab, backend):
    assert "hf" in lab.names("rollout_backend")
    assert isinstance(backend, rllab.RolloutBackend)
    assert lab.get("rollout_backend", "transformers").name == "hf"


def test_grouping_shapes_and_finish_reasons(backend, tiny):
    _, tok = tiny
    prompts = prompts_of(tok)
    out = backend.generate(prompts, SamplingParams(n=3, max_new_tokens=5, seed=0))
    assert len(out) == 12
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    for c in out:
        assert list(c.prompt_ids) == prompts[c.prompt_index]
        assert len(c.token_ids) in range(1, 6), c.token_ids  # at least one token, at most max_new_tokens
        assert len(c.log_probs) == len(c.token_ids)
        assert all(lp <= 0.0 for lp in c.log_probs)
        eos_at = [i for i, t in enumerate(c.token_ids) if t == tok.eos_token_id]
        if c.finish_reason == "stop":
            assert eos_at == [len(c.token_ids) - 1]
        else:
            assert c.finish_reason == "length" and eos_at == [] and len(c.token_ids) == 5


def test_eos_always_stops(backend, tiny):
    _, tok = tiny
    # A random model at a high temperature samples <eos> now and then: those rows must stop there.
    out = backend.generate(prompts_of(tok) * 4, SamplingParams(n=4, max_new_tokens=60, temperature=3.0, seed=1))
    reasons = {c.finish_reason for c in out}
    assert reasons == {"stop", "length"}
    for c in out:
        n_eos = c.token_ids.count(tok.eos_token_id)
        assert (n_eos == 1 and c.token_ids[-1] == tok.eos_token_id) if c.finish_reason == "stop" else n_eos == 0


def test_stop_token_ids(backend, tiny):
    model, tok = tiny
    prompt = prompts_of(tok)[1]
    greedy = manual_greedy(model, prompt, 6, tok.eos_token_id)
    stop = greedy[2]
    first = greedy.index(stop)
    [c] = backend.generate([prompt], SamplingParams(temperature=0, max_new_tokens=6, stop_token_ids=(stop,)))
    assert c.finish_reason == "stop" and list(c.token_ids) == greedy[: first + 1]


def test_loop_ends_when_every_row_is_done(backend, tiny, monkeypatch):
    _, tok = tiny
    calls = []
    model = backend.model
    orig = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: calls.append(1) or orig(*a, **k))
    vocab = tuple(range(len(tok)))  # every token stops: one sampled token per row
    out = backend.generate(prompts_of(tok), SamplingParams(n=2, max_new_tokens=50, stop_token_ids=vocab, seed=0))
    assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for c in out)
    assert len(calls) == 1  # the prefill only


def test_chunking_keeps_order_and_groups(lab, tiny):
    model, tok = tiny
    prompts = prompts_of(tok)
    small = make(lab, max_batch_size=4)
    small.update_weights(model)
    params = SamplingParams(n=3, max_new_tokens=4, temperature=0)
    big = make(lab)
    big.update_weights(model)
    a, b = small.generate(prompts, params), big.generate(prompts, params)
    assert [c.prompt_index for c in a] == [c.prompt_index for c in b]
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


def test_errors(lab, tiny):
    b = make(lab)
    with pytest.raises(RuntimeError, match="update_weights"):
        b.generate([[1, 2]], SamplingParams())
    b.update_weights(tiny[0])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        b.generate([[1, 2], []], SamplingParams())
    with pytest.raises(rllab.ConfigError, match="logprobs"):
        lab.get("rollout_backend", "hf", logprobs="sglang")


# --------------------------------------------------------------------------- exactness


def test_greedy_matches_manual_argmax_decoding(backend, tiny):
    model, tok = tiny
    prompts = prompts_of(tok)  # different lengths: left padding must not change anything
    out = backend.generate(prompts, SamplingParams(temperature=0, max_new_tokens=8, n=2))
    for c in out:
        assert list(c.token_ids) == manual_greedy(model, prompts[c.prompt_index], 8, tok.eos_token_id)
    topk1 = backend.generate(prompts, SamplingParams(temperature=0.7, top_k=1, max_new_tokens=8, seed=3))
    assert [c.token_ids for c in topk1] == [c.token_ids for c in out[::2]]


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_log_probs_equal_teacher_forcing(lab, tiny, temperature):
    model, tok = tiny
    params = SamplingParams(n=3, max_new_tokens=10, temperature=temperature, seed=0)
    for convention, T in (("raw", 1.0), ("temperature", temperature)):
        b = make(lab, logprobs=convention)
        b.update_weights(model)
        out = b.generate(prompts_of(tok), params)
        for c in out:
            want = teacher_forced(model, c.prompt_ids, c.token_ids, T)
            got = torch.tensor(c.log_probs, dtype=torch.float64)
            assert torch.allclose(got, want, rtol=0, atol=1e-5), (convention, (got - want).abs().max())


def test_greedy_log_probs(lab, tiny):
    model, tok = tiny
    params = SamplingParams(temperature=0, max_new_tokens=6)
    for convention in ("raw", "temperature"):  # greedy takes T = 1, like SGLang
        b = make(lab, logprobs=convention)
        b.update_weights(model)
        for c in b.generate(prompts_of(tok), params):
            want = teacher_forced(model, c.prompt_ids, c.token_ids)
            assert torch.allclose(torch.tensor(c.log_probs, dtype=torch.float64), want, atol=1e-5)
    b = make(lab, logprobs="processed")
    b.update_weights(model)
    assert all(lp == 0.0 for c in b.generate(prompts_of(tok), params) for lp in c.log_probs)


def test_processed_log_probs_renormalise_over_top_k_and_top_p(lab, tiny):
    model, tok = tiny
    T, k, p = 1.3, 7, 0.8
    b = make(lab, logprobs="processed")
    b.update_weights(model)
    out = b.generate(prompts_of(tok), SamplingParams(n=4, max_new_tokens=6, temperature=T, top_k=k, top_p=p, seed=0))
    for c in out:
        ids = torch.tensor([list(c.prompt_ids) + list(c.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(c.prompt_ids) - 1 : -1].double() / T
        for pos, token in enumerate(c.token_ids):
            probs = torch.softmax(logits[pos], -1)
            order = probs.argsort(descending=True)
            keep = order[:k]  # top-k, then the smallest prefix of those with mass >= p
            kept = probs[keep] / probs[keep].sum()
            n_keep = int((kept.cumsum(0) - kept < p).sum())
            nucleus = keep[:n_keep]
            assert token in nucleus.tolist()
            want = torch.log(probs[token] / probs[nucleus].sum())
            assert c.log_probs[pos] == pytest.approx(want.item(), abs=1e-5)


def test_top_p_and_top_k_restrict_the_support(lab, tiny):
    model, tok = tiny
    b = make(lab, logprobs="raw")
    b.update_weights(model)
    [prompt] = prompts_of(tok, ["12+34="])
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
    order = probs.argsort(descending=True).tolist()
    first = lambda params: {c.token_ids[0] for c in b.generate([prompt], params)}
    assert first(SamplingParams(n=300, max_new_tokens=1, top_k=3, seed=0)) <= set(order[:3])
    mass = probs[order].cumsum(0)
    n_nucleus = int((mass - probs[order] < 0.5).sum())
    assert first(SamplingParams(n=300, max_new_tokens=1, top_p=0.5, seed=0)) <= set(order[:n_nucleus])
    assert len(first(SamplingParams(n=300, max_new_tokens=1, temperature=5.0, seed=0))) > 20


def test_sampling_follows_the_distribution(lab, tiny):
    model, tok = tiny
    b = make(lab)
    b.update_weights(model)
    [prompt] = prompts_of(tok, ["5+5="])
    n = 20000
    out = b.generate([prompt], SamplingParams(n=n, max_new_tokens=1, temperature=0.5, seed=0))
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in out]), minlength=len(tok)).double()
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double() / 0.5, -1)
    top = probs.argsort(descending=True)[:5]
    sd = (probs[top] * (1 - probs[top]) / n).sqrt()
    assert ((counts[top] / n - probs[top]).abs() < 5 * sd + 1e-3).all()


# --------------------------------------------------------------------------- seeds and weights


def test_seeded_generation_is_reproducible(lab, backend, tiny):
    _, tok = tiny
    prompts = prompts_of(tok)
    params = SamplingParams(n=4, max_new_tokens=8, seed=123)
    a, b = backend.generate(prompts, params), backend.generate(prompts, params)
    assert a == b
    c = backend.generate(prompts, attrs.evolve(params, seed=124))
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    # Without params.seed the backend's own generator advances: calls differ, backends agree.
    unseeded = attrs.evolve(params, seed=None)
    other = make(lab)
    other.update_weights(tiny[0])
    fresh = make(lab)
    fresh.update_weights(tiny[0])
    x1, x2 = other.generate(prompts, unseeded), other.generate(prompts, unseeded)
    assert [c.token_ids for c in x1] != [c.token_ids for c in x2]
    assert fresh.generate(prompts, unseeded) == x1


def test_update_weights_copies_then_loads(lab, tiny):
    _, tok = tiny
    source, _ = build_tiny_model(CFG)
    b = make(lab)
    b.update_weights(source)
    prompts = prompts_of(tok)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    before = b.generate(prompts, params)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert b.generate(prompts, params) == before  # a private copy: the change is not seen yet
    b.update_weights(source)
    after = b.generate(prompts, params)
    assert after != before
    for c in after:
        assert list(c.token_ids) == manual_greedy(source, c.prompt_ids, 6, tok.eos_token_id)
    assert b.model is not source


def test_share_weights_and_state_dict_and_path(lab, tiny, tmp_path):
    model, tok = tiny
    prompts = prompts_of(tok)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    shared = make(lab, share_weights=True)
    shared.update_weights(model)
    assert shared.model is model
    model.train()
    shared.generate(prompts, params)
    assert model.training  # sampling ran in eval mode and gave the mode back
    model.eval()
    model.save_pretrained(tmp_path)
    from_path = make(lab, model_path=str(tmp_path))
    a, b = from_path.generate(prompts, params), shared.generate(prompts, params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert torch.allclose(torch.tensor([c.log_probs for c in a]), torch.tensor([c.log_probs for c in b]), atol=1e-5)
    other, _ = build_tiny_model(attrs.evolve(CFG, seed=7))
    from_path.update_weights(other.state_dict())
    copy = make(lab)
    copy.update_weights(other)
    assert from_path.generate(prompts, params) == copy.generate(prompts, params)
    from_path.close()
    assert from_path.model is None


def test_bfloat16_copy(lab, tiny):
    model, tok = tiny
    b = make(lab, dtype="bfloat16", num_threads=None)
    b.update_weights(model)
    assert next(b.model.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32
    out = b.generate(prompts_of(tok), SamplingParams(n=2, max_new_tokens=4, seed=0))
    assert len(out) == 8 and all(len(c.log_probs) == len(c.token_ids) for c in out)


def test_absolute_position_model(lab):
    """GPT-2 has learned absolute positions, so left padding is only harmless if position_ids
    skip the padding (Qwen2's rotary attention would hide a wrong offset)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_positions=64, n_embd=32, n_layer=2, n_head=2, eos_token_id=2)
    model = GPT2LMHeadModel(config).eval()
    b = make(lab)
    b.update_weights(model)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    for c in b.generate(prompts, SamplingParams(temperature=0, max_new_tokens=6, n=2)):
        assert list(c.token_ids) == manual_greedy(model, c.prompt_ids, 6, 2)
    for c in b.generate(prompts, SamplingParams(max_new_tokens=6, n=2, seed=0)):
        want = teacher_forced(model, c.prompt_ids, c.token_ids)
        assert torch.allclose(torch.tensor(c.log_probs, dtype=torch.float64), want, atol=1e-5)
