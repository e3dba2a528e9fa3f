"""The pivot interval for a ratio of noisy totals, against the exact law of its pivot."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import sampling
from mechanisms.dp import ratio
from mechanisms.dp.vectors import VectorNoise


def _pmf(noise: VectorNoise, k: np.ndarray) -> np.ndarray:
    if noise.kind == "discrete_gaussian":
        return sampling.discrete_gaussian_pmf(noise.scale, k)
    p = math.exp(-1.0 / noise.scale)
    return (1 - p) / (1 + p) * p ** np.abs(k)


def _coverage(count: VectorNoise, total: VectorNoise, g: float, mu: float, q: float) -> float:
    """P(|g·Z_s − μ·Z_c| <= q) by summing both pmfs over ±60 scales (the rest < 1e-20)."""
    kc = np.arange(-60 * math.ceil(count.scale) - 5, 60 * math.ceil(count.scale) + 6)
    ks = np.arange(-60 * math.ceil(total.scale) - 5, 60 * math.ceil(total.scale) + 6)
    w = np.abs(g * ks[None, :] - mu * kc[:, None]) <= q
    return float(_pmf(count, kc) @ w @ _pmf(total, ks))


@pytest.mark.parametrize("kind", ["discrete_laplace", "discrete_gaussian"])
def test_each_piece_quantile_covers_every_mean_in_it(kind: str) -> None:
    """At the pieces' edges and midpoints the exact coverage is >= the level, and the
    pieces' quantile is close to the exact one (the pivot is not a loose bound)."""
    count, total = VectorNoise(kind, 2.0), VectorNoise(kind, 3.0)
    g, lo, hi = 0.5, -1.0, 4.0
    out = ratio.quantiles(count, total, g, lo, hi, 0.95)
    assert out is not None
    edges, q = out
    for j in range(0, ratio.SEGMENTS, 7):
        for mu in (edges[j], (edges[j] + edges[j + 1]) / 2, edges[j + 1]):
            assert _coverage(count, total, g, float(mu), float(q[j])) >= 0.95
        worst = max(abs(edges[j]), abs(edges[j + 1]))
        # a tenth narrower misses the level at the piece's end of larger |μ|
        assert _coverage(count, total, g, float(worst), 0.9 * float(q[j])) < 0.95


@settings(max_examples=200, deadline=None)
@given(st.integers(-50, 50).map(float), st.floats(-500, 500), st.floats(0, 3))
def test_interval_is_the_hull_of_the_accepted_means(c: float, s: float, slack: float) -> None:
    edges = np.linspace(-1.0, 4.0, 9)
    q = np.linspace(2.0, 9.0, 8)
    low, high = ratio.interval(c, s, edges, q, slack)
    mus = np.linspace(-1.0, 4.0, 4001)
    piece = np.minimum(np.searchsorted(edges, mus, side="right") - 1, 7)
    accepted = mus[np.abs(s - mus * c) <= q[piece] + slack]
    if accepted.size == 0:
        return
    assert low <= accepted.min() + 1e-9 and accepted.max() - 1e-9 <= high
    assert -1.0 <= low <= high <= 4.0


def test_too_wide_count_noise_keeps_the_box() -> None:
    wide = VectorNoise("discrete_laplace", float(ratio.MAX_SUPPORT))
    assert ratio.quantiles(wide, VectorNoise("discrete_laplace", 1500.0), 1.0, 0.0, 1.0,
                           0.95) is None
