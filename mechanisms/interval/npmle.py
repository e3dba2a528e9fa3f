"""Nonparametric MLE of F_Y from released ranges (spec §3.3).

The log-likelihood ψ(F) = Σ_j w_j log F(S_j) depends on F only through the
masses p_k of the elementary cells between sorted range endpoints, and only
Turnbull's innermost cells (a left endpoint followed directly by a right
endpoint) can carry mass. Ranges are unions of pieces; in cell-index space a
piece is a contiguous block, so A·p and Aᵀ·v cost O(n + K) by cumulative
sums — no n × K incidence matrix is ever built.

Solvers:
* ``cnm`` (default): Wang's constrained Newton method with support reduction
  (Wang 2007, JRSS-B): add the local maxima of the gradient, solve the
  quadratic model by NNLS on the support, Armijo line search. The support's
  Gram matrix uses the block structure (O(n + k²) for one-piece ranges).
  Converges superlinearly to the KKT certificate.
* ``em``: Turnbull self-consistency with SQUAREM acceleration (Varadhan &
  Roland 2008), for comparison; sub-linear near the optimum.
* ``pava``: Case-I (current status) data, exactly: isotonic regression of δ
  on sorted anchors (Groeneboom & Wellner 1992).

Optimality certificate: d_k = W⁻¹ Σ_j w_j A_jk / (A p)_j <= 1 for every
candidate cell (= 1 on the support); ψ(p*) − ψ(p) <= W·(max_k d_k − 1) by
concavity, so ``kkt_gap`` = max_k d_k − 1 bounds the average log-likelihood
shortfall.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import linalg, optimize, special

from mechanisms.interval.ranges import FloatArray, Pieces

IntArray = NDArray[np.int64]
CONVENTIONS = ("right", "left", "midpoint")
#: ``auto`` uses CNM when a hitting set of the ranges has at most this many cells
AUTO_CNM_SUPPORT = 300


@dataclass(frozen=True)
class IntervalData:
    """Ranges reduced to Turnbull candidate cells; pieces are blocks [start, stop)."""

    #: candidate cells (left, right], floats (±inf allowed)
    cell_left: FloatArray
    cell_right: FloatArray
    #: one row per non-empty piece: owning record, first candidate, one past the last
    record: IntArray
    start: IntArray
    stop: IntArray
    weights: FloatArray
    multi: bool  # some record has more than one piece

    @property
    def n(self) -> int:
        return int(self.weights.shape[0])

    @property
    def k(self) -> int:
        return int(self.cell_left.shape[0])

    @classmethod
    def from_pieces(cls, pieces: Pieces, weights: ArrayLike | None = None) -> IntervalData:
        left, right = pieces.half_open()
        n = pieces.n
        rec = np.repeat(np.arange(n), pieces.width).reshape(n, pieces.width)
        ok = ~np.isnan(left) & ~np.isnan(right) & (left < right)
        left, right, rec = left[ok], right[ok], rec[ok]
        if n and not np.all(np.bincount(rec, minlength=n) > 0):
            raise ValueError("every record needs a non-empty range")
        # one sort of all ends gives the bounds and every end's index into them (no
        # binary searches of 10^6 unsorted queries, no isin)
        m = left.shape[0]
        bounds, inverse = np.unique(np.concatenate([left, right]), return_inverse=True)
        inverse = inverse.reshape(-1)
        a, b = inverse[:m], inverse[m:]  # piece covers cells a .. b-1
        # cell k = (bounds[k], bounds[k+1]]; candidate iff left end is a piece start and
        # right end a piece end (Turnbull's innermost intervals)
        is_start = np.zeros(bounds.shape[0], bool)
        is_start[a] = True
        is_end = np.zeros(bounds.shape[0], bool)
        is_end[b] = True
        cand_mask = is_start[:-1] & is_end[1:]
        cand = np.nonzero(cand_mask)[0]
        # searchsorted(cand, x) = #candidates below x: a gather on a cumulative count
        below = np.concatenate([[0], np.cumsum(cand_mask)])
        start = below[a].astype(np.int64)
        stop = below[b].astype(np.int64)
        w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
        return cls(bounds[cand], bounds[cand + 1], rec.astype(np.int64), start, stop, w,
                   bool(np.any(np.bincount(rec, minlength=n) > 1)))

    # -- linear algebra on the implicit incidence matrix

    def mass(self, p: FloatArray) -> FloatArray:
        """(A p)_j: the mass each record's range gets under cell masses p."""
        cum = np.concatenate([[0.0], np.cumsum(p)])
        piece: FloatArray = cum[self.stop] - cum[self.start]
        if not self.multi:
            return piece
        out: FloatArray = np.bincount(self.record, piece, minlength=self.n).astype(np.float64)
        return out

    def gradient(self, ap: FloatArray) -> FloatArray:
        """d_k = W⁻¹ Σ_j w_j A_jk / (A p)_j for every candidate cell."""
        v = self.weights / ap
        vp = v[self.record]
        diff = np.bincount(self.start, vp, minlength=self.k + 1) - np.bincount(
            self.stop, vp, minlength=self.k + 1)
        out: FloatArray = np.cumsum(diff)[: self.k] / self.weights.sum()
        return out

    def loglik(self, p: FloatArray) -> float:
        ap = self.mass(p)
        with np.errstate(divide="ignore"):
            return float(np.dot(self.weights, np.log(ap)))

    def gram(self, support: IntArray, ap: FloatArray) -> FloatArray:
        """G = Σ_j w_j s_j s_jᵀ with s_j = A_{j,S}/(A p)_j, for sorted support S."""
        k = support.shape[0]
        v = self.weights / (ap * ap)
        # rank[x] = #support cells < x, so that alpha = searchsorted(support, start): a
        # gather instead of n binary searches (the bulk of a CNM step at n = 10^6)
        member = np.zeros(self.k, np.int64)
        member[support] = 1
        rank = np.concatenate([[0], np.cumsum(member)])
        alpha = rank[self.start]
        beta = rank[self.stop]
        if not self.multi:
            # record covers support indices alpha..beta-1: G[i, i'] = Σ v 1{alpha <= i, beta > i'}
            h = np.bincount(alpha * (k + 1) + beta, v[self.record],
                            minlength=(k + 1) ** 2).reshape(k + 1, k + 1)
            t = np.cumsum(np.cumsum(h[:, ::-1], axis=1)[:, ::-1], axis=0)
            upper = np.triu(t[:k, 1:]).astype(np.float64)
            gram: FloatArray = upper + np.triu(upper, 1).T
            return gram
        d = np.zeros((self.n, k + 1))
        np.add.at(d, (self.record, alpha), 1.0)
        np.add.at(d, (self.record, beta), -1.0)
        m = (np.cumsum(d, axis=1)[:, :k] > 0.5).astype(np.float64)
        out: FloatArray = (m * v[:, None]).T @ m
        return out


@dataclass(frozen=True)
class NPMLEResult:
    """Cell masses of the NPMLE plus convergence diagnostics."""

    cell_left: FloatArray
    cell_right: FloatArray
    mass: FloatArray
    loglik: float
    iterations: int
    kkt_gap: float
    converged: bool
    method: str
    n: int
    history: list[float] = field(default_factory=list)

    def support(self, threshold: float = 0.0) -> NDArray[np.bool_]:
        return self.mass > threshold

    def cdf(self, x: ArrayLike) -> FloatArray:
        """F̂(x) with each cell's mass at its right end (the spec's convention)."""
        cum = np.concatenate([[0.0], np.cumsum(self.mass)])
        idx = np.searchsorted(self.cell_right, np.asarray(x, dtype=np.float64), side="right")
        out: FloatArray = np.clip(cum[idx], 0.0, 1.0)
        return out

    def cdf_bounds(self, x: ArrayLike) -> tuple[FloatArray, FloatArray]:
        """Envelope of all NPMLEs: mass at right ends (lower) or just past left ends (upper)."""
        x = np.asarray(x, dtype=np.float64)
        cum = np.concatenate([[0.0], np.cumsum(self.mass)])
        upper = cum[np.searchsorted(self.cell_left, x, side="left")]
        return self.cdf(x), np.clip(upper, 0.0, 1.0)

    def atoms(
        self, convention: str = "right", support: tuple[float, float] = (-math.inf, math.inf)
    ) -> tuple[FloatArray, list[str]]:
        """Where each cell's mass sits for functionals; infinite ends use ``support``."""
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}")
        warnings: list[str] = []
        lo = np.maximum(self.cell_left, support[0])
        hi = np.minimum(self.cell_right, support[1])
        pos = self.mass > 0
        if convention == "right":
            x = hi.copy()
            bad = pos & ~np.isfinite(x)
            x[bad] = lo[bad]
        elif convention == "left":
            x = lo.copy()
            bad = pos & ~np.isfinite(x)
            x[bad] = hi[bad]
        else:
            x = 0.5 * (lo + hi)
            bad = pos & ~np.isfinite(x)
            x[bad] = np.where(np.isfinite(lo[bad]), lo[bad], hi[bad])
        if np.any(bad):
            warnings.append(
                f"{float(self.mass[bad].sum()):.4g} of the mass is in unbounded cells and was"
                " placed at their finite end; declare bounds for a principled convention")
        return np.where(pos, x, 0.0), warnings

    def functional(
        self, phi: Callable[[FloatArray], FloatArray], convention: str = "right",
        support: tuple[float, float] = (-math.inf, math.inf),
    ) -> tuple[float, list[str]]:
        """Plug-in ∫ φ dF̂ (Example 1)."""
        x, warnings = self.atoms(convention, support)
        pos = self.mass > 0
        return float(np.dot(self.mass[pos], phi(x[pos]))), warnings

    def tail_mass(self) -> tuple[float, float]:
        """Mass in cells unbounded below / above."""
        return (float(self.mass[np.isneginf(self.cell_left)].sum()),
                float(self.mass[np.isposinf(self.cell_right)].sum()))


# --------------------------------------------------------------------------- solvers


def npmle(
    pieces: Pieces, method: str = "auto", tol: float = 1e-6, max_iter: int | None = None,
    weights: ArrayLike | None = None,
) -> NPMLEResult:
    """NPMLE of F_Y from ranges (rows of ``pieces``; exact values as point pieces).

    ``auto`` takes CNM unless the ranges need many support cells from the start (many
    exact values: each is its own atom), where the dense Newton step costs O(k³) and
    SQUAREM-accelerated EM is the faster route to the same certificate.
    """
    data = IntervalData.from_pieces(pieces, weights)
    if data.n == 0:
        raise ValueError("no ranges to estimate from")
    support = None
    if method == "auto":
        support = _initial_support(data)
        method = "cnm" if support.size <= AUTO_CNM_SUPPORT else "em"
    if method == "cnm":
        return _cnm(data, tol, max_iter or 500, support)
    if method == "em":
        return _em(data, tol, max_iter or 100_000)
    raise ValueError(f"unknown method {method!r} (pava needs npmle_case1)")


def _result(data: IntervalData, p: FloatArray, iterations: int, method: str, tol: float,
            history: list[float]) -> NPMLEResult:
    ap = data.mass(p)
    gap = float(np.max(data.gradient(ap)) - 1.0)
    return NPMLEResult(data.cell_left, data.cell_right, p, data.loglik(p), iterations, gap,
                       gap <= tol, method, data.n, history)


def _initial_support(data: IntervalData) -> IntArray:
    """A small set of cells hitting every range (greedy stabbing by right end)."""
    if not data.multi:
        return _stab_single(data)
    return _stab_general(data)


def _stab_general(data: IntervalData) -> IntArray:
    """Greedy stabbing by right end, one record at a time (multi-piece ranges)."""
    order = np.argsort(data.stop, kind="stable")
    hit = np.zeros(data.n, bool)
    chosen: list[int] = []
    last = -1
    for j in order:
        if data.start[j] <= last < data.stop[j]:
            hit[data.record[j]] = True
            continue
        if hit[data.record[j]]:
            continue
        last = int(data.stop[j]) - 1
        chosen.append(last)
        hit[data.record[j]] = True
    support = np.unique(np.asarray(chosen, dtype=np.int64))
    # multi-piece records may be hit only by a later stab: verify and patch
    p = np.zeros(data.k)
    p[support] = 1.0
    miss = data.mass(p) <= 0
    if np.any(miss):
        extra = data.stop[np.isin(data.record, np.nonzero(miss)[0])] - 1
        support = np.union1d(support, extra)
    return support


def _stab_single(data: IntervalData) -> IntArray:
    """Greedy stabbing of one-piece ranges without a loop over records.

    Sorted by right end, the greedy stabs the first range not hit at its last cell; a
    range is hit by the previous stab c iff its first cell is <= c. So the next stab is
    (the smallest stop among ranges starting after c) − 1: a suffix minimum over start
    cells, and the loop runs once per stab, not once per record.
    """
    k = data.k
    first_stop = np.full(k + 1, k + 1, np.int64)
    np.minimum.at(first_stop, data.start, data.stop)
    suffix = np.minimum.accumulate(first_stop[::-1])[::-1]
    chosen: list[int] = []
    last = -1
    while last + 1 <= k and suffix[last + 1] <= k:
        last = int(suffix[last + 1]) - 1
        chosen.append(last)
    return np.asarray(chosen, dtype=np.int64)


def _cnm(data: IntervalData, tol: float, max_iter: int,
         support: IntArray | None = None) -> NPMLEResult:
    """Newton steps on L(p) = ψ(p) − W·Σp over p >= 0, whose maximiser has Σp = 1."""
    w_total = float(data.weights.sum())
    if support is None:
        support = _initial_support(data)
    p = np.zeros(data.k)
    p[support] = 1.0 / support.size
    ap = data.mass(p)
    ll = float(np.dot(data.weights, np.log(ap)))
    history = [ll]
    iterations = 0
    stalled = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 - reported below
        g = data.gradient(ap)
        if g.max() - 1.0 <= tol:
            break
        if len(history) > 1 and history[-1] - history[-2] <= 1e-13 * max(1.0, abs(ll)):
            stalled += 1
            if stalled >= 3:  # at the float floor of ψ: the certificate is what it is
                break
        else:
            stalled = 0
        support = np.union1d(support, _new_points(g, support))
        b = w_total * g[support]
        q = _qp(data.gram(support, ap), 2.0 * b - w_total)
        direction = np.zeros(data.k)
        direction[support] = q
        direction -= p
        slope = float(b @ q) - w_total * float(q.sum())
        if slope <= 1e-12 * w_total:
            # the Newton model sees no ascent (NNLS at its precision floor): take a
            # vertex-direction step towards the steepest cell instead (Fedorov/VDM)
            p, ap, ll = _vertex_step(data, p, ap, int(np.argmax(g)))
            history.append(ll)
            support = np.union1d(support[p[support] > 0], [int(np.argmax(g))])
            continue
        alpha = 1.0
        lagrangian = ll - w_total
        while True:
            trial = p + alpha * direction
            trial[trial < 0] = 0.0
            ap_t = data.mass(trial)
            if np.all(ap_t > 0):
                value = float(np.dot(data.weights, np.log(ap_t))) - w_total * float(trial.sum())
            else:
                value = -np.inf
            if value >= lagrangian + 1e-4 * alpha * slope or alpha < 1e-10:
                break
            alpha *= 0.5
        if value < lagrangian:
            break
        p = trial / trial.sum()
        ap = data.mass(p)
        ll = float(np.dot(data.weights, np.log(ap)))
        history.append(ll)
        support = support[p[support] > 0]
    return _result(data, p, iterations, "cnm", tol, history)


def _vertex_step(data: IntervalData, p: FloatArray, ap: FloatArray, k: int
                 ) -> tuple[FloatArray, FloatArray, float]:
    """Move mass towards cell k: maximise ψ((1 − α)p + α e_k) over α in [0, 1]."""
    e = np.zeros(data.k)
    e[k] = 1.0
    ak = data.mass(e)  # A_{·k}: 1 where record j's range holds cell k
    diff = ak - ap

    def slope(alpha: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.dot(data.weights, diff / (ap + alpha * diff)))

    lo, hi = 0.0, 1.0
    if slope(1.0) > 0:
        lo = 1.0
    else:
        for _ in range(60):  # ψ is concave in α: bisect its derivative
            mid = 0.5 * (lo + hi)
            if slope(mid) > 0:
                lo = mid
            else:
                hi = mid
    new = (1.0 - lo) * p
    new[k] += lo
    new_ap = data.mass(new)
    return new, new_ap, float(np.dot(data.weights, np.log(new_ap)))


def _new_points(g: FloatArray, support: IntArray) -> IntArray:
    """Local maxima of the gradient between consecutive support cells, where it exceeds 1."""
    cells = np.setdiff1d(np.arange(g.shape[0]), support, assume_unique=True)
    cells = cells[g[cells] > 1.0]
    if cells.size == 0:
        return cells
    segment = np.searchsorted(support, cells)
    order = np.lexsort((-g[cells], segment))
    first = np.concatenate([[True], segment[order][1:] != segment[order][:-1]])
    out: IntArray = cells[order][first]
    return out


def _qp(gram: FloatArray, linear: FloatArray) -> FloatArray:
    """argmin ½qᵀGq − linearᵀq over q >= 0 (the Newton model of the CNM step), via NNLS."""
    k = linear.shape[0]
    g2 = gram.copy()
    g2[np.diag_indices(k)] += 1e-12 * max(float(np.trace(g2)) / k, 1e-300)
    try:
        r = linalg.cholesky(g2, lower=False)
    except linalg.LinAlgError:
        vals, vecs = linalg.eigh(g2)
        r = (vecs * np.sqrt(np.clip(vals, 1e-12 * vals.max(), None))).T
    c = linalg.solve_triangular(r, linear, trans="T", lower=False)
    q, _ = optimize.nnls(r, c, maxiter=50 * k + 100)
    out: FloatArray = q
    return out


def _em(data: IntervalData, tol: float, max_iter: int) -> NPMLEResult:
    """Self-consistency iterations p <- p·d(p), accelerated by SQUAREM (SqS3)."""
    p = np.full(data.k, 1.0 / data.k)

    def step(x: FloatArray) -> FloatArray:
        y = x * data.gradient(data.mass(x))
        return y / y.sum()

    ll = data.loglik(p)
    history = [ll]
    iterations = 0
    while iterations < max_iter:
        p1 = step(p)
        p2 = step(p1)
        iterations += 2
        r = p1 - p
        v = p2 - 2 * p1 + p
        nv = float(np.linalg.norm(v))
        alpha = -float(np.linalg.norm(r)) / nv if nv > 0 else -1.0
        alpha = min(alpha, -1.0)
        cand = np.clip(p - 2 * alpha * r + alpha * alpha * v, 0.0, None)
        if cand.sum() > 0 and np.all(data.mass(cand) > 0):
            cand = step(cand / cand.sum())
            iterations += 1
            ll_c = data.loglik(cand)
        else:
            ll_c = -np.inf
        ll2 = data.loglik(p2)
        p, ll = (cand, ll_c) if ll_c >= ll2 else (p2, ll2)
        history.append(ll)
        if np.max(data.gradient(data.mass(p))) - 1.0 <= tol:
            break
    return _result(data, p, iterations, "em", tol, history)


# --------------------------------------------------------------------------- Case I


def case1_pieces(u: ArrayLike, delta: ArrayLike) -> Pieces:
    """Case-I ranges (−∞, u] (δ = 1) or (u, ∞) (δ = 0)."""
    u = np.asarray(u, dtype=np.float64)
    d = np.asarray(delta).astype(bool)
    return Pieces.single(np.where(d, -np.inf, u), np.where(d, u, np.inf))


def pava(u: ArrayLike, delta: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """F̂ at the sorted unique anchors: isotonic regression of δ (ties pooled)."""
    u = np.asarray(u, dtype=np.float64)
    d = np.asarray(delta, dtype=np.float64)
    values, inverse = np.unique(u, return_inverse=True)
    counts = np.bincount(inverse).astype(np.float64)
    means = np.bincount(inverse, d) / counts
    fitted = optimize.isotonic_regression(means, weights=counts, increasing=True).x
    return values, np.clip(fitted, 0.0, 1.0)


def npmle_case1(u: ArrayLike, delta: ArrayLike, tol: float = 1e-6) -> NPMLEResult:
    """Exact Case-I NPMLE by PAVA, with the general KKT certificate."""
    u = np.asarray(u, dtype=np.float64)
    d = np.asarray(delta, dtype=np.float64)
    values, fitted = pava(u, d)
    data = IntervalData.from_pieces(case1_pieces(u, d))
    # F̂ at each candidate cell's right end; cells hold the increments
    idx = np.searchsorted(values, data.cell_right, side="right") - 1
    f_right = np.where(idx >= 0, fitted[np.clip(idx, 0, None)], 0.0)
    f_right[np.isposinf(data.cell_right)] = 1.0
    p = np.diff(np.concatenate([[0.0], f_right]))
    p = np.clip(p, 0.0, None)
    p = p / p.sum()
    f_at_u = np.interp(u, values, fitted)
    ll = float(np.sum(special.xlogy(d, f_at_u) + special.xlogy(1 - d, 1 - f_at_u)))
    ap = data.mass(p)
    with np.errstate(divide="ignore"):
        gap = float(np.max(data.gradient(np.maximum(ap, 1e-300))) - 1.0)
    return NPMLEResult(data.cell_left, data.cell_right, p, ll, 1, gap, gap <= tol, "pava",
                       data.n)


def result_summary(res: NPMLEResult, max_cells: int = 100_000) -> dict[str, Any]:
    """JSON-ready description (±∞ as None) of the cells carrying mass."""
    pos = res.mass > 0
    idx = np.nonzero(pos)[0][:max_cells]
    cum = np.cumsum(res.mass)

    def j(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return {
        "cells": [[j(res.cell_left[i]), j(res.cell_right[i])] for i in idx],
        "mass": [float(res.mass[i]) for i in idx],
        "cdf": [float(min(1.0, cum[i])) for i in idx],
        "cdf_convention": "mass at the right end of each cell (F jumps at cell ends)",
        "loglik": res.loglik,
        "iterations": res.iterations,
        "kkt_gap": res.kkt_gap,
        "converged": res.converged,
        "method": res.method,
        "n_used": res.n,
        "candidate_cells": int(res.mass.shape[0]),
    }
