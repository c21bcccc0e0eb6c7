"""Loss aggregation — how a (B, T) per-token loss becomes one scalar.

Every mode takes ``loss_mat`` (B, T) float and ``mask`` (B, T) bool (True where a token counts)
and returns a 0-d tensor. With ``n_b = Σ_t mask[b, t]`` the tokens of row ``b``,
``N = Σ_b n_b`` the valid tokens and ``S = #{b : n_b > 0}`` the non-empty rows:

======================= ==========================================================
``token-mean``          Σ_{b,t} loss·mask / N
``token-sum``           Σ_{b,t} loss·mask
``seq-mean-token-sum``  Σ_{b: n_b>0} (Σ_t loss·mask) / S
``seq-mean-token-mean`` Σ_{b: n_b>0} (Σ_t loss·mask / n_b) / S
``seq-mean-token-sum-   Σ_{b: n_b>0} (Σ_t loss·mask) / S / H — Dr.GRPO (Liu et al. 2025,
norm``                  "Understanding R1-Zero-Like Training"), H a constant horizon
======================= ==========================================================

Data parallelism / micro-batching: ``global_tokens`` (N of the whole batch) and ``global_seqs``
(S of the whole batch), when given, replace the local N and S. Each micro-batch is then
aggregated with the same normaliser, and the sum over micro-batches equals the aggregate of the
whole batch — the loss does not depend on how the batch was split. ``token-sum`` needs no count.
Each rank's result is its share of the global loss; where the data-parallel all-reduce averages
gradients over W ranks (DDP, FSDP), the trainer multiplies by W, as verl's ``dp_size`` factor does.

Edge cases, and where rllab differs from verl 0.9.1 ``agg_loss``:

* Fully masked rows are excluded from every sequence mean (as verl).
* An all-masked batch (N = 0 or S = 0) aggregates to 0 and its gradient is 0; verl divides by
  zero and returns NaN. A zero global count is treated the same way.
* Values at masked positions never reach the result, even NaN or inf: positions are selected with
  ``torch.where``. verl multiplies by the mask, so a NaN under the mask makes its loss NaN.
* ``seq-mean-token-mean`` divides each row by ``n_b`` exactly; verl adds 1e-8 to ``n_b`` (a
  relative difference of at most 1e-8, below float32 rounding).
* ``count_empty_rows`` (the three sequence modes; default False): True divides by the number of
  *rows*, fully masked ones included, instead of the non-empty rows — TRL 1.16's convention for
  ``loss_type`` ``grpo``/``sapo`` (``seq-mean-token-mean``), ``luspo`` (``seq-mean-token-sum``)
  and ``dr_grpo`` (``seq-mean-token-sum-norm`` with ``horizon = max_completion_length``), which
  take ``.mean()`` over the batch dimension. rllab leaves empty rows out by default, as verl does:
  a row with nothing to train on should not dilute the others. Under micro-batching the global
  row count must then be passed as ``global_rows`` (a ``global_seqs`` without it is refused: it
  counts non-empty rows only).
* ``seq-mean-token-sum-norm`` uses ``horizon`` when set and otherwise the mask width T — verl's
  default (``loss_scale_factor=None``). With the default, appending padding columns changes T
  and therefore the loss; set ``horizon`` (e.g. the maximum response length) for a loss that is
  invariant to padding, as Dr.GRPO intends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

import rllab

# torch (and rllab.ops, built on it) is imported inside the functions, so that loading the plugin
# -- `rllab --help`, a config error -- does not load torch.
if TYPE_CHECKING:
    import torch


def _divide(total: torch.Tensor, local_count: torch.Tensor, global_count) -> torch.Tensor:
    """total / count, where count is the global count if given, else the local one; 0 if count is 0."""
    import torch

    count = local_count if global_count is None else global_count
    if isinstance(count, torch.Tensor):
        return total / count.to(device=total.device, dtype=total.dtype).clamp(min=1)
    return total / max(float(count), 1.0)


def _rows(where, nonempty, config, global_seqs, global_rows):
    """(local row count, global normaliser) for a sequence mean: non-empty rows, or every row."""
    import torch

    if not getattr(config, "count_empty_rows", False):  # global_rows, when given, is not the normaliser
        return nonempty.sum(), global_seqs
    if global_seqs is not None and global_rows is None:
        raise ValueError(
            f"{where}: count_empty_rows = True needs global_rows (the batch's row count, empty rows included); "
            "global_seqs counts non-empty rows only"
        )
    return torch.tensor(nonempty.shape[0], device=nonempty.device), global_rows


@attrs.frozen
class SeqMeanConfig:
    """Knobs of the sequence-mean aggregations."""

    count_empty_rows: bool = rllab.knob(
        False, help="divide by every row, fully masked ones included (TRL's grpo/sapo/luspo/dr_grpo); "
        "False: non-empty rows only (verl)"
    )


def _row_sums(where: str, loss_mat: torch.Tensor, mask: torch.Tensor):
    """``loss_mat`` and ``mask`` checked for ``where``: (Σ_t loss·mask per row, n_b per row,
    non-empty-row mask), each (B,)."""
    from rllab import ops

    ops.check_token_tensor(where, "loss_mat", loss_mat, mask)
    row_sum = ops.masked_sum(loss_mat, mask, dim=-1)
    row_len = mask.sum(-1)
    return row_sum, row_len, row_len > 0


def _seq_mean(where, per_row, nonempty, config, global_seqs, global_rows):
    """The mean of ``per_row`` (B,) over the non-empty rows (every row with ``count_empty_rows``),
    the global row count replacing the local one where given."""
    from rllab import ops

    local, global_count = _rows(where, nonempty, config, global_seqs, global_rows)
    return _divide(ops.masked_sum(per_row, nonempty), local, global_count)


def token_mean(*, loss_mat, mask, config, global_tokens=None, global_seqs=None):
    """Mean over all valid tokens of the batch: Σ loss·mask / Σ mask.

    ``loss_mat`` (B, T) float, ``mask`` (B, T) bool; ``global_tokens`` replaces Σ mask.
    Returns a 0-d tensor (0 when no token is valid).
    """
    from rllab import ops

    ops.check_token_tensor("loss_aggregation 'token-mean'", "loss_mat", loss_mat, mask)
    return _divide(ops.masked_sum(loss_mat, mask), mask.sum(), global_tokens)


def token_sum(*, loss_mat, mask, config, global_tokens=None, global_seqs=None):
    """Sum over all valid tokens: Σ loss·mask (no normaliser; global counts are ignored).

    ``loss_mat`` (B, T) float, ``mask`` (B, T) bool. Returns a 0-d tensor.
    """
    from rllab import ops

    ops.check_token_tensor("loss_aggregation 'token-sum'", "loss_mat", loss_mat, mask)
    return ops.masked_sum(loss_mat, mask)


def seq_mean_token_sum(*, loss_mat, mask, config, global_tokens=None, global_seqs=None, global_rows=None):
    """Mean over non-empty rows (every row with ``count_empty_rows``) of each row's token sum.

    ``loss_mat`` (B, T) float, ``mask`` (B, T) bool; ``global_seqs`` (``global_rows``) replaces the
    number of non-empty rows (of rows). Returns a 0-d tensor (0 when every row is empty).
    """
    where = "loss_aggregation 'seq-mean-token-sum'"
    row_sum, _, nonempty = _row_sums(where, loss_mat, mask)
    return _seq_mean(where, row_sum, nonempty, config, global_seqs, global_rows)


def seq_mean_token_mean(*, loss_mat, mask, config, global_tokens=None, global_seqs=None, global_rows=None):
    """Mean over non-empty rows (every row with ``count_empty_rows``) of each row's token mean.

    ``loss_mat`` (B, T) float, ``mask`` (B, T) bool; ``global_seqs`` (``global_rows``) replaces the
    number of non-empty rows (of rows). Returns a 0-d tensor (0 when every row is empty).
    """
    where = "loss_aggregation 'seq-mean-token-mean'"
    row_sum, row_len, nonempty = _row_sums(where, loss_mat, mask)
    return _seq_mean(where, row_sum / row_len.clamp(min=1).to(row_sum.dtype), nonempty, config, global_seqs, global_rows)


@attrs.frozen
class SeqMeanTokenSumNormConfig:
    """Knobs of seq-mean-token-sum-norm."""

    horizon: int | None = rllab.knob(
        None,
        help="constant H dividing the sequence mean of token sums (Dr.GRPO uses the maximum "
        "response length); None = the mask width T, as verl",
        gt=0,
    )
    count_empty_rows: bool = rllab.knob(
        False, help="divide by every row, fully masked ones included (TRL's dr_grpo); False: non-empty rows (verl)"
    )


def seq_mean_token_sum_norm(*, loss_mat, mask, config, global_tokens=None, global_seqs=None, global_rows=None):
    """Dr.GRPO: mean over non-empty rows of each row's token sum, divided by a constant horizon.

    ``loss_mat`` (B, T) float, ``mask`` (B, T) bool; ``global_seqs`` replaces the number of
    non-empty rows; ``config.horizon`` (None = T). Returns a 0-d tensor (0 when every row is empty).
    """
    where = "loss_aggregation 'seq-mean-token-sum-norm'"
    row_sum, _, nonempty = _row_sums(where, loss_mat, mask)
    horizon = loss_mat.shape[-1] if config.horizon is None else config.horizon
    return _seq_mean(where, row_sum, nonempty, config, global_seqs, global_rows) / float(max(horizon, 1))


@rllab.hookimpl
def register_loss_aggregations(register):
    register("token-mean", token_mean, divides_by_tokens=True)
    register("token-sum", token_sum, divides_by_tokens=False)
    register("seq-mean-token-sum", seq_mean_token_sum, config=SeqMeanConfig, requires=("global_rows",), divides_by_tokens=False)
    register("seq-mean-token-mean", seq_mean_token_mean, config=SeqMeanConfig, requires=("global_rows",), divides_by_tokens=False)
    register(
        "seq-mean-token-sum-norm", seq_mean_token_sum_norm, config=SeqMeanTokenSumNormConfig, requires=("global_rows",),
        padding_dependent=lambda config: "horizon = None divides by the mask width T" if config.horizon is None else None,
        divides_by_tokens=False,
    )
