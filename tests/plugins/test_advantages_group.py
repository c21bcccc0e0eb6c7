"""Tests of the group-baseline estimators: grpo, rloo, reinforce_plus_plus_baseline, opo, gpg,
grpo_passk.

The loop references below are float64 loops over rows and groups written the way verl 0.9.1
writes them (dicts of group id → scores), so ``mask_scores=False`` must match them exactly.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rllab
from rllab.ops import RowError

LAB = rllab.Lab()
NAMES = ["grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg", "grpo_passk"]


def estimator(name, **knobs):
    return LAB.get("advantage_estimator", name, **knobs)


def outcome(scores, T=4, last=None):
    """(B, T) rewards with each score on the row's last valid token, and the mask."""
    B = len(scores)
    last = last if last is not None else [T - 1] * B
    r = torch.zeros(B, T)
    m = torch.zeros(B, T, dtype=torch.bool)
    for i, (s, j) in enumerate(zip(scores, last)):
        if j >= 0:
            r[i, j] = s
            m[i, : j + 1] = True
    return r, m


def rows(adv):
    """The per-row scalar of a broadcast advantage (its value on the first token)."""
    return adv[:, 0]


# --------------------------------------------------------------------------- loop references


def _groups(index):
    groups = defaultdict(list)
    for i, g in enumerate(index.tolist()):
        groups[g].append(i)
    return groups


def loop_grpo(scores, index, eps=1e-6, norm=True):
    out = torch.zeros_like(scores, dtype=torch.float64)
    for members in _groups(index).values():
        s = scores[members].double()
        mean, std = (s.mean(), s.std()) if len(members) > 1 else (0.0, 1.0)
        out[members] = (s - mean) / (std + eps) if norm else s - mean
    return out


def loop_rloo(scores, index, singleton_score=True):
    out = torch.zeros_like(scores, dtype=torch.float64)
    for members in _groups(index).values():
        s = scores[members].double()
        n = len(members)
        if n > 1:
            out[members] = torch.stack([s[k] - (s.sum() - s[k]) / (n - 1) for k in range(n)])
        elif singleton_score:
            out[members] = s
    return out


def loop_mean_baseline(scores, index):
    out = torch.zeros_like(scores, dtype=torch.float64)
    for members in _groups(index).values():
        s = scores[members].double()
        out[members] = s - (s.mean() if len(members) > 1 else 0.0)
    return out


def loop_opo(scores, lengths, index):
    out = torch.zeros_like(scores, dtype=torch.float64)
    for members in _groups(index).values():
        s, n = scores[members].double(), lengths[members].double()
        base = (n * s).sum() / n.sum() if len(members) > 1 and n.sum() > 0 else 0.0
        out[members] = s - base
    return out


def loop_passk(scores, index, eps=1e-6, norm=True):
    out = torch.zeros_like(scores, dtype=torch.float64)
    for members in _groups(index).values():
        if len(members) < 2:
            continue
        s = scores[members].double()
        top, where = torch.topk(s, 2)
        gap = top[0] - top[1]
        out[members[where[0].item()]] = gap / (s.std() + eps) if norm else gap
    return out


# --------------------------------------------------------------------------- hand-computed

# Group 7: scores 1, 0, 0, 1 (mean 0.5, unbiased std √(1/3)); group −2: a single row scoring 3.
SCORES = [1.0, 0.0, 0.0, 1.0, 3.0]
INDEX = torch.tensor([7, 7, 7, 7, -2])


def test_grpo_hand_computed():
    r, m = outcome(SCORES)
    adv, ret = estimator("grpo")(token_rewards=r, mask=m, index=INDEX)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # 0.866024...
    torch.testing.assert_close(rows(adv), torch.tensor([a, -a, -a, a, 3 / (1 + 1e-6)]), rtol=1e-6, atol=1e-7)
    assert (adv == adv[:, :1]).all()  # broadcast over the row's tokens
    torch.testing.assert_close(ret, adv, rtol=0, atol=0)


def test_grpo_variants_hand_computed():
    r, m = outcome(SCORES)
    adv, _ = estimator("grpo", norm_by_std=False)(token_rewards=r, mask=m, index=INDEX)  # Dr.GRPO
    torch.testing.assert_close(rows(adv), torch.tensor([0.5, -0.5, -0.5, 0.5, 3.0]))
    adv_none, _ = estimator("grpo", scale="none")(token_rewards=r, mask=m, index=INDEX)
    torch.testing.assert_close(adv_none, adv, rtol=0, atol=0)
    adv, _ = estimator("grpo", singleton="zero", epsilon=1e-4)(token_rewards=r, mask=m, index=INDEX)  # TRL
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    torch.testing.assert_close(rows(adv), torch.tensor([a, -a, -a, a, 0.0]), rtol=1e-6, atol=1e-7)
    # Batch std of 1, 0, 0, 1, 3: mean 1, squared deviations 0 + 1 + 1 + 0 + 4 = 6, var 6/4.
    adv, _ = estimator("grpo", scale="batch")(token_rewards=r, mask=m, index=INDEX)
    s = math.sqrt(1.5) + 1e-6
    expected = torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 3 / s])
    torch.testing.assert_close(rows(adv), expected, rtol=1e-6, atol=1e-7)


def test_rloo_hand_computed():
    r, m = outcome([1.0, 0.0, 0.0, 2.0, 3.0])
    adv, ret = estimator("rloo")(token_rewards=r, mask=m, index=INDEX)
    # leave-one-out: 1 − (0+0+2)/3, 0 − (1+0+2)/3, ..., 2 − (1+0+0)/3; singleton keeps its score
    expected = [1 - 2 / 3, -1.0, -1.0, 2 - 1 / 3, 3.0]
    torch.testing.assert_close(rows(adv), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ret, adv, rtol=0, atol=0)
    adv, _ = estimator("rloo", singleton="zero")(token_rewards=r, mask=m, index=INDEX)
    assert rows(adv)[4] == 0


def test_reinforce_plus_plus_baseline_hand_computed():
    # Group scores 1, 3 (mean 2) and a singleton 5 (baseline 0): centred 1 → −1, 3 → 1, 5 → 5,
    # on 1, 2 and 3 valid tokens. Whitening runs over those six tokens.
    r, m = outcome([1.0, 3.0, 5.0], T=3, last=[0, 1, 2])
    adv, ret = estimator("reinforce_plus_plus_baseline")(token_rewards=r, mask=m, index=torch.tensor([0, 0, 1]))
    tokens = [-1.0, 1.0, 1.0, 5.0, 5.0, 5.0]
    mean = sum(tokens) / 6  # 16/6
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / 5 + 1e-8)
    w = [(x - mean) / std for x in (-1.0, 1.0, 5.0)]
    expected = torch.tensor([[w[0], 0.0, 0.0], [w[1], w[1], 0.0], [w[2], w[2], w[2]]])
    torch.testing.assert_close(adv, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ret, adv, rtol=0, atol=0)


def test_opo_hand_computed():
    # Group 0: scores 1 and 4 on 1 and 3 valid tokens: baseline (1·1 + 3·4)/4 = 3.25.
    r, m = outcome([1.0, 4.0, 2.0], T=3, last=[0, 2, 1])
    adv, _ = estimator("opo")(token_rewards=r, mask=m, index=torch.tensor([0, 0, 5]))
    torch.testing.assert_close(rows(adv), torch.tensor([1 - 3.25, 4 - 3.25, 2.0]))


def test_gpg_hand_computed():
    # Scores 1, 0, 0, 1 | 3: 3 of 5 rows non-zero, α = 5/3; group mean 0.5, singleton baseline 0.
    r, m = outcome(SCORES)
    adv, _ = estimator("gpg")(token_rewards=r, mask=m, index=INDEX)
    a = 5 / 3
    torch.testing.assert_close(rows(adv), torch.tensor([a * 0.5, -a * 0.5, -a * 0.5, a * 0.5, a * 3.0]))
    adv2, _ = estimator("gpg", f_norm=2.0)(token_rewards=r, mask=m, index=INDEX)
    torch.testing.assert_close(adv2, adv / 2)


def test_grpo_passk_hand_computed():
    # Group 0: 0.2, 0.9, 0.5 → only row 1 gets 0.9 − 0.5 (÷ std); group 1: tie at 1 → 0; group 2: alone → 0.
    r, m = outcome([0.2, 0.9, 0.5, 1.0, 1.0, 0.0, 4.0])
    index = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    adv, _ = estimator("grpo_passk", norm_by_std=False)(token_rewards=r, mask=m, index=index)
    torch.testing.assert_close(rows(adv), torch.tensor([0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0]))
    adv, _ = estimator("grpo_passk")(token_rewards=r, mask=m, index=index)
    std = torch.tensor([0.2, 0.9, 0.5], dtype=torch.float64).std().item()
    torch.testing.assert_close(rows(adv), torch.tensor([0.0, 0.4 / (std + 1e-6), 0, 0, 0, 0, 0]))


# --------------------------------------------------------------------------- identities


@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0, 3.25]), min_size=1, max_size=6), min_size=1, max_size=8
    ),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_grpo_sums_to_zero_per_group(groups, scale):
    scores = [s for g in groups for s in g]
    index = torch.tensor([gid * 3 + 1 for gid, g in enumerate(groups) for _ in g])
    r, m = outcome(scores)
    adv, _ = estimator("grpo", scale=scale)(token_rewards=r, mask=m, index=index)
    per_row = rows(adv).double()
    for gid, g in enumerate(groups):
        sel = index == gid * 3 + 1
        if len(g) > 1:
            assert abs(per_row[sel].sum().item()) < 1e-5 * max(1.0, per_row.abs().max().item())
        if len(g) > 1 and len(set(g)) == 1:
            assert (per_row[sel] == 0).all()  # all-equal group: 0, not NaN


def test_rloo_is_score_minus_mean_of_the_others():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(12, generator=g)
    index = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    r, m = outcome(scores.tolist())
    adv, _ = estimator("rloo")(token_rewards=r, mask=m, index=index)
    for i in range(12):
        others = [j for j in range(12) if index[j] == index[i] and j != i]
        assert rows(adv)[i].item() == pytest.approx(scores[i].item() - scores[others].mean().item(), abs=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_row_order_and_group_ids_do_not_matter(name):
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 3, (10,), generator=g).float().tolist()
    index = torch.tensor([4, 4, 9, 9, 9, 4, 1, 1, 9, 4])
    r, m = outcome(scores, last=[3, 2, 1, 3, 0, 3, 2, 3, 1, 2])
    adv, _ = estimator(name)(token_rewards=r, mask=m, index=index)
    perm = torch.randperm(10, generator=g)
    relabel = {4: -100, 9: 2**40, 1: 0}
    index2 = torch.tensor([relabel[i] for i in index[perm].tolist()])
    adv2, _ = estimator(name)(token_rewards=r[perm], mask=m[perm], index=index2)
    if name == "grpo_passk":  # ties for the best may pick another row; compare per group
        for gid in (4, 9, 1):
            torch.testing.assert_close(adv[index == gid].sum(), adv2[index[perm] == gid].sum())
    else:
        torch.testing.assert_close(adv2, adv[perm], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_masked_positions_and_padding_change_nothing(name):
    r, m = outcome([1.0, 0.0, 2.0, 2.5, 0.0, 1.0], T=5, last=[4, 2, 3, 0, 1, 4])
    index = torch.tensor([0, 0, 0, 1, 1, 1])
    est = estimator(name)
    base, _ = est(token_rewards=r, mask=m, index=index)
    junk = torch.where(m, r, torch.full_like(r, float("nan")))
    padded_r = torch.cat([junk, torch.full((6, 7), float("inf"))], dim=1)
    padded_m = torch.cat([m, torch.zeros(6, 7, dtype=torch.bool)], dim=1)
    adv, ret = est(token_rewards=padded_r, mask=padded_m, index=index)
    torch.testing.assert_close(adv[:, :5], base, rtol=0, atol=0)
    assert (adv[:, 5:] == 0).all() and torch.isfinite(ret).all()


# --------------------------------------------------------------------------- against the loops


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=7),
    seed=st.integers(0, 2**31 - 1),
    discrete=st.booleans(),
)
def test_match_verl_loops(sizes, seed, discrete):
    g = torch.Generator().manual_seed(seed)
    B, T = sum(sizes), 6
    index = torch.tensor([gid * 5 for gid, n in enumerate(sizes) for _ in range(n)])
    index = index[torch.randperm(B, generator=g)]  # groups interleaved
    if discrete:
        r = torch.randint(0, 2, (B, T), generator=g).double()
    else:
        r = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = torch.rand(B, T, generator=g) > 0.3  # rows may be fully masked; rewards on masked tokens count in verl
    scores = r.sum(dim=1)
    lengths = m.sum(dim=1)
    verl = dict(mask_scores=False)

    def run(name, **knobs):
        adv, ret = estimator(name, **verl, **knobs)(token_rewards=r, mask=m, index=index)
        torch.testing.assert_close(ret, adv, rtol=0, atol=0)
        return adv

    def expect(adv, per_row):
        torch.testing.assert_close(adv, torch.where(m, per_row[:, None], 0.0), rtol=1e-9, atol=1e-9)

    expect(run("grpo"), loop_grpo(scores, index))
    expect(run("grpo", norm_by_std=False), loop_grpo(scores, index, norm=False))
    expect(run("rloo"), loop_rloo(scores, index))
    expect(run("rloo", singleton="zero"), loop_rloo(scores, index, singleton_score=False))
    expect(run("opo"), loop_opo(scores, lengths, index))
    alpha = B / max(1, int((scores != 0).sum()))
    expect(run("gpg"), alpha * loop_mean_baseline(scores, index))
    tokens = torch.where(m, loop_mean_baseline(scores, index)[:, None], 0.0)
    if m.sum() > 1:
        n = m.sum()
        mean = tokens.sum() / n
        var = torch.where(m, (tokens - mean) ** 2, 0.0).sum() / (n - 1)
        torch.testing.assert_close(
            run("reinforce_plus_plus_baseline"), torch.where(m, (tokens - mean) / torch.sqrt(var + 1e-8), 0.0)
        )
    passk = run("grpo_passk")
    ref = loop_passk(scores, index)
    for gid in set(index.tolist()):  # ties may pick a different best row: compare the group's total
        sel = index == gid
        torch.testing.assert_close(passk[sel].sum(0), torch.where(m[sel], ref[sel][:, None], 0.0).sum(0))


# --------------------------------------------------------------------------- mask_scores


def test_mask_scores_default_ignores_masked_rewards_and_empty_rows():
    # Row 2 is fully masked (a filtered response); a reward 5 sits on a masked token of row 0.
    r = torch.tensor([[1.0, 0.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    m = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    index = torch.tensor([0, 0, 0])
    adv, _ = estimator("grpo")(token_rewards=r, mask=m, index=index)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # scores 1, 0: mean 0.5, std √0.5
    torch.testing.assert_close(adv, torch.tensor([[a, a, 0.0], [-a, -a, -a], [0.0, 0.0, 0.0]]))
    # verl: scores 6, 0, 0 — the masked reward counts and the empty row shifts mean and std.
    adv, _ = estimator("grpo", mask_scores=False)(token_rewards=r, mask=m, index=index)
    mean, std = 2.0, math.sqrt(12.0)
    b, c = (6 - mean) / (std + 1e-6), (0 - mean) / (std + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([[b, b, 0.0], [c, c, c], [0.0, 0.0, 0.0]]))


def test_a_group_left_with_one_counted_row_is_a_singleton():
    r = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    m = torch.tensor([[True, True], [False, False]])
    adv, _ = estimator("grpo")(token_rewards=r, mask=m, index=torch.tensor([3, 3]))
    torch.testing.assert_close(adv, torch.tensor([[2 / (1 + 1e-6)] * 2, [0.0, 0.0]]))
    adv, _ = estimator("rloo")(token_rewards=r, mask=m, index=torch.tensor([3, 3]))
    torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0], [0.0, 0.0]]))


@pytest.mark.parametrize("name", NAMES)
def test_fully_masked_rows_do_not_poison_the_batch(name):
    r, m = outcome([1.0, 0.0, 2.0, 2.5, 0.0, 1.0], T=4)
    index = torch.tensor([0, 0, 0, 1, 1, 1])
    base, _ = estimator(name)(token_rewards=r, mask=m, index=index)
    r2 = torch.cat([r, torch.tensor([[7.0, 7.0, 7.0, float("nan")]])])
    m2 = torch.cat([m, torch.zeros(1, 4, dtype=torch.bool)])
    adv, ret = estimator(name)(token_rewards=r2, mask=m2, index=torch.cat([index, torch.tensor([1])]))
    assert (adv[6] == 0).all() and (ret[6] == 0).all()
    torch.testing.assert_close(adv[:6], base, rtol=0, atol=0)


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("name", NAMES)
def test_all_equal_and_all_masked_batches_are_zero(name):
    r, m = outcome([1.0, 1.0, 1.0, 1.0])
    index = torch.tensor([0, 0, 1, 1])
    adv, ret = estimator(name)(token_rewards=r, mask=m, index=index)
    assert (adv == 0).all() and (ret == 0).all()
    none = torch.zeros_like(m)
    adv, ret = estimator(name)(token_rewards=r, mask=none, index=index)
    assert (adv == 0).all() and (ret == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_empty_batch(name):
    for shape in [(0, 5), (0, 0)]:
        adv, ret = estimator(name)(
            token_rewards=torch.zeros(shape),
            mask=torch.zeros(shape, dtype=torch.bool),
            index=torch.zeros(0, dtype=torch.long),
        )
        assert adv.shape == ret.shape == shape


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_scores_name_the_rows(name):
    r, m = outcome([1.0, 0.0, 2.0, 1.0])
    r[0, 3] = float("nan")
    r[2, 1] = float("inf")
    with pytest.raises(RowError, match=r"token_rewards.*\[0, 2\]") as info:
        estimator(name)(token_rewards=r, mask=m, index=torch.tensor([0, 0, 1, 1]))
    assert info.value.rows == [0, 2]


def test_huge_finite_rewards_are_not_rejected():
    # The fast finiteness check sums the tensor; an overflowing sum must fall back, not fail.
    r, m = outcome([3e38, 0.0, 3e38, 0.0])  # the total overflows, no group's sum does
    for mask_scores in (True, False):
        adv, _ = estimator("rloo", mask_scores=mask_scores)(token_rewards=r, mask=m, index=torch.tensor([0, 0, 1, 1]))
        torch.testing.assert_close(rows(adv), torch.tensor([3e38, -3e38, 3e38, -3e38]))


def test_verl_mode_rejects_non_finite_rewards_on_masked_tokens():
    r, m = outcome([1.0, 0.0], T=3, last=[1, 1])
    r[1, 2] = float("nan")  # masked: ignored by default, summed by verl
    adv, _ = estimator("grpo")(token_rewards=r, mask=m, index=torch.tensor([0, 0]))
    assert torch.isfinite(adv).all()
    with pytest.raises(RowError, match=r"\[1\]"):
        estimator("grpo", mask_scores=False)(token_rewards=r, mask=m, index=torch.tensor([0, 0]))


def test_bad_arguments():
    r, m = outcome([1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match=r"index must be a \(3,\) tensor"):
        estimator("grpo")(token_rewards=r, mask=m, index=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="index must be"):
        estimator("rloo")(token_rewards=r, mask=m, index=None)
    with pytest.raises(TypeError, match="integer group ids"):
        estimator("grpo")(token_rewards=r, mask=m, index=torch.tensor([0.0, 0.0, 1.0]))
    with pytest.raises(TypeError, match="dtype torch.bool"):
        estimator("grpo")(token_rewards=r, mask=m.long(), index=torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        estimator("opo")(token_rewards=r[:, 0], mask=m[:, 0], index=torch.tensor([0, 0, 1]))


def test_float64_in_float64_out():
    r, m = outcome([1.0, 0.0, 2.0])
    for name in NAMES:
        adv, ret = estimator(name)(token_rewards=r.double(), mask=m, index=torch.tensor([0, 0, 0]))
        assert adv.dtype == ret.dtype == torch.float64


# --------------------------------------------------------------------------- registration, knobs


def test_registration():
    for name in NAMES:
        spec = LAB.spec("advantage_estimator", name)
        assert spec.provider == "rllab_advantages" and spec.requires == ()
    knobs = {k.name: k.default for k in LAB.spec("advantage_estimator", "grpo").knobs()}
    assert knobs == {"epsilon": 1e-6, "norm_by_std": True, "scale": "group", "singleton": "score", "mask_scores": True}


@pytest.mark.parametrize(
    "name,knobs,match",
    [
        ("grpo", {"scale": "global"}, "scale = 'global' is not allowed"),
        ("grpo", {"norm_by_std": False, "scale": "batch"}, "choose one"),
        ("grpo", {"epsilon": -1e-6}, "epsilon = -1e-06 is out of range"),
        ("grpo", {"singleton": "mean"}, "not allowed"),
        ("grpo", {"norm_adv_by_std": False}, "has no knob"),
        ("rloo", {"singleton": "one"}, "not allowed"),
        ("rloo", {"epsilon": 1e-6}, "has no knob"),
        ("gpg", {"f_norm": 0.0}, "out of range"),
        ("grpo_passk", {"mask_scores": 1}, "wrong type"),
    ],
)
def test_knob_validation(name, knobs, match):
    with pytest.raises(rllab.ConfigError, match=match):
        estimator(name, **knobs)
