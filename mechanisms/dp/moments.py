"""Variance, standard deviation and covariance matrix of bounded columns.

Released: the sample covariance C_jk = S_jk/(n − 1), S_jk = Σ_i (x_ij − m_j)(x_ik − m_k),
of the columns clipped to their declared [lo_j, hi_j] (w_j = hi_j − lo_j); the
variance is the 1-column case, the standard deviation sqrt(max(variance, 0)).

Sensitivity under replace-one, exact. Let m' be the mean of the n − 1 records
that stay. Adding a record x to them adds (n−1)/n·(x − m')(x − m')ᵀ to the
scatter matrix S (parallel-axis), so replacing x by y changes S by
(n−1)/n·[(y − m')(y − m')ᵀ − (x − m')(x − m')ᵀ]. For entry (j, k), with
u = y − m', v = x − m' in a box of sides w_j, w_k containing 0,
|u_j u_k − v_j v_k| <= w_j w_k (the range of a product over such a box is at
most w_j w_k, by the four corner cases), and all entries attain it at once
(the others at lo, x at lo, y at hi). Hence for C:
  Δ_jk = w_j w_k / n,   L1 = Σ_{j<=k} w_j w_k / n,   L2 = sqrt(Σ_{j<=k} (w_j w_k)²) / n
over the released upper triangle (j <= k). No ε split: the triangle is one
vector with noise calibrated to its joint sensitivity (discrete Laplace at
L1/ε, or discrete Gaussian by zCDP on the lattice L2; one entry: the exact
scalar curve). Variance: Δ = w²/n.

Floating point: two passes (``MeanStatistic`` then ``ScatterStatistic``: exact sums over
batches of rows, rounded once, which is math.fsum's value), math.fsum throughout, on
z = fl(clip(x) − lo) (|z| <= V = w(1 + 2^-50)): the mean errs by <= 3.1uV, each centred value by
<= 6.1uV, each product by <= 13.5uV_jV_k, the fsum by n·14.6uV_jV_k, and the
division by n − 1 adds a relative u: |Ĉ_jk − C_jk| <= 31.2u·V_jV_k (u = 2^-53) for
n >= 2; we charge err_jk = 2^-45·V_jV_k, 8 times more. Rounded to a power-of-two
grid g, an entry moves by at most floor((Δ_jk + 2 err_jk)/g) + 1 lattice units.

Post-processing (free, stated): a variance is clipped to [0, n/(n−1)·w²/4]
(the largest sample variance on [lo, hi]); the standard deviation is its square
root, within √h of the exact one when the variance is within h (|√a − √b| <= √|a − b|);
``psd: true`` clips the matrix's negative eigenvalues to 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms import zcdp
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.columns import clean, declared_bounds
from mechanisms.dp import baselines, confidence, vectors
from mechanisms.dp.confidence import Confidence, percent
from mechanisms.dp.vectors import VectorNoise
from mechanisms.exact import float_down
from mechanisms.statistics import (
    Batch,
    Partial,
    Statistic,
    check_rows,
    float_sums,
    to_float,
    whole,
)

#: charged floating-point error per entry, in units of V_j V_k
ENTRY_ERROR = Fraction(1, 2**45)


@dataclass(frozen=True)
class MomentPlan:
    statistic: str  # variance | std | covariance
    columns: tuple[ColumnMeta, ...]
    bounds: tuple[tuple[Fraction, Fraction], ...]
    n: int
    grid: float
    units: tuple[int, ...]  # lattice sensitivity per upper-triangle entry
    sensitivity: tuple[Fraction, ...]  # Δ_jk, statistic units
    err: tuple[Fraction, ...]
    noise: VectorNoise
    psd: bool
    #: per-entry intervals (the default) or simultaneous ones (``mechanisms.dp.confidence``)
    confidence: Confidence = field(default_factory=Confidence)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        k = len(self.columns)
        return [(j, i) for j in range(k) for i in range(j, k)]

    def first_pass(self) -> MeanStatistic:
        """The first of the two passes (the means; then the centred products)."""
        return MeanStatistic(self)

    def exact_from(self, partial: Partial) -> NDArray[np.int64]:
        """The upper triangle of the sample covariance on the lattice (no noise), from the
        second pass's merged partial."""
        check_rows(partial, self.n, self.columns[0].name)
        return np.array([round(to_float(t) / (self.n - 1) / self.grid)
                         for t in partial.parts["scatter"]], dtype=np.int64)

    def exact(self, data: Mapping[str, np.ndarray]) -> NDArray[np.int64]:
        """The upper triangle of the sample covariance on the lattice (no noise)."""
        return self.exact_from(whole(self.first_pass(), data))

    def run(self, data: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, Any]:
        return self.release_from(whole(self.first_pass(), data), rng)

    def release_from(self, partial: Partial, rng: np.random.Generator) -> dict[str, Any]:
        exact = self.exact_from(partial)
        return self.release(exact + self.noise.sample(rng, exact.size))

    def release(self, noisy: NDArray[np.int64]) -> dict[str, Any]:
        entries = noisy.astype(np.float64) * self.grid  # exact: |noisy| < 2^52
        if self.statistic != "covariance":
            lo, hi = self.bounds[0]
            top = float(Fraction(self.n, self.n - 1) * (hi - lo) ** 2 / 4)
            released = float(entries[0])
            variance = min(max(released, 0.0), top)
            # the exact variance is within ±h of the noisy one (95 %) and in [0, top]: so
            # is this interval; for std its square roots (monotone), much tighter than
            # ±sqrt(h) around the released std (post-processing of the released value)
            h = self.halfwidths()[0]
            low = min(max(released - h, 0.0), top)
            high = min(max(released + h, 0.0), top)
            if self.statistic == "std":
                return {"value": math.sqrt(variance),
                        "interval": [math.sqrt(low), math.sqrt(high)]}
            return {"value": variance, "interval": [low, high]}
        k = len(self.columns)
        matrix = np.zeros((k, k))
        for (j, i), v in zip(self.pairs, entries, strict=True):
            matrix[j, i] = matrix[i, j] = v
        if self.psd:
            eigenvalues, vectors_ = np.linalg.eigh(matrix)
            matrix = (vectors_ * np.maximum(eigenvalues, 0.0)) @ vectors_.T
            matrix = (matrix + matrix.T) / 2
        return {"columns": [c.name for c in self.columns], "matrix": matrix.tolist(),
                "psd": self.psd}

    def halfwidths(self, level: float = vectors.CI_LEVEL) -> list[float]:
        """Half-width per entry at ``level``: noise, half a grid step, the float error."""
        h = self.noise.halfwidth(level)
        return [(h + 0.5) * self.grid + float(e) for e in self.err]

    def accuracy(self) -> dict[str, Any]:
        l2 = self.noise.kind == "discrete_gaussian"
        total_l1 = sum(self.sensitivity, Fraction(0))
        total_l2 = math.sqrt(sum(float(s) ** 2 for s in self.sensitivity))
        h = self.halfwidths()
        kind = self.noise.kind.replace("_", " ")
        out: dict[str, Any] = {
            "noise": self.noise.kind,
            "scale": self.noise.scale * self.grid,
            "sensitivity": math.nextafter(total_l2, math.inf) if l2 else float(total_l1),
            "sensitivity_norm": "l2" if l2 else "l1",
            "grid": self.grid,
            "grid_sensitivity": sum(u * u for u in self.units) if l2 else sum(self.units),
        }
        if self.statistic == "covariance":
            entries = len(h)
            asked = self.halfwidths(self.confidence.per_entry(entries))
            level = percent(self.confidence.level)
            out["ci95_halfwidth"] = h[0] if len(set(h)) == 1 else max(h)
            out["ci95_halfwidths"] = h
            out["halfwidths"] = asked
            out["confidence"] = self.confidence.document(entries)
            noise = (f"{kind} noise on each of the {entries} entries, one vector calibrated"
                     " to their joint sensitivity")
            if self.confidence.simultaneous and entries > 1:
                out["statement"] = (
                    f"With probability at least {level}, all {entries} entries of the upper"
                    f" triangle are at once within ±{max(asked):.6g} of the exact sample"
                    f" covariance of the data clipped to the declared bounds (simultaneous"
                    f" intervals, each at level {self.confidence.per_entry(entries):.4%};"
                    f" {noise})")
            else:
                out["statement"] = (
                    f"With probability at least {level}, each entry of the upper triangle is"
                    f" within ±{max(asked):.6g} of the exact sample covariance of the data"
                    f" clipped to the declared bounds ({noise}){self.confidence.joint(entries)}")
            out["statement"] += ("; the PSD projection is free post-processing." if self.psd
                                 else ".")
        elif self.statistic == "variance":
            out["ci95_halfwidth"] = h[0]
            out["statement"] = (
                f"With probability at least 95%, the released sample variance is within"
                f" ±{h[0]:.6g} of the exact one of the data clipped to the declared bounds"
                f" ({kind} noise, sensitivity (hi - lo)^2/n; clipped to its possible range);"
                f" result.interval is the noisy variance ±{h[0]:.6g} within that range.")
        else:
            out["ci95_halfwidth"] = math.sqrt(h[0])
            out["statement"] = (
                f"With probability at least 95%, the released standard deviation is within"
                f" ±{math.sqrt(h[0]):.6g} of the exact sample standard deviation of the data"
                f" clipped to the declared bounds (the square root of a noisy variance within"
                f" ±{h[0]:.6g}); result.interval, the square roots of the noisy variance"
                f" ±{h[0]:.6g}, contains it with the same probability and is usually much"
                f" narrower.")
        return out


def _shifted(plan: MomentPlan, chunk: Batch) -> list[NDArray[np.float64]]:
    """z_j = fl(clip(x_j) − lo_j) per column, as the two-pass formula reads it."""
    out = []
    for col, (lo, hi) in zip(plan.columns, plan.bounds, strict=True):
        z = clean(chunk[col.name], float(lo), float(hi))
        z -= float(lo)
        out.append(z)
    return out


@dataclass(frozen=True)
class MeanStatistic(Statistic):
    """Pass 1: the exact sum of each column's z_j (``sums``, units of 2**-SCALE); its
    rounding to a double is math.fsum(z_j), so the mean m_j = fsum(z_j)/n is the one the
    whole-column formula took, whatever the batches."""

    plan: MomentPlan

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.plan.columns)

    def sizes(self) -> Mapping[str, int]:
        return {"sums": len(self.plan.columns)}

    def reduce(self, chunk: Batch) -> Mapping[str, Sequence[int]]:
        return {"sums": [float_sums(z)[0] for z in _shifted(self.plan, chunk)]}

    def then(self, partial: Partial) -> Statistic:
        check_rows(partial, self.plan.n, self.plan.columns[0].name)
        n = self.plan.n
        return ScatterStatistic(self.plan, tuple(to_float(t) / n for t in partial.parts["sums"]))


@dataclass(frozen=True)
class ScatterStatistic(Statistic):
    """Pass 2: per upper-triangle pair (j, k) the exact sum of the doubles
    fl(fl(z_j − m_j)·fl(z_k − m_k)) (``scatter``): rounded once, their math.fsum."""

    plan: MomentPlan
    means: tuple[float, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.plan.columns)

    def sizes(self) -> Mapping[str, int]:
        return {"scatter": len(self.plan.pairs)}

    def reduce(self, chunk: Batch) -> Mapping[str, Sequence[int]]:
        centred = _shifted(self.plan, chunk)
        for z, mean in zip(centred, self.means, strict=True):
            z -= mean
        return {"scatter": [float_sums(centred[j] * centred[k])[0]
                            for j, k in self.plan.pairs]}


def covariance_sensitivity(widths: list[Fraction], n: int) -> list[Fraction]:
    """Exact Δ_jk = w_j w_k / n of each upper-triangle entry (see the module doc)."""
    k = len(widths)
    return [widths[j] * widths[i] / n for j in range(k) for i in range(j, k)]


def plan(mechanism: str, params: Mapping[str, Any], amounts: Mapping[str, Fraction],
         meta: DatasetMeta) -> MomentPlan:
    statistic = params["statistic"]
    if mechanism == "geometric":
        raise MechanismInputError(
            "params.statistic", f"{statistic} is real-valued; geometric releases integers:"
            " use laplace")
    if statistic == "covariance":
        names = list(params["columns"])
        if len(set(names)) != len(names):
            raise MechanismInputError("params.columns", "columns names a column twice")
        columns = [meta.column(name, "params.columns") for name in names]
    else:
        columns = [meta.column(params["column"])]
    bounds = []
    for c in columns:
        try:
            bounds.append(declared_bounds(c, statistic))
        except MechanismInputError as refused:
            field = "params.columns" if statistic == "covariance" else refused.field
            raise MechanismInputError(field, refused.message) from None
    n = meta.n_rows
    if n < 2:
        raise MechanismInputError("params.statistic", f"{statistic} needs at least 2 rows")
    widths = [hi - lo for lo, hi in bounds]
    sens = covariance_sensitivity(widths, n)
    k = len(columns)
    spread = [w * (1 + Fraction(1, 2**50)) for w in widths]
    err = [spread[j] * spread[i] * ENTRY_ERROR for j in range(k) for i in range(j, k)]
    epsilon, delta, rho = amounts.get("epsilon"), amounts.get("delta"), amounts.get("rho")
    l2_exact = math.nextafter(math.sqrt(sum(float(s) ** 2 for s in sens)), math.inf)
    if rho is not None:  # a zcdp dataset (mechanisms.zcdp)
        scale = zcdp.sigma_real(l2_exact, rho)
    elif mechanism == "gaussian":
        assert epsilon is not None and delta is not None
        scale = baselines.analytic_gaussian_sigma(
            float_down(epsilon), float_down(delta), l2_exact)
    else:
        assert epsilon is not None
        scale = float_down(sum(sens, Fraction(0)) / epsilon)
    grid = vectors.grid_for(float_down(min(sens)), scale)
    units = [vectors.units(s, e, grid) for s, e in zip(sens, err, strict=True)]
    top = max(s * s for s in spread) * Fraction(n, n - 1)
    if top / Fraction(grid) >= baselines.LATTICE_LIMIT:
        raise MechanismInputError("params.column", "too many rows for exact lattice arithmetic")
    if mechanism == "gaussian":
        noise = vectors.gaussian_noise(epsilon, delta, sum(u * u for u in units),
                                       scalar_units=units[0] if k == 1 else None, rho=rho)
    else:
        assert epsilon is not None
        noise = vectors.laplace_noise(epsilon, sum(units))
    return MomentPlan(statistic, tuple(columns), tuple(bounds), n, grid, tuple(units),
                      tuple(sens), tuple(err), noise, bool(params.get("psd", False)),
                      confidence.read(params))
