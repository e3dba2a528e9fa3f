"""Accuracy benchmark of the functional mean mechanisms (issue 16 item 1): the README table.

RMSE = √(mean over seeds of ‖f̃ − μ‖²), the quadrature L2 norm on the grid, for
ICLP-QR (default tuning), ICLP-AR, FRL, GP-ADP (δ = 1e-6) and the Bernstein
mean, over ε ∈ {1/8, 1/2, 1, 2, 4, 8, 16}, n ∈ {100, 500, 10^4} and our
stand-ins S1–S4 (``tests/unit/iclp/sim.py``: μ + GP errors, sd 0.5, length
0.1, 100-point grid, τ = 3, τ_∞ = 3 for Bernstein). Each seed draws one
dataset per (S, n) and one release per (mechanism, ε); the seeds are
``SEEDS``. Also prints the exact expected RMSE ratio QR/FRL (no Monte Carlo).
Not in CI: ``make bench`` or ``python -m tests.bench.test_iclp_accuracy_bench``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mechanisms.iclp import ar, bernstein, gp, mean
from tests.unit.iclp.sim import GRID, SCENARIO_TAU, SCENARIOS, expected_sq_error, gp_curves

pytestmark = pytest.mark.bench

SEEDS = tuple(range(10))
EPSILONS = (Fraction(1, 8), Fraction(1, 2), Fraction(1), Fraction(2), Fraction(4),
            Fraction(8), Fraction(16))
SIZES = (100, 500, 10_000)
DELTA = Fraction(1, 10**6)
MECHANISMS: dict[str, Callable[[int, Fraction], Any]] = {
    "ICLP-QR": lambda n, e: mean.plan_iclp_mean(GRID, SCENARIO_TAU, n, e),
    "ICLP-AR": lambda n, e: ar.plan_iclp_ar_mean(GRID, SCENARIO_TAU, n, e),
    "FRL": lambda n, e: mean.plan_frl_mean(GRID, SCENARIO_TAU, n, e),
    "GP-ADP": lambda n, e: gp.plan_gp_mean(GRID, SCENARIO_TAU, n, e, DELTA),
    "Bernstein": lambda n, e: bernstein.plan_bernstein_mean(GRID, SCENARIO_TAU, n, e),
}
_WEIGHTS = mean.domain.quadrature_weights(tuple(GRID))


def table(seeds: tuple[int, ...] = SEEDS) -> dict[tuple[str, int, Fraction, str], float]:
    """RMSE per (scenario, n, ε, mechanism)."""
    plans = {(name, n, e): make(n, e) for name, make in MECHANISMS.items() for n in SIZES
             for e in EPSILONS}
    sq: dict[tuple[str, int, Fraction, str], list[float]] = {}
    for s_index, (label, mu) in enumerate(SCENARIOS.items()):
        for n in SIZES:
            for seed in seeds:
                rng = np.random.default_rng([seed, s_index, n])
                curves = gp_curves(rng, n, mu=mu)
                for (name, pn, e), plan in plans.items():
                    if pn != n:
                        continue
                    values = plan.release(curves, rng).values
                    err = float(np.sum(_WEIGHTS * (values - mu) ** 2))
                    sq.setdefault((label, n, e, name), []).append(err)
    return {key: math.sqrt(float(np.mean(v))) for key, v in sq.items()}


def markdown(rmse: dict[tuple[str, int, Fraction, str], float]) -> str:
    names = list(MECHANISMS)
    lines = ["| S | n | ε | " + " | ".join(names) + " | best ε-DP |",
             "|---|---|---|" + "---|" * len(names) + "---|"]
    for label in SCENARIOS:
        for n in SIZES:
            for e in EPSILONS:
                row = [rmse[(label, n, e, m)] for m in names]
                pure = {m: r for m, r in zip(names, row, strict=True) if m != "GP-ADP"}
                best = min(pure, key=pure.__getitem__)
                cells = " | ".join(f"**{r:.4f}**" if m == best else f"{r:.4f}"
                                   for m, r in zip(names, row, strict=True))
                lines.append(f"| {label} | {n} | {_eps(e)} | {cells} | {best} |")
    return "\n".join(lines)


def exact_ratios() -> str:
    """Exact E‖f̃ − μ‖² ratio √(QR/FRL), max over S1–S4, per (n, ε)."""
    lines = ["| n | " + " | ".join(_eps(e) for e in EPSILONS) + " |",
             "|---|" + "---|" * len(EPSILONS)]
    for n in SIZES:
        cells = []
        for e in EPSILONS:
            qr = mean.plan_iclp_mean(GRID, SCENARIO_TAU, n, e)
            frl = mean.plan_frl_mean(GRID, SCENARIO_TAU, n, e)
            cells.append(max(math.sqrt(expected_sq_error(qr, mu) / expected_sq_error(frl, mu))
                             for mu in SCENARIOS.values()))
        lines.append(f"| {n} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def _eps(e: Fraction) -> str:
    return str(e.numerator) if e.denominator == 1 else f"{e.numerator}/{e.denominator}"


def test_accuracy_table() -> None:
    start = time.perf_counter()
    rmse = table()
    print(f"\nseeds {SEEDS}; {time.perf_counter() - start:.0f} s\n")
    print(markdown(rmse))
    print("\nexact RMSE ratio ICLP-QR / FRL, max over S1-S4\n")
    print(exact_ratios())
    cells = [(s, n, e) for s in SCENARIOS for n in SIZES for e in EPSILONS]
    over_frl = sum(rmse[(*c, "ICLP-QR")] <= rmse[(*c, "FRL")] for c in cells)
    best = sum(rmse[(*c, "ICLP-QR")] <= min(rmse[(*c, m)] for m in ("FRL", "ICLP-AR",
                                                                    "Bernstein"))
               for c in cells)
    print(f"\nICLP-QR <= FRL in {over_frl} of {len(cells)} cells; best pure-DP mechanism"
          f" in {best}")
    # the exact expectations lose in 3 (n, ε) corners only (tests/unit/iclp/test_tuning.py);
    # 10 seeds of one dataset each leave Monte Carlo noise at small n·ε²
    assert over_frl >= 66


if __name__ == "__main__":
    test_accuracy_table()
