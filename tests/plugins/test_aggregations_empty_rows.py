"""rllab_aggregations's ``count_empty_rows``: TRL's sequence means over every row, fully masked ones included."""

from __future__ import annotations

import pytest
import torch

import rllab
from rllab.config import load_config

LAB = rllab.Lab()

# rows: [1, 2 | 3], [4 | ·], [· · ·] (empty); mask T = 3
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])


@pytest.mark.parametrize(
    "mode, rows_only, every_row",
    [
        # row sums 3, 4: over 2 non-empty rows 3.5, over 3 rows 7/3
        ("seq-mean-token-sum", 3.5, 7 / 3),
        # row means 1.5, 4: 2.75 vs 5.5/3
        ("seq-mean-token-mean", 2.75, 5.5 / 3),
        # row sums / T = 3: 3.5/3 vs 7/9
        ("seq-mean-token-sum-norm", 3.5 / 3, 7 / 9),
    ],
)
def test_count_empty_rows_by_hand(mode, rows_only, every_row):
    agg = lambda **k: LAB.get("loss_aggregation", mode, **k)  # noqa: E731
    assert float(agg()(loss_mat=LOSS, mask=MASK)) == pytest.approx(rows_only, rel=1e-12)
    assert float(agg(count_empty_rows=True)(loss_mat=LOSS, mask=MASK)) == pytest.approx(every_row, rel=1e-12)


@pytest.mark.parametrize("mode", ["seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_count_empty_rows_splits_with_global_rows(mode):
    agg = LAB.get("loss_aggregation", mode, count_empty_rows=True)
    whole = agg(loss_mat=LOSS, mask=MASK)
    parts = agg(loss_mat=LOSS[:1], mask=MASK[:1], global_seqs=2, global_rows=3) + agg(
        loss_mat=LOSS[1:], mask=MASK[1:], global_seqs=2, global_rows=3
    )
    assert float(parts) == pytest.approx(float(whole), rel=1e-12)
    with pytest.raises(ValueError, match="global_rows"):
        agg(loss_mat=LOSS, mask=MASK, global_seqs=2)
    # without count_empty_rows the row count is not the normaliser: passing it changes nothing
    plain = LAB.get("loss_aggregation", mode)
    assert float(plain(loss_mat=LOSS, mask=MASK, global_rows=3)) == float(plain(loss_mat=LOSS, mask=MASK))


def test_reachable_from_the_aggregation_section(tmp_path):
    p = tmp_path / "exp.toml"
    p.write_text('[aggregation]\nname = "seq-mean-token-mean"\ncount_empty_rows = true\n')
    cfg = load_config(p, lab=LAB)
    ref = cfg.component("aggregation")
    agg = LAB.get("loss_aggregation", ref.name, **ref.knobs)
    assert agg.config.count_empty_rows is True
    assert float(agg(loss_mat=LOSS, mask=MASK)) == pytest.approx(5.5 / 3, rel=1e-12)
