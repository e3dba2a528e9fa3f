"""The ICLP releases' data passes as exact, mergeable statistics (issue #30).

Each release of this family is a fixed linear map of a few sums over the rows, the
noise added after it: the mean (column sums of the clipped curves), the covariance
(sums of products of the clipped curves' grid values), function-on-scalar regression
(products of clipped covariates, and of covariates and clipped curves), the densities
(records per grid point or cell) and ERM (per grid point: records and responses). A plan
names them (``Summed.sizes``) and reads one chunk of rows into exact integers
(``Summed.reduce``): counts, or exact sums of doubles (``statistics.column_sums`` and
``product_sums``), each term rounded per row as the whole-column code rounded it. So any
split of the rows gives
the same partial, bit for bit, and the plan's ``coefficients`` round its exact totals
once (the old float accumulation erred by up to n ulps, inside the plans' error bounds,
which these sums only tighten). ``PlanPass`` is the one ``Statistic`` for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from mechanisms.iclp import domain
from mechanisms.statistics import Batch, Partial, Statistic, to_float


class Summed(Protocol):
    """A plan whose data pass is exact sums over its columns' rows."""

    def sizes(self) -> Mapping[str, int]:
        """Name -> public length of each part."""
        ...

    def widths(self) -> Sequence[int | None]:
        """Cells per row of each column, in order (None: a scalar column)."""
        ...

    def reduce(self, *columns: np.ndarray) -> Mapping[str, NDArray[np.int64] | Sequence[int]]:
        """The exact integers of one chunk of rows of the columns, per part."""
        ...


@dataclass(frozen=True, eq=False)
class PlanPass(Statistic):
    """A plan's data pass over the named columns (in the order its ``reduce`` takes)."""

    plan: Summed
    names: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.names

    def sizes(self) -> Mapping[str, int]:
        return self.plan.sizes()

    def widths(self) -> Mapping[str, int]:
        return {name: width for name, width in zip(self.names, self.plan.widths(), strict=True)
                if width is not None}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64] | Sequence[int]]:
        return self.plan.reduce(*(np.asarray(chunk[name]) for name in self.names))


def totals(partial: Partial, name: str, n: int) -> NDArray[np.float64]:
    """A part of exact float sums over ``n``, each rounded once (the mean of its terms)."""
    return np.array([to_float(total, n) for total in partial.parts[name]], dtype=np.float64)


def clipped(curves: np.ndarray, weights: NDArray[np.float64], tau: float) -> NDArray[np.float64]:
    """Rows of curves clipped to norm τ (``domain.clip_curves``: per row, so per batch)."""
    return domain.clip_curves(np.asarray(curves, dtype=np.float64), weights, tau)
