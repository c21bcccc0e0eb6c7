"""The autograd hand-over shared by every log-prob ``autograd.Function`` of :mod:`rllab.kernels.chunked`
and :mod:`rllab.kernels.triton_impl` (logits or hidden states, torch or Triton): each forward ends with
:func:`_keep` and each backward starts with :func:`_backward_start`."""

from __future__ import annotations


def _keep(ctx, tensors, **settings) -> None:
    """End of a forward: save ``tensors`` (``None`` allowed) and plain ``settings`` on ``ctx``.

    Gradients are not materialised: an output that gets no upstream gradient (the entropy, most
    often) reaches backward as ``None`` instead of a tensor of zeros.
    """
    ctx.set_materialize_grads(False)
    for name, value in settings.items():
        setattr(ctx, name, value)
    ctx.save_for_backward(*tensors)


def _backward_start(ctx, g_lp, g_ent, n_diff: int):
    """Start of a backward: what it works on, or ``None`` when there is nothing to compute.

    ``n_diff``: how many leading forward inputs can take a gradient (1: the logits; 3: hidden,
    weight, bias). Nothing to compute: no upstream gradient reached ``log_prob`` or ``entropy``,
    or none of those inputs needs one; the backward then returns ``None`` for every input.
    Otherwise returns ``(saved, needs, g_lp, g_ent)``: the tensors :func:`_keep` saved, the
    ``n_diff`` flags of ``ctx.needs_input_grad``, and the upstream gradients in float32 (the
    outputs' shapes, ``None`` where absent).
    """
    needs = tuple(ctx.needs_input_grad[:n_diff])
    if (g_lp is None and g_ent is None) or not any(needs):
        return None
    g_lp, g_ent = (None if g is None else g.float() for g in (g_lp, g_ent))
    return ctx.saved_tensors, needs, g_lp, g_ent
