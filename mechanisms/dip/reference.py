"""Reference distributions for the sequential (Rosenblatt) chain of spec §3.6.

A reference F over columns (X_1..X_p) is used in a chosen order: the
forward map u_l = F_l(x_l | x_1..x_{l−1}) conditions on the record's
**original** earlier values (so u_l is uniform and independent of the
prefix when the record follows F), the inverse x̃_l = F_l^←(g_l | x̃_1..x̃_{l−1})
on the **privatized** ones. Each row of u depends on that record alone,
which is what makes the noise step's per-entry guarantee a per-record one.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import linalg, special

from mechanisms.dip.continualize import Continuous
from mechanisms.dip.univariate import TINY, Univariate, finite

FloatArray = NDArray[np.float64]


class Reference(abc.ABC):
    """A joint reference F over named columns, usable in any variable order."""

    columns: tuple[str, ...]
    #: quantiles read h = 1 − g in the upper tail (unbounded laws); bounded ones need only g
    needs_upper_tail: bool = True

    def check_order(self, order: Sequence[str] | None) -> tuple[str, ...]:
        """The order as a tuple; it must be a permutation of the columns."""
        chosen = tuple(self.columns if order is None else order)
        if sorted(chosen) != sorted(self.columns):
            raise ValueError("order must be a permutation of the reference's columns")
        return chosen

    @abc.abstractmethod
    def clean(self, column: str, z: ArrayLike) -> NDArray[np.generic]:
        """Raw values of a column into its domain."""

    @abc.abstractmethod
    def uniformize(
        self, data: Mapping[str, NDArray[np.generic]], order: Sequence[str],
        rng: np.random.Generator,
    ) -> FloatArray:
        """(n, p) array of u_il = F_l(x_il | original prefix), randomized at atoms."""

    @abc.abstractmethod
    def quantile(
        self, g: FloatArray, h: FloatArray, order: Sequence[str]
    ) -> dict[str, NDArray[np.generic]]:
        """Inverse chain: column -> privatized values, conditioning on privatized prefixes."""


class Product(Reference):
    """Independent columns, each with its own one-dimensional F (also the univariate case)."""

    def __init__(self, marginals: Mapping[str, Univariate]) -> None:
        if not marginals:
            raise ValueError("a reference needs at least one column")
        self.marginals = dict(marginals)
        self.columns = tuple(self.marginals)

    def clean(self, column: str, z: ArrayLike) -> NDArray[np.generic]:
        return self.marginals[column].clean(z)

    def uniformize(
        self, data: Mapping[str, NDArray[np.generic]], order: Sequence[str],
        rng: np.random.Generator,
    ) -> FloatArray:
        return np.stack([self.marginals[c].pit(data[c], rng) for c in order], axis=1)

    def quantile(
        self, g: FloatArray, h: FloatArray, order: Sequence[str]
    ) -> dict[str, NDArray[np.generic]]:
        return {c: self.marginals[c].quantile(g[:, t], h[:, t]) for t, c in enumerate(order)}


class Gaussian(Reference):
    """A multivariate normal N(mean, cov): conditionals through the Cholesky factor.

    With x = μ + L z (L lower-triangular for the chosen order) the Rosenblatt
    transform is z = L^{-1}(x − μ), u = Φ(z); the inverse is x̃ = μ + L Φ^{-1}(g).
    """

    def __init__(self, columns: Sequence[str], mean: ArrayLike, cov: ArrayLike) -> None:
        mu = np.asarray(mean, dtype=np.float64)
        sigma = np.asarray(cov, dtype=np.float64)
        p = len(columns)
        if mu.shape != (p,) or sigma.shape != (p, p):
            raise ValueError("mean must have one entry and cov one row per column")
        if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(sigma))):
            raise ValueError("mean and cov must be finite")
        if not np.allclose(sigma, sigma.T, rtol=1e-12, atol=0.0):
            raise ValueError("cov must be symmetric")
        try:
            np.linalg.cholesky(sigma)
        except np.linalg.LinAlgError:
            raise ValueError("cov must be positive definite") from None
        self.columns = tuple(columns)
        self.mean, self.cov = mu, sigma
        self._domain = Continuous()

    def clean(self, column: str, z: ArrayLike) -> FloatArray:
        return self._domain.clean(z)

    def _factor(self, order: Sequence[str]) -> tuple[FloatArray, FloatArray]:
        idx = [self.columns.index(c) for c in order]
        chol: FloatArray = np.linalg.cholesky(self.cov[np.ix_(idx, idx)]).astype(np.float64)
        return self.mean[idx], chol

    def uniformize(
        self, data: Mapping[str, NDArray[np.generic]], order: Sequence[str],
        rng: np.random.Generator,
    ) -> FloatArray:
        mu, chol = self._factor(order)
        x = np.stack([np.asarray(data[c], dtype=np.float64) for c in order], axis=1)
        z = linalg.solve_triangular(chol, (x - mu).T, lower=True, check_finite=False).T
        return np.clip(np.nan_to_num(special.ndtr(z), nan=0.5), 0.0, 1.0)

    def quantile(
        self, g: FloatArray, h: FloatArray, order: Sequence[str]
    ) -> dict[str, NDArray[np.generic]]:
        mu, chol = self._factor(order)
        lo = special.ndtri(np.clip(g, TINY, 1.0))
        hi = -special.ndtri(np.clip(h, TINY, 1.0))
        z = np.where(g <= 0.5, lo, hi)
        x = finite(mu + z @ chol.T)
        return {c: x[:, t] for t, c in enumerate(order)}
