"""Permute-and-flip with exact coins and fixed work (``mechanisms.flip``, issue #27)."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from mechanisms import flip


def test_thresholds_bracket_exp_minus_gamma_times_2_63() -> None:
    """lo <= exp(−γ)·2^63 <= hi (computed at 60 digits) across the range of γ, including
    γ with huge numerators and denominators, γ near 0 and beyond 60 (E < 1); and the
    bracket is narrow: the exact tier is needed with probability below 2^-48 per coin."""
    rng = np.random.default_rng(3)
    gammas = [Fraction(1, 3), Fraction(2), Fraction(30), Fraction(59), Fraction(61),
              Fraction(7, 10**9), Fraction(10**20 + 1, 10**19), Fraction(2**70 + 1, 2**65)]
    gammas += [Fraction(int(k), int(d)) for k, d in zip(rng.integers(1, 10**6, 200),
                                                         rng.integers(1, 10**5, 200),
                                                         strict=True)]
    coins = flip.Coins.of([Fraction(0), *gammas])
    assert coins.lo[0] == coins.hi[0] == 2**63  # γ = 0: every word accepts
    with localcontext() as ctx:
        ctx.prec = 60
        for g, lo, hi in zip(gammas, coins.lo[1:], coins.hi[1:], strict=True):
            e = (-Decimal(g.numerator) / Decimal(g.denominator)).exp() * Decimal(2**63)
            assert int(lo) <= e <= int(hi), g
            assert (int(hi) - int(lo)) / 2.0**63 < 2.0**-48


@pytest.mark.parametrize("gamma", [Fraction(1, 3), Fraction(5, 2), Fraction(12)])
def test_coins_have_probability_exp_minus_gamma(gamma: Fraction) -> None:
    coins = flip.Coins.of([gamma])
    runs = 200_000
    heads, near = coins.flip(np.random.default_rng(5), np.zeros(runs, dtype=np.int64))
    p = math.exp(-float(gamma))
    assert abs(heads.mean() - p) <= 4.5 * math.sqrt(p * (1 - p) / runs) + 1e-12
    assert near.size == 0  # the exact tier is a 2^-48 event


def test_probabilities_match_enumeration_and_sampling() -> None:
    """``probabilities`` equals permute-and-flip's law by enumerating the orders, and 50,000
    draws fit it (chi-square, p > 10^-3); every draw flips all m coins."""
    gammas = [Fraction(0), Fraction(1, 2), Fraction(1), Fraction(3, 2), Fraction(4)]
    p = [math.exp(-float(g)) for g in gammas]
    law = np.zeros(len(p))
    orders = list(itertools.permutations(range(len(p))))
    for order in orders:
        alive = 1.0
        for c in order:
            law[c] += alive * p[c] / len(orders)
            alive *= 1.0 - p[c]
    assert flip.probabilities([float(g) for g in gammas]) == pytest.approx(law, abs=1e-12)
    draws = 50_000
    flips = flip.permute_and_flip(np.random.default_rng(9), flip.Coins.of(gammas), draws)
    assert flips.coins == draws * len(gammas)
    assert flips.refined.shape == (draws,) and not flips.refined.any()
    observed = np.bincount(flips.chosen, minlength=len(gammas))
    assert stats.chisquare(observed, law * draws).pvalue > 1e-3


def test_blocks_keep_memory_bounded_and_draws_independent_of_the_split() -> None:
    """Draws are processed in blocks of ⌊2^20 / m⌋; a release spanning several blocks has
    every draw filled, and the work is still draws · m coins."""
    m = 6000
    gammas = [Fraction(0)] + [Fraction(k % 40 + 1, 4) for k in range(m - 1)]
    draws = 2 * (flip.BLOCK_COINS // m) + 3
    flips = flip.permute_and_flip(np.random.default_rng(2), flip.Coins.of(gammas), draws)
    assert flips.chosen.shape == (draws,) and flips.coins == draws * m
    assert flips.chosen.min() >= 0 and flips.chosen.max() < m


def test_permute_and_flip_needs_a_sure_candidate() -> None:
    with pytest.raises(ValueError):
        flip.permute_and_flip(np.random.default_rng(0), flip.Coins.of([Fraction(1)]), 1)
    with pytest.raises(ValueError):
        flip.Coins.of([Fraction(-1)])


def test_the_code_path_follows_the_public_bound_only() -> None:
    """``scaled`` picks the int64 or the exact-conversion path from the public bound, never
    from the numerators; both give the same thresholds, and a numerator above the bound is
    refused (it would mean the bound was not a bound)."""
    scale = Fraction(3, 7)
    ks = [0, 1, 5, 40, 150]
    fast = flip.Coins.scaled(scale, ks, 200)
    slow = flip.Coins.scaled(scale, ks, 2**64)
    for a, b in ((fast.lo, slow.lo), (fast.hi, slow.hi)):  # equal up to ĝ's last ulps
        assert all(abs(int(x) - int(y)) <= max(int(x), 1) * 2.0**-55 + 1
                   for x, y in zip(a, b, strict=True))
    assert slow.gamma(3) == fast.gamma(3) == Fraction(120, 7)
    with pytest.raises(ValueError):
        flip.Coins.scaled(scale, ks, 100)
