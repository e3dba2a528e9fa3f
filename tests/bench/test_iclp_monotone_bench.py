"""The long grid of issue #32 item 5: every functional and density mechanism's error
against ε at default params, 200 noise seeds (CI runs 40: ``test_defaults_monotone``).

Prints mean ± standard error of the squared L2 error per ε on the fixed smooth dataset
of ``tests/unit/iclp/monotone_cases.py`` (n = 500) and asserts, over every pair ε < ε'
of a finer grid (1/8 … 4.8), that the paired mean difference is at most 3 of its standard
errors, except for ``RISING``.
Not in CI: ``make bench``.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from tests.unit.iclp.monotone_cases import CASES
from tests.unit.iclp.test_defaults_monotone import Z

pytestmark = pytest.mark.bench

SEEDS = 200
#: still rise on this finer grid (200 seeds, measured 2026-11-29): the min-risk designs
#: where the candidate switches (the reference is not this dataset): kde2d 0.644 -> 0.687
#: (ε 0.63 -> 1.42), logistic erm 0.726 -> 0.777 (0.95 -> 1.42). Printed, not asserted.
#: (The square-loss erm, cov and fos rose with ψ minimising privacy + a worst-case bias ψR²/4:
#: 0.226 -> 0.319 and 0.278 -> 0.388 from ε = 1/8 to 3/16, fos 7.6 -> 21 from 1/8 to
#: 0.42; their reference-risk ψ does not.)
RISING = ("iclp.kde2d", "iclp.erm.logistic")
#: 1/8 · (3/2)^k, k = 0 … 9: 1/8 to about 4.8, finer than CI's doubling grid
EPSILONS = tuple(Fraction(1, 8) * Fraction(3, 2) ** k for k in range(10))


@pytest.mark.parametrize("name", list(CASES))
def test_error_against_epsilon(name: str) -> None:
    errors = np.stack([CASES[name].errors(eps, SEEDS) for eps in EPSILONS])
    cells = [f"{m:.4g}±{s:.2g}" for m, s in zip(
        errors.mean(axis=1), errors.std(axis=1, ddof=1) / math.sqrt(SEEDS), strict=True)]
    print(f"\n{name}: " + "  ".join(f"eps={float(e):.3g}: {c}"
                                    for e, c in zip(EPSILONS, cells, strict=True)))
    if name in RISING:
        return
    for i, j in itertools.combinations(range(len(EPSILONS)), 2):
        diff = errors[j] - errors[i]
        assert float(diff.mean()) <= Z * float(diff.std(ddof=1)) / math.sqrt(SEEDS), (
            name, EPSILONS[i], EPSILONS[j])
