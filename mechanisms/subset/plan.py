"""From request parameters and public metadata to what will be privatized.

A *plan* lists the privatized variables — each a domain (one column, or
columns combined, times an optional artificial variable), a design, and
for ``subset.dummy`` the augmentation — before any data is read, so cost
and accuracy come from public inputs only. Errors name the offending field
and never contain data values.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from mechanisms.base import Budget, ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.subset import bitmask, design
from mechanisms.subset.design import Design, DesignError
from mechanisms.subset.domain import Domain, Factor
from mechanisms.subset.dummy import DummyAugmentation, base_design

MEASURE = "subset_draws"
LABEL_SUFFIX = "_categories"
#: the names format is refused when its fixed-width column could exceed this
MAX_LABEL_BYTES = 1 << 28
SMALL_DOMAIN_HELP = (
    "use combine_with (join it with other categorical columns), artificial_levels (pair it"
    " with an artificial uniform variable), or the subset.dummy mechanism (dummy categories)"
)


@dataclass(frozen=True)
class Variable:
    """One privatized variable: its table column, domain, design and dummies if any."""

    name: str
    domain: Domain
    design: Design
    augmentation: DummyAugmentation | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """The dataset columns it reads (each is charged one draw)."""
        return self.domain.names

    @property
    def p(self) -> int:
        """Size of the released domain (dummies included)."""
        return self.domain.p + (2 if self.augmentation else 0)

    @property
    def categories(self) -> tuple[str, ...]:
        """Names of the released domain's categories, in bit order."""
        labels = self.domain.labels
        if self.augmentation is None:
            return labels
        return (*labels, *dummy_names(labels))

    def describe(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "columns": list(self.columns),
            "categories": list(self.categories),
            "domain": self.domain.describe(),
            "design": self.design.describe(self.domain.labels),
        }
        if self.augmentation is not None:
            doc["dummy"] = {"alpha": self.augmentation.alpha,
                            "dummy_categories": list(self.categories[-2:])}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Variable:
        """Rebuild from ``describe`` output (what analyses read from a release's result)."""
        domain = Domain.from_json(doc["domain"])
        base = design.from_json(doc["design"], domain.labels)
        dummy = doc.get("dummy")
        augmentation = DummyAugmentation(base, float(dummy["alpha"])) if dummy else None
        return cls(str(doc["name"]), domain, base, augmentation)


@dataclass(frozen=True)
class Plan:
    """Everything a subset release needs, resolved against the metadata."""

    mechanism: str
    variables: tuple[Variable, ...]
    format: str
    prior_draws: int
    n_rows: int

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for v in self.variables for c in v.columns)

    def table_columns(self, variable: Variable) -> dict[str, str | None]:
        """Names of the variable's table columns by kind (bitmask / categories)."""
        bits = variable.name if self.format in ("bitmask", "both") else None
        names = None
        if self.format == "categories":
            names = variable.name
        elif self.format == "both":
            names = variable.name + LABEL_SUFFIX
        return {"bitmask": bits, "categories": names}


def dummy_names(labels: Sequence[str]) -> tuple[str, str]:
    """Two names for the dummy categories that differ from every real one."""
    taken = set(labels)
    stem = "dummy"
    while f"<{stem} 1>" in taken or f"<{stem} 2>" in taken:
        stem = "_" + stem
    return f"<{stem} 1>", f"<{stem} 2>"


# ---------------------------------------------------------------------- resolve


def resolve(mechanism: str, params: Mapping[str, Any], meta: DatasetMeta) -> Plan:
    """Check ``params`` against the metadata; raises MechanismInputError naming the field."""
    fmt = str(params.get("format", "bitmask"))
    prior = int(params.get("prior_draws", 0))
    if mechanism == "subset.uniform":
        variables: tuple[Variable, ...] = (_uniform_variable(params, meta),)
    elif mechanism == "subset.custom":
        variables = (_custom_variable(params, meta),)
    elif mechanism == "subset.dummy":
        variables = (_dummy_variable(params, meta),)
    elif mechanism == "subset.product":
        variables = _product_variables(params, meta)
    else:
        raise ValueError(f"not a subset mechanism: {mechanism}")
    plan = Plan(mechanism, variables, fmt, prior, meta.n_rows)
    _check_table(plan)
    return plan


def _categorical(meta: DatasetMeta, name: str, field: str) -> ColumnMeta:
    column = meta.column(name, field)
    if column.type != "categorical":
        raise MechanismInputError(
            field, f"column {name!r} is {column.type}; subset privacy needs a categorical column")
    if not column.categories:
        raise MechanismInputError(field, f"column {name!r} declares no categories")
    return column


def _uniform_variable(params: Mapping[str, Any], meta: DatasetMeta) -> Variable:
    names = [params["column"], *params.get("combine_with", [])]
    if len(set(names)) != len(names):
        raise MechanismInputError("params.combine_with", "a column is combined with itself")
    fields = ["params.column", *(f"params.combine_with.{i}" for i in range(len(names) - 1))]
    columns = [_categorical(meta, n, f) for n, f in zip(names, fields, strict=True)]
    levels = int(params.get("artificial_levels", 1))
    return _uniform_on(columns, levels, "params.column", "+".join(names))


def _uniform_on(columns: Sequence[ColumnMeta], levels: int, field: str, name: str) -> Variable:
    factors = tuple(Factor(c.name, tuple(c.categories or ())) for c in columns)
    p = math.prod(f.size for f in factors) * levels
    if p > bitmask.MAX_P:
        raise MechanismInputError(
            field, f"the privatized variable would have {p} categories; at most"
                   f" {bitmask.MAX_P} fit a subset bitmask")
    if p < 4:
        raise MechanismInputError(
            field,
            f"{' x '.join(repr(c.name) for c in columns)} has {p} categories; the uniform design"
            f" needs at least 4 (it releases subsets of size 2..p-2, and there are none for"
            f" p < 4): {SMALL_DOMAIN_HELP}",
        )
    return Variable(name, Domain(factors, levels), design.uniform(p))


def _explicit_design(
    spec: Mapping[str, Any], column: ColumnMeta, prefix: str, column_field: str
) -> Design:
    categories = column.categories or ()
    p = len(categories)
    if p > design.ENUMERATION_LIMIT:
        raise MechanismInputError(
            column_field,
            f"column {column.name!r} has {p} categories; explicit designs are limited to"
            f" {design.ENUMERATION_LIMIT} (2**p subsets); use the uniform design")
    index = {c: j for j, c in enumerate(categories)}
    subsets = []
    for i, subset in enumerate(spec["subsets"]):
        unknown = [s for s in subset if s not in index]
        if unknown:
            raise MechanismInputError(
                f"{prefix}.subsets.{i}",
                f"names a category that column {column.name!r} does not declare")
        subsets.append([index[s] for s in subset])
    try:
        if spec["type"] == "nu":
            return design.from_nu(subsets, spec["probabilities"], p)
        return design.from_mu(subsets, spec["probabilities"], p)
    except DesignError as err:
        where = {"subsets": "subsets", "probabilities": "probabilities"}.get(err.field, "type")
        raise MechanismInputError(f"{prefix}.{where}", err.message) from None


def _custom_variable(params: Mapping[str, Any], meta: DatasetMeta) -> Variable:
    column = _categorical(meta, params["column"], "params.column")
    chosen = _explicit_design(params["design"], column, "params.design", "params.column")
    return Variable(column.name, Domain.single(column.name, column.categories or ()), chosen)


def _dummy_variable(params: Mapping[str, Any], meta: DatasetMeta) -> Variable:
    column = _categorical(meta, params["column"], "params.column")
    p = len(column.categories or ())
    if p < 2:
        raise MechanismInputError("params.column",
                                  f"column {column.name!r} has a single category: nothing to hide")
    if p + 2 > bitmask.MAX_P:
        raise MechanismInputError("params.column", f"at most {bitmask.MAX_P - 2} categories"
                                                   " fit a bitmask with the two dummies")
    base = params.get("base", "auto")
    try:
        if base == "uniform":
            chosen = design.uniform(p)
        elif base == "proper":
            chosen = design.proper(p)
        else:
            chosen = base_design(p)
    except DesignError as err:
        raise MechanismInputError("params.base", err.message) from None
    augmentation = DummyAugmentation(chosen, float(params["alpha"]))
    return Variable(column.name, Domain.single(column.name, column.categories or ()), chosen,
                    augmentation)


def _product_variables(params: Mapping[str, Any], meta: DatasetMeta) -> tuple[Variable, ...]:
    names = list(params["columns"])
    specs = dict(params.get("designs") or {})
    for key in specs:
        if key not in names:
            raise MechanismInputError(f"params.designs.{key}", "not one of params.columns")
    variables = []
    for i, name in enumerate(names):
        column = _categorical(meta, name, f"params.columns.{i}")
        spec = specs.get(name, {"type": "uniform"})
        if spec.get("type", "uniform") == "uniform":
            levels = int(spec.get("artificial_levels", 1))
            variables.append(_uniform_on([column], levels, f"params.columns.{i}", name))
        else:
            chosen = _explicit_design(spec, column, f"params.designs.{name}",
                                      f"params.columns.{i}")
            variables.append(Variable(name, Domain.single(name, column.categories or ()), chosen))
    return tuple(variables)


def _check_table(plan: Plan) -> None:
    """Table column names must not collide; '|' inside a category would make names ambiguous."""
    seen: set[str] = set()
    for variable in plan.variables:
        for kind, name in plan.table_columns(variable).items():
            if name is None:
                continue
            if name in seen:
                raise MechanismInputError("params.format", f"two table columns would be named"
                                                           f" {name!r}; use format 'bitmask'")
            seen.add(name)
            if kind != "categories":
                continue
            if any(bitmask.SEPARATOR in c for c in variable.categories):
                raise MechanismInputError(
                    "params.format", f"a category of {variable.name!r} contains"
                                     f" {bitmask.SEPARATOR!r}; use format 'bitmask'")
            # fixed-width strings: the longest possible label times the released records
            width = sum(len(c) + 1 for c in variable.categories)
            records = plan.n_rows
            if variable.augmentation is not None:
                records += 2 * variable.augmentation.dummy_count(plan.n_rows)
            if 4 * width * records > MAX_LABEL_BYTES:
                raise MechanismInputError(
                    "params.format", f"category names for {variable.name!r} could take"
                                     f" {4 * width * records // 2**20} MiB; use format"
                                     " 'bitmask'")


# ---------------------------------------------------------------------- cost


def charge(plan: Plan, budget: Budget) -> dict[str, Fraction]:
    """One draw per column read: ``{"subset_draws:<column>": 1}``.

    The analyst agrees with ``subset_draws`` (any column) or
    ``subset_draws:<column>``; at least one draw must be agreed to.
    """
    allowed = {MEASURE, *(f"{MEASURE}:{c}" for c in plan.columns)}
    extra = sorted(set(budget) - allowed)
    if extra:
        raise MechanismInputError(
            "budget", f"{plan.mechanism} spends only {MEASURE} (one draw per column);"
                      f" got {', '.join(extra)}")
    cost: dict[str, Fraction] = {}
    for column in plan.columns:
        key = f"{MEASURE}:{column}"
        field = f"budget.{key}" if key in budget else f"budget.{MEASURE}"
        agreed = budget.get(key, budget.get(MEASURE))
        if agreed is None:
            raise MechanismInputError(f"budget.{MEASURE}",
                                      f"{plan.mechanism} needs a {MEASURE} budget")
        if isinstance(agreed, bool) or not isinstance(agreed, numbers.Real) or (
                isinstance(agreed, float) and not math.isfinite(agreed)):
            raise MechanismInputError(field, "must be a finite number")
        if not Fraction(agreed) >= 1:
            raise MechanismInputError(
                field, "a subset release draws once per record and column: agree to 1 draw")
        cost[key] = Fraction(1)
    return cost
