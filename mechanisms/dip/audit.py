"""Exact output laws of DIP for auditing privacy and invariance (no sampling).

For an input whose uniformized value u is uniform on [L_j, R_j] (a discrete
value's PIT interval, or a point when L_j = R_j), and output events
"g in [l_k, r_k]" (e.g. F^←(g) = a_k), ``transition_matrix`` gives
M[j, k] = P(output event k | input j):

* ``continuous``: the paper's step g = G(u + e), e ~ Laplace(0, b), via the
  thresholds G^{-1}(l_k), G^{-1}(r_k) and the closed-form integral of the
  Laplace CDF over u;
* ``discrete``: the step actually run (``noise.NoiseStep``): k = ⌊uK⌋ + 1,
  W = k + D, g the randomized PIT of W, summed exactly over W.

The largest log-ratio of a column over inputs is the mechanism's exact
privacy loss on those events; ``pmf @ M == pmf`` is exact invariance.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.dip.g import g_ppf, gk_cdf, gk_pmf
from mechanisms.dip.noise import NoiseStep

FloatArray = NDArray[np.float64]


def _laplace_cdf(x: FloatArray, b: float) -> FloatArray:
    with np.errstate(over="ignore"):
        return np.where(x < 0, 0.5 * np.exp(x / b), 1.0 - 0.5 * np.exp(-x / b))


def _laplace_cdf_integral(x: FloatArray, b: float) -> FloatArray:
    """Ψ(x) = ∫_{−∞}^x Λ(s) ds for the Laplace(0, b) CDF Λ."""
    with np.errstate(over="ignore"):
        return np.where(x <= 0, 0.5 * b * np.exp(np.minimum(x, 0.0) / b),
                        x + 0.5 * b * np.exp(-np.maximum(x, 0.0) / b))


def _prob_below(t: FloatArray, lo: FloatArray, hi: FloatArray, b: float) -> FloatArray:
    """P(u + e <= t) with u ~ Unif[lo, hi] (a point when lo == hi); t may be ±inf."""
    t, lo, hi = np.broadcast_arrays(t, lo, hi)
    width = hi - lo
    finite = np.isfinite(t)
    tf = np.where(finite, t, 0.0)
    point = _laplace_cdf(tf - lo, b)
    spread = (_laplace_cdf_integral(tf - lo, b) - _laplace_cdf_integral(tf - hi, b)) / np.where(
        width > 0, width, 1.0
    )
    inner = np.where(width > 0, spread, point)
    return np.where(finite, inner, np.where(t > 0, 1.0, 0.0))


def transition_matrix_continuous(
    inputs: ArrayLike, outputs: ArrayLike, b: float
) -> FloatArray:
    """M[j, k] for the continuous Laplace step of scale b.

    ``inputs`` (J, 2): u-intervals [L_j, R_j]; ``outputs`` (K, 2): g-intervals.
    """
    inp = np.asarray(inputs, dtype=np.float64)
    out = np.asarray(outputs, dtype=np.float64)

    def threshold(g: FloatArray) -> FloatArray:
        t = np.full(g.shape, np.inf)
        t[g <= 0.0] = -np.inf
        inner = (g > 0.0) & (g < 1.0)
        t[inner] = g_ppf(g[inner], b)
        return t

    lo_t, hi_t = threshold(out[:, 0]), threshold(out[:, 1])
    below_hi = _prob_below(hi_t[None, :], inp[:, :1], inp[:, 1:], b)
    below_lo = _prob_below(lo_t[None, :], inp[:, :1], inp[:, 1:], b)
    result: FloatArray = np.maximum(below_hi - below_lo, 0.0)
    return result


def transition_matrix_discrete(
    inputs: ArrayLike, outputs: ArrayLike, step: NoiseStep, tail: float = 1e-18
) -> tuple[FloatArray, float]:
    """M[j, k] for the exact discrete step, and a bound on the truncated tail mass."""
    inp = np.asarray(inputs, dtype=np.float64)
    out = np.asarray(outputs, dtype=np.float64)
    k_res, scale = step.resolution, step.scale
    a = 1.0 / scale
    # P(k | j): overlap of [(k-1)/K, k/K) with [L_j, R_j] (a point: the step's own quantizer)
    edges = np.arange(k_res + 1, dtype=np.float64) / k_res
    lo, hi = inp[:, :1], inp[:, 1:]
    overlap = np.clip(np.minimum(edges[None, 1:], hi) - np.maximum(edges[None, :-1], lo), 0, None)
    width = (hi - lo)[:, 0]
    p_k = overlap / np.where(width > 0, width, 1.0)[:, None]
    points = width <= 0
    if np.any(points):
        kk = step.quantize(inp[points, 0])
        p_k[points] = 0.0
        p_k[np.flatnonzero(points), kk - 1] = 1.0
    # P(W = w | k) = (1-α)/(1+α) α^{|w-k|}, w truncated where α^T (both sides) < tail
    span = math.ceil(-math.log(tail) * scale) + 1
    w = np.arange(1 - span, k_res + span + 1, dtype=np.float64)
    d = w[None, :] - np.arange(1, k_res + 1, dtype=np.float64)[:, None]
    norm = -math.expm1(-a) / (1.0 + math.exp(-a))
    p_w = p_k @ (norm * np.exp(-a * np.abs(d)))
    lost = 2.0 * math.exp(-a * span) / (1.0 + math.exp(-a))
    # P(event | W = w): overlap of [G_K(w-1), G_K(w)] with the event's g-interval, / P(W = w)
    g_lo, g_hi = gk_cdf(w - 1.0, k_res, a), gk_cdf(w, k_res, a)
    mass = gk_pmf(w, k_res, a)
    ev = np.clip(
        np.minimum(g_hi[:, None], out[None, :, 1]) - np.maximum(g_lo[:, None], out[None, :, 0]),
        0.0, None,
    ) / np.where(mass > 0, mass, 1.0)[:, None]
    return p_w @ np.clip(ev, 0.0, 1.0), lost


def max_privacy_loss(matrix: ArrayLike) -> float:
    """max over events k and input pairs j, j' of log(M[j, k] / M[j', k]) (events with mass)."""
    m = np.asarray(matrix, dtype=np.float64)
    keep = m.max(axis=0) > 0
    m = m[:, keep]
    if np.any(m <= 0):
        return math.inf
    logs = np.log(m)
    return float(np.max(logs.max(axis=0) - logs.min(axis=0)))


def pit_intervals(pmf: ArrayLike) -> FloatArray:
    """(s, 2) intervals [F(a_k−), F(a_k)] of a discrete law with the given pmf."""
    p = np.asarray(pmf, dtype=np.float64)
    right = np.cumsum(p)
    right[-1] = 1.0
    return np.stack([right - p, right], axis=1)
