"""Anchor distributions: the only randomness of an interval mechanism.

Anchors are drawn from a *known* law and **independently of Y** (spec §6.1
pitfall 1): no function here takes data. Location–scale families sample with
numpy's own generators (fast), and expose ``ppf`` so coverage can be
integrated by quasi-Monte Carlo over the same law. ``optimal`` tabulates the
Theorem 2 density for a linear functional under the prior.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from mechanisms.interval.ranges import FloatArray, Law

FAMILIES = ("logistic", "normal", "laplace", "uniform", "optimal")
LOCATION_SCALE = ("logistic", "normal", "laplace", "uniform")
FUNCTIONALS = ("mean", "second_moment")


@dataclass(frozen=True)
class AnchorDist:
    """A univariate anchor law.

    Location–scale: ``loc`` and ``scale`` (uniform: [loc − scale, loc + scale]).
    ``optimal``: a tabulated quantile function ``grid_q`` -> ``grid_x``.
    """

    family: str
    loc: float = 0.0
    scale: float = 1.0
    grid_q: FloatArray | None = field(default=None, compare=False, repr=False)
    grid_x: FloatArray | None = field(default=None, compare=False, repr=False)
    functional: str | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown anchor family {self.family!r}")
        if self.family != "optimal" and not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError("anchor scale must be positive and finite")

    def with_scale(self, scale: float) -> AnchorDist:
        return AnchorDist(self.family, self.loc, scale)

    def ppf(self, q: ArrayLike) -> FloatArray:
        q = np.asarray(q, dtype=np.float64)
        out: FloatArray
        if self.family == "logistic":
            out = self.loc + self.scale * special.logit(q)
        elif self.family == "normal":
            out = self.loc + self.scale * special.ndtri(q)
        elif self.family == "laplace":
            out = self.loc - self.scale * np.sign(q - 0.5) * np.log1p(-2.0 * np.abs(q - 0.5))
        elif self.family == "uniform":
            out = self.loc + self.scale * (2.0 * q - 1.0)
        else:
            assert self.grid_q is not None and self.grid_x is not None
            out = np.interp(q, self.grid_q, self.grid_x)
        return out

    def cdf(self, x: ArrayLike) -> FloatArray:
        z = (np.asarray(x, dtype=np.float64) - self.loc) / self.scale
        out: FloatArray
        if self.family == "logistic":
            out = special.expit(z)
        elif self.family == "normal":
            out = special.ndtr(z)
        elif self.family == "laplace":
            out = np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0)), 1 - 0.5 * np.exp(-np.abs(z)))
        elif self.family == "uniform":
            out = np.clip((z + 1.0) / 2.0, 0.0, 1.0)
        else:
            assert self.grid_q is not None and self.grid_x is not None
            out = np.interp(np.asarray(x, dtype=np.float64), self.grid_x, self.grid_q)
        return out

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> FloatArray:
        """Draws from the anchor law; takes no data by construction."""
        out: FloatArray
        if self.family == "logistic":
            # log(q / (1 − q)) in place: one logarithm per draw
            out = rng.random(size)
            with np.errstate(divide="ignore"):  # q = 0 (probability 2**-53) gives -inf
                np.divide(out, 1.0 - out, out=out)
                np.log(out, out=out)
            if self.scale != 1.0:
                out *= self.scale
            if self.loc != 0.0:
                out += self.loc
        elif self.family == "normal":
            out = rng.normal(self.loc, self.scale, size)
        elif self.family == "laplace":
            out = rng.laplace(self.loc, self.scale, size)
        elif self.family == "uniform":
            out = rng.uniform(self.loc - self.scale, self.loc + self.scale, size)
        else:
            out = self.ppf(rng.random(size))
        return out

    @property
    def support(self) -> tuple[float, float]:
        if self.family == "uniform":
            return self.loc - self.scale, self.loc + self.scale
        if self.family == "optimal":
            assert self.grid_x is not None
            return float(self.grid_x[0]), float(self.grid_x[-1])
        return -math.inf, math.inf

    def describe(self) -> dict[str, Any]:
        if self.family == "optimal":
            lo, hi = self.support
            return {"family": "optimal", "functional": self.functional, "support": [lo, hi]}
        out: dict[str, Any] = {"family": self.family, "loc": self.loc, "scale": self.scale}
        if self.family == "uniform":
            out["low"], out["high"] = self.support
        return out


def uniform(low: float, high: float) -> AnchorDist:
    """U[low, high] anchors (Example 2's design)."""
    return AnchorDist("uniform", 0.5 * (low + high), 0.5 * (high - low))


def optimal(prior: Law, functional: str = "mean", points: int = 4097) -> AnchorDist:
    """Theorem 2: g_U ∝ sqrt(F(1 − F))·|φ′| minimises the NPMLE's information bound.

    For the mean φ′ = 1, for the second moment |φ′(u)| = 2|u|. The density is
    tabulated on prior quantiles in (1e-6, 1 − 1e-6) and integrated by the
    trapezoid rule; its quantile function is the linear interpolant.
    """
    if functional not in FUNCTIONALS:
        raise ValueError(f"functional must be one of {FUNCTIONALS}")
    q = np.linspace(1e-6, 1.0 - 1e-6, points)
    x = np.unique(prior.ppf(q))
    if x.size < 2:
        raise ValueError("the prior is degenerate")
    f = prior.cdf(x)
    density = np.sqrt(np.clip(f * (1.0 - f), 0.0, None))
    if functional == "second_moment":
        density = density * np.abs(x)
    steps = 0.5 * (density[1:] + density[:-1]) * np.diff(x)
    cumulative = np.concatenate([[0.0], np.cumsum(steps)])
    if not cumulative[-1] > 0:
        raise ValueError("the optimal anchor density vanishes on the prior's support")
    grid_q = cumulative / cumulative[-1]
    grid_q, keep = np.unique(grid_q, return_index=True)
    return AnchorDist("optimal", 0.0, 1.0, grid_q=grid_q, grid_x=x[keep], functional=functional)


def from_spec(spec: Mapping[str, Any], center: float, unit: float) -> AnchorDist:
    """An anchor law from a request spec; ``center``/``unit`` are the prior's median and SD.

    ``loc`` defaults to the prior median; with ``standardize`` loc and scale are in prior
    SD units around the median (spec pitfall 14). Uniform also takes ``low``/``high``.
    """
    family = spec["family"]
    if family == "uniform" and "low" in spec:
        low, high = float(spec["low"]), float(spec["high"])
        if spec.get("standardize"):
            low, high = center + unit * low, center + unit * high
        return uniform(low, high)
    loc = spec.get("loc")
    scale = float(spec.get("scale", 1.0))
    if spec.get("standardize"):
        return AnchorDist(family, center + unit * float(loc or 0.0), unit * scale)
    return AnchorDist(family, center if loc is None else float(loc), scale)
