"""Asymptotic covariances of the estimators (Theorems 3 and 4), from the design and w.

They give standard errors before any data exist (accuracy statements under
a prior) and the "LIM" targets of Table III: E[n‖ŵ−w‖²] → trace(Σ). All
are sums over the support of weighted Gram matrices Σ_a μ_a f(L(a)) 1_a1_aᵀ;
for the uniform design under the uniform prior L(a) = |a|/p, so the sums
collapse to size classes and hold for any p ≤ 63.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import bitmask
from mechanisms.subset.design import Design, DesignError, uniform_support_size

Weight = Callable[[NDArray[np.float64]], NDArray[np.float64]]


def reparam_matrix(p: int) -> NDArray[np.float64]:
    """B = (I_{p−1}, −1)ᵀ: w = α_0 + Bθ with θ the first p − 1 coordinates."""
    return np.vstack([np.eye(p - 1), -np.ones((1, p - 1))])


def is_flat(w: ArrayLike) -> bool:
    values = np.asarray(w, float)
    return bool(np.allclose(values, 1.0 / len(values), rtol=0, atol=1e-15))


def weighted_gram(design: Design, w: ArrayLike, f: Weight) -> NDArray[np.float64]:
    """Σ_a μ_a f(L(a)) 1_a 1_aᵀ with L(a) = 1_aᵀw."""
    w = np.asarray(w, float)
    if design.enumerable:
        masks, mu = design.law()
        rows = bitmask.indicators(masks, design.p)
        weights = mu * f(rows @ w)
        result: NDArray[np.float64] = rows.T @ (weights[:, None] * rows)
        return result
    if design.is_uniform and is_flat(w):
        return size_class_gram(design.p, f)
    raise DesignError("p", "this needs an enumerable design (or the uniform design under the"
                           " uniform prior)")


def size_class_gram(p: int, f: Weight) -> NDArray[np.float64]:
    """``weighted_gram`` of the uniform design under the uniform prior, L(a) = |a|/p.

    Subsets of size s holding j: C(p−1, s−1); holding i ≠ j: C(p−2, s−2);
    each has μ = 2/(2^p − 2p − 2).
    """
    sizes = np.arange(2, p - 1, dtype=np.float64)
    values = f(sizes / p)
    total = uniform_support_size(p)
    diag = sum(2.0 * math.comb(p - 1, int(s) - 1) / total * float(v)
               for s, v in zip(sizes, values, strict=True))
    off = sum(2.0 * math.comb(p - 2, int(s) - 2) / total * float(v)
              for s, v in zip(sizes, values, strict=True))
    result: NDArray[np.float64] = (diag - off) * np.eye(p) + off * np.ones((p, p))
    return result


def fisher_information(design: Design, w: ArrayLike) -> NDArray[np.float64]:
    """Per-observation I(θ) = Σ_a (μ_a/L(a)) Bᵀ1_a1_aᵀB."""
    b = reparam_matrix(design.p)
    gram = weighted_gram(design, w, _inverse)
    result: NDArray[np.float64] = b.T @ gram @ b
    return result


def mle_covariance(design: Design, w: ArrayLike) -> NDArray[np.float64]:
    """Limit covariance of √n(ŵ_MLE − w): B I(θ)⁻¹ Bᵀ (also the one-step estimator's)."""
    b = reparam_matrix(design.p)
    result: NDArray[np.float64] = b @ np.linalg.inv(fisher_information(design, w)) @ b.T
    return result


def indicator_covariance(design: Design, w: ArrayLike) -> NDArray[np.float64]:
    """C = Cov(1_A) = H − γγᵀ with H = Σ_a μ_a L(a) 1_a1_aᵀ and γ = Q w."""
    gamma = design.Q @ np.asarray(w, float)
    h = weighted_gram(design, w, _identity)
    result: NDArray[np.float64] = h - np.outer(gamma, gamma)
    return result


def mom_covariance(design: Design, w: ArrayLike) -> NDArray[np.float64]:
    """Limit covariance of √n(Q⁻¹γ̂ − w): Q⁻¹ C Q⁻¹ (Theorem 4)."""
    q_inv = np.linalg.inv(design.Q)
    result: NDArray[np.float64] = q_inv @ indicator_covariance(design, w) @ q_inv
    return result


def mom_closed_covariance(design: Design, w: ArrayLike) -> NDArray[np.float64]:
    """Limit covariance of the uniform closed form (r γ̂ − 1)/(r − 1): (r/(r−1))² C."""
    r = float(design.r_p)
    result: NDArray[np.float64] = (r / (r - 1.0)) ** 2 * indicator_covariance(design, w)
    return result


def dummy_mom_covariance(design: Design, w: ArrayLike, alpha: float) -> NDArray[np.float64]:
    """MoM with dummy share α: Q⁻¹ C_α Q⁻¹ / (1−2α)², C_α the mixture's indicator covariance.

    Real records (share 1−2α) follow the design; dummy records (2α) carry
    Ã ~ ν with E[1_Ã1_Ãᵀ] = Q/2 for a complement-symmetric ν. So
    H_α = (1−2α)H + αQ and γ_α = (1−2α)Qw + α·1.
    """
    w = np.asarray(w, float)
    q = design.Q
    h = (1.0 - 2.0 * alpha) * weighted_gram(design, w, _identity) + alpha * q
    gamma = (1.0 - 2.0 * alpha) * (q @ w) + alpha
    q_inv = np.linalg.inv(q)
    result: NDArray[np.float64] = (
        q_inv @ (h - np.outer(gamma, gamma)) @ q_inv / (1.0 - 2.0 * alpha) ** 2
    )
    return result


def sample_covariance(w: ArrayLike) -> NDArray[np.float64]:
    """Non-private baseline: the multinomial covariance diag(w) − wwᵀ."""
    w = np.asarray(w, float)
    result: NDArray[np.float64] = np.diag(w) - np.outer(w, w)
    return result


def _inverse(values: NDArray[np.float64]) -> NDArray[np.float64]:
    result: NDArray[np.float64] = 1.0 / values
    return result


def _identity(values: NDArray[np.float64]) -> NDArray[np.float64]:
    return values
