"""Registered mechanisms: ``subset.uniform``, ``.custom``, ``.dummy`` and ``.product``.

Thin wrappers: ``plan.resolve`` checks parameters against the metadata,
``plan.charge`` prices one draw per column, ``report`` states accuracy and
summarizes, and the library privatizes. The output table holds one row per
released record in the dataset's row order (``subset.dummy`` interleaves its
simulated records at random positions): a bitmask column (int64, bit j =
category j) and/or the category names joined by "|". The service releases
the records in the dataset's secret order (``mechanisms.rows``): the threat
model (spec §1.3) assumes nobody knows which record is whose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import marshmallow
import numpy as np
from numpy.typing import NDArray

from mechanisms.base import (
    Analysis,
    Budget,
    DatasetMeta,
    Output,
    RecordMechanism,
    batch_columns,
)
from mechanisms.registry import register
from mechanisms.statistics import Batch, Partial, Statistic
from mechanisms.subset import analyses, bitmask, policy, report, sampler, schemas
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.dummy import privatize_with_dummies
from mechanisms.subset.plan import Plan, Variable, charge, resolve

#: the most categories (with dummies) of a variable a partitioned release aggregates:
#: its released subsets are counted in a dense vector of 2**p entries
MAX_MAPPED_P = 16

VERSION = "subset-1"
PRIVACY_UNIT = "neighbouring datasets differ in one record replaced; n_rows public"


class _Subset(RecordMechanism):
    """Each record's subset drawn on its own: a row map (``RecordMechanism``) whose
    summary is the released subsets' counts, unless a variable has dummy categories
    (simulated records at random positions: ``run_whole``) or more than
    ``MAX_MAPPED_P`` categories, or the table holds no bitmask column to count."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 112.0
    fixed_bytes = 16 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 8.0
    map_fixed_bytes = 5 * 2**20
    record_level = True  # one output per record: the dataset's opt-in
    measures = ("subset_draws",)
    analyses: ClassVar[Mapping[str, Analysis]] = {
        "estimate": analyses.ESTIMATE,
        "independence_test": analyses.PAIR_TEST,
    }

    def plan(self, params: Mapping[str, Any], meta: DatasetMeta) -> Plan:
        return resolve(self.name, params, meta)

    def with_history(self, params: dict[str, Any],
                     committed: Callable[[], Mapping[str, Fraction]]) -> dict[str, Any]:
        """Earlier draws of the same columns, from the ledger: the release then reports
        the composed design's metrics (a client cannot understate them)."""
        columns = params.get("columns") or [params.get("column")]
        spent = committed()
        drawn = max((int(spent.get(f"subset_draws:{c}", 0)) for c in columns), default=0)
        if drawn > int(params.get("prior_draws", 0)):
            return {**params, "prior_draws": drawn}
        return params

    def cost(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
             ) -> dict[str, Fraction]:
        plan = self.plan(params, meta)
        cost = charge(plan, budget)
        policy.check(plan, meta)  # operator thresholds: refused before anything is reserved
        return cost

    def accuracy(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
                 ) -> dict[str, Any]:
        return _accuracy(self.plan(params, meta), meta)

    def mappable(self, params: Mapping[str, Any], meta: DatasetMeta) -> bool:
        plan = self.plan(params, meta)
        return plan.format in ("bitmask", "both") and all(
            v.augmentation is None and v.p <= MAX_MAPPED_P for v in plan.variables)

    def mapped_columns(self, params: Mapping[str, Any], meta: DatasetMeta) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for v in self.plan(params, meta).variables
                                   for c in v.columns))

    def fit(self, params: Mapping[str, Any], partial: Partial | None, cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Plan:
        return self.plan(params, meta)

    def privatize(self, rows: Mapping[str, np.ndarray], start: int,
                  params: Mapping[str, Any], cost: Budget, meta: DatasetMeta, model: Any,
                  rng: np.random.Generator) -> dict[str, np.ndarray]:
        """One child stream per variable: columns are privatized independently
        (Definition 8)."""
        plan: Plan = model
        data = batch_columns(rows, self.mapped_columns(params, meta))
        table: dict[str, np.ndarray] = {}
        for variable, stream in zip(plan.variables, rng.spawn(len(plan.variables)),
                                    strict=True):
            masks, _ = _privatize(variable, data, stream)
            table.update(_table(plan, variable, masks))
        return table

    def summary(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                model: Any) -> Statistic:
        plan: Plan = model
        return _SubsetCounts(tuple((plan.table_columns(v)["bitmask"] or "", v.p)
                                   for v in plan.variables))

    def describe(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 model: Any, released: Partial | None) -> Output:
        plan: Plan = model
        assert released is not None
        summaries = []
        for i, variable in enumerate(plan.variables):
            counts = released.vector(f"subsets_{i}")
            distinct = np.flatnonzero(counts)
            summaries.append(report.summarize_counts(
                variable, distinct.astype(np.uint64), counts[distinct], plan))
        result = {
            "mechanism_version": VERSION,
            "n_rows": meta.n_rows,
            "n_records": released.rows,
            "format": plan.format,
            "encoding": "bitmask int64: bit j set = category j of the variable's categories",
            # the service replaces this by the dataset's secret order (mechanisms.rows)
            "row_order": "dataset row order",
            "variables": summaries,
        }
        return Output(result=result, accuracy=_accuracy(plan, meta), guarantee=guarantee(plan))

    def run_whole(
        self,
        data: Mapping[str, np.ndarray],
        params: Mapping[str, Any],
        cost: Budget,
        meta: DatasetMeta,
        rng: np.random.Generator,
    ) -> Output:
        """Variables with dummy categories interleave simulated records: whole columns."""
        plan = self.plan(params, meta)
        table: dict[str, np.ndarray] = {}
        summaries = []
        # one child stream per variable: columns are privatized independently (Definition 8)
        for variable, stream in zip(plan.variables, rng.spawn(len(plan.variables)),
                                    strict=True):
            masks, dummy = _privatize(variable, data, stream)
            table.update(_table(plan, variable, masks))
            summaries.append(report.summarize(variable, masks, plan, dummy))
        records = len(next(iter(table.values())))
        interleaved = any(v.augmentation for v in plan.variables)
        result = {
            "mechanism_version": VERSION,
            "n_rows": meta.n_rows,
            "n_records": records,
            "format": plan.format,
            "encoding": "bitmask int64: bit j set = category j of the variable's categories",
            # the service replaces this by the dataset's secret order (mechanisms.rows)
            "row_order": "dataset row order",
            "variables": summaries,
        }
        if interleaved:
            result["dummy_records"] = "simulated records at random positions among the real ones"
        return Output(result=result, accuracy=_accuracy(plan, meta),
                      guarantee=guarantee(plan), table=table)


@dataclass(frozen=True)
class _SubsetCounts(Statistic):
    """Per variable (its bitmask column and categories p), how many released records
    drew each subset (``subsets_<i>``, 2**p counts): what its summary reads."""

    variables: tuple[tuple[str, int], ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name, _ in self.variables))

    def sizes(self) -> Mapping[str, int]:
        return {f"subsets_{i}": 1 << p for i, (_, p) in enumerate(self.variables)}

    def reduce(self, chunk: Batch) -> Mapping[str, NDArray[np.int64]]:
        return {f"subsets_{i}": np.bincount(np.asarray(chunk[name]).astype(np.intp),
                                            minlength=1 << p).astype(np.int64)
                for i, (name, p) in enumerate(self.variables)}


def _accuracy(plan: Plan, meta: DatasetMeta) -> dict[str, Any]:
    """The accuracy statement, with the operator thresholds and the values checked."""
    doc = report.accuracy(plan)
    block = policy.describe(policy.check(plan, meta))
    if block is not None:
        doc["policy"] = block
    return doc


def _privatize(variable: Variable, data: Mapping[str, np.ndarray], rng: np.random.Generator
               ) -> tuple[Masks, dict[str, Any] | None]:
    encode_stream, draw_stream = rng.spawn(2)
    codes = variable.domain.encode([data[c] for c in variable.columns], encode_stream)
    if variable.augmentation is None:
        return sampler.privatize(codes, variable.design, draw_stream), None
    released = privatize_with_dummies(codes, variable.augmentation, draw_stream)
    alpha = released.alpha_effective
    return released.masks, {
        "n_real": released.n_real,
        "dummy_records_per_category": released.n_dummy_per_category,
        "alpha_effective": float(alpha),
        "alpha_effective_exact": f"{alpha.numerator}/{alpha.denominator}",
    }


def _table(plan: Plan, variable: Variable, masks: Masks) -> dict[str, np.ndarray]:
    names = plan.table_columns(variable)
    out: dict[str, np.ndarray] = {}
    if names["bitmask"] is not None:
        out[names["bitmask"]] = masks.astype(np.int64)  # p ≤ 63: bit 63 is never set
    if names["categories"] is not None:
        out[names["categories"]] = bitmask.labels(masks, variable.categories)
    return out


def guarantee(plan: Plan) -> str:
    """The privacy notion, the designs, what is not promised, and the privacy unit."""
    parts = []
    for v in plan.variables:
        p = v.domain.p
        if v.augmentation is not None:
            what = (f"{v.name!r}: {p} categories plus 2 dummy categories of share"
                    f" {v.augmentation.alpha:g} (every record's size coverage >= that share)")
        elif v.design.is_uniform:
            what = f"{v.name!r}: uniform design over subsets of size 2..{p - 2} of {p} categories"
        else:
            what = f"{v.name!r}: custom {v.design.kind} design on {p} categories"
        parts.append(what)
    return (
        "subset privacy (non-informative and faithful: each record's released subset contains"
        " its true category and reveals nothing beyond that event; " + "; ".join(parts) + ");"
        " one draw per record and column (intersecting independent draws can disclose"
        " categories); not epsilon-DP (no finite epsilon); does not protect against side"
        f" information linking a person to a row; {PRIVACY_UNIT}"
    )


class UniformSubset(_Subset):
    """The uniform independent design on one column (or a combined / augmented variable)."""

    name = "subset.uniform"
    params_schema: ClassVar[type[marshmallow.Schema]] = schemas.UniformParamsSchema
    description = (
        "Subset privacy: each record's category is replaced by a random subset that contains"
        " it (uniform design, sizes 2..p-2, p >= 4); combine_with / artificial_levels handle"
        " small domains. Not epsilon-DP; one draw per record and column."
    )


class CustomSubset(_Subset):
    map_fixed_bytes = 2 * 2**20  # measured: 1.6 MB at 10^5 rows (uniform, product: 4.5 MB)
    """An explicit independent (ν) or conditional (μ) design on one column, p ≤ 16."""

    name = "subset.custom"
    params_schema: ClassVar[type[marshmallow.Schema]] = schemas.CustomParamsSchema
    description = (
        "Subset privacy with an explicit design: nu (independent: a subset or its complement"
        " is released) or mu (conditional); validated for support, sums and identifiability."
    )


class DummySubset(_Subset):
    """Dummy-category augmentation: a coverage floor alpha for every record (any p ≥ 2)."""

    name = "subset.dummy"
    params_schema: ClassVar[type[marshmallow.Schema]] = schemas.DummyParamsSchema
    description = (
        "Subset privacy with two dummy categories of share alpha: simulated dummy records"
        " are interleaved and every released subset holds one dummy, so every record's size"
        " coverage is at least alpha; works for p = 2, 3."
    )
    analyses: ClassVar[Mapping[str, Analysis]] = {"estimate": analyses.ESTIMATE}


class ProductSubset(_Subset):
    """One design per column, drawn independently (Definition 8)."""

    name = "subset.product"
    params_schema: ClassVar[type[marshmallow.Schema]] = schemas.ProductParamsSchema
    description = (
        "Subset privacy for several columns: each column gets its own design (uniform by"
        " default) and is privatized independently; supports independence tests."
    )
    analyses: ClassVar[Mapping[str, Analysis]] = {
        "estimate": analyses.ESTIMATE,
        "independence_test": analyses.PRODUCT_TEST,
    }


uniform = register(UniformSubset())
custom = register(CustomSubset())
dummy = register(DummySubset())
product = register(ProductSubset())
