"""Variance, standard deviation and covariance: exact sensitivities, float error, coverage."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import marshmallow
import numpy as np
import pytest

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.dp import baselines, moments, vectors

Z = 4.5
EPS = {"epsilon": Fraction(1)}
EPS_DELTA = {"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}
BUDGET = {"laplace": EPS, "gaussian": EPS_DELTA}


def _cov(rows: list[tuple[int, int]]) -> list[Fraction]:
    """Exact sample covariance triangle (var x, cov, var y) with Fractions."""
    n = len(rows)
    mx = Fraction(sum(r[0] for r in rows), n)
    my = Fraction(sum(r[1] for r in rows), n)
    sxx = sum((r[0] - mx) ** 2 for r in rows)
    sxy = sum((r[0] - mx) * (r[1] - my) for r in rows)
    syy = sum((r[1] - my) ** 2 for r in rows)
    return [s / (n - 1) for s in (sxx, sxy, syy)]


@pytest.mark.parametrize("n", [2, 3])
def test_covariance_sensitivity_is_exact_by_brute_force(n: int) -> None:
    """Over every dataset on {0,1,2} x {0,1} and every replacement: each entry moves by at
    most w_j w_k / n, the triangle's L1 by at most their sum, and both are attained.
    Catches the population-variance or (n − 1) denominators and a missed joint attainment."""
    domain = list(itertools.product(range(3), range(2)))
    worst = [Fraction(0)] * 3
    worst_l1 = Fraction(0)
    for data in itertools.product(domain, repeat=n):
        base = _cov(list(data))
        for y in domain:
            moved = _cov([y, *data[1:]])
            diff = [abs(a - b) for a, b in zip(base, moved, strict=True)]
            worst = [max(a, b) for a, b in zip(worst, diff, strict=True)]
            worst_l1 = max(worst_l1, sum(diff, Fraction(0)))
    expected = moments.covariance_sensitivity([Fraction(2), Fraction(1)], n)
    assert expected == [Fraction(4, n), Fraction(2, n), Fraction(1, n)]
    assert worst == expected
    assert worst_l1 == sum(expected, Fraction(0))


def _meta(n: int) -> DatasetMeta:
    return DatasetMeta(n, {"x": ColumnMeta("x", "continuous", bounds=(-1.0, 3.0)),
                           "y": ColumnMeta("y", "continuous", bounds=(0.0, 0.5)),
                           "k": ColumnMeta("k", "integer", bounds=(0, 9)),
                           "c": ColumnMeta("c", "categorical", categories=("a",))})


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.5, 3.5, n)  # some outside the bounds: clipped
    return {"x": x, "y": 0.1 * x + rng.uniform(0.0, 0.2, n), "k": rng.integers(0, 10, n),
            "c": np.zeros(n, dtype=np.int64)}


def _plan(name: str, raw: dict[str, Any], meta: DatasetMeta) -> moments.MomentPlan:
    mech = registry.get(name)
    return moments.plan(name, mech.load_params(raw), BUDGET[name], meta)


def test_computed_covariance_is_within_the_charged_float_error() -> None:
    """The two-pass fsum computation, against the exact rational one on the clipped data."""
    n = 500
    meta, data = _meta(n), _data(n, 1)
    plan = _plan("laplace", {"statistic": "covariance", "columns": ["x", "y", "k"]}, meta)
    lattice = plan.exact(data)
    clipped = [np.clip(data["x"], -1, 3), np.clip(data["y"], 0, 0.5), data["k"]]
    exact = []
    for j, k in plan.pairs:
        a = [Fraction(float(v)) for v in clipped[j]]
        b = [Fraction(float(v)) for v in clipped[k]]
        ma, mb = sum(a, Fraction(0)) / n, sum(b, Fraction(0)) / n
        exact.append(sum(((u - ma) * (v - mb) for u, v in zip(a, b, strict=True)),
                         Fraction(0)) / (n - 1))
    for value, truth, err in zip(lattice, exact, plan.err, strict=True):
        assert abs(Fraction(int(value)) * Fraction(plan.grid) - truth) <= \
            Fraction(plan.grid) / 2 + err


def test_neighbours_move_each_entry_within_its_units() -> None:
    n = 50
    meta = _meta(n)
    plan = _plan("gaussian", {"statistic": "covariance", "columns": ["x", "y"]}, meta)
    base = {"x": np.full(n, -1.0), "y": np.zeros(n)}
    moved = {"x": base["x"].copy(), "y": base["y"].copy()}
    moved["x"][0], moved["y"][0] = 3.0, 0.5
    diff = np.abs(plan.exact(base) - plan.exact(moved))
    assert np.all(diff <= np.asarray(plan.units))
    assert np.all(diff >= np.asarray(plan.units) - 2)  # the extreme neighbours attain it
    assert plan.noise.kind == "discrete_gaussian"


@pytest.mark.parametrize("name", ["laplace", "gaussian"])
@pytest.mark.parametrize("statistic", ["variance", "std", "covariance"])
def test_releases_cover_as_stated(name: str, statistic: str) -> None:
    n = 400
    meta, data = _meta(n), _data(n, 2)
    mech = registry.get(name)
    raw: dict[str, Any] = {"statistic": statistic}
    if statistic == "covariance":
        raw["columns"] = ["x", "y"]
    else:
        raw["column"] = "x"
    params = mech.load_params(raw)
    acc = mech.accuracy(params, BUDGET[name], meta)
    x, y = np.clip(data["x"], -1, 3), data["y"].clip(0, 0.5)
    cov = np.cov(x, y)
    truth = {"variance": [cov[0, 0]], "std": [math.sqrt(cov[0, 0])],
             "covariance": [cov[0, 0], cov[0, 1], cov[1, 1]]}[statistic]
    rng = np.random.default_rng(9)
    hits = total = 0
    for _ in range(300):
        result = mech.run(data, params, BUDGET[name], meta, rng).result
        if statistic == "covariance":
            m = np.asarray(result["matrix"])
            assert np.array_equal(m, m.T)
            got = [m[0, 0], m[0, 1], m[1, 1]]
            half = acc["ci95_halfwidths"]
        else:
            got, half = [result["value"]], [acc["ci95_halfwidth"]]
        hits += sum(abs(g - t) <= h for g, t, h in zip(got, truth, half, strict=True))
        total += len(got)
    assert hits / total >= 0.95 - Z * math.sqrt(0.95 * 0.05 / total)


def test_variance_sensitivity_and_post_processing() -> None:
    n = 10
    meta = _meta(n)
    plan = _plan("laplace", {"statistic": "variance", "column": "x"}, meta)
    assert plan.sensitivity == (Fraction(16, 10),)
    top = 10 / 9 * 16 / 4
    assert plan.release(np.array([-5]))["value"] == 0.0
    assert plan.release(np.array([10**9]))["value"] == pytest.approx(top)
    std = _plan("laplace", {"statistic": "std", "column": "x"}, meta)
    value = 2.0 / std.grid
    assert std.release(np.array([int(value)]))["value"] == pytest.approx(math.sqrt(2.0))


def test_psd_projection_is_symmetric_and_psd() -> None:
    meta = _meta(5)
    plan = _plan("laplace", {"statistic": "covariance", "columns": ["x", "y", "k"],
                             "psd": True}, meta)
    rng = np.random.default_rng(0)
    for _ in range(20):
        noisy = rng.integers(-10**6, 10**6, 6)
        m = np.asarray(plan.release(noisy)["matrix"])
        assert np.array_equal(m, m.T)
        assert np.linalg.eigvalsh(m).min() >= -1e-9 * max(1.0, float(np.abs(m).max()))


def test_zcdp_conversion_is_valid_and_tight() -> None:
    """CKS Cor. 13 is at least as good as Bun-Steinke's ε = ρ + 2√(ρ ln 1/δ), and the ρ
    found is the largest (to 1e-6) whose δ(ε) fits."""
    for eps, delta in ((1.0, 1e-6), (0.1, 1e-10), (5.0, 1e-3)):
        rho = vectors.zcdp_rho(eps, delta)
        assert vectors.zcdp_log_delta(rho, eps) <= math.log(delta)
        assert vectors.zcdp_log_delta(rho * 1.000001, eps) > math.log(delta) - 1e-5
        bs = (math.sqrt(math.log(1 / delta) + eps) - math.sqrt(math.log(1 / delta))) ** 2
        assert rho >= bs


def test_vector_gaussian_sigma_exceeds_the_continuous_one() -> None:
    """A sanity floor: the discrete Gaussian by zCDP needs at least the analytic σ."""
    noise = vectors.gaussian_noise(Fraction(1), Fraction(1, 10**6), 25)
    assert noise.scale >= baselines.analytic_gaussian_sigma(1.0, 1e-6, 5.0)
    assert noise.scale <= 1.3 * baselines.analytic_gaussian_sigma(1.0, 1e-6, 5.0)


@pytest.mark.parametrize(("name", "raw", "field"), [
    ("geometric", {"statistic": "variance", "column": "k"}, "params.statistic"),
    ("laplace", {"statistic": "std", "column": "c"}, "params.column"),
    ("laplace", {"statistic": "covariance", "columns": ["x", "x"]}, "params.columns"),
    ("laplace", {"statistic": "covariance", "columns": ["x", "zz"]}, "params.columns"),
    ("laplace", {"statistic": "covariance", "columns": ["x", "c"]}, "params.columns"),
])
def test_moment_input_errors_name_the_field(name: str, raw: dict[str, Any], field: str) -> None:
    mech = registry.get(name)
    with pytest.raises(MechanismInputError) as err:
        mech.cost(mech.load_params(raw), EPS, _meta(10))
    assert err.value.field == field


def test_one_row_is_refused() -> None:
    mech = registry.get("laplace")
    with pytest.raises(MechanismInputError) as err:
        mech.cost(mech.load_params({"statistic": "variance", "column": "x"}), EPS, _meta(1))
    assert err.value.field == "params.statistic"


@pytest.mark.parametrize(("raw", "key"), [
    ({"statistic": "covariance", "column": "x"}, "columns"),
    ({"statistic": "covariance", "columns": ["x"]}, "columns"),
    ({"statistic": "covariance", "columns": ["x", "y"], "column": "x"}, "column"),
    ({"statistic": "variance", "column": "x", "psd": True}, "psd"),
    ({"statistic": "std"}, "column"),
])
def test_schema_rejects_bad_moment_params(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(marshmallow.ValidationError) as err:
        registry.get("laplace").load_params(raw)
    assert key in err.value.messages


@pytest.mark.parametrize(("sigma", "eps", "reference"), [
    (1.0, 1.0, 0.24684633078294466),
    (3.0, 2.0, 8.233344041022613e-10),
    (10.0, 1.0, 1.1626191118257858e-24),
])
def test_zcdp_delta_matches_opendp(sigma: float, eps: float, reference: float) -> None:
    """δ(ε) of ρ = 1/(2σ²), against OpenDP 0.16's ``make_zCDP_to_approxDP`` (values
    recorded from it): an independent implementation of the same CKS conversion."""
    delta = math.exp(vectors.zcdp_log_delta(1 / (2 * sigma**2), eps))
    assert delta == pytest.approx(reference, rel=1e-9)
