"""The registered mechanisms: params, cost, accuracy, run, errors and plot data."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import marshmallow
import numpy as np
import pytest

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta, Mechanism, MechanismInputError, Output
from mechanisms.iclp import entries, plot_data, pss
from tests.unit.iclp.sim import gp_curves

N = 120
GRID = tuple(float(t) for t in np.linspace(0.0, 24.0, 49))  # e.g. hours of the day
META = DatasetMeta(
    n_rows=N,
    columns={
        "load": ColumnMeta("load", "functional", grid=GRID, norm_bound=2.0),
        "wage": ColumnMeta("wage", "continuous", (0.0, 5000.0)),
        "age": ColumnMeta("age", "integer", (17, 90)),
        "race": ColumnMeta("race", "categorical", categories=("A", "B")),
        "free": ColumnMeta("free", "continuous"),
        "flat": ColumnMeta("flat", "functional", grid=(0.0, 1.0, 1.0), norm_bound=1.0),
        "nobound": ColumnMeta("nobound", "functional", grid=GRID, norm_bound=0.0),
        "huge": ColumnMeta("huge", "functional", grid=tuple(range(2001)), norm_bound=1.0),
    },
)
SECRET = 987654.125
EPS = {"epsilon": Fraction(1, 2)}
MEANS = ("iclp.mean", "frl.mean", "iclp.ar", "bernstein.mean")
DENSITIES = ("iclp.kde", "bernstein.kde", "frl.kde")
COLUMN = {**dict.fromkeys(MEANS, "load"), **dict.fromkeys(DENSITIES, "wage")}
#: the entries themselves (the registry also loads the other families; see test_registered)
MECHANISMS: dict[str, Mechanism] = {
    m.name: m for m in (entries.iclp_mean, entries.frl_mean, entries.iclp_kde,
                        entries.bernstein_kde, entries.iclp_ar, entries.frl_kde,
                        entries.bernstein_mean)
}


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    curves = gp_curves(rng, N, mu=np.sin(np.linspace(0, 2 * np.pi, 49)))
    curves[0, 3] = SECRET
    wage = rng.gamma(2.0, 800.0, N)
    wage[1] = SECRET
    return {"load": curves, "wage": wage}


DATA = _data()


def _run(name: str, params: Mapping[str, Any], budget: Mapping[str, Any] = EPS) -> Output:
    mech = MECHANISMS[name]
    loaded = mech.load_params(params)
    cost = mech.cost(loaded, budget, META)
    return mech.run(DATA, loaded, cost, META, np.random.default_rng(1))


def _input_error(name: str, params: Mapping[str, Any],
                 budget: Mapping[str, Any] = EPS) -> MechanismInputError:
    mech = MECHANISMS[name]
    with pytest.raises(MechanismInputError) as info:
        mech.cost(mech.load_params(params), budget, META)
    assert str(SECRET) not in info.value.message
    return info.value


def test_registered() -> None:
    names = registry.names()
    for name in (*MEANS, *DENSITIES):
        assert name in names
        assert registry.get(name) is MECHANISMS[name]
        assert MECHANISMS[name].measures == ("epsilon",)


@pytest.mark.parametrize("name", [*MEANS, *DENSITIES])
def test_cost_is_the_budget_and_outputs_are_plain_json(name: str) -> None:
    mech = MECHANISMS[name]
    params = mech.load_params({"column": COLUMN[name]})
    assert mech.cost(params, EPS, META) == {"epsilon": Fraction(1, 2)}
    accuracy = mech.accuracy(params, EPS, META)
    json.dumps(accuracy, allow_nan=False)
    assert accuracy["expected_sq_l2_error"] > 0 and "statement" in accuracy
    out = _run(name, {"column": COLUMN[name]})
    json.dumps(out.result, allow_nan=False)
    assert out.accuracy == accuracy
    assert out.guarantee.startswith("pure epsilon-DP (")
    assert out.guarantee.endswith("epsilon=0.5 nats), replace-one neighbours, n public")
    result = out.result
    assert {"values", "grid", "coefficients", "kernel", "smoothing"} <= set(result)
    assert len(result["values"]) == len(result["grid"])
    assert all(isinstance(v, float) for v in result["values"] + result["coefficients"])
    grid, values = plot_data(result)
    assert grid == result["grid"] and values == result["values"]


def test_mean_result_shapes() -> None:
    out = _run("iclp.mean", {"column": "load", "smoothing": {"psi": "balanced"}}).result
    assert out["grid"] == list(GRID)
    assert len(out["coefficients"]) == len(out["basis"]["eigenvalues"]) == 49
    assert out["kernel"] == {"family": "matern", "rho": 0.1, "nu": 1.5, "variance": 1.0,
                             "domain": [0.0, 24.0], "length_units": "fraction of the grid span"}
    smoothing = out["smoothing"]
    assert smoothing["eta"] == 1.5 and smoothing["psi_rule"] == "balanced"
    assert smoothing["psi"] == pytest.approx((N * 0.25) ** -1.2)
    frl = _run("frl.mean", {"column": "load"}).result
    m = frl["smoothing"]["components"]
    assert len(frl["coefficients"]) == m < math.isqrt(N // 4)  # min-risk, not ⌊√n·ε⌋


def test_mean_default_tuning_is_the_risk_minimiser() -> None:
    """The default chooses ρ, J, η, ψ by ``pss.qr_risk`` and says so in the accuracy."""
    out = _run("iclp.mean", {"column": "load"})
    smoothing = out.result["smoothing"]
    assert smoothing["psi_rule"] == "min-risk" and smoothing["rho_rule"] == "auto"
    assert smoothing["rho"] in pss.RHO_CANDIDATES and smoothing["eta"] in pss.ETA_CANDIDATES
    assert len(out.result["coefficients"]) == smoothing["components"]
    assert smoothing["components"] in {*pss.component_candidates(49),
                                       smoothing["risk"]["frl"]["components"]}
    assert smoothing["noise_profile"] == "matched"
    assert out.accuracy["laplace_scales"].startswith("Delta*sqrt(F_j)")
    assert out.result["kernel"]["rho"] == smoothing["rho"]
    assert "minimises a data-free risk" in out.accuracy["statement"]
    assert out.accuracy["smoothing"]["risk"]["total"] == pytest.approx(
        sum(smoothing["risk"][k] for k in ("privacy", "bias", "sampling")))
    # a given rho or eta is kept; only the open knobs are tuned
    fixed = _run("iclp.mean", {"column": "load", "kernel": {"rho": 0.07},
                               "smoothing": {"eta": 2.5}}).result["smoothing"]
    assert fixed["rho"] == 0.07 and fixed["rho_rule"] == "given" and fixed["eta"] == 2.5


def test_mean_options_are_honoured() -> None:
    out = _run("iclp.mean", {
        "column": "load",
        "kernel": {"family": "gaussian", "rho": 0.2},
        "smoothing": {"eta": 2.0, "psi": "free"},
        "max_components": 6,
    }).result
    assert out["kernel"]["family"] == "gaussian" and out["kernel"]["rho"] == 0.2
    assert out["smoothing"]["eta"] == 2.0 and out["smoothing"]["psi"] == 1 / N
    assert len(out["coefficients"]) == 6
    assert _run("iclp.mean", {"column": "load", "smoothing": {"psi": 0.01}}).result[
        "smoothing"]["psi"] == 0.01
    assert len(_run("frl.mean", {"column": "load", "components": 3}).result["coefficients"]) == 3


def test_mean_noise_profile_and_plain_projection() -> None:
    """``noise_profile`` picks the ICLP covariance (matched by default, the paper's C under
    its own ψ rules or on request); ψ = 0 (the unshrunk projection, FRL's estimator) is
    accepted; bad values are refused by the schema."""
    def smoothing(extra: dict[str, Any]) -> dict[str, Any]:
        out = _run("iclp.mean", {"column": "load", "smoothing": extra})
        return {**out.result["smoothing"], "scales": out.accuracy["laplace_scales"]}

    assert smoothing({"psi": "balanced"})["noise_profile"] == "kernel"
    assert smoothing({"psi": 0.01})["noise_profile"] == "matched"
    kernel = smoothing({"psi": 0.01, "noise_profile": "kernel"})
    assert kernel["noise_profile"] == "kernel" and "lambda_j" in kernel["scales"]
    flat = smoothing({"psi": 0})
    assert flat["psi"] == 0.0 and flat["psi_rule"] == "given"
    free = _run("iclp.mean", {"column": "load", "smoothing": {"frl_guard": False}})
    assert not free.result["smoothing"]["risk"]["frl_guard_met"]
    assert "no worse than FRL's" not in free.accuracy["statement"]
    for bad in ({"psi": -1}, {"noise_profile": "flat"}, {"frl_guard": "no"}):
        with pytest.raises(marshmallow.ValidationError):
            MECHANISMS["iclp.mean"].load_params({"column": "load", "smoothing": bad})


def test_density_result_shapes() -> None:
    out = _run("iclp.kde", {"column": "wage", "grid_size": 64,
                            "kernel": {"family": "matern", "nu": 2.5, "rho": 0.05}}).result
    assert out["grid"][0] == 0.0 and out["grid"][-1] == 5000.0 and len(out["values"]) == 64
    assert out["kernel"]["bandwidth"] == pytest.approx(250.0)
    assert out["smoothing"]["eta"] == pytest.approx(4 / 3)
    assert sum(out["values"]) * 5000 / 64 == pytest.approx(1.0)
    raw = _run("bernstein.kde", {"column": "wage", "lattice_size": 8, "normalize": False}).result
    assert len(raw["coefficients"]) == 9 and raw["postprocessing"] == "none"


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("iclp.mean", {"column": "nope"}, "params.column"),
        ("iclp.mean", {"column": "wage"}, "params.column"),
        ("frl.mean", {"column": "race"}, "params.column"),
        ("iclp.kde", {"column": "load"}, "params.column"),
        ("iclp.kde", {"column": "age"}, "params.column"),
        ("bernstein.kde", {"column": "free"}, "params.column"),
        ("iclp.mean", {"column": "flat"}, "params.column"),
        ("iclp.mean", {"column": "nobound"}, "params.column"),
        ("iclp.mean", {"column": "huge"}, "params.column"),
        ("iclp.mean", {"column": "load", "smoothing": {"eta": 0.5}}, "params.smoothing.eta"),
        ("iclp.kde", {"column": "wage", "smoothing": {"eta": 1.0}}, "params.smoothing.eta"),
        ("frl.mean", {"column": "load", "components": 50}, "params.components"),
    ],
)
def test_params_that_do_not_fit_the_metadata(name: str, params: dict, field: str) -> None:
    assert _input_error(name, params).field == field


def test_messages_name_the_problem() -> None:
    assert "strictly increasing" in _input_error("iclp.mean", {"column": "flat"}).message
    assert "at most 2000" in _input_error("iclp.mean", {"column": "huge"}).message
    assert "functional" in _input_error("iclp.mean", {"column": "wage"}).message


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        ({"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}, "budget"),
        ({}, "budget.epsilon"),
        ({"epsilon": Fraction(0)}, "budget.epsilon"),
        ({"epsilon": Fraction(101)}, "budget.epsilon"),
        ({"epsilon": math.inf}, "budget.epsilon"),
        ({"epsilon": "1"}, "budget.epsilon"),
        ({"epsilon": Fraction(1, 10**12)}, "budget.epsilon"),  # beyond the sampler's range
    ],
)
@pytest.mark.parametrize("name", [*MEANS, *DENSITIES])
def test_bad_budgets(name: str, budget: dict, field: str) -> None:
    assert _input_error(name, {"column": COLUMN[name]}, budget).field == field


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("iclp.mean", {}),
        ("iclp.mean", {"column": "load", "extra": 1}),
        ("iclp.mean", {"column": "load", "kernel": {"family": "cubic"}}),
        ("iclp.mean", {"column": "load", "kernel": {"family": "gaussian", "nu": 1.5}}),
        ("iclp.mean", {"column": "load", "kernel": {"nu": 0}}),
        ("iclp.mean", {"column": "load", "kernel": {"rho": -0.1}}),
        ("iclp.mean", {"column": "load", "kernel": {"rho": "wide"}}),
        ("iclp.mean", {"column": "load", "smoothing": {"psi": "cv"}}),
        ("iclp.mean", {"column": "load", "smoothing": {"eta": True}}),
        ("iclp.mean", {"column": "load", "smoothing": {"eta": math.nan}}),
        ("iclp.mean", {"column": "load", "max_components": 0}),
        ("frl.mean", {"column": "load", "components": 2.5}),
        ("iclp.kde", {"column": "wage", "grid_size": 5}),
        ("iclp.kde", {"column": "wage", "grid_size": 10**6}),
        ("iclp.kde", {"column": "wage", "kernel": {"nu": 1.5}}),
        ("iclp.kde", {"column": "wage", "smoothing": {"psi": 1.0}}),
        ("bernstein.kde", {"column": "wage", "lattice_size": 0}),
        ("bernstein.kde", {"column": "wage", "normalize": "yes"}),
    ],
)
def test_malformed_params_fail_validation(name: str, params: dict) -> None:
    with pytest.raises(marshmallow.ValidationError):
        MECHANISMS[name].load_params(params)


def test_run_checks_the_data_shape_without_echoing_it() -> None:
    mech = MECHANISMS["iclp.mean"]
    params = mech.load_params({"column": "load"})
    cost = mech.cost(params, EPS, META)
    with pytest.raises(ValueError, match="2-D column of the batch") as info:
        mech.run({"load": DATA["load"][:, :10]}, params, cost, META, np.random.default_rng(0))
    assert str(SECRET) not in str(info.value)


def test_plot_data_refuses_non_functions() -> None:
    with pytest.raises(ValueError, match="no grid"):
        plot_data({"value": 3.0})
    with pytest.raises(ValueError, match="same length"):
        plot_data({"grid": [0.0, 1.0], "values": [1.0]})
    with pytest.raises(ValueError, match="numbers"):
        plot_data({"grid": [0.0, "x"], "values": [1.0, 2.0]})
    grid, values = plot_data({"grid": [0, 1, 2], "values": [1.0, None, 2]})
    assert grid == [0.0, 1.0, 2.0] and math.isnan(values[1])
