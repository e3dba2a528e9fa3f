"""Registry entry ``interval.progressive_categorical`` and its ``categories`` analysis.

The charge is the exact worst case over priors of the leakage, (1 − s_k)(1 − 1/k)
(``categorical.worst_case_leakage``), rounded up to the ledger unit: a categorical
column declares no prior, and the uniform one leaks the most, so the statement
holds for whatever the population's category shares are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.base import (
    Analysis,
    Budget,
    ColumnMeta,
    DatasetMeta,
    MechanismInputError,
    Output,
    RecordMechanism,
    ReleaseView,
    Work,
    batch_columns,
)
from mechanisms.interval import categorical, schemas
from mechanisms.interval.entries import LEDGER_UNIT, MEASURE, PRIVACY_UNIT, read_leakage
from mechanisms.statistics import Batch, Partial, Statistic

NAME = "interval.progressive_categorical"
#: bytes per row of a privatized batch, per round and category: a float64 key, the
#: asked mask, two int64 argsort ranks (``categorical.ProgressiveCategorical.run``)
_DRAW_BYTES = 24.0


def _column(params: Mapping[str, Any], meta: DatasetMeta) -> ColumnMeta:
    column = meta.column(params["column"])
    if column.type != "categorical" or not column.categories:
        raise MechanismInputError("params.column", f"column {column.name!r} is not categorical")
    if len(column.categories) > categorical.MAX_CATEGORIES:
        raise MechanismInputError(
            "params.column", f"progressive questions take at most"
            f" {categorical.MAX_CATEGORIES} categories; this column has"
            f" {len(column.categories)}")
    return column


def _charge(k: int, rounds: int) -> Fraction:
    leak = categorical.worst_case_leakage(k, rounds)
    return Fraction(math.ceil(leak * LEDGER_UNIT), LEDGER_UNIT)


def _statement(column: ColumnMeta, rounds: int) -> dict[str, Any]:
    k = len(column.categories or ())
    s = categorical.survival(k, rounds)
    charge = _charge(k, rounds)
    return {
        "expected_coverage_uniform": float(categorical.expected_coverage(k, rounds)),
        "other_option_survival": float(s),
        "leakage": float(categorical.worst_case_leakage(k, rounds)),
        "leakage_charged": float(charge),
        "coverage_formula": "tau = s + (1 - s) * sum_c pi_c^2 >= s + (1 - s)/k (exact; the"
                            " uniform prior is the worst case)",
        "design": categorical.ProgressiveCategorical(k, rounds).describe(),
        "statement": (
            f"A released set holds the true category of {column.name!r}; under any prior its"
            f" expected prior mass is at least {float(1 - charge):.4g} (exact worst case over"
            " priors). The category shares estimated from the sets (NPMLE) are free"
            " post-processing."),
    }


class ProgressiveCategoricalMechanism(RecordMechanism):
    """Each record's questions drawn on its own: a row map whose model is the design."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 872.0
    fixed_bytes = 4 * 2**20
    #: a row map's (``map_bytes``): per row of its table, 32 bytes and 16 a round; per
    #: row of a batch privatized at once, ``_DRAW_BYTES`` per round and category; the
    #: fixed part
    map_row_bytes = 32.0
    map_fixed_bytes = 4 * 2**20
    record_level = True  # one output per record: the dataset's opt-in

    def charged_columns(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        """Its one column's leakage: known before a (possibly cold) calibration."""
        return (f"{MEASURE}:{params['column']}",)
    name = NAME
    measures = (MEASURE,)
    params_schema = schemas.ProgressiveCategoricalSchema
    description = ("Interval privacy on a categorical column: progressive questions 'is your"
                   " answer one of Q?' with Q a random half of the feasible options (the"
                   " authors' survey code).")

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        k = len(_column(params, meta).categories or ())
        return Work(float(max(meta.n_rows, 1)) * params["rounds"] * k * max(1.0, math.log2(k)),
                    "params.rounds")

    def cost(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
             ) -> dict[str, Fraction]:
        column = _column(params, meta)
        agreed = read_leakage(budget, column.name, self.name)
        charge = _charge(len(column.categories or ()), params["rounds"])
        if charge > agreed:
            raise MechanismInputError(
                f"budget.{MEASURE}", f"{params['rounds']} rounds leak up to {float(charge):.6g}"
                f" but the budget allows {float(agreed):.6g}; ask fewer rounds")
        return {f"{MEASURE}:{column.name}": charge}

    def accuracy(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
                 ) -> dict[str, Any]:
        return _statement(_column(params, meta), params["rounds"])

    def map_bytes(self, params: Mapping[str, Any], meta: DatasetMeta) -> tuple[float, float]:
        rounds, k = int(params["rounds"]), len(_column(params, meta).categories or ())
        return self.map_row_bytes + 16.0 * rounds, _DRAW_BYTES * rounds * k

    def fit(self, params: Mapping[str, Any], partial: Partial | None, cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> categorical.ProgressiveCategorical:
        """The design: public (the categories and the rounds), after the charge's check."""
        column = _column(params, meta)
        k = len(column.categories or ())
        if _charge(k, params["rounds"]) > read_leakage(cost, column.name, self.name):
            raise MechanismInputError(f"budget.{MEASURE}", "the cost does not cover this design")
        return categorical.ProgressiveCategorical(k, params["rounds"])

    def privatize(self, rows: Mapping[str, np.ndarray], start: int,
                  params: Mapping[str, Any], cost: Budget, meta: DatasetMeta, model: Any,
                  rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Each record's questions from its own keys (rounds x k uniforms, in row order):
        the table's columns are the rounds' (public), whatever the rows."""
        design: categorical.ProgressiveCategorical = model
        raw = batch_columns(rows, [params["column"]])[params["column"]]
        codes = np.where((raw >= 0) & (raw < design.k), raw, 0).astype(np.int64)  # as clean()
        return design.release(codes, rng).table(np.full(design.k, 1.0 / design.k))

    def summary(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                model: Any) -> Statistic:
        return _Rounds(model.rounds)

    def describe(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 model: Any, released: Partial | None) -> Output:
        column = _column(params, meta)
        assert released is not None
        statement = _statement(column, params["rounds"])
        names = list(self.privatize({column.name: np.zeros(0, np.int64)}, 0, params, cost,
                                    meta, model, np.random.default_rng(0)))  # no rows, no draw
        result = {
            "n": released.rows, "column": column.name, "mechanism": self.name,
            "categories": list(column.categories or ()),
            "design": statement["design"],
            "expected_coverage_uniform": statement["expected_coverage_uniform"],
            "leakage_charged": statement["leakage_charged"],
            "rounds_histogram": list(released.parts["rounds"]),
            "columns": names,
            "convention": (
                "set_mask: bit c set iff category c (0-based, in the column's order) is still"
                " feasible; asked_h: the options of round h's question (0 once stopped);"
                " answer_h: 1 yes (inclusion), 0 no (exclusion), -1 not asked; coverage: the"
                " set's mass under the uniform prior"),
        }
        guarantee = (
            f"interval privacy (Ding & Ding 2022, Def. 1) on categorical column"
            f" {column.name!r}: each released set contains the true category and the"
            " questions depend only on earlier answers, so the posterior is the prior"
            f" restricted to the set; leakage {statement['leakage_charged']:.6g} charged to"
            f" {MEASURE}:{column.name}, the worst case over priors (additive across"
            f" releases, Thm 4); {PRIVACY_UNIT}; prior-relative, not epsilon-DP")
        return Output(result=result, accuracy=statement, guarantee=guarantee)


@dataclass(frozen=True)
class _Rounds(Statistic):
    """How many released records answered each number of rounds (0 .. ``rounds``):
    the result's histogram, exact from any partitions."""

    rounds: int

    @property
    def columns(self) -> tuple[str, ...]:
        return ("rounds",)

    def sizes(self) -> Mapping[str, int]:
        return {"rounds": self.rounds + 1}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64]]:
        return {"rounds": np.bincount(np.asarray(chunk["rounds"], dtype=np.int64),
                                      minlength=self.rounds + 1).astype(np.int64)}


class CategoriesAnalysis(Analysis):
    """Category shares from released sets: the NPMLE max Σ log π(S_j), with its KKT
    certificate. Post-processing (Thm 6): free."""

    name = "categories"
    params_schema = schemas.CategoriesParams

    def _k(self, release: ReleaseView) -> int:
        cats = release.result.get("categories")
        if not isinstance(cats, list) or not 2 <= len(cats) <= categorical.MAX_CATEGORIES:
            raise MechanismInputError("release", "this release carries no category list")
        if release.table is None or "set_mask" not in release.table:
            raise MechanismInputError("release", "the release table has no set_mask column")
        return len(cats)

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        super().check(release, params, others)
        self._k(release)

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        k = self._k(release)
        n = len(np.asarray((release.table or {})["set_mask"]))
        return Work(float(params["max_iter"]) * n * k, "params.max_iter", "lower max_iter")

    def run(self, release: ReleaseView, params: Mapping[str, Any], others: list[ReleaseView],
            rng: np.random.Generator) -> dict[str, Any]:
        k = self._k(release)
        feasible = categorical.masks_from_table(dict(release.table or {}), k)
        probs, res = categorical.category_npmle(feasible, params["tol"], params["max_iter"])
        names = list(release.result["categories"])
        warnings = []
        if not res.converged:
            warnings.append(f"not converged: KKT gap {res.kkt_gap:.3g} after"
                            f" {res.iterations} iterations; raise max_iter")
        return {"probabilities": dict(zip(names, (float(p) for p in probs), strict=True)),
                "loglik": res.loglik, "kkt_gap": res.kkt_gap, "converged": res.converged,
                "iterations": res.iterations, "n_used": res.n, "post_processing": True,
                "warnings": warnings}


ANALYSES: dict[str, Analysis] = {a.name: a for a in (CategoriesAnalysis(),)}
