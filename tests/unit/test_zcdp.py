"""ρ-zCDP accounting (mechanisms.zcdp) and per-dataset notions (service.budget): exact units,
the Gaussian's charge, the conversion to (ε, δ), and the Gaussian variants under zcdp."""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import zcdp
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.dp import baselines, moments, tables, vectors
from service import budget
from service.ingest import IngestError, parse_metadata

ZMETA = DatasetMeta(
    n_rows=1000,
    columns={
        "x": ColumnMeta("x", "continuous", bounds=(0.0, 10.0)),
        "k": ColumnMeta("k", "integer", bounds=(0, 7)),
        "g": ColumnMeta("g", "categorical", categories=("a", "b", "c")),
    },
    gaussian_accounting="zcdp",
)

COUNT = {"statistic": "count", "condition": {"column": "k", "op": "ge", "value": 0}}
rhos = st.fractions(min_value=Fraction(1, 10**6), max_value=100, max_denominator=10**6)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), rhos)
def test_sigma_for_rho_is_the_smallest_float_meeting_rho(l2sq: int, rho: Fraction) -> None:
    """Exactly Δ²/(2σ²) <= ρ at the σ returned (rational arithmetic) and > ρ one float
    below: the charge is never optimistic and the noise never needlessly large."""
    sigma = zcdp.sigma_for_rho(l2sq, rho)
    assert zcdp.gaussian_rho(l2sq, sigma) <= rho
    assert zcdp.gaussian_rho(l2sq, math.nextafter(sigma, 0.0)) > rho


def test_pure_to_rho_is_exact() -> None:
    assert zcdp.pure_to_rho(Fraction(1, 10)) == Fraction(1, 200)
    assert budget.cost_units("rho", zcdp.pure_to_rho(Fraction(1, 10))) == 5 * 10**9


@settings(max_examples=100, deadline=None)
@given(st.fractions(min_value=Fraction(1, 10**6), max_value=1000, max_denominator=10**9),
       st.sampled_from([Fraction(1, 10**3), Fraction(1, 10**6), Fraction(1, 10**9),
                        Fraction(3, 10**12)]))
def test_conversion_matches_a_direct_computation(rho: Fraction, delta: Fraction) -> None:
    """ε = ρ + 2√(ρ log 1/δ) (BS16 Prop 1.3) computed at 50 digits: the float shown is never
    below it and within 1e-10 relative; and the CKS Cor. 13 δ at that ε is indeed <= δ."""
    getcontext().prec = 50
    r, d = Decimal(rho.numerator) / Decimal(rho.denominator), Decimal(delta.numerator) / \
        Decimal(delta.denominator)
    exact = r + 2 * (r * (1 / d).ln()).sqrt()
    shown = zcdp.epsilon_for(rho, delta)
    assert Decimal(shown) >= exact
    assert Decimal(shown) <= exact * (1 + Decimal("1e-10"))
    assert vectors.zcdp_log_delta(float(rho), shown) <= math.log(float(delta)) + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**15), st.lists(rhos, min_size=1, max_size=40))
def test_units_never_let_charges_exceed_the_cap(cap_units: int, costs: list[Fraction]) -> None:
    """The ledger's rule (charge if cost <= cap − spent, integer units: costs rounded up) on
    ρ amounts: what is charged never exceeds the cap, and the charged units, read back as
    ρ, are at least the exact ρ the releases spent (rounding never favours the spender)."""
    cap = budget.from_units("rho", cap_units)
    spent_units, spent_exact = 0, Fraction(0)
    for c in costs:
        units = budget.cost_units("rho", c)
        if units <= cap_units - spent_units:
            spent_units += units
            spent_exact += c
    assert spent_units <= cap_units and spent_exact <= budget.from_units("rho", spent_units)
    assert spent_exact <= cap
    assert budget.cap_units("rho", cap) == cap_units  # a cap read back is the same cap


def test_rho_units_stay_exact_in_lua() -> None:
    """Lua numbers are doubles: three times the largest ρ cap must stay below 2**53."""
    per, top = budget.MEASURES["rho"]
    assert 3 * per * top < 2**53 and top >= zcdp.MAX_RHO


def test_charge_on_a_zcdp_dataset() -> None:
    """Pure ε becomes ε²/2 in ρ; ρ and the other notions' measures pass; a mechanism that
    accounts its own (ε, δ) (gp.adp) is refused rather than charged a meaningless ρ."""
    assert zcdp.charge({"epsilon": Fraction(1, 2)}, "laplace") == {"rho": Fraction(1, 8)}
    assert zcdp.charge({"rho": Fraction(1, 3)}, "gaussian") == {"rho": Fraction(1, 3)}
    assert zcdp.charge({"noiseless_bits": Fraction(2)}, "noiseless.local") == {
        "noiseless_bits": Fraction(2)}
    with pytest.raises(MechanismInputError):
        zcdp.charge({"epsilon": Fraction(1), "delta": Fraction(1, 10**6)}, "gp.adp")


@pytest.mark.parametrize(("params", "l2sq_of"), [
    ({"statistic": "count", "condition": {"column": "k", "op": "ge", "value": 3}},
     lambda u: u * u),
    ({"statistic": "sum", "column": "k"}, lambda u: u * u),
    ({"statistic": "mean", "column": "x"}, lambda u: u * u),
    ({"statistic": "histogram", "column": "g"}, lambda u: 2 * u * u),
])
def test_gaussian_on_a_zcdp_dataset_charges_delta_squared_over_two_sigma_squared(
        params: dict[str, object], l2sq_of: object) -> None:
    """The baseline reads ρ, charges it, and its σ on the lattice satisfies CKS Thm 14's
    Δ²/(2σ²) <= ρ with Δ the lattice shift (a histogram moves Δ out of one bin and into
    another: 2Δ²); that exact ρ in units rounded up is the charge. Old code: KeyError on
    'epsilon' (no ρ)."""
    rho = Fraction(1, 20)
    mech = baselines.gaussian
    params = mech.load_params(params)
    cost = mech.cost(params, {"rho": rho}, ZMETA)
    assert cost == {"rho": rho}
    plan = mech._plan(params, cost, ZMETA)
    l2sq = l2sq_of(plan.lattice_sensitivity)  # type: ignore[operator]
    proven = zcdp.gaussian_rho(l2sq, plan.noise_scale)
    assert proven <= rho and proven >= rho * (1 - Fraction(1, 10**12))
    assert budget.cost_units("rho", proven) == budget.cost_units("rho", rho)
    accuracy = mech.accuracy(params, cost, ZMETA)
    assert accuracy["noise"] == "discrete_gaussian"
    assert math.isclose(accuracy["scale"], plan.noise_scale * plan.grid)
    with pytest.raises(MechanismInputError):
        mech.cost(params, {"epsilon": 1, "delta": 1e-6}, ZMETA)  # a zcdp dataset reads ρ


def test_gaussian_zcdp_release_runs_with_the_stated_noise() -> None:
    """A count on a zcdp dataset: unbiased, and its noise's spread is σ = Δ/√(2ρ) (Δ = 1):
    over 4,000 seeded releases the sample sd is within 5 % of σ (sd's standard error is
    about σ/√(2·4000) = 1.1 %)."""
    rho = Fraction(1, 2)  # σ = 1
    data = {"x": np.zeros(1000), "k": np.zeros(1000, dtype=np.int64),
            "g": np.zeros(1000, dtype=np.int64)}
    rng = np.random.default_rng(7)
    params = baselines.gaussian.load_params(COUNT)
    values = np.array([baselines.gaussian.run(data, params, {"rho": rho}, ZMETA,
                                              rng).result["value"] for _ in range(4000)])
    assert abs(values.mean() - 1000) < 4 * 1.0 / math.sqrt(4000)
    assert abs(values.std() - 1.0) < 0.05


def test_gaussian_guarantee_names_rho() -> None:
    out = baselines.gaussian.run({"x": np.zeros(1000), "k": np.zeros(1000, dtype=np.int64),
                                  "g": np.zeros(1000, dtype=np.int64)},
                                 baselines.gaussian.load_params(COUNT),
                                 {"rho": Fraction(1, 10)}, ZMETA,
                                 np.random.default_rng(1))
    assert "rho-zCDP (rho=0.1" in out.guarantee


def test_tables_and_moments_read_rho_on_a_zcdp_dataset() -> None:
    """A count table's shift is one unit out of a cell and one into another (L2² = 2), so
    σ² >= 2/(2ρ); a mean table spends ρ/2 on counts and ρ/2 on sums (zCDP adds); a
    variance's lattice shift gives its σ the same way. Old code: KeyError on 'epsilon'."""
    rho = Fraction(1, 10)
    count = tables.plan("gaussian", baselines.gaussian.load_params(
        {"statistic": "count", "group_by": ["g"]}), {"rho": rho}, ZMETA)
    assert count.count is not None and count.count.rho == rho
    assert zcdp.gaussian_rho(2, count.count.noise.scale) <= rho
    assert "rho" in count.count.accuracy() and "epsilon" not in count.count.accuracy()
    mean = tables.plan("gaussian", baselines.gaussian.load_params(
        {"statistic": "mean", "column": "k", "group_by": ["g"]}), {"rho": rho}, ZMETA)
    assert mean.count is not None and mean.sum is not None
    assert mean.count.rho == mean.sum.rho == rho / 2
    assert zcdp.gaussian_rho(2, mean.count.noise.scale) <= rho / 2
    assert zcdp.gaussian_rho(mean.sum.l2sq, mean.sum.noise.scale) <= rho / 2
    var = moments.plan("gaussian", {"statistic": "variance", "column": "x"}, {"rho": rho},
                       ZMETA)
    l2sq = sum(u * u for u in var.units)
    assert zcdp.gaussian_rho(l2sq, var.noise.scale) <= rho
    assert zcdp.gaussian_rho(l2sq, var.noise.scale) >= rho * (1 - Fraction(1, 10**12))


def test_notions_of_and_lock() -> None:
    """The notion of a release follows from the measures it charges; the lock applies only
    where both DP and noiseless are admitted and mixing is not allowed."""
    assert budget.notions_of({"rho": 1}) == {"dp"}
    assert budget.notions_of({"interval_leakage:age": 1}) == {"interval"}
    default: dict[str, object] = {}
    assert budget.notion_lock({"epsilon": 1}, default) == "dp"
    assert budget.notion_lock({"noiseless_bits": 1}, default) == "noiseless"
    assert budget.notion_lock({"subset_draws:g": 1}, default) == ""
    assert budget.notion_lock({"epsilon": 1}, {"allow_mixed_noiseless_dp": True}) == ""
    assert budget.notion_lock({"epsilon": 1}, {"notions": ["dp", "interval"]}) == ""


def _meta(**extra: object) -> dict[str, object]:
    return {"name": "t", "columns": {"x": {"type": "continuous", "bounds": [0, 1]}},
            "budgets": {"rho": 1}, **extra}


def test_metadata_accounting_fields() -> None:
    """Defaults keep today's accounting; notions absent unless named (registration
    resolves them from the budgets, #27.3) and record-level releases off; a zcdp dataset
    with an ε or δ cap is refused (it would never be spent), as are unknown or repeated
    notions, a δ outside (0, 1) and a record_level that is not a boolean."""
    spec = parse_metadata(_meta())
    assert spec.accounting == {"gaussian_accounting": "approx_dp", "zcdp_delta": 1e-6,
                               "allow_mixed_noiseless_dp": False, "record_level": False}
    z = parse_metadata(_meta(gaussian_accounting="zcdp", zcdp_delta=1e-9))
    assert z.meta(10).gaussian_accounting == "zcdp" and z.accounting["zcdp_delta"] == 1e-9
    for bad, field in [
        (_meta(gaussian_accounting="zcdp", budgets={"epsilon": 1}), "metadata.budgets.epsilon"),
        (_meta(gaussian_accounting="renyi"), "metadata.gaussian_accounting"),
        (_meta(notions=["dp", "dp"]), "metadata.notions"),
        (_meta(notions=["quantum"]), "metadata.notions"),
        (_meta(notions=[]), "metadata.notions"),
        (_meta(zcdp_delta=1), "metadata.zcdp_delta"),
        (_meta(allow_mixed_noiseless_dp="yes"), "metadata.allow_mixed_noiseless_dp"),
        (_meta(record_level="yes"), "metadata.record_level"),
        (_meta(record_level=1), "metadata.record_level"),
    ]:
        with pytest.raises(IngestError) as info:
            parse_metadata(bad)
        assert info.value.field.startswith(field), (info.value.field, field)
