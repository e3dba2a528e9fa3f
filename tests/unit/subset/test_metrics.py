"""Privacy metrics (spec §1.4, §6.1-6.2, §9.5 items 15-17): exact values and identities."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import subset
from mechanisms.subset import bitmask, metrics
from tests.unit.subset.stats import assert_close

ADULT_RACE = np.array([311, 1039, 3124, 271, 27816]) / 32561  # Table II counts


def test_example_2_size_coverage() -> None:
    w = np.array([0.01, 0.1, 0.2, 0.69])
    report = subset.privacy_report(subset.design_uniform(4), w)
    assert math.isclose(report.size_coverage, 0.684133, abs_tol=5e-7)
    # τ = 1/3 + (2/3)Σw² (the uniform closed form)
    assert math.isclose(report.size_coverage, 1 / 3 + 2 / 3 * float(w @ w), abs_tol=1e-12)
    assert math.isclose(subset.individual_report(0b1110, w)["size"], 0.99)
    assert math.isclose(subset.individual_report(0b0011, w)["size"], 0.11)


def test_adult_race_three_designs() -> None:
    uniform = subset.privacy_report(subset.design_uniform(5), ADULT_RACE)
    assert math.isclose(uniform.size_leakage, 0.155900, abs_tol=5e-7)
    assert math.isclose(uniform.mi_bits or 0, 0.409004, abs_tol=5e-7)
    assert math.isclose(uniform.prediction_risk, 0.922367, abs_tol=5e-7)
    private = subset.non_private_report(ADULT_RACE)
    assert math.isclose(private.size_leakage, 0.259833, abs_tol=5e-7)
    assert math.isclose(private.mi_bits or 0, 0.798741, abs_tol=5e-7)
    assert private.prediction_risk == 1.0
    full = subset.fully_private_report(ADULT_RACE)
    assert (full.size_leakage, full.mi_bits) == (0.0, 0.0)
    assert math.isclose(full.prediction_risk, 0.854274, abs_tol=5e-7)
    assert uniform.entropy_bits == private.mi_bits == private.entropy_bits
    assert math.isclose(uniform.conditional_entropy_bits or 0,
                        uniform.entropy_bits - (uniform.mi_bits or 0))


def test_adult_individual_cases() -> None:
    """Fig. 4: case 12 (White in {Black, White, Asian}) and case 14 (Asian in {Asian, White})."""
    case12 = subset.individual_report(0b10110, ADULT_RACE, true_code=4)
    assert math.isclose(case12["size"], 0.982126, abs_tol=5e-7)
    assert case12["map_guess"] == 4 and case12["prediction_leakage"] == 1
    case14 = subset.individual_report(0b10010, ADULT_RACE, true_code=1)
    assert math.isclose(case14["size_leakage"], 1 - 0.886183, abs_tol=5e-7)
    assert case14["map_guess"] == 4 and case14["prediction_leakage"] == 0


def test_uniform_population_p4() -> None:
    report = subset.privacy_report(subset.design_uniform(4), np.full(4, 0.25))
    assert math.isclose(report.size_coverage, 0.5)
    assert math.isclose(report.mi_bits or 0, 1.0)
    assert math.isclose(report.prediction_risk, 0.5)


def test_cycle_design_exceeds_one_bit() -> None:
    cycle = subset.design_from_mu([[j, (j + 1) % 5] for j in range(5)], [0.5] * 5, 5)
    report = subset.privacy_report(cycle, np.full(5, 0.2))
    assert math.isclose(report.mi_bits or 0, math.log2(2.5), abs_tol=1e-12)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(4, 8), seed=st.integers(0, 2**32 - 1))
def test_independent_designs_leak_at_most_one_bit(p: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.random(p) ** 3
    w /= w.sum()
    report = subset.privacy_report(subset.design_random(p, rng), w)
    assert report.mi_bits is not None and report.mi_bits <= 1.0 + 1e-12
    # the MAP guesser beats the no-data baseline but is never sure
    assert report.baseline_risk - 1e-12 <= report.prediction_risk <= 1.0
    assert 0.0 <= report.size_leakage <= 1.0
    assert report.min_individual_coverage <= report.size_coverage + 1e-12


@pytest.mark.parametrize("p", [5, 8, 12, 16])
def test_uniform_closed_forms_match_enumeration(p: int) -> None:
    rng = np.random.default_rng(p)
    w = rng.random(p)
    w /= w.sum()
    exact = subset.privacy_report(subset.design_uniform(p), w)
    closed = metrics.uniform_closed_form(p, w)
    for name in ("size_coverage", "prediction_risk", "min_individual_coverage"):
        assert math.isclose(getattr(exact, name), getattr(closed, name), rel_tol=1e-10)
    flat = np.full(p, 1.0 / p)
    assert math.isclose(subset.privacy_report(subset.design_uniform(p), flat).mi_bits or 0,
                        metrics.uniform_closed_form(p, flat).mi_bits or 0, rel_tol=1e-10)


def test_large_p_reports_without_enumeration() -> None:
    report = subset.privacy_report(subset.design_uniform(40), np.full(40, 1 / 40))
    assert report.mi_bits is not None and 0.9 < report.mi_bits <= 1.0
    skewed = np.linspace(1, 2, 40)
    report = subset.privacy_report(subset.design_uniform(40), skewed / skewed.sum())
    assert report.mi_bits is None and 0 < report.size_coverage < 1


def test_metrics_match_simulation() -> None:
    """τ = E[L(A)], I = E[−log2 L(A)] and the MAP guesser's hit rate, by Monte Carlo."""
    rng = np.random.default_rng(3)
    w = np.array([0.05, 0.15, 0.2, 0.25, 0.35])
    design = subset.design_random(5, rng)
    n = 200_000
    x = rng.choice(5, n, p=w)
    masks = subset.privatize(x, design, rng)
    rows = bitmask.indicators(masks, 5)
    size = rows @ w
    guess = np.argmax(np.where(rows > 0, w, -1.0), axis=1)
    report = subset.privacy_report(design, w)
    assert report.mi_bits is not None
    values = [size.mean(), (-np.log2(size)).mean(), (guess == x).mean()]
    errors = [size.std() / np.sqrt(n), np.log2(size).std() / np.sqrt(n),
              np.sqrt(report.prediction_risk * (1 - report.prediction_risk) / n)]
    assert_close(values, [report.size_coverage, report.mi_bits, report.prediction_risk], errors)


def test_posterior_sums_to_one_inside_the_subset() -> None:
    post = subset.posterior(0b10110, ADULT_RACE)
    assert math.isclose(post.sum(), 1.0) and post[0] == post[3] == 0.0
    assert np.allclose(post[[1, 2, 4]], ADULT_RACE[[1, 2, 4]] / 0.982126, atol=1e-6)
