"""ρ-zCDP accounting for Gaussian releases (Bun & Steinke 2016; Canonne, Kamath & Steinke 2020).

A dataset whose metadata says ``gaussian_accounting: "zcdp"`` keeps ONE ρ budget
for all its DP releases, because zCDP composes by adding ρ — so k Gaussian
releases cost kρ, where (ε, δ) accounting would add k ε's and k δ's:

* Gaussian-noise releases charge ρ. Our samplers draw the *discrete* Gaussian
  exactly (``sampling.discrete_gaussian``, CKS 2020 Algorithm 3) at a float σ,
  and CKS 2020 Thm 14 proves: adding discrete Gaussian noise of parameter σ² to
  an integer-valued query whose neighbours differ by a shift of squared L2 norm
  Δ² (integer vector, coordinates independent) is Δ²/(2σ²)-zCDP. Every release
  rounds its statistic to a lattice whose integer shift (``units``) already
  bounds the float error, so the ρ charged here is exactly that theorem's.
  ``sigma_for_rho`` picks the smallest float σ with Δ²/(2σ²) <= ρ, checked in
  exact rational arithmetic.
* Pure ε-DP releases charge ρ = ε²/2 (ε-DP implies ε²/2-zCDP, BS16 Prop 1.4),
  into the same budget: one ledger per dataset, no mixed (ε, ρ) bookkeeping.
* A ρ total converts to (ε, δ)-DP for a public δ by BS16 Prop 1.3,
  ε = ρ + 2√(ρ log(1/δ)); the budget view shows it for the cap, the committed
  and the remaining ρ (``epsilon_for``). CKS 2020 Cor. 13 is tighter
  (``vectors.zcdp_log_delta``); the BS16 bound is shown because it is the one
  every reader can check by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from mechanisms.base import MechanismInputError, read_amount

#: a release's ρ above this is refused as absurd (the release would be essentially exact)
MAX_RHO = Fraction(10**3)
#: the accountings a dataset may choose for its Gaussian releases
ACCOUNTINGS = ("approx_dp", "zcdp")
#: public δ of the (ε, δ) conversion when the metadata gives none
DEFAULT_DELTA = Fraction(1, 10**6)
#: relative upward margin on the float conversion: the shown ε is never below the exact one
_UP = 1.0 + 1e-12


def read_rho(budget: Mapping[str, object], name: str) -> Fraction:
    """A zCDP Gaussian release's budget: exactly ``{"rho": ρ}`` with 0 < ρ <= MAX_RHO."""
    extra = sorted(set(budget) - {"rho"})
    if extra:
        raise MechanismInputError(
            "budget", f"{name} on a zcdp dataset spends only rho; got {', '.join(extra)}")
    return read_amount(budget, "rho", MAX_RHO, f"{name} on a zcdp dataset needs a rho budget")


def gaussian_rho(l2sq_units: int, sigma: float) -> Fraction:
    """Exact ρ of discrete Gaussian(σ) noise on an integer shift of squared L2 norm Δ²:
    Δ²/(2σ²) (CKS 2020 Thm 14), σ taken as the float the sampler uses."""
    if l2sq_units <= 0 or not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError("need a positive shift and a positive finite sigma")
    s = Fraction(sigma)
    return Fraction(l2sq_units) / (2 * s * s)


def sigma_for_rho(l2sq_units: int, rho: Fraction) -> float:
    """The smallest float σ whose ``gaussian_rho(l2sq_units, σ)`` is at most ρ (exact check)."""
    if l2sq_units <= 0 or rho <= 0:
        raise ValueError("need a positive shift and a positive rho")
    target = Fraction(l2sq_units) / (2 * rho)  # σ² must be at least this
    sigma = math.sqrt(float(target))
    while Fraction(sigma) ** 2 < target:
        sigma = math.nextafter(sigma, math.inf)
    while sigma > 0 and Fraction(math.nextafter(sigma, 0.0)) ** 2 >= target:
        sigma = math.nextafter(sigma, 0.0)
    return sigma


def sigma_real(l2_sensitivity: float, rho: Fraction) -> float:
    """σ of the continuous Gaussian at ρ (statistic units); only places the lattice."""
    return l2_sensitivity / math.sqrt(2.0 * float(rho))


def pure_to_rho(epsilon: Fraction) -> Fraction:
    """ρ of an ε-DP release: ε²/2 (BS16 Prop 1.4), exact."""
    return epsilon * epsilon / 2


def epsilon_for(rho: Fraction, delta: Fraction) -> float:
    """ε such that ρ-zCDP implies (ε, δ)-DP: ρ + 2√(ρ log(1/δ)) (BS16 Prop 1.3), rounded up."""
    if not 0 < delta < 1:
        raise ValueError("delta must be in (0, 1)")
    if rho <= 0:
        return 0.0
    r = float(rho) * _UP
    return (r + 2.0 * math.sqrt(r * -math.log(float(delta)) * _UP)) * _UP


def conversion(rho: Fraction, delta: Fraction) -> dict[str, float]:
    """The (ε, δ) statement of a ρ amount, for JSON."""
    return {"epsilon": epsilon_for(rho, delta), "delta": float(delta)}


def charge(cost: Mapping[str, Fraction], name: str) -> dict[str, Fraction]:
    """A release's cost on a zcdp dataset: ρ as is; pure ε as ρ = ε²/2; other measures
    (noiseless bits, interval leakage, subset draws) as they are. A mechanism that
    accounts its own Gaussian noise in (ε, δ) is refused: its δ has no ρ to charge."""
    if "delta" in cost:
        raise MechanismInputError(
            "mechanism", f"{name} is accounted in (epsilon, delta); this dataset accounts"
            " Gaussian noise in zCDP (rho)")
    out = {m: a for m, a in cost.items() if m != "epsilon"}
    if "epsilon" in cost:
        out["rho"] = out.get("rho", Fraction(0)) + pure_to_rho(cost["epsilon"])
    return out
