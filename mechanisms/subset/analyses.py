"""Free post-processing of subset releases: ``estimate`` and ``independence_test``.

They read the released subsets and the design stored in the release's
result (never the data), so by the data-processing inequality they cannot
raise I(X; ·) or the prediction risk: they spend nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import marshmallow
import numpy as np

from mechanisms.base import Analysis, MechanismInputError, ReleaseView, Work
from mechanisms.subset import bitmask, estimation, independence, joint, report, schemas
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import ENUMERATION_LIMIT, DesignError
from mechanisms.subset.plan import Variable

#: EM, one-step and the tests hold an m × p indicator matrix of the distinct subsets
MAX_INDICATOR_ENTRIES = 1 << 24


def _variables(release: ReleaseView, field: str) -> list[Mapping[str, Any]]:
    docs = release.result.get("variables")
    if not release.mechanism.startswith("subset.") or not isinstance(docs, list) or not docs:
        raise MechanismInputError(field, "not a subset-privacy release")
    return docs


def _pick(release: ReleaseView, name: str | None, field: str, release_field: str
          ) -> tuple[Variable, Mapping[str, Any]]:
    """The named privatized variable of a release (the only one if unnamed)."""
    docs = _variables(release, release_field)
    names = [str(d["name"]) for d in docs]
    if name is None:
        if len(docs) > 1:
            raise MechanismInputError(field, f"the release privatized several variables;"
                                             f" name one of {names}")
        doc = docs[0]
    elif name in names:
        doc = docs[names.index(name)]
    else:
        raise MechanismInputError(field, f"the release privatized only {names}")
    return Variable.from_json(doc), doc


def _masks(release: ReleaseView, variable: Variable, doc: Mapping[str, Any],
           field: str) -> Masks:
    """The variable's released subsets from the release table (bitmask or names)."""
    table = release.table
    where = doc.get("table") or {}
    if table is None:
        raise MechanismInputError(field, "the release has no stored table")
    bits, names = where.get("bitmask"), where.get("categories")
    if bits is not None and bits in table:
        values = np.asarray(table[bits])
        if values.dtype.kind in "iu":
            return bitmask.as_masks(values)
    if names is not None and names in table:
        return bitmask.parse_labels(table[names], variable.categories)
    raise MechanismInputError(field, "the release table lacks the variable's subsets")


def _distinct(release: ReleaseView, variable: Variable, doc: Mapping[str, Any],
              field: str) -> int:
    """Distinct released subsets of a variable: a count of the released output (public),
    as the release's summary states it, else counted from its table."""
    counts = doc.get("counts")
    if isinstance(counts, Mapping) and isinstance(counts.get("distinct_subsets"), int):
        return int(counts["distinct_subsets"])
    return len(np.unique(_masks(release, variable, doc, field)))


def _has_table_column(release: ReleaseView, doc: Mapping[str, Any], field: str) -> None:
    """The release's table holds the variable's subsets (names only; nothing is read)."""
    where = doc.get("table") or {}
    table = release.table or {}
    if not any(where.get(k) is not None and where.get(k) in table
               for k in ("bitmask", "categories")):
        raise MechanismInputError(field, "the release table lacks the variable's subsets")


def _is_subset_release(mechanism: str, result: Mapping[str, Any]) -> bool:
    docs = result.get("variables")
    return mechanism.startswith("subset.") and isinstance(docs, list) and bool(docs)


def _alpha(variable: Variable, doc: Mapping[str, Any]) -> float:
    return float(doc["dummy"]["alpha_effective"]) if variable.augmentation else 0.0


class EstimateAnalysis(Analysis):
    """ŵ by EM, moments (raw and projected) or one-step, with SEs and privacy metrics."""

    name = "estimate"
    params_schema: ClassVar[type[marshmallow.Schema]] = schemas.EstimateParamsSchema

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        return _is_subset_release(mechanism, result)

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        variable, doc = _pick(release, params.get("column"), "params.column", "release")
        _has_table_column(release, doc, "params.column")
        method = params.get("method", "em")
        if method == "mom_closed" and not variable.design.is_uniform:
            raise MechanismInputError("params.method", "mom_closed is the uniform design's"
                                      " closed form; this release's design is not uniform"
                                      " (use mom, em or one_step)")
        m = _distinct(release, variable, doc, "params.column")
        if method in ("em", "one_step") and m * variable.p > MAX_INDICATOR_ENTRIES:
            raise MechanismInputError(
                "params.method", f"{m} distinct subsets of {variable.p} categories are"
                " too many for the likelihood methods; use method 'mom'")

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        """EM: iterations x distinct subsets x categories (one-step may fall back to EM);
        moments: one pass over the records and a p x p solve."""
        variable, doc = _pick(release, params.get("column"), "params.column", "release")
        m, p = _distinct(release, variable, doc, "params.column"), variable.p
        method = params.get("method", "em")
        if method in ("em", "one_step"):
            units = float(params.get("max_iter", estimation.EM_MAX_ITER)) * m * p
            if method == "one_step":
                units += float(m) * p * p
            return Work(units, "params.max_iter", "lower max_iter")
        return Work(float(release.meta.n_rows) * p + float(p) ** 3, "params.method")

    def run(self, release: ReleaseView, params: Mapping[str, Any],
            others: list[ReleaseView], rng: np.random.Generator) -> dict[str, Any]:
        variable, doc = _pick(release, params.get("column"), "params.column", "release")
        masks = _masks(release, variable, doc, "params.column")
        alpha = _alpha(variable, doc)
        obs = report.observed(variable, masks, alpha)
        method = params.get("method", "em")
        if method in ("em", "one_step") and len(obs.masks) * obs.p > MAX_INDICATOR_ENTRIES:
            raise MechanismInputError(
                "params.method", f"{len(obs.masks)} distinct subsets of {obs.p} categories are"
                " too many for the likelihood methods; use method 'mom'")
        try:
            fit = estimation.estimate(
                obs, variable.design, method,
                project=bool(params.get("project", True)),
                tol=float(params.get("tol", estimation.EM_TOL)),
                max_iter=int(params.get("max_iter", estimation.EM_MAX_ITER)),
                accelerate=bool(params.get("accelerate", True)))
        except ValueError as err:
            raise MechanismInputError("params.method", str(err)) from None
        out = fit.to_json(variable.domain.labels)
        out["column"] = variable.name
        if fit.cov is not None and variable.domain.p <= ENUMERATION_LIMIT:
            out["cov"] = [[float(v) for v in row] for row in fit.cov]
        if variable.augmentation is not None:
            out["dummy"] = {"alpha_effective": alpha, "note": "the dummy share is fixed at its"
                            " published value; w is the distribution of the real records"}
        domain = variable.domain
        if len(domain.factors) > 1 or domain.artificial_levels > 1:
            out["marginals"] = {}
            for factor in domain.factors:
                m = domain.marginal_matrix(factor.name)
                marginal: dict[str, Any] = {"categories": list(factor.categories),
                                            "w": [float(v) for v in m.T @ fit.w]}
                if fit.cov is not None:
                    var = np.clip(np.diag(m.T @ fit.cov @ m), 0.0, None)
                    marginal["se"] = [float(v) for v in np.sqrt(var)]
                out["marginals"][factor.name] = marginal
        out["privacy"] = report.privacy_under(variable, fit.w, alpha) if obs.n else None
        return out


def _test_work(pairs: list[tuple[Variable, int]], params: Mapping[str, Any]) -> Work:
    """Marginal EMs, then per statistic a joint fit over the distinct subset pairs (EM
    for lrt_mle), once and again per permutation table."""
    (var_a, m_a), (var_b, m_b) = pairs
    methods = list(params.get("methods", ["lrt_mom"]))
    marginal = float(joint.JOINT_MAX_ITER) * (m_a * var_a.p + m_b * var_b.p)
    per_table = float(m_a) * m_b * var_a.p * var_b.p
    if "lrt_mle" in methods:
        per_table *= joint.JOINT_MAX_ITER
    tables = 1 + (int(params.get("n_perm", 999))
                  if params.get("calibration") == "permutation" else 0)
    field = "params.n_perm" if tables > 1 else "params.methods"
    return Work(marginal + tables * per_table * len(methods), field,
                "use fewer permutations, asymptotic calibration or lrt_mom")


def _test(
    a: tuple[Variable, Masks], b: tuple[Variable, Masks], params: Mapping[str, Any],
    rng: np.random.Generator, field: str,
) -> dict[str, Any]:
    (var_a, masks_a), (var_b, masks_b) = a, b
    for var in (var_a, var_b):
        if var.augmentation is not None:
            raise MechanismInputError(field, "a dummy-augmented release adds simulated records;"
                                             " it cannot be paired record by record")
    if len(masks_a) != len(masks_b):
        raise MechanismInputError(field, "the releases hold different numbers of records")
    size = len(np.unique(masks_a)) * var_a.p + len(np.unique(masks_b)) * var_b.p
    if size > MAX_INDICATOR_ENTRIES:
        raise MechanismInputError(field, "too many distinct subsets to test at these domain"
                                         " sizes")
    try:
        results = independence.independence_tests(
            masks_a, masks_b, var_a.design, var_b.design,
            list(params.get("methods", ["lrt_mom"])),
            alpha=float(params.get("alpha", 0.05)),
            calibration=params.get("calibration", "asymptotic"),
            n_perm=int(params.get("n_perm", 999)),
            df_mode=params.get("df_mode", "model"),
            rng=rng,
        )
    except DesignError as err:
        raise MechanismInputError("params.calibration", err.message) from None
    except ValueError as err:
        raise MechanismInputError(field, str(err)) from None
    return {
        "columns": [var_a.name, var_b.name],
        "n": len(masks_a),
        "tests": {m: r.to_json() for m, r in results.items()},
        "hypothesis": "H0: the two variables are independent (equivalently, so are their"
                      " released subsets under a product design)",
        "recommended": "lrt_mom",
    }


class PairTest(Analysis):
    """Independence of this release's variable and another release's (same rows)."""

    name = "independence_test"
    params_schema: ClassVar[type[marshmallow.Schema]] = schemas.PairTestParamsSchema
    n_others = 1

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        return _is_subset_release(mechanism, result)

    def _picked(self, release: ReleaseView, params: Mapping[str, Any],
                others: list[ReleaseView]) -> list[tuple[Variable, int]]:
        if len(others) != 1:
            raise MechanismInputError("releases", "give exactly one other subset release")
        out = []
        for view, name, field, release_field in (
                (release, params.get("column"), "params.column", "release"),
                (others[0], params.get("other_column"), "params.other_column", "releases.0")):
            var, doc = _pick(view, name, field, release_field)
            _has_table_column(view, doc, release_field)
            if var.augmentation is not None:
                raise MechanismInputError(release_field, "a dummy-augmented release adds"
                                          " simulated records; it cannot be paired record by"
                                          " record")
            out.append((var, _distinct(view, var, doc, release_field)))
        return out

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        self._picked(release, params, others)

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        return _test_work(self._picked(release, params, others), params)

    def run(self, release: ReleaseView, params: Mapping[str, Any],
            others: list[ReleaseView], rng: np.random.Generator) -> dict[str, Any]:
        if len(others) != 1:
            raise MechanismInputError("releases", "give exactly one other subset release")
        var_a, doc_a = _pick(release, params.get("column"), "params.column", "release")
        var_b, doc_b = _pick(others[0], params.get("other_column"), "params.other_column",
                             "releases.0")
        a = (var_a, _masks(release, var_a, doc_a, "params.column"))
        b = (var_b, _masks(others[0], var_b, doc_b, "releases.0"))
        return _test(a, b, params, rng, "releases.0")


class ProductTest(Analysis):
    """Independence of two variables of one ``subset.product`` release."""

    name = "independence_test"
    params_schema: ClassVar[type[marshmallow.Schema]] = schemas.ProductTestParamsSchema
    n_others = 0

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        docs = result.get("variables")
        return _is_subset_release(mechanism, result) and isinstance(docs, list) and (
            len(docs) >= 2)

    def _picked(self, release: ReleaseView, params: Mapping[str, Any]
                ) -> list[tuple[Variable, int]]:
        docs = _variables(release, "release")
        names = params.get("columns") or [d["name"] for d in docs[:2]]
        if len(names) != 2 or names[0] == names[1]:
            raise MechanismInputError("params.columns", "name two different variables")
        out = []
        for name in names:
            var, doc = _pick(release, name, "params.columns", "release")
            _has_table_column(release, doc, "params.columns")
            if var.augmentation is not None:
                raise MechanismInputError("params.columns", "a dummy-augmented variable adds"
                                          " simulated records; it cannot be paired record by"
                                          " record")
            out.append((var, _distinct(release, var, doc, "params.columns")))
        return out

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        self._picked(release, params)

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        return _test_work(self._picked(release, params), params)

    def run(self, release: ReleaseView, params: Mapping[str, Any],
            others: list[ReleaseView], rng: np.random.Generator) -> dict[str, Any]:
        docs = _variables(release, "release")
        names = params.get("columns") or [d["name"] for d in docs[:2]]
        if len(names) != 2 or names[0] == names[1]:
            raise MechanismInputError("params.columns", "name two different variables")
        picked = []
        for name in names:
            var, doc = _pick(release, name, "params.columns", "release")
            picked.append((var, _masks(release, var, doc, "params.columns")))
        return _test(picked[0], picked[1], params, rng, "params.columns")


ESTIMATE = EstimateAnalysis()
PAIR_TEST = PairTest()
PRODUCT_TEST = ProductTest()
