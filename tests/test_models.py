"""Tests for rllab.models.forward: chunked log-probs / entropy, response alignment, critic values.

References are the dense formulas ``log_softmax(z).gather(...)`` and ``−Σ softmax·log_softmax``
evaluated in float64; the chunked kernels run in float32 and must match to 1e-5.
"""

import math

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from rllab.kernels import chunked as kernels
from rllab.models import forward as models
from rllab.models.forward import (
    CriticModel,
    ValueHead,
    logprobs_from_hidden,
    logprobs_from_logits,
    position_ids_from_mask,
    response_logprobs,
    supports_hidden_path,
)

ATOL = 1e-5


def dense(z64: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0):
    """float64 reference: log π(label) and entropy of softmax(z / τ)."""
    log_p = torch.log_softmax(z64 / temperature, dim=-1)
    log_prob = log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return log_prob, entropy


def close(a, b, atol=ATOL):
    torch.testing.assert_close(a.double(), b.double(), atol=atol, rtol=1e-5)


class BigAllocations(TorchDispatchMode):
    """Records the element count of every freshly allocated (non-view) floating-point op output."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t, ret in zip(outs, func._schema.returns):
            fresh = ret.alias_info is None  # views and in-place results alias an input
            if fresh and isinstance(t, torch.Tensor) and t.is_floating_point():
                self.sizes.append(t.numel())
        return out


# --------------------------------------------------------------------------- logprobs_from_logits


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 16, 100, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logits_values_and_grads_match_dense(chunk_size, temperature):
    g = torch.Generator().manual_seed(0)
    N, V = 37, 29
    logits = (3 * torch.randn(N, V, generator=g)).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=g)
    g_lp, g_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)

    log_prob, entropy = logprobs_from_logits(
        logits, labels, chunk_size=chunk_size, with_entropy=True, temperature=temperature
    )
    grad = torch.autograd.grad((log_prob * g_lp + entropy * g_ent).sum(), logits)[0]

    z64 = logits.detach().double().requires_grad_()
    ref_lp, ref_ent = dense(z64, labels, temperature)
    ref_grad = torch.autograd.grad((ref_lp * g_lp.double() + ref_ent * g_ent.double()).sum(), z64)[0]
    assert log_prob.shape == entropy.shape == (N,) and log_prob.dtype == torch.float32
    close(log_prob, ref_lp)
    close(entropy, ref_ent)
    close(grad, ref_grad)


@pytest.mark.parametrize("chunk_size", [2, 5, 6, 13, None])
def test_logits_batched_3d_matches_flat(chunk_size):
    g = torch.Generator().manual_seed(1)
    B, T, V = 3, 5, 11
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    labels = torch.randint(0, V, (B, T), generator=g)
    log_prob, entropy = logprobs_from_logits(logits, labels, chunk_size=chunk_size, with_entropy=True)
    assert log_prob.shape == entropy.shape == (B, T)
    (log_prob.sum() - 0.3 * entropy.sum()).backward()
    z64 = logits.detach().double().requires_grad_()
    ref_lp, ref_ent = dense(z64, labels)
    (ref_lp.sum() - 0.3 * ref_ent.sum()).backward()
    close(log_prob, ref_lp)
    close(entropy, ref_ent)
    close(logits.grad, z64.grad)


def test_logits_strided_view_of_model_logits():
    """Slicing the response positions out of (B, L, V) logits works without a copy and the
    gradient lands on the right positions of the full tensor (zero elsewhere)."""
    g = torch.Generator().manual_seed(2)
    B, L, T, V = 2, 9, 4, 13
    full = torch.randn(B, L, V, generator=g, requires_grad=True)
    ids = torch.randint(0, V, (B, L), generator=g)
    view = full[:, -T - 1 : -1]
    assert not view.is_contiguous()
    log_prob = logprobs_from_logits(view, ids[:, -T:], chunk_size=3)
    log_prob.sum().backward()
    z64 = full.detach().double().requires_grad_()
    ref = torch.log_softmax(z64, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)[:, -T:]
    ref.sum().backward()
    close(log_prob, ref)
    close(full.grad, z64.grad)
    assert full.grad[:, : L - T - 1].abs().sum() == 0 and full.grad[:, -1].abs().sum() == 0


def test_logits_hand_values_uniform_and_two_token():
    # uniform over V: log π = −log V, H = log V
    V = 8
    log_prob, entropy = logprobs_from_logits(torch.zeros(3, V), torch.tensor([0, 3, 7]), with_entropy=True)
    close(log_prob, torch.full((3,), -math.log(V)))
    close(entropy, torch.full((3,), math.log(V)))
    # two tokens with logits (0, log 3): π = (1/4, 3/4); H = −(¼ log ¼ + ¾ log ¾)
    logits = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    log_prob, entropy = logprobs_from_logits(logits, torch.tensor([1]), with_entropy=True)
    close(log_prob, torch.tensor([math.log(0.75)]))
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(entropy, torch.tensor([h]))
    log_prob.sum().backward()
    close(logits.grad, torch.tensor([[-0.25, 0.25]]))  # onehot − π


def test_logits_temperature_is_division():
    g = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(10, 7, generator=g), torch.randint(0, 7, (10,), generator=g)
    a = logprobs_from_logits(logits, labels, temperature=0.5, chunk_size=4)
    b = logprobs_from_logits(logits * 2, labels, chunk_size=4)
    close(a, b)


def test_logits_only_one_output_used():
    """Gradients are right when only log_prob or only entropy reaches the loss."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(9, 6, generator=g, requires_grad=True)
    labels = torch.randint(0, 6, (9,), generator=g)
    z64 = logits.detach().double().requires_grad_()
    ref_lp, ref_ent = dense(z64, labels)
    for pick in (0, 1):
        out = logprobs_from_logits(logits, labels, with_entropy=True, chunk_size=4)
        (grad,) = torch.autograd.grad(out[pick].sum(), logits)
        (ref_grad,) = torch.autograd.grad((ref_lp, ref_ent)[pick].sum(), z64, retain_graph=True)
        close(grad, ref_grad)


def test_logits_bf16_computes_in_float32():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(12, 40, generator=g).bfloat16().requires_grad_()
    labels = torch.randint(0, 40, (12,), generator=g)
    log_prob, entropy = logprobs_from_logits(logits, labels, with_entropy=True, chunk_size=5)
    assert log_prob.dtype == entropy.dtype == torch.float32
    ref_lp, ref_ent = dense(logits.detach().double(), labels)
    close(log_prob, ref_lp)
    close(entropy, ref_ent)
    (log_prob.sum() + entropy.sum()).backward()
    assert logits.grad.dtype == torch.bfloat16
    z64 = logits.detach().double().requires_grad_()
    a, b = dense(z64, labels)
    (a.sum() + b.sum()).backward()
    torch.testing.assert_close(logits.grad.double(), z64.grad, atol=1e-2, rtol=1e-2)


def test_logits_negative_infinity_is_finite():
    """A −inf logit (a banned token) has probability 0 and contributes nothing to the entropy."""
    logits = torch.tensor([[0.0, 0.0, -math.inf, 0.0]], requires_grad=True)
    log_prob, entropy = logprobs_from_logits(logits, torch.tensor([1]), with_entropy=True)
    close(log_prob, torch.tensor([-math.log(3)]))
    close(entropy, torch.tensor([math.log(3)]))
    (log_prob.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 2] == 0


def test_logits_no_grad_forward():
    logits, labels = torch.randn(5, 4, requires_grad=True), torch.tensor([0, 1, 2, 3, 0])
    with torch.no_grad():
        log_prob = logprobs_from_logits(logits, labels)
    assert not log_prob.requires_grad
    close(log_prob, dense(logits.detach().double(), labels)[0])


def test_logits_never_allocates_a_second_full_tensor():
    """Forward allocates nothing near (N, V); backward allocates the (N, V) gradient once.

    The dense formula allocates several (N, V) tensors — checked too, so the probe can fail.
    """
    N, V, chunk = 64, 50, 8
    logits = torch.randn(N, V, requires_grad=True)
    labels = torch.randint(0, V, (N,))
    with BigAllocations() as fwd:
        log_prob, entropy = logprobs_from_logits(logits, labels, chunk_size=chunk, with_entropy=True)
    assert max(fwd.sizes) <= chunk * V
    with BigAllocations() as bwd:
        (log_prob.sum() + entropy.sum()).backward()
    assert sum(s >= N * V for s in bwd.sizes) == 1
    assert max(s for s in bwd.sizes if s < N * V) <= chunk * V

    logits.grad = None
    with BigAllocations() as naive:
        ref_lp, ref_ent = dense(logits, labels)
        (ref_lp.sum() + ref_ent.sum()).backward()
    assert sum(s >= N * V for s in naive.sizes) >= 4


def test_empty_batches():
    logits = torch.randn(0, 5, requires_grad=True)
    log_prob, entropy = logprobs_from_logits(logits, torch.zeros(0, dtype=torch.long), with_entropy=True)
    assert log_prob.shape == entropy.shape == (0,)
    (log_prob.sum() + entropy.sum()).backward()
    assert logits.grad.shape == (0, 5)
    hidden, weight = torch.randn(2, 0, 3, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    log_prob = logprobs_from_hidden(hidden, weight, torch.zeros(2, 0, dtype=torch.long))
    assert log_prob.shape == (2, 0)
    log_prob.sum().backward()
    assert weight.grad.abs().sum() == 0


def test_logits_bad_inputs():
    logits, labels = torch.randn(4, 6), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"labels has shape \(3,\).*\(4, 6\)"):
        logprobs_from_logits(logits, labels[:3])
    with pytest.raises(ValueError, match=r"\(N, V\) or \(B, T, V\), got shape \(6,\)"):
        logprobs_from_logits(logits[0], labels)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        logprobs_from_logits(logits, labels.float())
    with pytest.raises(TypeError, match="logits must be a floating-point tensor"):
        logprobs_from_logits(labels.view(4, 1), labels)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        logprobs_from_logits(logits, labels, chunk_size=0)
    with pytest.raises(ValueError, match="temperature must be a number > 0"):
        logprobs_from_logits(logits, labels, temperature=0.0)
    with pytest.raises(ValueError, match=r"labels has shape \(2, 2\) but logits of shape \(2, 3, 6\)"):
        logprobs_from_logits(torch.randn(2, 3, 6), torch.zeros(2, 2, dtype=torch.long))


# --------------------------------------------------------------------------- logprobs_from_hidden


TILES = [(1, None), (4, None), (7, None), (50, None), (None, None), (None, 5), (7, 5), (4, 1), (18, 23), (5, 22)]


@pytest.mark.parametrize("chunk_size,vocab_chunk_size", TILES)
@pytest.mark.parametrize("use_bias", [False, True])
def test_hidden_values_and_grads_match_dense(chunk_size, vocab_chunk_size, use_bias):
    g = torch.Generator().manual_seed(6)
    B, T, D, V = 3, 6, 10, 23
    hidden = torch.randn(B, T, D, generator=g, requires_grad=True)
    weight = torch.randn(V, D, generator=g, requires_grad=True)
    bias = torch.randn(V, generator=g, requires_grad=True) if use_bias else None
    labels = torch.randint(0, V, (B, T), generator=g)
    g_lp, g_ent = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    tau = 0.8

    log_prob, entropy = logprobs_from_hidden(
        hidden, weight, labels, bias=bias, chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size,
        with_entropy=True, temperature=tau,
    )
    params = [hidden, weight] + ([bias] if use_bias else [])
    grads = torch.autograd.grad((log_prob * g_lp + entropy * g_ent).sum(), params)

    params64 = [p.detach().double().requires_grad_() for p in params]
    z64 = params64[0] @ params64[1].t() + (params64[2] if use_bias else 0)
    ref_lp, ref_ent = dense(z64, labels, tau)
    ref_grads = torch.autograd.grad((ref_lp * g_lp.double() + ref_ent * g_ent.double()).sum(), params64)
    assert log_prob.shape == entropy.shape == (B, T)
    close(log_prob, ref_lp)
    close(entropy, ref_ent)
    for a, b in zip(grads, ref_grads):
        close(a, b)


def test_hidden_equals_logits_path():
    g = torch.Generator().manual_seed(7)
    hidden, weight = torch.randn(20, 8, generator=g), torch.randn(31, 8, generator=g)
    labels = torch.randint(0, 31, (20,), generator=g)
    a = logprobs_from_hidden(hidden, weight, labels, chunk_size=6, with_entropy=True)
    b = logprobs_from_logits(hidden @ weight.t(), labels, chunk_size=9, with_entropy=True)
    close(a[0], b[0])
    close(a[1], b[1])


@pytest.mark.parametrize("vocab_chunk_size", [None, 3, 4])
def test_hidden_banned_tokens_in_whole_tiles(vocab_chunk_size):
    """A bias of −inf bans tokens; a tile made only of banned tokens must not produce NaN."""
    g = torch.Generator().manual_seed(15)
    N, D, V = 6, 4, 12
    hidden = torch.randn(N, D, generator=g, requires_grad=True)
    weight = torch.randn(V, D, generator=g, requires_grad=True)
    bias = torch.zeros(V)
    bias[:4] = -math.inf  # the first tile (3 or 4 columns) is entirely banned
    labels = torch.randint(4, V, (N,), generator=g)
    log_prob, entropy = logprobs_from_hidden(
        hidden, weight, labels, bias=bias, chunk_size=4, vocab_chunk_size=vocab_chunk_size, with_entropy=True
    )
    (log_prob.sum() + entropy.sum()).backward()
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    z = (h64 @ w64.t())[:, 4:]  # the allowed tokens only
    ref_lp, ref_ent = dense(z, labels - 4)
    (ref_lp.sum() + ref_ent.sum()).backward()
    close(log_prob, ref_lp)
    close(entropy, ref_ent)
    close(hidden.grad, h64.grad)
    close(weight.grad, w64.grad)
    assert weight.grad[:4].abs().sum() == 0


def test_hidden_frozen_head_or_frozen_hidden():
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(11, 5, generator=g)
    weight = torch.randn(13, 5, generator=g)
    labels = torch.randint(0, 13, (11,), generator=g)
    h = hidden.clone().requires_grad_()
    logprobs_from_hidden(h, weight, labels, chunk_size=4).sum().backward()
    w = weight.clone().requires_grad_()
    logprobs_from_hidden(hidden, w, labels, chunk_size=4).sum().backward()
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    dense(h64 @ w64.t(), labels)[0].sum().backward()
    close(h.grad, h64.grad)
    close(w.grad, w64.grad)


@pytest.mark.parametrize("vocab_chunk_size", [None, 16])
def test_hidden_bf16_head(vocab_chunk_size):
    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(9, 16, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(40, 16, generator=g).bfloat16().requires_grad_()
    labels = torch.randint(0, 40, (9,), generator=g)
    log_prob, entropy = logprobs_from_hidden(
        hidden, weight, labels, chunk_size=4, vocab_chunk_size=vocab_chunk_size, with_entropy=True
    )
    assert log_prob.dtype == torch.float32
    ref = logprobs_from_logits(hidden.detach() @ weight.detach().t(), labels, with_entropy=True)
    close(log_prob, ref[0])
    close(entropy, ref[1])
    (log_prob.sum() + entropy.sum()).backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    a, b = dense(h64 @ w64.t(), labels)
    (a.sum() + b.sum()).backward()
    # the head's matmul runs in bfloat16, so compare at bfloat16 precision
    torch.testing.assert_close(hidden.grad.double(), h64.grad, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(weight.grad.double(), w64.grad, atol=3e-2, rtol=3e-2)


def test_hidden_never_materialises_logits():
    N, D, V, chunk = 64, 6, 50, 8
    hidden = torch.randn(N, D, requires_grad=True)
    weight = torch.randn(V, D, requires_grad=True)
    labels = torch.randint(0, V, (N,))
    with BigAllocations() as probe:
        log_prob, entropy = logprobs_from_hidden(hidden, weight, labels, chunk_size=chunk, with_entropy=True)
        (log_prob.sum() + entropy.sum()).backward()
    assert max(probe.sizes) <= chunk * V
    weight.grad = hidden.grad = None
    with BigAllocations() as tiled:  # all tokens at once, 10 vocabulary entries per tile
        log_prob, entropy = logprobs_from_hidden(
            hidden, weight, labels, chunk_size=N, vocab_chunk_size=10, with_entropy=True
        )
        (log_prob.sum() + entropy.sum()).backward()
    assert max(tiled.sizes) <= N * 10
    with BigAllocations() as naive:
        ref = dense(hidden @ weight.t(), labels)
        (ref[0].sum() + ref[1].sum()).backward()
    assert max(naive.sizes) >= N * V


def test_hidden_bad_inputs():
    hidden, weight, labels = torch.randn(4, 5), torch.randn(7, 5), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"lm_head_weight must be \(V, D\) with D = 5.*got shape \(7, 6\)"):
        logprobs_from_hidden(hidden, torch.randn(7, 6), labels)
    with pytest.raises(ValueError, match=r"labels has shape \(4, 1\) but hidden of shape \(4, 5\)"):
        logprobs_from_hidden(hidden, weight, labels[:, None])
    with pytest.raises(ValueError, match=r"bias must have shape \(7,\)"):
        logprobs_from_hidden(hidden, weight, labels, bias=torch.zeros(6))
    with pytest.raises(TypeError, match="hidden is torch.float32 but lm_head_weight is torch.bfloat16"):
        logprobs_from_hidden(hidden, weight.bfloat16(), labels)
    with pytest.raises(ValueError, match="hidden must be"):
        logprobs_from_hidden(hidden[0], weight, labels)
    with pytest.raises(ValueError, match="vocab_chunk_size must be a positive int"):
        logprobs_from_hidden(hidden, weight, labels, vocab_chunk_size=0)


# --------------------------------------------------------------------------- transformers models

VOCAB = 64


def qwen2(**kw):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, **kw,
    )
    return transformers.Qwen2ForCausalLM(cfg).eval()


def llama(**kw):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, **kw,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def granite():
    """A model whose head scales the logits, so the hidden-state path would be wrong for it."""
    torch.manual_seed(0)
    cfg = transformers.GraniteConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, logits_scaling=4.0,
    )
    return transformers.GraniteForCausalLM(cfg).eval()


def padded_batch(prompts, responses, extra_left=0):
    """Left-pad prompts and right-pad responses the way RolloutBatch.from_completions does."""
    P = max(len(p) for p in prompts) + extra_left
    T = max(len(r) for r in responses)
    B = len(prompts)
    ids = torch.zeros(B, P + T, dtype=torch.long)
    mask = torch.zeros(B, P + T, dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p) : P] = torch.tensor(p)
        mask[i, P - len(p) : P] = True
        ids[i, P : P + len(r)] = torch.tensor(r)
        mask[i, P : P + len(r)] = True
    return ids, mask, T


def rand_tokens(g, n):
    return torch.randint(1, VOCAB, (n,), generator=g).tolist()


def test_position_ids_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]


def test_supports_hidden_path():
    assert supports_hidden_path(qwen2()) and supports_hidden_path(llama())
    assert not supports_hidden_path(granite())


@pytest.mark.parametrize("make", [qwen2, llama])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_response_logprobs_equals_full_logits(make, temperature):
    model = make()
    g = torch.Generator().manual_seed(10)
    B, L, T = 3, 12, 5
    ids = torch.randint(0, VOCAB, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    log_prob, entropy = response_logprobs(model, ids, mask, T, with_entropy=True, temperature=temperature, chunk_size=4)
    assert log_prob.shape == entropy.shape == (B, T)
    with torch.no_grad():
        logits = model(ids).logits.double()
    ref_lp, ref_ent = dense(logits[:, L - T - 1 : L - 1], ids[:, L - T :], temperature)
    close(log_prob, ref_lp)
    close(entropy, ref_ent)


@pytest.mark.parametrize("make", [qwen2, llama])
def test_response_logprobs_gradients_match_full_logits(make):
    model = make(tie_word_embeddings=True)
    g = torch.Generator().manual_seed(11)
    ids, mask, T = padded_batch(
        [rand_tokens(g, 3), rand_tokens(g, 6)], [rand_tokens(g, 4), rand_tokens(g, 2)]
    )
    weights = torch.randn(2, T, generator=g)
    log_prob, entropy = response_logprobs(model, ids, mask, T, with_entropy=True, chunk_size=3)
    ours = torch.autograd.grad((weights * (log_prob - 0.1 * entropy)).sum(), list(model.parameters()))
    logits = model(ids, attention_mask=mask.long(), position_ids=position_ids_from_mask(mask)).logits
    L = ids.shape[1]
    log_p = torch.log_softmax(logits[:, L - T - 1 : L - 1].float(), -1)
    ref_lp = log_p.gather(-1, ids[:, -T:, None]).squeeze(-1)
    ref_ent = -(log_p.exp() * log_p).sum(-1)
    ref = torch.autograd.grad((weights * (ref_lp - 0.1 * ref_ent)).sum(), list(model.parameters()))
    for a, b in zip(ours, ref):
        close(a, b)


@pytest.mark.parametrize("make", [qwen2, llama])
def test_response_logprobs_left_padding_invariance(make):
    """Each row of a padded batch scores as it does alone; extra left padding changes nothing."""
    model = make()
    g = torch.Generator().manual_seed(12)
    prompts = [rand_tokens(g, 2), rand_tokens(g, 7), rand_tokens(g, 4)]
    responses = [rand_tokens(g, 5), rand_tokens(g, 1), rand_tokens(g, 3)]
    ids, mask, T = padded_batch(prompts, responses)
    resp_mask = mask[:, -T:]
    lp, ent = response_logprobs(model, ids, mask, T, with_entropy=True)
    ids2, mask2, T2 = padded_batch(prompts, responses, extra_left=6)
    lp2, ent2 = response_logprobs(model, ids2, mask2, T2, with_entropy=True)
    assert T2 == T
    close(torch.where(resp_mask, lp, 0), torch.where(resp_mask, lp2, 0))
    close(torch.where(resp_mask, ent, 0), torch.where(resp_mask, ent2, 0))
    for i, (p, r) in enumerate(zip(prompts, responses)):
        alone = torch.tensor([p + r])
        lp_i = response_logprobs(model, alone, torch.ones_like(alone, dtype=torch.bool), len(r))
        close(lp[i, : len(r)], lp_i[0])


def test_response_logprobs_fallback_uses_model_head():
    model = granite()
    g = torch.Generator().manual_seed(13)
    ids, mask, T = padded_batch([rand_tokens(g, 2), rand_tokens(g, 5)], [rand_tokens(g, 4), rand_tokens(g, 3)])
    log_prob = response_logprobs(model, ids, mask, T, chunk_size=2)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask.long(), position_ids=position_ids_from_mask(mask)).logits
    L = ids.shape[1]
    ref, _ = dense(logits[:, L - T - 1 : L - 1].double(), ids[:, -T:])
    close(log_prob, ref)
    # the hidden-state formula without the head's scaling would differ
    hidden = model.model(ids, attention_mask=mask.long(), position_ids=position_ids_from_mask(mask)).last_hidden_state
    wrong = logprobs_from_hidden(hidden[:, L - T - 1 : L - 1].detach(), model.lm_head.weight.detach(), ids[:, -T:])
    assert (wrong - log_prob).abs().max() > 1e-3


def test_response_logprobs_bad_inputs():
    model = qwen2()
    ids, mask = torch.zeros(2, 6, dtype=torch.long), torch.ones(2, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"response_length must be an int in \[1, L − 1\] = \[1, 5\].*got 6"):
        response_logprobs(model, ids, mask, 6)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\) but input_ids has shape \(2, 6\)"):
        response_logprobs(model, ids, mask[:, 1:], 2)
    with pytest.raises(ValueError, match="input_ids must be a \\(B, L\\) int64 tensor"):
        response_logprobs(model, ids.float(), mask, 2)


# --------------------------------------------------------------------------- critic


def test_value_head_shapes_and_init():
    head = ValueHead(32)
    assert head(torch.randn(2, 5, 32, dtype=torch.bfloat16)).shape == (2, 5)
    assert head.summary.bias.abs().sum() == 0
    assert 0.05 < head.summary.weight.std().item() < 0.35  # ≈ 1/√33 = 0.17


def test_critic_values_alignment():
    """values[:, j] is the value after reading everything before response token j: equal to the
    last-position value of the prefix that ends just before that token."""
    policy = qwen2()
    critic = CriticModel.from_causal_lm(policy).eval()
    g = torch.Generator().manual_seed(14)
    prompts, responses = [rand_tokens(g, 3), rand_tokens(g, 5)], [rand_tokens(g, 4), rand_tokens(g, 2)]
    ids, mask, T = padded_batch(prompts, responses)
    with torch.no_grad():
        values = critic.values(ids, mask, T)
    assert values.shape == (2, T) and values.dtype == torch.float32
    for i, (p, r) in enumerate(zip(prompts, responses)):
        for j in range(len(r)):
            prefix = torch.tensor([p + r[:j]])
            with torch.no_grad():
                h = critic.backbone(prefix).last_hidden_state[:, -1]
                close(values[i, j], critic.value_head(h)[0])
    # more left padding changes no valid value
    ids2, mask2, _ = padded_batch(prompts, responses, extra_left=4)
    with torch.no_grad():
        values2 = critic(ids2, mask2, T)
    resp = mask[:, -T:]
    close(torch.where(resp, values, 0), torch.where(resp, values2, 0))


def test_critic_is_a_copy_and_trains():
    policy = qwen2()
    critic = CriticModel.from_causal_lm(policy)
    assert isinstance(critic.backbone, transformers.Qwen2Model)
    before = policy.model.embed_tokens.weight.clone()
    ids, mask = torch.randint(0, VOCAB, (2, 8)), torch.ones(2, 8, dtype=torch.bool)
    critic.values(ids, mask, 3).square().sum().backward()
    assert critic.value_head.summary.weight.grad.abs().sum() > 0
    assert critic.backbone.embed_tokens.weight.grad.abs().sum() > 0
    with torch.no_grad():
        critic.backbone.embed_tokens.weight.add_(1.0)
    assert torch.equal(policy.model.embed_tokens.weight, before)
    assert policy.model.embed_tokens.weight.grad is None


def test_critic_from_config():
    cfg = llama().config
    critic = CriticModel.from_config(cfg)
    assert isinstance(critic.backbone, transformers.LlamaModel)
    ids, mask = torch.randint(0, VOCAB, (3, 7)), torch.ones(3, 7, dtype=torch.bool)
    assert critic.values(ids, mask, 2).shape == (3, 2)
    with pytest.raises(ValueError, match="response_length"):
        critic.values(ids, mask, 0)


def test_default_chunk_budget():
    assert kernels._chunk_rows(None, 151_936, "x") == (1 << 25) // 151_936
    assert kernels._chunk_rows(None, 10, "x") == (1 << 25) // 10
    assert kernels._hidden_tile(None, None, 4096, 151_936, "x") == (4096, 8192)
    assert kernels._hidden_tile(None, None, 100_000, 151_936, "x") == (8192, 4096)
    assert kernels._hidden_tile(None, None, 10, 151_936, "x") == (10, 151_936)
    assert kernels._hidden_tile(220, None, 4096, 151_936, "x") == (220, 151_936)
    assert kernels._hidden_tile(None, 1024, 4096, 151_936, "x") == (32768, 1024)


# --------------------------------------------------------------------------- grouped prompts

from rllab.models.forward import grouped_response_logprobs  # noqa: E402


def grouped_batch(g, group_sizes, prompt_lengths, empty=()):
    """Rows grouped by prompt: group k repeats one prompt of ``prompt_lengths[k]`` tokens
    ``group_sizes[k]`` times, each row with its own response (1..6 tokens, none for rows in
    ``empty``). Returns the padded batch and the number of distinct prompts."""
    prompts, responses = [], []
    for size, n in zip(group_sizes, prompt_lengths):
        p = rand_tokens(g, n)
        for _ in range(size):
            prompts.append(p)
            responses.append(rand_tokens(g, int(torch.randint(1, 7, (1,), generator=g))))
    for i in empty:
        responses[i] = []
    ids, mask, T = padded_batch(prompts, responses)
    return ids, mask, T


class TokenCount:
    """Counts the tokens the decoder embeds (a forward hook on the input embedding)."""

    def __init__(self, model):
        self.shapes = []
        self.handle = model.get_input_embeddings().register_forward_hook(
            lambda mod, args, out: self.shapes.append(tuple(args[0].shape))
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    @property
    def tokens(self):
        return sum(math.prod(s) for s in self.shapes)


def assert_grouped_matches(model, ids, mask, T, with_entropy, temperature, chunk_size=None, seed=0):
    """grouped_response_logprobs equals response_logprobs: values and every parameter's gradient."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(ids.shape[0], T, generator=g)
    params = list(model.parameters())
    kw = dict(with_entropy=with_entropy, temperature=temperature, chunk_size=chunk_size)
    results = []
    for fn in (response_logprobs, grouped_response_logprobs):
        out = fn(model, ids, mask, T, **kw)
        log_prob, entropy = out if with_entropy else (out, None)
        loss = (weights * log_prob).sum()
        if with_entropy:
            loss = loss - 0.1 * (weights.flip(0) * entropy).sum()
        results.append((out, torch.autograd.grad(loss, params)))
    (ref, ref_grads), (ours, our_grads) = results
    for a, b in zip(ours if with_entropy else (ours,), ref if with_entropy else (ref,)):
        assert a.shape == b.shape == (ids.shape[0], T) and a.dtype == torch.float32
        close(a, b)
    for (name, _), a, b in zip(model.named_parameters(), our_grads, ref_grads):
        assert b.abs().sum() > 0, name
        close(a, b)


@pytest.mark.parametrize("make", [qwen2, llama])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_grouped_response_logprobs_matches_plain(make, with_entropy, temperature):
    """Groups of sizes 1–4, prompts of 2–7 tokens (left padding), responses of 0–6 tokens."""
    model = make(tie_word_embeddings=True)
    g = torch.Generator().manual_seed(20)
    ids, mask, T = grouped_batch(g, [3, 1, 4, 2], [5, 2, 7, 3], empty=(1, 6))
    assert not mask[1, -T:].any() and not mask[6, -T:].any()
    with TokenCount(model) as count:
        grouped_response_logprobs(model, ids, mask, T)
    P = ids.shape[1] - T
    assert count.tokens == 4 * P + 10 * (T - 1)  # each distinct prompt once, then the responses
    assert_grouped_matches(model, ids, mask, T, with_entropy, temperature, seed=21)


def test_grouped_response_logprobs_untied_head_and_chunks():
    model = qwen2(tie_word_embeddings=False)
    g = torch.Generator().manual_seed(22)
    ids, mask, T = grouped_batch(g, [2, 5], [4, 6], empty=(3,))
    assert_grouped_matches(model, ids, mask, T, with_entropy=True, temperature=1.3, chunk_size=3, seed=23)


def test_grouped_response_logprobs_one_response_token():
    """T = 1: every response token is scored from the prompt pass alone."""
    model = llama(tie_word_embeddings=True)
    ids, mask, T = padded_batch([[5, 6, 7]] * 3 + [[9, 2]], [[1], [2], [3], [4]])
    assert T == 1
    with TokenCount(model) as count:
        grouped_response_logprobs(model, ids, mask, T)
    assert count.tokens == 2 * 3
    assert_grouped_matches(model, ids, mask, T, with_entropy=True, temperature=1.0, seed=25)


def test_grouped_response_logprobs_no_repeats_falls_back():
    model = qwen2()
    g = torch.Generator().manual_seed(26)
    ids, mask, T = grouped_batch(g, [1, 1, 1], [3, 5, 4])
    with TokenCount(model) as count:
        out = grouped_response_logprobs(model, ids, mask, T, with_entropy=True)
    assert count.shapes == [tuple(ids.shape)]  # one plain forward
    assert_grouped_matches(model, ids, mask, T, with_entropy=True, temperature=1.0, seed=27)
    assert out[0].shape == (3, T)


def test_grouped_prompts_ignore_pad_ids_but_not_masks():
    ids = torch.tensor([[0, 4, 5, 1], [7, 4, 5, 2], [0, 4, 5, 3], [4, 4, 5, 3], [0, 0, 5, 3]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    first, inverse = models._distinct_prompts(ids, mask, 3)
    assert first.shape == (3,)
    assert inverse[0] == inverse[1] == inverse[2]  # same prompt, different pad ids
    assert len({int(inverse[0]), int(inverse[3]), int(inverse[4])}) == 3
    assert torch.equal(inverse[first], torch.arange(3))
    assert sorted(first.tolist()) == [0, 3, 4]


def test_grouped_response_logprobs_fallbacks_match():
    """A head with logit scaling, and gradient checkpointing in training, take the plain path."""
    model = granite()
    ids, mask, T = padded_batch([[3, 4, 5]] * 3, [[1, 2], [6], [7, 8]])
    close(grouped_response_logprobs(model, ids, mask, T), response_logprobs(model, ids, mask, T))
    model = qwen2()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    model.train()
    with TokenCount(model) as count:
        grouped = grouped_response_logprobs(model, ids, mask, T)
    assert count.shapes == [tuple(ids.shape)]
    close(grouped, response_logprobs(model, ids, mask, T))


def test_grouped_response_logprobs_bad_inputs():
    model = qwen2()
    ids, mask = torch.zeros(2, 6, dtype=torch.long), torch.ones(2, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"grouped_response_logprobs: response_length must be an int"):
        grouped_response_logprobs(model, ids, mask, 6)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\) but input_ids has shape \(2, 6\)"):
        grouped_response_logprobs(model, ids, mask[:, 1:], 2)


def test_grouped_response_logprobs_sliding_window():
    """A sliding-window model (Mistral, window 3 < prompt + response) agrees too: the cache is a
    full one and the window is applied by the mask on absolute positions."""
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, sliding_window=3,
    )
    model = transformers.MistralForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(28)
    ids, mask, T = grouped_batch(g, [3, 2], [6, 4])
    assert_grouped_matches(model, ids, mask, T, with_entropy=True, temperature=1.0, seed=29)


def test_response_log_sum_sq_probs_matches_dense():
    from rllab.models.forward import response_log_sum_sq_probs
    from rllab.models.tiny import TinyModelConfig, build_tiny_model

    torch.manual_seed(0)
    model, _ = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64))
    model.eval()
    B, P, T = 5, 4, 3
    ids = torch.randint(3, 50, (B, P + T))
    attn = torch.ones(B, P + T, dtype=torch.bool)
    attn[0, :2] = False  # left padding
    attn[1, -1] = False  # a shorter response
    out = response_log_sum_sq_probs(model, ids, attn, T, temperature=0.7, rows_per_chunk=2)
    with torch.no_grad():
        pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attn.long(), position_ids=pos).logits[:, P - 1 : P + T - 1].double() / 0.7
    expected = torch.log((torch.softmax(logits, -1) ** 2).sum(-1)).float()
    resp = attn[:, P:]
    torch.testing.assert_close(out[resp], expected[resp], rtol=1e-5, atol=1e-6)
    assert torch.all(out[~resp] == 0)


def test_a_saved_tiny_model_s_tokenizer_reloads_with_its_spaces_and_newlines(tmp_path):
    from rllab.models.forward import load_tokenizer
    from rllab.models.tiny import TinyModelConfig, build_tiny_model

    model, tok = build_tiny_model(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=16))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    text = "sort 3a1:\nmake 22 from 3 5 7:"
    assert load_tokenizer(tmp_path)(text).input_ids == tok(text).input_ids
