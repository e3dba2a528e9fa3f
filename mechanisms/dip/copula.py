"""A DP Gaussian-copula reference for many columns (beyond the paper, spec §7.1(c)).

A joint histogram needs B^p cells, so it stops being usable at a handful of
columns (the noise of empty cells swamps the data). The copula reference
needs p one-dimensional DP histograms and one DP correlation matrix:

* **marginals**: each column's DP histogram (``histogram.dp_histogram``) with
  ε_marg/p, noise of scale 2p/ε_marg per cell (replace-one moves one record
  in every column's histogram: L1 sensitivity 2 per column);
* **dependence**: Spearman correlations of the records' DP-marginal PITs
  u_il = F̂_l(x_il) ∈ [0, 1] (a discrete value at its cell's middle), quantized to
  M = 2^10 levels as odd integers c = 2⌊uM⌋ − (M − 1) ∈ [−(M − 1), M − 1];
  the p(p − 1)/2 sums T_lm = Σ_i c_il c_im are exact integers (float64 BLAS is
  exact below 2^53) and get discrete Laplace noise of scale
  (M − 1)²·p(p − 1)/ε_corr (replace-one moves each sum by at most 2(M − 1)²).
  C = T/(4M²n) estimates Cov(U_l, U_m). For two continuous columns the
  Gaussian copula's r solves C = arcsin(r/2)/(2π) (Spearman's ρ_S = 12C).
  A discrete column is a thresholded latent normal (thresholds Φ^{-1} of
  its DP marginal's cell ends) and its U is uniform inside the cell, which
  attenuates C; r is then the latent correlation whose model C matches the
  noisy one (``latent_correlation``: closed forms with the bivariate normal
  CDF; the posterior mean of r under a uniform prior, given the known noise
  variance, so weakly identified pairs shrink to 0). The matrix is projected to the nearest
  correlation matrix with eigenvalues >= ``EIGEN_FLOOR``.

Both use the same rows, so the reference costs ε_ref = ε_marg + ε_corr
(sequential composition; the PITs use the already-released marginals, which
is post-processing of them). The chain (Rosenblatt) transform is that of the
latent Gaussian model, randomized inside discrete cells (``uniformize``);
the inverse maps back through the Cholesky factor L and each marginal's
quantile. When the records follow the copula, DIP's output does, exactly.

Why a Gaussian copula: it is the smallest model that keeps every pairwise
monotone dependence (what regressions and classifiers on the release use),
its parameters are p marginals and p(p − 1)/2 numbers whose DP noise does
not grow with any bin count, and its conditionals are closed-form, so the
chain costs O(p²) per record. Higher-order interactions are not kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from mechanisms import sampling
from mechanisms.dip.continualize import Continualizer, Continuous, Mixed
from mechanisms.dip.histogram import histogram_counts, histogram_edges, noisy_histogram
from mechanisms.dip.reference import Reference
from mechanisms.dip.univariate import TINY, PiecewiseLinear
from mechanisms.exact import float_up
from mechanisms.statistics import Batch, Partial, Statistic

FloatArray = NDArray[np.float64]
#: quantization of the PITs in the correlation sums
QUANTUM = 2**10
#: smallest eigenvalue kept in the projected correlation matrix
EIGEN_FLOOR = 1e-3
#: PITs are kept this far inside (0, 1) before Φ^{-1} (|z| <= 8.3)
U_EDGE = 2.0**-53
#: rows whose PITs are formed at once (p columns each)
CHUNK_ROWS = 2**14
#: discrete columns with more values than this are treated as continuous in the latent fit
MAX_STEPS = 16
#: latent correlations range over [−R_MAX, R_MAX]
R_MAX = 0.999


#: arguments of the bivariate normal CDF smaller than this in magnitude are taken as 0
_TINY_ARGUMENT = 2.0**-500


def bivariate_normal_cdf(
    h: FloatArray, k: FloatArray, rho: float | FloatArray
) -> FloatArray:
    """Φ2(h, k; ρ) through Owen's T (exact; h, k, ρ broadcast); h, k finite, |ρ| < 1.

    Φ2 = ½Φ(h) + ½Φ(k) − T(h, a_h) − T(k, a_k) − β, a_h = (k − ρh)/(h√(1 − ρ²)),
    a_k = (h − ρk)/(k√(1 − ρ²)), β = ½ unless hk > 0 or (hk = 0 and h + k >= 0).
    """
    h, k, rho = np.broadcast_arrays(np.asarray(h, dtype=np.float64),
                                    np.asarray(k, dtype=np.float64),
                                    np.asarray(rho, dtype=np.float64))
    # |h| below 2^-500 is 0 to within φ(0)·2^-500: snapping it keeps ρh and h√(1 − ρ²) out
    # of the subnormals, where a_h lost its digits (Φ2(5e-324, 5e-324; ½) came out ¼, not ⅓)
    h = np.where(np.abs(h) < _TINY_ARGUMENT, 0.0, h)
    k = np.where(np.abs(k) < _TINY_ARGUMENT, 0.0, k)
    root = np.sqrt(1.0 - rho * rho)
    hh = np.where(h == 0.0, 1e-300, h)
    kk = np.where(k == 0.0, 1e-300, k)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        a_h = (k - rho * h) / (hh * root)
        a_k = (h - rho * k) / (kk * root)
    t_h = np.where(h == 0.0, np.sign(k - rho * h) * 0.25, special.owens_t(h, a_h))
    t_k = np.where(k == 0.0, np.sign(h - rho * k) * 0.25, special.owens_t(k, a_k))
    both_zero = (h == 0.0) & (k == 0.0)
    sign = np.sign(h) * np.sign(k)  # not h·k, which underflows to 0 for tiny h, k
    beta = np.where((sign > 0) | ((sign == 0) & (h + k >= 0)), 0.0, 0.5)
    out = 0.5 * special.ndtr(h) + 0.5 * special.ndtr(k) - t_h - t_k - beta
    out = np.where(both_zero, 0.25 + np.arcsin(rho) / (2.0 * np.pi), out)
    return np.clip(out, 0.0, 1.0)


class Steps:
    """E[U | latent z] of a column: Φ(z) (continuous) or a step function of z (discrete)."""

    def __init__(self, thresholds: FloatArray | None = None,
                 jumps: FloatArray | None = None) -> None:
        self.thresholds = thresholds
        self.jumps = jumps

    @property
    def smooth(self) -> bool:
        return self.thresholds is None

    @classmethod
    def of(cls, marginal: PiecewiseLinear) -> Steps:
        """A discrete column's cell ends in u (its DP marginal) give thresholds and jumps."""
        cont = marginal.continualizer
        count = cont.max_bins()
        if isinstance(cont, Continuous | Mixed) or count is None or count > MAX_STEPS:
            return cls()
        edges = cont.edges(count)
        cdf = np.clip(marginal.cdf(edges), 0.0, 1.0)
        mids = (cdf[:-1] + cdf[1:]) / 2.0
        return cls(_normal_scores(cdf[1:-1]), np.diff(mids))


def model_covariance(a: Steps, b: Steps, r: float) -> float:
    """Cov(E[U_a | Z_a], E[U_b | Z_b]) for latent normals of correlation r."""
    return float(model_covariances(a, b, np.array([r]))[0])


def model_covariances(a: Steps, b: Steps, rs: FloatArray) -> FloatArray:
    """``model_covariance`` at every r of ``rs`` (one vectorized pass)."""
    r = np.asarray(rs, dtype=np.float64)
    if a.smooth and b.smooth:
        out: FloatArray = np.arcsin(r / 2.0) / (2.0 * np.pi)
        return out
    if a.smooth or b.smooth:
        steps = b if a.smooth else a
        assert steps.thresholds is not None and steps.jumps is not None
        s = -steps.thresholds[None, :]  # Cov(Φ(Z1), 1{Z2 > t}) = Φ2(0, −t; r/√2) − Φ(−t)/2
        terms = bivariate_normal_cdf(np.zeros_like(s), s, r[:, None] / math.sqrt(2.0))
        return np.asarray((terms - 0.5 * special.ndtr(s)) @ steps.jumps, dtype=np.float64)
    assert a.thresholds is not None and a.jumps is not None
    assert b.thresholds is not None and b.jumps is not None
    h = -a.thresholds[None, :, None]
    k = -b.thresholds[None, None, :]
    joint = bivariate_normal_cdf(h, k, r[:, None, None]) - special.ndtr(h) * special.ndtr(k)
    return np.asarray(np.einsum("i,rij,j->r", a.jumps, joint, b.jumps), dtype=np.float64)


#: latent correlations at which the model covariance is computed exactly (denser towards
#: ±1, where it bends most); work per pair: 25·(steps_a − 1)(steps_b − 1) Owen's T pairs
R_NODES = R_MAX * np.sin(np.linspace(-np.pi / 2, np.pi / 2, 25))
#: and the fine grid the posterior is taken on (covariances interpolated linearly)
R_FINE = np.linspace(-R_MAX, R_MAX, 2001)


def latent_correlation(a: Steps, b: Steps, covariance: float, sd: float) -> float:
    """Posterior mean of the latent r under a uniform prior, given the noisy covariance.

    The covariance carries known noise (the DP noise plus a public bound on
    sampling error, together ``sd``); where it identifies r well this is the
    root of model_covariance(r) = covariance, and where the noise spans the
    attainable range (rare categories, small n·ε) it shrinks to 0 instead of
    jumping to ±1, which would also distort every other entry through the
    positive-definite projection.
    """
    if a.smooth and b.smooth:
        fine = np.arcsin(R_FINE / 2.0) / (2.0 * math.pi)
    else:
        fine = np.interp(R_FINE, R_NODES, model_covariances(a, b, R_NODES))
    log_w = -0.5 * ((covariance - fine) / sd) ** 2
    w = np.exp(log_w - log_w.max())
    return float(np.sum(w * R_FINE) / np.sum(w))


def correlation_noise_scale(columns: int, epsilon_corr: Fraction | float) -> float:
    """Discrete Laplace scale (M − 1)²·p(p − 1)/ε_corr for the correlation sums, rounded up."""
    if columns < 2:
        raise ValueError("a correlation needs at least two columns")
    return float_up(Fraction((QUANTUM - 1) ** 2 * columns * (columns - 1)) / Fraction(epsilon_corr))


def nearest_correlation(r: FloatArray, floor: float = EIGEN_FLOOR) -> FloatArray:
    """Symmetrize, clip eigenvalues at ``floor``, rescale to a unit diagonal."""
    sym = (r + r.T) / 2.0
    np.fill_diagonal(sym, 1.0)
    vals, vecs = np.linalg.eigh(sym)
    fixed = (vecs * np.maximum(vals, floor)) @ vecs.T
    d = np.sqrt(np.diag(fixed))
    out: FloatArray = fixed / np.outer(d, d)
    np.fill_diagonal(out, 1.0)
    return (out + out.T) / 2.0


def _normal_scores(u: FloatArray) -> FloatArray:
    out: FloatArray = special.ndtri(np.clip(u, U_EDGE, 1.0 - U_EDGE))
    return out


def _truncated_normal(
    a: FloatArray, b: FloatArray, v: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """x with Φ(x) = Φ(a) + v(Φ(b) − Φ(a)), and Φ(x), computed in the nearer tail."""
    upper = a + b > 0  # work with Φ(−x) there: no cancellation near 1
    lo = np.where(upper, -b, a)
    hi = np.where(upper, -a, b)
    p_lo, p_hi = special.ndtr(lo), special.ndtr(hi)
    q = p_lo + np.where(upper, 1.0 - v, v) * (p_hi - p_lo)
    x = special.ndtri(np.clip(q, TINY, 1.0 - U_EDGE))
    x = np.clip(x, lo, hi)
    x = np.where(upper, -x, x)
    u = np.where(upper, 1.0 - q, q)
    return x, np.clip(u, 0.0, 1.0)


class Copula(Reference):
    """A Gaussian copula with piecewise-linear (histogram) marginals."""

    def __init__(
        self, marginals: Mapping[str, PiecewiseLinear], correlation: FloatArray,
        edge: float = U_EDGE,
    ) -> None:
        """``edge``: PITs are kept in [edge, 1 − edge] (``dp_copula``: 1/(2N)), so a value at
        the end of its column's mass (clipped or top-coded data) does not become an extreme
        latent value that would push every later column of its record to a tail."""
        self.columns = tuple(marginals)
        self.marginals = dict(marginals)
        corr = np.asarray(correlation, dtype=np.float64)
        p = len(self.columns)
        if corr.shape != (p, p) or not np.all(np.isfinite(corr)):
            raise ValueError("correlation must be a finite p x p matrix")
        np.linalg.cholesky(corr)  # positive definite, or LinAlgError
        self.correlation = corr
        self.edge = max(U_EDGE, float(edge))
        self._factors: dict[tuple[str, ...], FloatArray] = {}

    def _factor(self, order: Sequence[str]) -> FloatArray:
        key = tuple(order)
        if key not in self._factors:
            idx = [self.columns.index(c) for c in key]
            sub = self.correlation[np.ix_(idx, idx)]
            self._factors[key] = np.linalg.cholesky(sub).astype(np.float64)
        return self._factors[key]

    def clean(self, column: str, z: ArrayLike) -> NDArray[np.generic]:
        return self.marginals[column].clean(z)

    def cells(self, column: str, z: NDArray[np.generic]) -> tuple[FloatArray, FloatArray]:
        """Latent cell [t_lo, t_hi] of clean values: Φ^{-1} of the marginal at the ends of
        the value's continualized cell (t_lo = t_hi for a continuous value)."""
        marginal = self.marginals[column]
        cont = marginal.continualizer
        ones = np.ones(np.shape(z))
        lo = marginal.cdf(cont.forward(z, ones))
        hi = marginal.cdf(cont.forward(z, np.zeros(np.shape(z))))
        if isinstance(cont, Continuous):
            lo = hi = np.clip(hi, self.edge, 1.0 - self.edge)
        return _normal_scores(lo), _normal_scores(hi)

    def uniformize(
        self, data: Mapping[str, NDArray[np.generic]], order: Sequence[str],
        rng: np.random.Generator,
    ) -> FloatArray:
        """The latent model's Rosenblatt transform, randomized inside discrete cells.

        With z = L w (L the Cholesky factor in ``order``) the latent z_l given
        the earlier w has mean μ = Σ_{k<l} L_lk w_k and sd L_ll; a record whose
        value occupies the latent cell [t_lo, t_hi] gets w_l drawn from the
        standard normal truncated to [(t_lo − μ)/L_ll, (t_hi − μ)/L_ll] (exactly
        (t − μ)/L_ll for a continuous value), and u_l = Φ(w_l). When the records
        follow the copula and the earlier columns are continuous the u_l are
        independent uniforms, so DIP's output follows it too; after a discrete
        column the draw ignores what later cells say about its latent value, an
        approximation that matters only when the noise is small. Each row uses
        only its own record.
        """
        inner, where = self._inner(order)
        chol = self._factor(inner)
        n = int(np.shape(data[order[0]])[0])
        w = np.empty((n, len(order)), dtype=np.float64)
        u = np.empty_like(w)
        for t, c in enumerate(inner):
            t_lo, t_hi = self.cells(c, data[c])
            mu = w[:, :t] @ chol[t, :t]
            sigma = chol[t, t]
            a, b = (t_lo - mu) / sigma, (t_hi - mu) / sigma
            w[:, t], u[:, where[t]] = _truncated_normal(a, b, rng.random(n))
        return u

    def _inner(self, order: Sequence[str]) -> tuple[tuple[str, ...], list[int]]:
        """The transform's own order: continuous columns first (their latent values are
        exact, so later columns condition on the truth), then the rest; and where each
        inner column sits in ``order``. Any fixed bijection of a record's u is fine
        for DP (each coordinate still gets its own noise), so this is free."""
        inner = tuple(sorted(order, key=lambda c: not isinstance(
            self.marginals[c].continualizer, Continuous)))
        return inner, [list(order).index(c) for c in inner]

    def quantile(
        self, g: FloatArray, h: FloatArray, order: Sequence[str]
    ) -> dict[str, NDArray[np.generic]]:
        inner, where = self._inner(order)
        g, h = g[:, where], h[:, where]
        lo = special.ndtri(np.clip(g, TINY, 1.0))
        hi = -special.ndtri(np.clip(h, TINY, 1.0))
        z = np.where(g <= 0.5, lo, hi) @ self._factor(inner).T
        out: dict[str, NDArray[np.generic]] = {}
        for t, c in enumerate(inner):
            marginal = self.marginals[c]
            v = marginal.quantile_continualized(np.clip(special.ndtr(z[:, t]), 0.0, 1.0))
            out[c] = marginal.continualizer.ceiling(v)
        return out


def correlation_codes(reference: Copula, block: Mapping[str, NDArray[np.generic]]) -> FloatArray:
    """(rows, p): the quantized centred PITs c = 2⌊uM⌋ − (M − 1) of a block of rows, odd
    integers in [−(M − 1), M − 1] held in float64."""
    u = np.stack([
        reference.marginals[c].cdf(reference.marginals[c].continualizer.forward(
            reference.clean(c, block[c]), np.full(len(block[c]), 0.5)))
        for c in reference.columns
    ], axis=1)
    k = np.clip(np.floor(u * QUANTUM), 0, QUANTUM - 1)
    out: FloatArray = 2.0 * k - (QUANTUM - 1)
    return out


def check_sum_rows(n: int) -> None:
    """Refuse a row count whose sums Σ c_il c_im could reach 2**53 (float64's exact range)."""
    if n * (QUANTUM - 1) ** 2 >= 2**53:
        raise ValueError("too many rows for exact correlation sums")


def correlation_sums(reference: Copula, data: Mapping[str, NDArray[np.generic]]) -> FloatArray:
    """T = Σ_i c_i c_iᵀ of the quantized centred PITs (exact integers held in float64).

    The PIT of a discrete value is its cell's middle, E[U | x]: a randomized
    PIT would add jitter noise of order 1/√n to every covariance, more than
    the covariance of a rare binary column.
    """
    columns = reference.columns
    n = int(np.shape(data[columns[0]])[0])
    check_sum_rows(n)
    p = len(columns)
    total = np.zeros((p, p), dtype=np.float64)
    for start in range(0, n, CHUNK_ROWS):
        c = correlation_codes(reference, {k: data[k][start:start + CHUNK_ROWS]
                                          for k in columns})
        total += c.T @ c
    return total


def dp_marginals(
    counts: Mapping[str, NDArray[np.int64]],
    continualizers: Mapping[str, Continualizer],
    bins: Mapping[str, int],
    epsilon_marginal: Fraction,
    rng: np.random.Generator,
) -> dict[str, PiecewiseLinear]:
    """Each column's ε_marginal/p-DP histogram marginal from its exact counts, noise drawn
    in the columns' order (the copula's first stage)."""
    per_column = epsilon_marginal / len(continualizers)
    edges = histogram_edges(continualizers, bins)
    return {c: noisy_histogram(counts[c], {c: continualizers[c]}, {c: edges[c]}, per_column,
                               rng).marginal(c)
            for c in continualizers}


def noisy_copula(
    marginals: Mapping[str, PiecewiseLinear],
    sums: FloatArray,
    n: int,
    epsilon_corr: Fraction,
    rng: np.random.Generator,
) -> Copula:
    """The copula from the released marginals and the exact correlation sums ``sums``
    (p x p, ``correlation_sums`` under the independent copula of those marginals), with
    ε_corr-DP noise on the p(p − 1)/2 off-diagonal sums (the second stage)."""
    columns = tuple(marginals)
    p = len(columns)
    scale = correlation_noise_scale(p, epsilon_corr)
    if scale > sampling.MAX_SCALE:
        raise ValueError("epsilon too small for the correlation noise")
    upper = np.triu_indices(p, 1)
    noisy = sums[upper] + sampling.discrete_laplace(rng, scale, upper[0].size)
    covariance = noisy / (4.0 * QUANTUM**2 * max(n, 1))
    steps = [Steps.of(marginals[c]) for c in columns]
    r = np.eye(p)
    sd = math.hypot(covariance_noise_sd(p, epsilon_corr, n), 1.0 / (4.0 * math.sqrt(max(n, 1))))
    for t, (i, j) in enumerate(zip(*upper, strict=True)):
        r[i, j] = r[j, i] = latent_correlation(steps[i], steps[j], float(covariance[t]), sd)
    return Copula(marginals, nearest_correlation(r), edge=0.5 / max(n, 1))


def dp_copula(
    data: Mapping[str, NDArray[np.generic]],
    continualizers: Mapping[str, Continualizer],
    bins: Mapping[str, int],
    epsilon_marginal: Fraction,
    epsilon_corr: Fraction,
    rng: np.random.Generator,
) -> Copula:
    """An (ε_marginal + ε_corr)-DP copula reference: ε_marginal/p per column's histogram,
    then the noised correlation sums under those marginals (both stages on whole columns;
    ``CorrelationStatistic`` is the second's mergeable pass)."""
    edges = histogram_edges(continualizers, bins)
    counts = {c: histogram_counts({c: data[c]}, {c: continualizers[c]}, {c: edges[c]})
              for c in continualizers}
    marginals = dp_marginals(counts, continualizers, bins, epsilon_marginal, rng)
    sums = correlation_sums(Copula(marginals, np.eye(len(marginals))), data)
    n = int(np.shape(data[next(iter(continualizers))])[0])
    return noisy_copula(marginals, sums, n, epsilon_corr, rng)


@dataclass(frozen=True)
class CorrelationStatistic(Statistic):
    """The copula's second pass: the exact sums Σ_i c_il c_im (row-major p x p) of the
    quantized PITs under the independent copula of the released marginals, the same
    integers as ``correlation_sums`` however the rows are split."""

    reference: Copula

    @property
    def columns(self) -> tuple[str, ...]:
        return self.reference.columns

    def sizes(self) -> Mapping[str, int]:
        return {"sums": len(self.reference.columns) ** 2}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64]]:
        c = correlation_codes(self.reference, chunk)
        return {"sums": (c.T @ c).astype(np.int64).reshape(-1)}  # exact: < 2**53 a chunk

    def sums(self, partial: Partial) -> FloatArray:
        """The p x p sums (exact in float64 below ``check_sum_rows``'s bound)."""
        check_sum_rows(partial.rows)
        p = len(self.reference.columns)
        out: FloatArray = partial.vector("sums").astype(np.float64).reshape(p, p)
        return out


def covariance_noise_sd(columns: int, epsilon_corr: Fraction | float, n_rows: int) -> float:
    """Standard deviation the DP noise adds to each estimated Cov(U_l, U_m):
    √(2α)/(1 − α)/(4M²n), α = e^{−1/scale} (discrete Laplace variance 2α/(1 − α)²)."""
    scale = correlation_noise_scale(columns, epsilon_corr)
    alpha = math.exp(-1.0 / scale)
    sd = math.sqrt(2.0 * alpha) / -math.expm1(-1.0 / scale)
    return sd / (4.0 * QUANTUM**2 * max(n_rows, 1))


def correlation_noise_sd(columns: int, epsilon_corr: Fraction | float, n_rows: int) -> float:
    """Standard deviation the noise adds to each Spearman ρ_S = 12·Cov (of continuous columns;
    at most π/3 times it in their copula r; discrete pairs are shrunk towards 0)."""
    return 12.0 * covariance_noise_sd(columns, epsilon_corr, n_rows)
