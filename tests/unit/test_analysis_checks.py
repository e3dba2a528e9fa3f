"""Analyses checked and bounded before they are queued (issue #15 items 1 and 6).

``Analysis.check`` must refuse exactly what ``run`` would refuse (same field), from
public outputs only; ``Analysis.work`` bounds the run from the release's public size
and the params; the config and Celery settings carry the limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError, ReleaseView
from mechanisms.subset.estimation import EM_MAX_ITER
from service.analyses import error_of as _analysis_error
from service.config import Config
from service.releases.documents import runnable_analyses
from service.releases.queue import RUN_ANALYSIS, RUN_RELEASE, VISIBILITY_TIMEOUT, time_limits

N = 600
META = DatasetMeta(n_rows=N, columns={
    "x": ColumnMeta("x", "continuous", prior={"family": "normal", "loc": 0, "scale": 1}),
    "w": ColumnMeta("w", "continuous", (0.0, 1.0)),
    "c": ColumnMeta("c", "categorical", categories=("a", "b", "c", "d")),
})
G = np.random.default_rng(0)
DATA = {"x": G.normal(size=N), "w": G.random(N), "c": G.integers(0, 4, N)}


def _view(name: str, raw: Mapping[str, Any], budget: Mapping[str, Fraction]) -> ReleaseView:
    mech = registry.get(name)
    params = mech.load_params(raw)
    cost = mech.cost(params, budget, META)
    out = mech.run(DATA, params, cost, META, np.random.default_rng(1))
    return ReleaseView("r", name, params, out.result, out.table, META)


HALF = {"interval_leakage": Fraction(6, 10)}
UNIFORM = {"family": "uniform", "low": 0, "high": 1}
LOGISTIC = {"family": "logistic", "scale": 1}
INTERVAL = {
    "case1_uniform": ("interval.case1", {"column": "w", "anchors": UNIFORM}, HALF),
    "case1_logistic": ("interval.case1", {"column": "x", "anchors": LOGISTIC}, HALF),
    "case2": ("interval.case2", {"column": "w", "anchors": UNIFORM}, HALF),
    "casek_exact": ("interval.casek", {"column": "x", "m": 3, "offsets": [-1, 1],
                                       "exact_cells": [2], "anchors": LOGISTIC},
                    {"interval_leakage": Fraction(9, 10)}),
    "progressive": ("interval.progressive", {"column": "w", "rounds": 2},
                    {"interval_leakage": Fraction(9, 10)}),
    "selective": ("interval.selective", {"column": "x", "tau": 0.6, "anchors": LOGISTIC},
                  HALF),
}
VIEWS = {key: _view(*spec) for key, spec in INTERVAL.items()}
FEATURES = [[float(v)] for v in DATA["x"]]
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("mean", {}),
    ("npmle", {"method": "pava"}),
    ("npmle", {"method": "cnm", "max_iter": 30}),
    ("moments", {"method": "pava"}),
    ("mle", {"family": "normal"}),
    ("mle", {"family": "lognormal", "max_iter": 20}),
    ("functionals", {"functionals": [{"type": "cdf", "t": 0.5}], "bootstrap": 3}),
    ("ed", {"domain": [0, 1]}),
    ("ed", {"source": "first_round"}),
    ("ed_release", {"domain": [0, 1]}),
    ("functionals", {"functionals": [{"type": "quantile", "p": 0.5}], "method": "pava",
                     "bootstrap": 0}),
    ("regression", {"features": FEATURES, "max_iter": 5}),
    ("regression", {"features": FEATURES[:-1], "max_iter": 5}),
    ("regression", {"features": FEATURES, "max_iter": 5, "predict": [[1.0, 2.0]]}),
]


def _refusal(call: Any) -> str | None:
    try:
        call()
    except MechanismInputError as err:
        return err.field
    return None


@pytest.mark.parametrize("release", sorted(VIEWS))
@pytest.mark.parametrize(("analysis", "raw"), REQUESTS,
                         ids=[f"{a}-{i}" for i, (a, _) in enumerate(REQUESTS)])
def test_check_refuses_exactly_what_run_refuses(release: str, analysis: str,
                                                raw: dict[str, Any]) -> None:
    """Catches: main had no check at POST, so ``mean`` on case2, pava on a non-Case-I
    design and short feature lists were queued (202) and failed at run time."""
    view = VIEWS[release]
    a = registry.get(view.mechanism).analyses[analysis]
    params = a.load_params(raw)
    at_post = _refusal(lambda: a.check(view, params, []))
    at_run = _refusal(lambda: a.run(view, params, [], np.random.default_rng(2)))
    assert at_post == at_run
    if analysis == "mean" and release not in ("case1_uniform", "progressive"):
        assert at_post == "analysis"
    if analysis == "regression" and len(raw["features"]) != N:
        assert at_post == "params.features"
    if at_post is None:
        assert a.work(view, params, []).units > 0


def test_mean_is_listed_only_where_it_applies() -> None:
    """Catches: main listed ``mean`` for every interval mechanism (it needs Case-I ranges
    with uniform anchors, or progressive ones)."""
    listed = {key: runnable_analyses(v.mechanism, dict(v.params), dict(v.result))
              for key, v in VIEWS.items()}
    assert {k for k, names in listed.items() if "mean" in names} == {"case1_uniform",
                                                                      "progressive"}
    assert all({"npmle", "moments", "regression"} <= set(names) for names in listed.values())
    assert runnable_analyses("laplace", {}, {"value": 1.0}) == []


def test_regression_rows_are_checked_against_the_public_n() -> None:
    view = VIEWS["case2"]
    a = registry.get("interval.case2").analyses["regression"]
    with pytest.raises(MechanismInputError, match=str(N)) as err:
        a.check(view, a.load_params({"features": FEATURES[:-1]}), [])
    assert err.value.field == "params.features"


@settings(max_examples=50, deadline=None)
@given(method=st.sampled_from(["em", "cnm", "auto"]),
       max_iter=st.integers(min_value=1, max_value=1_000_000))
def test_npmle_work_is_iterations_times_records(method: str, max_iter: int) -> None:
    """The bound the ceiling is checked against: iterations x records x pieces (a CNM
    iteration counts 16), so a max_iter of 10^6 on 10^6 records is refused."""
    view = VIEWS["case2"]  # one piece per record; CNM ranges, so auto reaches both solvers
    a = registry.get("interval.case2").analyses["npmle"]
    work = a.work(view, a.load_params({"method": method, "max_iter": max_iter}), [])
    factor = 1 if method == "em" else 16
    assert work.units == max_iter * N * factor and work.field == "params.max_iter"


def _subset(name: str, raw: Mapping[str, Any]) -> ReleaseView:
    return _view(name, raw, {"subset_draws": Fraction(1)})


CUSTOM = {"type": "mu", "subsets": [["a", "b"], ["c", "d"], ["a", "c"], ["b", "d"],
                                    ["a", "d"], ["b", "c"]],
          "probabilities": [0.5, 0.5, 0.25, 0.25, 0.25, 0.25]}


def test_mom_closed_is_refused_on_a_non_uniform_design() -> None:
    """Catches: main queued ``mom_closed`` on a custom design; it failed at run time."""
    custom = _subset("subset.custom", {"column": "c", "design": CUSTOM})
    uniform = _subset("subset.uniform", {"column": "c"})
    a = registry.get("subset.custom").analyses["estimate"]
    params = a.load_params({"method": "mom_closed"})
    with pytest.raises(MechanismInputError, match="uniform") as err:
        a.check(custom, params, [])
    assert err.value.field == "params.method"
    a.check(uniform, params, [])  # the uniform design's closed form applies
    assert _refusal(lambda: a.run(custom, params, [], np.random.default_rng(0))) == (
        "params.method")


def test_subset_em_work_uses_the_released_distinct_subsets() -> None:
    """The issue's case: p = 16, 62,633 distinct subsets, max_iter 10^6 is ~10^12 units,
    far above the default ceiling; the count is the release's own (public) summary."""
    view = _subset("subset.uniform", {"column": "c"})
    a = registry.get("subset.uniform").analyses["estimate"]
    var = view.result["variables"][0]
    m = var["counts"]["distinct_subsets"]
    assert m == len(np.unique(np.asarray(view.table["c"])))  # type: ignore[index]
    assert a.work(view, a.load_params({}), []).units == EM_MAX_ITER * m * 4
    big = dict(view.result)
    big["variables"] = [{**var, "counts": {**var["counts"], "distinct_subsets": 62_633}}]
    huge = ReleaseView("r", view.mechanism, view.params, big, view.table, META)
    work = a.work(huge, a.load_params({"max_iter": 1_000_000, "accelerate": False}), [])
    assert work.field == "params.max_iter" and work.units == 1e6 * 62_633 * 4
    assert work.units > Config().max_analysis_work


def test_release_work_counts_rows_times_size_params() -> None:
    laplace = registry.get("laplace")
    params = laplace.load_params({"statistic": "histogram", "column": "w", "bins": 500})
    work = laplace.work(params, META)
    assert work.units == N * 500 and work.field == "params.bins"
    plain = laplace.work(laplace.load_params({"statistic": "mean", "column": "w"}), META)
    assert plain.units == N and plain.field == "dataset_id"


def test_failed_analysis_errors_carry_a_code_and_the_field() -> None:
    """Catches: main stored only a message for a failed analysis."""
    assert _analysis_error(MechanismInputError("params.features", "need 3 rows")) == {
        "code": "invalid_input", "field": "params.features", "message": "need 3 rows"}
    assert _analysis_error(ZeroDivisionError("secret 42")) == {
        "code": "analysis_failed", "message": "analysis failed (ZeroDivisionError)"}


def test_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVRELEASE_MAX_WORK", "1e7")
    monkeypatch.setenv("PRIVRELEASE_MAX_RELEASE_WORK", "3e8")
    monkeypatch.setenv("PRIVRELEASE_ANALYSIS_TIME_LIMIT", "12")
    monkeypatch.setenv("PRIVRELEASE_TIME_LIMIT_GRACE", "3")
    config = Config.from_env()
    assert config.max_analysis_work == 1e7 and config.max_release_work == 3e8
    limits = time_limits(config)
    assert limits[RUN_ANALYSIS] == {"soft_time_limit": 12.0, "time_limit": 15.0}
    assert limits[RUN_RELEASE]["soft_time_limit"] == Config.release_time_limit
    monkeypatch.setenv("PRIVRELEASE_ANALYSIS_TIME_LIMIT", str(VISIBILITY_TIMEOUT))
    with pytest.raises(SystemExit):
        time_limits(Config.from_env())  # redelivered while running: refused at start
    monkeypatch.setenv("PRIVRELEASE_MAX_WORK", "-1")
    with pytest.raises(SystemExit):
        Config.from_env()
