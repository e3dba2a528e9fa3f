"""Design constants and validation (spec §2, §3.1, §9.5 item 3): exact checks."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import subset
from mechanisms.subset import bitmask
from mechanisms.subset.design import ENUMERATION_LIMIT, DesignError


@pytest.mark.parametrize(("p", "support"), [(4, 6), (5, 20), (6, 50), (8, 238)])
def test_uniform_support_and_nu(p: int, support: int) -> None:
    design = subset.design_uniform(p)
    masks, nu = design.nu()
    assert design.support_size == support == len(masks) == 2**p - 2 * p - 2
    assert np.all(nu == 1.0 / support)
    sizes = bitmask.popcount(masks)
    assert sizes.min() == 2 and sizes.max() == p - 2
    law_masks, mu = design.law()
    assert np.array_equal(law_masks, masks)  # the support is closed under complements
    assert np.allclose(mu, 2.0 / support, rtol=0, atol=1e-15)


@pytest.mark.parametrize(("p", "r"), [(4, Fraction(3)), (5, Fraction(5, 2)),
                                      (6, Fraction(25, 11)), (8, Fraction(119, 57))])
def test_r_p_and_q_off_diagonal(p: int, r: Fraction) -> None:
    design = subset.design_uniform(p)
    assert design.r_p == r
    masks, mu = design.law()
    rows = bitmask.indicators(masks, p)
    q = rows.T @ (mu[:, None] * rows)  # enumerated, against the closed form
    assert np.allclose(q, design.Q, rtol=0, atol=1e-12)
    off = design.Q[~np.eye(p, dtype=bool)]
    assert np.allclose(off, float(1 / r), rtol=0, atol=1e-15)
    assert np.allclose(np.diag(design.Q), 1.0)


def test_r_p_tends_to_two() -> None:
    exact = [subset.r_p(p) for p in (7, 10, 12, 30, 63)]
    assert exact == sorted(exact, reverse=True)
    assert math.isclose(exact[0], 2.1538, abs_tol=1e-4)
    assert math.isclose(exact[1], 2.0283, abs_tol=1e-4)
    assert math.isclose(exact[2], 2.0089, abs_tol=1e-4)
    assert 2 < exact[-1] < 2 + Fraction(1, 10**15)


def _identities(design: subset.Design) -> None:
    masks, mu = design.law()
    p = design.p
    rows = bitmask.indicators(masks, p)
    assert np.allclose(rows.T @ mu, 1.0, atol=1e-12)  # Σ_{a∋j} μ_a = 1
    assert math.isclose(float(mu @ rows.sum(axis=1)), p, abs_tol=1e-9)  # Σ μ_a|a| = p
    assert bitmask.popcount(masks).min() >= 2
    if design.is_independent:
        assert math.isclose(float(mu.sum()), 2.0, abs_tol=1e-12)
        assert design.is_complement_symmetric()
    assert np.allclose(design.expected_size(), design.Q.sum(axis=1))


@pytest.mark.parametrize("p", [4, 5, 6, 8, 10])
def test_uniform_identities(p: int) -> None:
    _identities(subset.design_uniform(p))


@settings(max_examples=25, deadline=None)
@given(p=st.integers(4, 9), seed=st.integers(0, 2**32 - 1))
def test_random_designs_are_valid(p: int, seed: int) -> None:
    design = subset.design_random(p, np.random.default_rng(seed))
    _identities(design)
    assert design.is_identifiable()
    again = subset.design_from_json(design.describe())
    assert again.masks is not None and design.masks is not None
    assert again.probs is not None and design.probs is not None
    assert np.array_equal(again.masks, design.masks)
    assert np.allclose(again.probs, design.probs)


def test_uniform_needs_four_categories() -> None:
    for p in (2, 3):
        with pytest.raises(DesignError, match="at least 4 categories"):
            subset.design_uniform(p)
    with pytest.raises(DesignError):
        subset.design_uniform(64)
    assert subset.design_uniform(63).support_size == 2**63 - 128


def test_non_identifiable_designs_are_refused() -> None:
    # p = 4, μ_{12} = μ_{34} = 1: Q has eigenvalues 0, 0, 2, 2
    masks, mu = [[0, 1], [2, 3]], [1.0, 1.0]
    design = subset.design_from_mu(masks, mu, 4, require_identifiable=False)
    assert np.allclose(np.linalg.eigvalsh(design.Q), [0, 0, 2, 2], atol=1e-12)
    assert not design.is_identifiable()
    with pytest.raises(DesignError, match="not identifiable"):
        subset.design_from_mu(masks, mu, 4)
    # a ν whose support keeps 0 and 1 together: rank(Q) < p
    with pytest.raises(DesignError, match="not identifiable"):
        subset.design_from_nu([[0, 1], [0, 1, 2]], [0.5, 0.5], 5)


@pytest.mark.parametrize(("subsets", "probs", "p", "field", "match"), [
    ([[0, 1], [2, 3]], [0.5, 0.6], 4, "probabilities", "sum to 1"),
    ([[0], [1, 2]], [0.5, 0.5], 4, "subsets", "size 2..2"),
    ([[0, 1, 2]], [1.0], 4, "subsets", "size 2..2"),
    ([[0, 1], [1, 0]], [0.5, 0.5], 4, "subsets", "listed twice"),
    ([[0, 0]], [1.0], 4, "subsets", "twice"),
    ([[0, 7]], [1.0], 4, "subsets", "outside"),
    ([[0, 1]], [-1.0], 4, "probabilities", "non-negative"),
    ([[0, 1]], [1.0, 0.0], 4, "probabilities", "one probability"),
    ([[0, 1]], [1.0], 17, "p", "p <= 16"),
    ([[0, 1]], [1.0], 3, "p", "4 <= p"),
])
def test_nu_validation(subsets: list[list[int]], probs: list[float], p: int, field: str,
                       match: str) -> None:
    with pytest.raises(DesignError, match=match) as info:
        subset.design_from_nu(subsets, probs, p)
    assert info.value.field == field


def test_mu_validation() -> None:
    with pytest.raises(DesignError, match="must sum to 1") as info:
        subset.design_from_mu([[0, 1], [2, 3], [0, 2]], [0.5, 0.5, 0.5], 4)
    assert info.value.field == "probabilities"
    with pytest.raises(DesignError, match="at least 2"):
        subset.design_from_mu([[0], [1, 2, 3]], [1.0, 1.0], 4)
    # p = 5 cycle: valid conditional design that no independent mechanism realizes
    cycle = subset.design_from_mu([[j, (j + 1) % 5] for j in range(5)], [0.5] * 5, 5)
    _identities(cycle)
    assert not cycle.is_complement_symmetric()
    with pytest.raises(DesignError, match="complement-symmetric"):
        cycle.to_independent()


def test_symmetric_conditional_design_runs_independently() -> None:
    uniform = subset.design_uniform(5)
    masks, mu = uniform.law()
    conditional = subset.design_from_mu(masks, mu, 5)
    independent = conditional.to_independent()
    assert independent.kind == "independent"
    assert independent.probs is not None and np.allclose(independent.probs, mu / 2)
    assert np.allclose(independent.Q, uniform.Q)


def test_mu_of_matches_the_law() -> None:
    for design in (subset.design_uniform(6), subset.design_random(6, np.random.default_rng(3))):
        every = bitmask.all_masks(6)
        masks, mu = design.law()
        expected = np.zeros(len(every))
        expected[masks.astype(np.intp)] = mu
        assert np.allclose(design.mu_of(every), expected, rtol=0, atol=1e-15)


def test_proper_base_design_for_small_domains() -> None:
    two = subset.design_proper(2)
    assert np.array_equal(two.nu()[0], bitmask.from_members([[0], [1]]))
    assert np.allclose(two.Q, np.eye(2))
    three = subset.design_proper(3)
    assert three.support_size == 6 and three.is_complement_symmetric() and three.min_size == 1
    assert subset.design_from_json(three.describe()).min_size == 1
    assert ENUMERATION_LIMIT == 16


def test_describe_uses_names() -> None:
    pairs = [[0, 1], [2, 3], [0, 2], [1, 3], [0, 3], [1, 2]]
    design = subset.design_from_nu(pairs, [0.25, 0.25, 0.15, 0.15, 0.1, 0.1], 4)
    doc = design.describe(["a", "b", "c", "d"])
    assert doc["type"] == "nu" and doc["subsets"][0] == ["a", "b"]
    again = subset.design_from_json(doc, ["a", "b", "c", "d"])
    assert np.allclose(again.Q, design.Q)
    uniform = subset.design_uniform(8).describe()
    assert uniform == {"type": "uniform", "p": 8, "support_size": 238, "nu": 1 / 238,
                       "subset_sizes": [2, 6], "r_p": 119 / 57, "r_p_exact": "119/57"}
