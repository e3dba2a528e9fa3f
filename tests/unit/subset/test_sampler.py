"""Privatization: faithfulness, the transition law, non-informativeness (spec §9.5 items 1-6, 21).

Goodness-of-fit checks use Pearson χ² with p > 1e-3 (the spec's threshold);
frequencies are compared within a Bonferroni-adjusted z of their binomial
standard error (see ``stats``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import subset
from mechanisms.subset import bitmask, sampler
from tests.unit.subset.stats import assert_close, gof_p_value

GOF_FLOOR = 1e-3


@settings(max_examples=40, deadline=None)
@given(p=st.integers(4, 63), n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_uniform_output_is_faithful_and_sized(p: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, p, size=n)
    masks = subset.privatize(x, subset.design_uniform(p), rng)
    assert masks.dtype == np.uint64 and masks.shape == (n,)
    assert np.all(bitmask.contains(masks, x))
    sizes = bitmask.popcount(masks)
    assert np.all((sizes >= 2) & (sizes <= p - 2))
    assert np.all(masks <= bitmask.full(p))


@settings(max_examples=20, deadline=None)
@given(p=st.integers(4, 8), seed=st.integers(0, 2**32 - 1))
def test_explicit_designs_are_faithful(p: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    design = subset.design_random(p, rng)
    x = rng.integers(0, p, size=200)
    for draw in (subset.privatize(x, design, rng), sampler.enumerated(x, design, rng)):
        assert np.all(bitmask.contains(draw, x))
        assert np.all(design.mu_of(draw) > 0)


def test_p4_outputs_are_pairs() -> None:
    rng = np.random.default_rng(0)
    masks = subset.privatize(rng.integers(0, 4, 10_000), subset.design_uniform(4), rng)
    assert np.all(bitmask.popcount(masks) == 2)


def _transition_check(design: subset.Design, draw: str, n: int, seed: int) -> None:
    """Given X = j, A ~ μ_a·1{j∈a}: one χ² GOF per category, plus equal μ_a across j ∈ a."""
    rng = np.random.default_rng(seed)
    support, mu = design.law()
    per_category = []
    for j in range(design.p):
        x = np.full(n, j)
        out = sampler.enumerated(x, design, rng) if draw == "enumerated" else subset.privatize(
            x, design, rng)
        holds = bitmask.contains(support, np.full(len(support), j))
        counts = np.array([np.count_nonzero(out == m) for m in support[holds]])
        assert counts.sum() == n  # nothing outside the support
        assert gof_p_value(counts, mu[holds]) > GOF_FLOOR
        per_category.append(dict(zip(support[holds].tolist(), counts, strict=True)))
    # non-informativeness: for each subset a, P(A=a | X=j) is the same for every j ∈ a
    for mask in support.tolist():
        members = bitmask.members(mask)
        table = np.array([[per_category[j][mask], n - per_category[j][mask]] for j in members])
        assert stats.chi2_contingency(table, correction=False).pvalue > GOF_FLOOR / len(support)


@pytest.mark.parametrize(("design", "draw"), [
    (subset.design_uniform(4), "rejection"),
    (subset.design_uniform(5), "rejection"),
    (subset.design_random(5, np.random.default_rng(11)), "enumerated"),
    (subset.design_from_mu([[j, (j + 1) % 5] for j in range(5)], [0.5] * 5, 5), "privatize"),
])
def test_transition_law(design: subset.Design, draw: str) -> None:
    _transition_check(design, draw, 200_000 if design.p == 4 else 60_000, seed=design.p)


def test_rejection_sampler_matches_enumeration() -> None:
    """The p = 6 uniform design two ways: a χ² homogeneity test on the 50 subsets."""
    rng = np.random.default_rng(5)
    design = subset.design_uniform(6)
    x = rng.integers(0, 6, 100_000)
    fast = subset.privatize(x, design, rng)
    slow = sampler.enumerated(x, design, rng)
    support, _ = design.law()
    table = np.array([[np.count_nonzero(fast == m) for m in support],
                      [np.count_nonzero(slow == m) for m in support]])
    assert table.sum() == 200_000
    assert stats.chi2_contingency(table).pvalue > GOF_FLOOR


def test_posterior_is_the_restricted_prior() -> None:
    """Empirical P(X=x | A=a) = w_x / L(a) (Definition 1), within z·SE for every (a, x)."""
    rng = np.random.default_rng(7)
    w = np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    design = subset.design_uniform(5)
    x = rng.choice(5, size=400_000, p=w)
    masks = subset.privatize(x, design, rng)
    estimates, targets, errors = [], [], []
    for mask in design.law()[0].tolist():
        rows = masks == mask
        total = int(rows.sum())
        for j in bitmask.members(mask):
            post = subset.posterior(mask, w)[j]
            estimates.append(np.count_nonzero(x[rows] == j) / total)
            targets.append(post)
            errors.append(np.sqrt(post * (1 - post) / total))
    assert_close(estimates, targets, errors)


def test_survey_mode_has_the_same_law() -> None:
    """Asking "is X in Ã?" and releasing Ã or Ã^c is the independent mechanism."""
    rng = np.random.default_rng(9)
    design = subset.design_uniform(5)
    x = rng.integers(0, 5, 100_000)
    questions = subset.survey_question(design, rng, size=len(x))
    sizes = bitmask.popcount(questions)
    assert np.all((sizes >= 2) & (sizes <= 3))
    asked = subset.survey_answer(questions, bitmask.contains(questions, x), 5)
    direct = subset.privatize(x, design, rng)
    support, _ = design.law()
    table = np.array([[np.count_nonzero(asked == m) for m in support],
                      [np.count_nonzero(direct == m) for m in support]])
    assert stats.chi2_contingency(table).pvalue > GOF_FLOOR
    assert np.all(bitmask.contains(asked, x))
    with pytest.raises(subset.DesignError):
        subset.survey_question(subset.design_from_mu([[j, (j + 1) % 5] for j in range(5)],
                                                      [0.5] * 5, 5), rng)


def test_same_seed_same_bytes() -> None:
    x = np.random.default_rng(0).integers(0, 7, 5_000)
    design = subset.design_uniform(7)
    one = subset.privatize(x, design, np.random.default_rng(42))
    two = subset.privatize(x, design, np.random.default_rng(42))
    assert one.tobytes() == two.tobytes()
    other = subset.privatize(x, design, np.random.default_rng(43))
    assert one.tobytes() != other.tobytes()


def test_product_columns_use_independent_streams() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 4, 50_000)
    a, b = subset.privatize_product([x, x], [subset.design_uniform(4)] * 2, rng)
    assert np.all(bitmask.contains(a, x)) and np.all(bitmask.contains(b, x))
    assert not np.array_equal(a, b)
    # given X, the two draws are independent: P(A1 = A2 | X) = Σ_a μ_a² over a ∋ X = 1/3
    same = float(np.mean(a == b))
    assert_close(same, 1 / 3, np.sqrt((1 / 3) * (2 / 3) / len(x)))
    with pytest.raises(ValueError, match="one design per column"):
        subset.privatize_product([x], [], rng)


def test_codes_are_checked_without_echoing_values() -> None:
    design = subset.design_uniform(4)
    with pytest.raises(ValueError, match=r"0\.\.3") as info:
        subset.privatize(np.array([0, 9]), design, np.random.default_rng(0))
    assert "9" not in str(info.value)
    with pytest.raises(ValueError):
        subset.privatize(np.array([0.5]), design, np.random.default_rng(0))
