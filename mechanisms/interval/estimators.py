"""Direct estimators from released ranges: Example 2's mean and plug-in functionals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from mechanisms.interval.npmle import NPMLEResult
from mechanisms.interval.ranges import FloatArray


@dataclass(frozen=True)
class MeanEstimate:
    value: float
    se: float
    n: int

    @property
    def ci95(self) -> tuple[float, float]:
        return self.value - 1.959964 * self.se, self.value + 1.959964 * self.se


def example2_mean(u: ArrayLike, delta: ArrayLike, a: float, b: float,
                  clip: bool = False) -> MeanEstimate:
    """Proposition 1: μ̂ = mean of Δ(2U − b) + (1 − Δ)(2U − a), unbiased for U ~ U[a, b].

    E[term | Y = y] = y for y in [a, b] (an outlier above b counts as b). The SE is the
    sample SD of the terms over √n; ``clip`` clips μ̂ to [a, b] as the paper's code does.
    """
    u = np.asarray(u, dtype=np.float64)
    d = np.asarray(delta, dtype=np.float64)
    if u.size == 0:
        raise ValueError("no records")
    terms = d * (2.0 * u - b) + (1.0 - d) * (2.0 * u - a)
    value = float(terms.mean())
    se = float(terms.std(ddof=1) / math.sqrt(u.size)) if u.size > 1 else math.inf
    if clip:
        value = min(max(value, a), b)
    return MeanEstimate(value, se, int(u.size))


def moments(res: NPMLEResult, orders: Sequence[int], convention: str = "right",
            support: tuple[float, float] = (-math.inf, math.inf)) -> tuple[dict[int, float],
                                                                          list[str]]:
    """Raw moments ∫ y^k dF̂ under a mass-placement convention (spec §3.3)."""
    out: dict[int, float] = {}
    warnings: list[str] = []
    for k in orders:

        def power(x: FloatArray, k: int = int(k)) -> FloatArray:
            out: FloatArray = x**k
            return out

        value, w = res.functional(power, convention, support)
        out[int(k)] = value
        warnings = w
    return out, warnings
