"""``lrm``: the Laplace randomized mechanism on each value (DIP's LRM / NLRM competitor).

Every record's value of every chosen column gets its own Laplace noise of scale
(hi - lo)/ε_col, with [lo, hi] the column's **declared** bounds (values are clipped
to them) and ε_col = ε/p over p columns (sequential composition; the paper's NLRM,
spec §4). Records are privatized independently, so the release is ε-local-DP per
record and hence ε-DP under replace-one. The paper approximated the bounds by the
data's own range ([-max|Z|, max|Z|], [0, max Z]), which is NOT differentially
private; here they come from the metadata only.

The paper's LRM adds CONTINUOUS Laplace noise, Laplace(0, 1/ε) on its discrete
simulations too, so its integer values come out real (spec §4; for Bernoulli the
range is 1 and the scale is the paper's; beyond a range of 1 the paper's is not ε-DP
and the scale here is (hi - lo)/ε). That is the default (``noise: "laplace"``), on
every column: exact discrete Laplace on a power-of-two lattice 2^10 times finer than
the scale (``common.lattice``), never a float Laplace draw. ``noise: "geometric"``
keeps an integer column's values integers (two-sided geometric noise of the same
scale), which is NOT the paper's LRM: on Bernoulli at ε = 4 it leaves 96 % of the
values as they were, and its mean error ties DIP's where the paper's LRM is 35 % or
more worse (issue #32; ``tests/unit/competitors/test_competitors.py``).

``round_to`` (MovieLens-style) post-processes each noisy value to the nearest point of
the public lattice lo + step·j inside [lo, hi] (free).

Output: microdata as ``dip`` releases it: ``_row`` plus one column per chosen
column, in dataset row order, every row released.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
from marshmallow import ValidationError, fields, validate, validates_schema
from numpy.typing import NDArray

from mechanisms import sampling
from mechanisms.base import (
    Budget,
    DatasetMeta,
    MechanismInputError,
    Output,
    RecordMechanism,
    batch_columns,
)
from mechanisms.competitors.common import (
    CI_LEVEL,
    PRIVACY_UNIT,
    ROW_COLUMN,
    ColumnsSchema,
    Lattice,
    PerColumnMechanism,
    lattice,
    numeric_columns,
    split_epsilon,
)
from mechanisms.exact import fmt
from mechanisms.statistics import ColumnSums, Partial, Statistic

#: ``round_to`` lattices of more points than this are refused (a finer step is no rounding)
MAX_ROUND_POINTS = 2**40
#: the noise laws: the paper's (continuous Laplace, exact on a fine lattice) or integer
NOISES = ("laplace", "geometric")


class LrmParamsSchema(ColumnsSchema):
    round_to = fields.Float(load_default=None, allow_none=True, allow_nan=False, metadata={
        "description": "a step above 0: each noisy value is rounded to the nearest point lo + "
                       "step * j within the declared bounds (free post-processing; default none)"})

    noise = fields.String(load_default="laplace", validate=validate.OneOf(NOISES), metadata={
        "description": "laplace (the paper's LRM: real-valued noise on every column, "
                       "default) or geometric (integer columns only: integer noise, integer "
                       "values)"})

    @validates_schema
    def _check_round(self, data: dict[str, Any], **kwargs: Any) -> None:
        step = data.get("round_to")
        if step is not None and not (math.isfinite(step) and step > 0):
            raise ValidationError("must be a positive number", "round_to")


def round_to_lattice(y: NDArray[np.float64], lo: float, hi: float, step: float
                     ) -> NDArray[np.float64]:
    """Nearest point of {lo + step·j : j = 0..J}, J = ⌊(hi - lo)/step⌋ (clamped to the ends)."""
    top = math.floor((hi - lo) / step)
    j = np.clip(np.rint((y - lo) / step), 0, top)
    out: NDArray[np.float64] = lo + step * j
    return out


class LrmMechanism(PerColumnMechanism, RecordMechanism):
    """Laplace noise on each value of each chosen column, ε/p per column: a row map whose
    model is the per-column lattices (public), so it runs in partitions."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 96.0
    fixed_bytes = 4 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 8.0
    map_fixed_bytes = 4 * 2**20

    record_level = True  # one output per record: the dataset's opt-in
    record_row_column = ROW_COLUMN

    name = "lrm"
    params_schema = LrmParamsSchema
    description = (
        "DIP's LRM competitor: pure epsilon-DP microdata, exact discrete Laplace noise of"
        " scale (hi - lo)/(epsilon/p) on a fine lattice on every value of p columns (declared"
        " bounds; integer noise on integer columns only if asked), optional rounding to a"
        " public lattice."
    )

    def _plan(self, params: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta
              ) -> dict[str, Lattice]:
        """Per column the calibrated lattice for ε_col = ``epsilon``/p."""
        columns = numeric_columns(params, meta)
        per = epsilon / len(columns)
        geometric = params.get("noise", "laplace") == "geometric"
        if geometric:
            real = [c.name for c in columns if c.type != "integer"]
            if real:
                raise MechanismInputError("params.noise", "geometric noise needs integer"
                                          f" columns; {real[0]!r} is not")
        out: dict[str, Lattice] = {}
        for c in columns:
            assert c.bounds is not None
            lo, hi = float(c.bounds[0]), float(c.bounds[1])
            out[c.name] = lattice(lo, hi, per, integer=geometric)
        step = params.get("round_to")
        if step is not None:
            for c in columns:
                assert c.bounds is not None
                if (float(c.bounds[1]) - float(c.bounds[0])) / step > MAX_ROUND_POINTS:
                    raise MechanismInputError("params.round_to", "step too small for the range")
        return out

    def accuracy(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
                 ) -> dict[str, Any]:
        epsilon, per = split_epsilon(cost, self.name, len(params["columns"]))
        return self._accuracy(self._plan(params, epsilon, meta), meta.n_rows, per,
                              params.get("round_to"))

    def fit(self, params: Mapping[str, Any], partial: Partial | None, cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> dict[str, Lattice]:
        epsilon, _ = split_epsilon(cost, self.name, len(params["columns"]))
        return self._plan(params, epsilon, meta)

    def privatize(self, rows: Mapping[str, np.ndarray], start: int,
                  params: Mapping[str, Any], cost: Budget, meta: DatasetMeta, model: Any,
                  rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Column by column (each column's draws in row order): over all rows with one
        generator, the draws the release always made."""
        columns = batch_columns(rows, list(model))
        m = len(next(iter(columns.values())))
        table: dict[str, np.ndarray] = {ROW_COLUMN: np.arange(start, start + m,
                                                              dtype=np.int64)}
        for name, plan in model.items():
            table[name] = self.privatize_column(columns[name], plan, rng,
                                                params.get("round_to"))
        return table

    def summary(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                model: Any) -> Statistic:
        return ColumnSums(tuple(model))

    def describe(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 model: Any, released: Partial | None) -> Output:
        epsilon, per = split_epsilon(cost, self.name, len(params["columns"]))
        plans: dict[str, Lattice] = model
        assert released is not None
        n = meta.n_rows
        return Output(
            result={"n_rows": n, "columns": list(plans), "row_column": ROW_COLUMN,
                    "epsilon": {"total": float(epsilon), "per_column": float(per)},
                    "means": ColumnSums(tuple(plans)).means(released)},
            accuracy=self._accuracy(plans, n, per, params.get("round_to")),
            guarantee=(f"pure epsilon-DP (LRM, epsilon={fmt(epsilon)} nats; epsilon="
                       f"{fmt(per)} per column over {len(plans)} column(s), exact discrete"
                       f" Laplace noise on each value, declared bounds), {PRIVACY_UNIT};"
                       " each record is privatized on its own (epsilon-local DP)"),
            row_column=ROW_COLUMN,
        )

    @staticmethod
    def privatize_column(x: NDArray[Any], plan: Lattice, rng: np.random.Generator,
                  round_to: float | None = None) -> NDArray[Any]:
        """One column's released values: c + g (k(clip x) + D), then ``round_to``."""
        k = plan.index(x)
        k += sampling.discrete_laplace(rng, plan.scale, k.shape[0])
        if plan.integer and round_to is None:
            return k + int(plan.centre)
        y = plan.value(k)
        if round_to is not None:
            y = round_to_lattice(y, plan.lo, plan.hi, round_to)
        return y

    @staticmethod
    def _accuracy(plans: Mapping[str, Lattice], n: int, per: Fraction,
                  round_to: float | None) -> dict[str, Any]:
        columns = {}
        for name, p in plans.items():
            var = p.noise_variance
            columns[name] = {
                "noise": "discrete_laplace" if not p.integer else "two_sided_geometric",
                "scale": p.laplace_scale,
                "grid": p.grid,
                "noise_variance": var,
                "value_ci95_halfwidth": p.halfwidth,
                "mean_noise_sd": math.sqrt(var / n) if n else math.inf,
            }
        rounding = (" Rounding to the lattice of step round_to is post-processing: it biases"
                    " values near the bounds and is not accounted in these figures."
                    if round_to is not None else "")
        statement = (
            f"Each released value is its record's value clipped to the declared bounds plus"
            f" independent zero-mean noise (epsilon={float(per):.6g} per column): with"
            f" probability {CI_LEVEL:.0%} a value is within its column's value_ci95_halfwidth;"
            " the mean of a released column is unbiased for the mean of the clipped data with"
            " standard deviation mean_noise_sd = sqrt(noise_variance / n). The marginal"
            " distribution is the data's convolved with the noise (it is NOT preserved)."
            + rounding
        )
        return {"columns": columns, "statement": statement}
