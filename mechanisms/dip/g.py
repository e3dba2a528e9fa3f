"""G, the CDF of Unif(0,1) + Laplace(0, b), and its discrete analogue G_K.

DIP adds Laplace noise to a value u in [0, 1] and maps the sum back to
[0, 1] with G, so that G(u + e) is uniform whenever u is (spec §3.1). The
closed form loses everything to cancellation for large b and to overflow
for small b, so the middle branch is written with ``expm1`` and the upper
tail is taken from the symmetry G(x) + G(1 − x) = 1, which keeps 1 − G(x)
accurate where G(x) rounds to 1.

G_K is the CDF of k + D for k uniform on {1..K} and D two-sided geometric
with P(D = d) ∝ α^|d| (spec §7.8): the law of the integer the exact
(discrete) variant of the noise step releases. It has the same symmetry,
G_K(w) + G_K(K − w) = 1, and is evaluated the same way.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize

FloatArray = NDArray[np.float64]


def _scale(b: float) -> float:
    b = float(b)
    if not (math.isfinite(b) and b > 0.0):
        raise ValueError("the Laplace scale b must be positive and finite")
    return b


def _g_lower(x: FloatArray, b: float) -> FloatArray:
    """G(x) for x <= 1/2, where it is at most 1/2 and nothing overflows."""
    c = -math.expm1(-1.0 / b)  # 1 - e^{-1/b}, exact for large b
    out = np.empty_like(x)
    neg = x < 0.0
    with np.errstate(under="ignore"):
        out[neg] = 0.5 * b * np.exp(x[neg] / b) * c
        xm = x[~neg]
        # (b/2)(e^{-x/b} - e^{(x-1)/b}) = -(b/2) e^{-x/b} expm1((2x-1)/b): no cancellation,
        # and (2x-1)/b <= 0 here, so expm1 stays in [-1, 0]
        out[~neg] = xm - 0.5 * b * np.exp(-xm / b) * np.expm1((2.0 * xm - 1.0) / b)
    return out


def g_cdf(x: ArrayLike, b: float) -> FloatArray:
    """G(x) = P(U + e <= x), U ~ Unif(0, 1), e ~ Laplace(0, b); vectorised and stable.

    The spec's three branches, evaluated on the lower half only; the upper
    half comes from G(x) = 1 − G(1 − x), so no branch ever multiplies an
    underflowed exponential by an overflowed one (small b) or subtracts
    nearly equal terms (large b).
    """
    b = _scale(b)
    x = np.asarray(x, dtype=np.float64)
    lower = x <= 0.5
    out = _g_lower(np.where(lower, x, 1.0 - x), b)
    return np.where(lower, out, 1.0 - out)


def g_sf(x: ArrayLike, b: float) -> FloatArray:
    """1 − G(x), accurate in the upper tail (equal to G(1 − x) by symmetry)."""
    b = _scale(b)
    x = np.asarray(x, dtype=np.float64)
    upper = x >= 0.5
    out = _g_lower(np.where(upper, 1.0 - x, x), b)
    return np.where(upper, out, 1.0 - out)


def g_pdf(x: ArrayLike, b: float) -> FloatArray:
    """G'(x), the density of U + e: P(x − 1 <= e <= x)."""
    b = _scale(b)
    x = np.asarray(x, dtype=np.float64)
    c = -math.expm1(-1.0 / b)
    with np.errstate(under="ignore", over="ignore"):
        tails = 0.5 * np.exp(-np.maximum(-x, x - 1.0) / b) * c
        inside = 1.0 - 0.5 * np.exp(-x / b) - 0.5 * np.exp((x - 1.0) / b)
    return np.where((x < 0.0) | (x > 1.0), tails, inside)


def g_ppf(y: ArrayLike, b: float) -> FloatArray:
    """G^{-1}(y) for y in (0, 1): closed form in the tails, brentq on [0, 1].

    DIP itself never inverts G; exact privacy-loss computations do.
    """
    b = _scale(b)
    y = np.asarray(y, dtype=np.float64)
    if np.any((y <= 0.0) | (y >= 1.0)):
        raise ValueError("g_ppf needs 0 < y < 1")
    c = -math.expm1(-1.0 / b)
    g0 = 0.5 * b * c  # G(0) = 1 - G(1)
    out = np.empty_like(y)
    lo, hi = y < g0, y > 1.0 - g0
    out[lo] = b * np.log(y[lo] / g0)
    out[hi] = 1.0 - b * np.log((1.0 - y[hi]) / g0)
    mid = np.flatnonzero(~(lo | hi))
    flat_y, flat_out = y.reshape(-1), out.reshape(-1)
    for i in mid:
        target = float(flat_y[i])
        flat_out[i] = optimize.brentq(
            lambda t, v=target: float(g_cdf(t, b)) - v, 0.0, 1.0, xtol=1e-15, rtol=1e-15
        )
    return out


# --------------------------------------------------------------------------- discrete G_K


def _k_alpha(k: int, a: float) -> tuple[int, float]:
    if k < 1:
        raise ValueError("the resolution K must be a positive integer")
    if not (math.isfinite(a) and a > 0.0):
        raise ValueError("the decay a = -log(alpha) must be positive and finite")
    return int(k), float(a)


def _gk_lower(w: FloatArray, k: int, a: float) -> FloatArray:
    """G_K(w) for w <= K/2 (the lower half, where it is at most 1/2)."""
    alpha = math.exp(-a)
    one_minus_alpha2 = -math.expm1(-2.0 * a)
    out = np.empty_like(w)
    neg = w <= 0.0
    with np.errstate(under="ignore"):
        # w <= 0: (1/K) Σ_{t=1-w}^{K-w} α^t/(1+α) = α^{1-w}(1-α^K) / (K(1-α²))
        out[neg] = np.exp(-a * (1.0 - w[neg])) * (-math.expm1(-a * k) / (k * one_minus_alpha2))
        wp = w[~neg]
        # 0 <= w <= K/2: (w + α(α^w - α^{K-w})/(1-α²)) / K, the difference via expm1
        out[~neg] = (
            wp - alpha * np.exp(-a * wp) * np.expm1(-a * (k - 2.0 * wp)) / one_minus_alpha2
        ) / k
    return out


def gk_cdf(w: ArrayLike, k: int, a: float) -> FloatArray:
    """G_K(w) = P(k' + D <= w), k' ~ Unif{1..K}, P(D = d) ∝ e^{-a|d|} (w integer-valued)."""
    k, a = _k_alpha(k, a)
    w = np.asarray(w, dtype=np.float64)
    lower = w <= k / 2.0
    out = _gk_lower(np.where(lower, w, k - w), k, a)
    return np.where(lower, out, 1.0 - out)


def gk_sf(w: ArrayLike, k: int, a: float) -> FloatArray:
    """1 − G_K(w) = G_K(K − w), accurate in the upper tail."""
    k, a = _k_alpha(k, a)
    return gk_cdf(k - np.asarray(w, dtype=np.float64), k, a)


def gk_pmf(w: ArrayLike, k: int, a: float) -> FloatArray:
    """P(k' + D = w) = P(w − K <= D <= w − 1) / K, symmetric about (K + 1)/2."""
    k, a = _k_alpha(k, a)
    w = np.asarray(w, dtype=np.float64)
    r = np.where(w <= (k + 1) / 2.0, w, k + 1.0 - w)  # reflect into the lower half
    alpha = math.exp(-a)
    norm = (1.0 + alpha) * k
    out = np.empty_like(r)
    neg = r <= 0.0
    with np.errstate(under="ignore"):
        out[neg] = np.exp(-a * (1.0 - r[neg])) * (-math.expm1(-a * k)) / norm
        rp = r[~neg]
        # 1 - (α^r + α^{K+1-r})/(1+α) = ((1-α^r) + α(1-α^{K-r}))/(1+α): no cancellation
        out[~neg] = (-np.expm1(-a * rp) - alpha * np.expm1(-a * (k - rp))) / norm
    return out
