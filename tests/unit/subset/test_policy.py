"""Operator thresholds on subset designs (issue #17 item 6): refused before anything is spent.

Exact reference values under the uniform prior (spec §1.4, §2.3):
p = 5 uniform design: r_5 = 5/2, τ = 1/r + (1 − 1/r)/p = 0.52, R = Σμ_a/p = 2/5;
p = 4 uniform design: τ = 1/2, I = 1 bit, R = 1/2; two draws: P(|A1∩A2| = 1) = 2/3 and
R* = E[1/|A*|] = 2/3 + (1/3)(1/2) = 5/6.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError, PolicyViolation
from mechanisms.subset import composition, design, policy, release
from service.ingest import IngestError, parse_metadata

DRAW = {"subset_draws": Fraction(1)}
RACE = ("AIE", "API", "Black", "Other", "White")


def _meta(dataset: Mapping[str, float] | None = None,
          race: Mapping[str, float] | None = None,
          c4: Mapping[str, float] | None = None, n: int = 1000) -> DatasetMeta:
    return DatasetMeta(n, {
        "race": ColumnMeta("race", "categorical", categories=RACE, subset_policy=race),
        "c4": ColumnMeta("c4", "categorical", categories=("a", "b", "c", "d"),
                         subset_policy=c4),
        "sex": ColumnMeta("sex", "categorical", categories=("F", "M")),
        "wide": ColumnMeta("wide", "categorical", categories=tuple(f"k{i}" for i in range(17))),
    }, subset_policy=dataset)


def _cost(mechanism: Any, raw: Mapping[str, Any], meta: DatasetMeta) -> dict[str, Fraction]:
    params = mechanism.load_params(raw)
    cost: dict[str, Fraction] = mechanism.cost(params, DRAW, meta)
    return cost


def test_without_thresholds_nothing_changes() -> None:
    """No policy: cost as before and no ``policy`` block in the accuracy statement."""
    meta = _meta()
    params = release.uniform.load_params({"column": "race"})
    assert release.uniform.cost(params, DRAW, meta) == {"subset_draws:race": 1}
    assert "policy" not in release.uniform.accuracy(params, DRAW, meta)


def test_estimate_shows_thresholds_and_exact_public_values() -> None:
    """The accuracy (what estimate returns) names each threshold, its source and the value."""
    meta = _meta(dataset={"min_size_coverage": 0.5, "max_prediction_risk": 0.4})
    params = release.uniform.load_params({"column": "race"})
    cost = release.uniform.cost(params, DRAW, meta)
    block = release.uniform.accuracy(params, cost, meta)["policy"]
    (var,) = block["variables"]
    assert var["thresholds"] == {"min_size_coverage": 0.5, "max_prediction_risk": 0.4}
    assert var["sources"]["min_size_coverage"] == "metadata.subset_policy.min_size_coverage"
    assert var["computed"]["size_coverage"] == pytest.approx(0.52, abs=1e-12)
    assert var["computed"]["prediction_risk"] == pytest.approx(0.4, abs=1e-12)
    assert var["computed"]["draws"] == 1


@pytest.mark.parametrize(("policy_doc", "threshold", "computed"), [
    ({"min_size_coverage": 0.53}, "min_size_coverage", 0.52),
    ({"max_prediction_risk": 0.39}, "max_prediction_risk", 0.4),
    ({"max_mi_bits": 0.5}, "max_mi_bits", None),  # checked: the value is ~0.9 bits
])
def test_violation_is_refused_in_cost_naming_the_threshold(
        policy_doc: dict[str, float], threshold: str, computed: float | None) -> None:
    """A design beyond a threshold is refused by ``cost`` (before the ledger reserves)."""
    meta = _meta(dataset=policy_doc)
    with pytest.raises(PolicyViolation) as info:
        _cost(release.uniform, {"column": "race"}, meta)
    err = info.value
    assert isinstance(err, MechanismInputError) and err.code == "policy_violation"
    assert err.field == f"metadata.subset_policy.{threshold}"
    assert err.extra["threshold"] == threshold and err.extra["limit"] == policy_doc[threshold]
    if computed is not None:
        assert err.extra["computed"] == pytest.approx(computed, abs=1e-12)
    else:
        assert 0.5 < err.extra["computed"] <= 1.0  # independent designs leak at most 1 bit


def test_column_overrides_dataset_default_key_by_key() -> None:
    """race allows R = 0.4 itself, c4 only has the dataset default 0.3 (p = 4: R = 0.5)."""
    meta = _meta(dataset={"max_prediction_risk": 0.3}, race={"max_prediction_risk": 0.45})
    assert _cost(release.uniform, {"column": "race"}, meta) == {"subset_draws:race": 1}
    with pytest.raises(PolicyViolation) as info:
        _cost(release.uniform, {"column": "c4"}, meta)
    assert info.value.field == "metadata.subset_policy.max_prediction_risk"
    assert info.value.extra["computed"] == pytest.approx(0.5, abs=1e-12)


def test_combined_columns_obey_the_strictest() -> None:
    """sex x c4 (p = 8) reads both columns: c4's own threshold binds the combined variable."""
    meta = _meta(dataset={"max_prediction_risk": 0.9}, c4={"max_prediction_risk": 0.2})
    with pytest.raises(PolicyViolation) as info:
        _cost(release.uniform, {"column": "sex", "combine_with": ["c4"]}, meta)
    assert info.value.field == "metadata.columns.c4.subset_policy.max_prediction_risk"
    # p = 8 uniform: R = Σμ_a / 8 = 1/4 > 0.2
    assert info.value.extra["computed"] == pytest.approx(0.25, abs=1e-12)


def test_product_checks_every_column() -> None:
    """The second column of a product release is gated as well."""
    meta = _meta(c4={"min_size_coverage": 0.6})
    with pytest.raises(PolicyViolation) as info:
        _cost(release.product, {"columns": ["race", "c4"]}, meta)
    assert info.value.field == "metadata.columns.c4.subset_policy.min_size_coverage"
    assert info.value.extra["variable"] == "c4"


def test_earlier_draws_gate_the_composed_design() -> None:
    """p = 4 uniform: one draw has R = 1/2, two draws R* = 5/6 — the second is refused."""
    meta = _meta(c4={"max_prediction_risk": 0.6})
    assert _cost(release.uniform, {"column": "c4"}, meta)
    with pytest.raises(PolicyViolation) as info:
        _cost(release.uniform, {"column": "c4", "prior_draws": 1}, meta)
    assert info.value.extra["computed"] == pytest.approx(5 / 6, abs=1e-12)
    plan = release.uniform.plan(release.uniform.load_params({"column": "c4", "prior_draws": 1}),
                                meta)
    values = policy.design_metrics(plan.variables[0], meta.n_rows, 1)
    assert values["disclosure_probability"] == pytest.approx(2 / 3, abs=1e-12)


def test_unverifiable_threshold_is_refused() -> None:
    """Dummies on 17 categories (p' = 19): I is not computed exactly, so max_mi_bits fails
    closed; size coverage has a closed form and passes."""
    meta = _meta(dataset={"min_size_coverage": 0.1})
    assert _cost(release.dummy, {"column": "wide", "alpha": 0.1}, meta)
    meta = _meta(dataset={"max_mi_bits": 1.0})
    with pytest.raises(PolicyViolation, match="cannot be computed"):
        _cost(release.dummy, {"column": "wide", "alpha": 0.1}, meta)


def test_dummy_floor_lifts_coverage_above_threshold() -> None:
    """sex (p = 2) with α = 0.25 dummies passes a coverage threshold the values allow."""
    meta = _meta(dataset={"min_size_coverage": 0.5})
    params = release.dummy.load_params({"column": "sex", "alpha": 0.25})
    cost = release.dummy.cost(params, DRAW, meta)
    var = release.dummy.accuracy(params, cost, meta)["policy"]["variables"][0]
    assert var["computed"]["size_coverage"] >= 0.5


def test_gating_never_reads_data() -> None:
    """The values checked are the same for any data: the run's accuracy equals the dry
    run's, on two very different datasets."""
    meta = _meta(dataset={"min_size_coverage": 0.5})
    params = release.uniform.load_params({"column": "race"})
    cost = release.uniform.cost(params, DRAW, meta)
    dry = release.uniform.accuracy(params, cost, meta)["policy"]
    for seed, probs in ((0, [0.96, 0.01, 0.01, 0.01, 0.01]), (1, [0.2] * 5)):
        rng = np.random.default_rng(seed)
        data = {"race": rng.choice(5, meta.n_rows, p=probs),
                "c4": np.zeros(meta.n_rows, np.int64), "sex": np.zeros(meta.n_rows, np.int64),
                "wide": np.zeros(meta.n_rows, np.int64)}
        out = release.uniform.run(data, params, cost, meta, np.random.default_rng(seed))
        assert out.accuracy["policy"] == dry


def _upload_meta(**extra: Any) -> dict[str, Any]:
    return {"name": "s", "budgets": {"subset_draws": 1},
            "columns": {"race": {"type": "categorical", "categories": list(RACE),
                                 "subset_policy": {"max_mi_bits": 0.9}}}, **extra}


def test_metadata_thresholds_reach_the_mechanisms() -> None:
    spec = parse_metadata(_upload_meta(subset_policy={"min_size_coverage": 0.5},
                                       keep_row_order=True))
    meta = spec.meta(10)
    assert meta.subset_policy == {"min_size_coverage": 0.5} and meta.keep_row_order
    assert meta.columns["race"].subset_policy == {"max_mi_bits": 0.9}
    assert not parse_metadata(_upload_meta()).meta(10).keep_row_order


@pytest.mark.parametrize(("extra", "field"), [
    ({"subset_policy": {"min_size_coverage": 1.5}}, "metadata.subset_policy.min_size_coverage"),
    ({"subset_policy": {"max_mi_bits": -1}}, "metadata.subset_policy.max_mi_bits"),
    ({"subset_policy": {"max_risk": 0.5}}, "metadata.subset_policy.max_risk"),
    ({"subset_policy": {"max_prediction_risk": "0.5"}},
     "metadata.subset_policy.max_prediction_risk"),
    ({"keep_row_order": 1}, "metadata.keep_row_order"),
])
def test_metadata_rejects_bad_thresholds(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(IngestError) as info:
        parse_metadata(_upload_meta(**extra))
    assert info.value.field == field


def test_numeric_columns_take_no_subset_policy() -> None:
    doc = {"name": "s", "budgets": {"epsilon": 1},
           "columns": {"x": {"type": "integer", "bounds": [0, 9],
                             "subset_policy": {"max_mi_bits": 1}}}}
    with pytest.raises(IngestError) as info:
        parse_metadata(doc)
    assert info.value.field == "metadata.columns.x.subset_policy"


def test_policy_threshold_dataclass_tolerance() -> None:
    """Equality passes (τ = 0.52 exactly at the limit), a hair beyond fails."""
    meta = _meta(dataset={"min_size_coverage": 0.52})
    assert _cost(release.uniform, {"column": "race"}, meta)
    meta = dataclasses.replace(meta, subset_policy={"min_size_coverage": 0.5201})
    with pytest.raises(PolicyViolation):
        _cost(release.uniform, {"column": "race"}, meta)


def test_result_privacy_reports_the_composed_design() -> None:
    """Item 8: a release after earlier draws (prior_draws, from the ledger) reports the
    composed design's risk in the result's ``privacy`` block, for the same ŵ the single-draw
    metrics use. p = 4 uniform, two draws: P(|A*| = 1 | X = j) = 2/3 for every j, so the
    disclosure probability is exactly 2/3 whatever ŵ. Old code: no ``composed`` there."""
    meta = _meta()
    rng = np.random.default_rng(8)
    data = {"c4": rng.choice(4, meta.n_rows, p=[0.1, 0.2, 0.3, 0.4]),
            "race": np.zeros(meta.n_rows, np.int64), "sex": np.zeros(meta.n_rows, np.int64),
            "wide": np.zeros(meta.n_rows, np.int64)}
    params = release.uniform.load_params({"column": "c4", "prior_draws": 1})
    out = release.uniform.run(data, params, DRAW, meta, np.random.default_rng(9))
    var = out.result["variables"][0]
    composed = var["privacy"]["composed"]
    w_hat = np.array(var["estimate"]["w"])
    exact = composition.compose([design.uniform(4)] * 2).report(w_hat).to_json()
    assert composed["draws"] == 2
    assert composed["privacy_under_estimate"] == pytest.approx(exact, abs=1e-12)
    assert composed["disclosure_probability_under_estimate"] == pytest.approx(2 / 3, abs=1e-12)
    assert exact["prediction_risk"] > var["privacy"]["prediction_risk"]
    single = release.uniform.load_params({"column": "c4"})
    out1 = release.uniform.run(data, single, DRAW, meta, np.random.default_rng(9))
    assert "composed" not in out1.result["variables"][0]["privacy"]
