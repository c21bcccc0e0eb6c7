"""Tests for rllab.kernels.triton_impl, the CUDA path of logprobs_from_logits / logprobs_from_hidden.

GPU tests carry the ``gpu`` marker (deselected by default; run with ``pytest -m gpu``) and compare
the Triton path with a float64 dense reference and with rllab's torch path on the same device.
``test_interpreter_matches_torch_path`` runs the same kernels on the CPU through Triton's
interpreter, on tiny shapes, wherever Triton is installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rllab.kernels import triton_impl as triton_kernels
from rllab.models.forward import logprobs_from_hidden, logprobs_from_logits

HAS_TRITON = importlib.util.find_spec("triton") is not None


def on_gpu(test):
    """``gpu`` marker, and a skip where CUDA or Triton is missing."""
    skip = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_TRITON), reason="needs CUDA and triton")
    return pytest.mark.gpu(skip(test))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64; NaN anywhere fails."""
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def dense64(h, w, b, labels, tau):
    z = h.double() @ w.double().t()
    if b is not None:
        z = z + b.double()
    log_p = torch.log_softmax(z / tau, -1)
    # clamp: a banned token (−inf logit) contributes 0 to the entropy, not 0·(−inf)
    return log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p.clamp_min(-1e300)).sum(-1)


def value_and_grads(fn, params, g_lp, g_ent, with_entropy, *args, **kwargs):
    out = fn(*args, with_entropy=with_entropy, **kwargs)
    lp, ent = out if with_entropy else (out, None)
    loss = (lp.double() * g_lp).sum() + ((ent.double() * g_ent).sum() if with_entropy else 0)
    return lp, ent, torch.autograd.grad(loss, params)


# --------------------------------------------------------------------------- hidden-state path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("tile", [(None, None), (64, 384), (1000, 128)])
@on_gpu
def test_hidden_matches_reference(dtype, use_bias, with_entropy, tau, tile, monkeypatch):
    torch.manual_seed(hash((str(dtype), use_bias, with_entropy, tau, tile)) % 2**31)
    N, D, V, dev = 333, 96, 5003, "cuda"
    h = torch.randn(N, D, device=dev).to(dtype).requires_grad_()
    w = (torch.randn(V, D, device=dev) / D**0.5 * 3).to(dtype).requires_grad_()
    b = torch.randn(V, device=dev).to(dtype).requires_grad_() if use_bias else None
    labels = torch.randint(0, V, (N,), device=dev)
    g_lp, g_ent = torch.randn(N, device=dev).double(), torch.randn(N, device=dev).double()
    params = [h, w] + ([b] if use_bias else [])
    rows, cols = tile
    lp, ent, grads = value_and_grads(
        triton_kernels.logprobs_from_hidden, params, g_lp, g_ent, with_entropy, h, w, labels,
        bias=b, temperature=tau, rows=rows, cols=cols,
    )
    assert lp.dtype == torch.float32 and all(g.dtype == dtype for g in grads)
    ref_params = [p.detach().double().requires_grad_() for p in params]
    ref_lp, ref_ent = dense64(ref_params[0], ref_params[1], ref_params[2] if use_bias else None, labels, tau)
    ref_loss = (ref_lp * g_lp).sum() + ((ref_ent * g_ent).sum() if with_entropy else 0)
    ref_grads = torch.autograd.grad(ref_loss, ref_params)
    # bfloat16: the logits themselves are rounded to bfloat16 (as nn.Linear's output is), which
    # moves softmax probabilities by ~2⁻⁹ relative; both rllab paths share that rounding, so they
    # agree with each other more tightly than with the float64 reference.
    tol_v = 1e-6 if dtype == torch.float32 else 1e-2
    tol_g = 1e-5 if dtype == torch.float32 else 3e-2
    assert rel(lp, ref_lp) < tol_v
    if with_entropy:
        assert rel(ent, ref_ent) < tol_v
    for g, r in zip(grads, ref_grads):
        assert rel(g, r) < tol_g
    tol_g = 1e-5 if dtype == torch.float32 else 1e-2
    # and the same function as the torch path on the same device
    monkeypatch.setenv("RLLAB_TRITON", "0")
    t_lp, t_ent, t_grads = value_and_grads(
        logprobs_from_hidden, params, g_lp, g_ent, with_entropy, h, w, labels, bias=b, temperature=tau,
    )
    assert rel(lp, t_lp) < min(tol_v, 1e-5)
    if with_entropy:
        assert rel(ent, t_ent) < min(tol_v, 1e-5)
    for g, r in zip(grads, t_grads):
        assert rel(g, r) < tol_g


@on_gpu
@pytest.mark.parametrize("with_entropy", [True, False])
def test_hidden_grad_accumulation_fallback(with_entropy, monkeypatch):
    """grad_hidden accumulated through a bfloat16 product (where cuBLAS' float32 output is
    refused) equals the float32-output accumulation."""
    torch.manual_seed(4)
    N, D, V = 700, 128, 9000
    h = torch.randn(N, D, device="cuda").bfloat16().requires_grad_()
    w = (torch.randn(V, D, device="cuda") * 0.1).bfloat16().requires_grad_()
    labels = torch.randint(0, V, (N,), device="cuda")
    g_lp, g_ent = torch.randn(N, device="cuda").double(), torch.randn(N, device="cuda").double()
    args = (triton_kernels.logprobs_from_hidden, [h, w], g_lp, g_ent, with_entropy, h, w, labels)
    _, _, fast = value_and_grads(*args, rows=256, cols=1024)
    monkeypatch.setattr(triton_kernels, "_MM_INTO_FP32", False)
    _, _, slow = value_and_grads(*args, rows=256, cols=1024)
    assert rel(fast[0], slow[0]) < 5e-3 and rel(fast[1], slow[1]) < 1e-6


@on_gpu
def test_hidden_dispatch_full_vocabulary_bf16(monkeypatch):
    """Qwen2.5-0.5B head size through the public function: Triton vs the torch path."""
    torch.manual_seed(1)
    N, D, V = 1536, 896, 151_936
    h = torch.randn(N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(V, D, device="cuda") * 0.05).bfloat16().requires_grad_()
    labels = torch.randint(0, V, (2, N // 2), device="cuda")
    g_lp, g_ent = torch.randn(2, N // 2, device="cuda"), torch.randn(2, N // 2, device="cuda")

    def run():
        h.grad = w.grad = None
        lp, ent = logprobs_from_hidden(h.view(2, N // 2, D), w, labels, with_entropy=True, temperature=0.9)
        ((lp * g_lp).sum() + (ent * g_ent).sum()).backward()
        return lp, ent, h.grad, w.grad

    assert triton_kernels.supports(h, w)
    fast = run()
    monkeypatch.setenv("RLLAB_TRITON", "0")
    slow = run()
    assert fast[0].shape == (2, N // 2)
    assert rel(fast[0], slow[0]) < 1e-5 and rel(fast[1], slow[1]) < 1e-5
    assert rel(fast[2], slow[2]) < 1e-2 and rel(fast[3], slow[3]) < 1e-2


@on_gpu
def test_hidden_frozen_parts_and_banned_tokens():
    torch.manual_seed(2)
    N, D, V = 77, 32, 1000
    h = torch.randn(N, D, device="cuda")
    w = torch.randn(V, D, device="cuda")
    b = torch.zeros(V, device="cuda")
    b[::3] = float("-inf")  # banned tokens: p = 0 there, nothing may turn into NaN
    labels = torch.randint(0, V // 3, (N,), device="cuda") * 3 + 1
    hh = h.clone().requires_grad_()
    lp, ent = logprobs_from_hidden(hh, w, labels, bias=b, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
    h64 = h.double().requires_grad_()
    ref_lp, ref_ent = dense64(h64, w, b, labels, 1.0)
    (ref_lp.sum() + ref_ent.sum()).backward()
    assert rel(lp, ref_lp) < 1e-6 and rel(ent, ref_ent) < 1e-6 and rel(hh.grad, h64.grad) < 1e-5
    ww = w.clone().requires_grad_()
    logprobs_from_hidden(h, ww, labels).sum().backward()
    w64 = w.double().requires_grad_()
    dense64(h, w64, None, labels, 1.0)[0].sum().backward()
    assert rel(ww.grad, w64.grad) < 1e-5


# --------------------------------------------------------------------------- logits path


@on_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_logits_matches_reference_on_strided_view(dtype, with_entropy, tau, monkeypatch):
    torch.manual_seed(3)
    B, L, T, V = 3, 40, 25, 30_011
    model_logits = (4 * torch.randn(B, L, V, device="cuda")).to(dtype)
    model_logits[0, -T - 1, :7] = float("-inf")
    model_logits.requires_grad_()
    labels = torch.randint(0, V, (B, T), device="cuda")
    g_lp, g_ent = torch.randn(B, T, device="cuda").double(), torch.randn(B, T, device="cuda").double()

    view = model_logits[:, -T - 1 : -1]
    lp, ent, (grad,) = value_and_grads(logprobs_from_logits, [model_logits], g_lp, g_ent, with_entropy, view, labels, temperature=tau)
    assert lp.shape == (B, T) and grad.dtype == dtype
    z64 = model_logits.detach().double().requires_grad_()
    log_p = torch.log_softmax(z64[:, -T - 1 : -1] / tau, -1)
    ref_lp = log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref_ent = -(log_p.exp() * log_p.clamp_min(-1e300)).sum(-1)
    loss = (ref_lp * g_lp).sum() + ((ref_ent * g_ent).sum() if with_entropy else 0)
    (ref_grad,) = torch.autograd.grad(loss, z64)
    tol_g = 1e-6 if dtype == torch.float32 else 5e-3
    assert rel(lp, ref_lp) < 1e-6
    if with_entropy:
        assert rel(ent, ref_ent) < 1e-6
    assert rel(grad, ref_grad) < tol_g
    assert (grad[:, -1] == 0).all() and (grad[:, : L - T - 1] == 0).all()
    monkeypatch.setenv("RLLAB_TRITON", "0")
    t_lp, _, (t_grad,) = value_and_grads(logprobs_from_logits, [model_logits], g_lp, g_ent, with_entropy, view, labels, temperature=tau)
    assert rel(lp, t_lp) < 1e-6 and rel(grad, t_grad) < tol_g


@on_gpu
def test_dispatch_rules(monkeypatch):
    x = torch.randn(4, 10, device="cuda")
    assert triton_kernels.supports(x)
    assert not triton_kernels.supports(x.cpu())
    assert not triton_kernels.supports(x.double())
    assert not triton_kernels.supports(x[:0])
    monkeypatch.setenv("RLLAB_TRITON", "0")
    assert not triton_kernels.supports(x)


# --------------------------------------------------------------------------- CPU, Triton's interpreter

_INTERPRETED = textwrap.dedent(
    """
    import torch
    import triton.runtime.interpreter as interp

    # Scalars reach the interpreter as one-element arrays, which recent numpy refuses to index with.
    _orig = interp._patch_lang_tensor

    def _patched(tensor, scope):
        _orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = _patched

    from rllab.kernels import triton_impl as tk
    from rllab.models import forward as models

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()

    torch.manual_seed(0)
    N, D, V = 21, 8, 200
    for use_bias, tau in ((False, 1.0), (True, 0.7)):
        h = torch.randn(N, D, requires_grad=True)
        w = torch.randn(V, D, requires_grad=True)
        b = torch.randn(V, requires_grad=True) if use_bias else None
        y = torch.randint(0, V, (N,))
        g1, g2 = torch.randn(N), torch.randn(N)
        params = [h, w] + ([b] if use_bias else [])
        outs = []
        for fn, kw in ((tk.logprobs_from_hidden, dict(rows=8, cols=64)), (models.logprobs_from_hidden, {})):
            lp, ent = fn(h, w, y, with_entropy=True, bias=b, temperature=tau, **kw)
            outs.append([lp, ent, *torch.autograd.grad((lp * g1 + ent * g2).sum(), params)])
        errs = [rel(a, r) for a, r in zip(*outs)]
        assert max(errs) < 1e-5, errs
        x = (3 * torch.randn(2, 9, V)).requires_grad_()
        yy = torch.randint(0, V, (2, 8))
        outs = []
        for fn in (tk.logprobs_from_logits, models.logprobs_from_logits):
            lp, ent = fn(x[:, :-1], yy, with_entropy=True, temperature=tau)
            outs.append([lp, ent, *torch.autograd.grad((lp * g1[:16].view(2, 8) + ent).sum(), x)])
        errs = [rel(a, r) for a, r in zip(*outs)]
        assert max(errs) < 1e-5, errs
    print("ok")
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_interpreter_matches_torch_path():
    """The kernels themselves, on CPU tensors through TRITON_INTERPRET=1 (a fresh process: the
    interpreter is chosen when the kernels are defined)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
