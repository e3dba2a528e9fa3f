"""Local noiseless quantization of 10**6 records against ``np.digitize`` (best of 5).

Ours does the whole release: clip to the declared bounds, missing values to
the lower bound, bin by exact comparisons (``np.searchsorted``), closed last
bin, and look up each bin's released value. ``np.digitize`` on the same data
and edges only finds the bins. Target: ours within 3x of it. The exact sum
behind the aggregate release is timed against ``math.fsum`` and reported.
Run with ``make bench`` (or ``pytest tests/bench -o addopts="" -s``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mechanisms import noiseless

pytestmark = pytest.mark.bench

RECORDS = 10**6
REPEATS = 5
MAX_SLOWDOWN = 3.0


def _best(run: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("bits", [Fraction(3), Fraction(8), Fraction(16)])
def test_local_quantization_against_digitize(bits: Fraction) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(50.0, 30.0, RECORDS)  # some records beyond the bounds, as in real data
    plan = noiseless.plan_local(bits, (0.0, 100.0))
    edges = plan.quantizer.edges
    ours = _best(lambda: noiseless.quantize(x, plan))
    digitize = _best(lambda: np.digitize(x, edges))
    ratio = ours / digitize
    print(
        f"\nlocal quantize, {plan.count} levels: {RECORDS / ours / 1e6:.1f} M records/s;"
        f" np.digitize {RECORDS / digitize / 1e6:.1f} M/s; ours/digitize {ratio:.2f}"
    )
    # same bins as digitize on the clipped data (last bin closed)
    clipped = np.clip(x, 0.0, 100.0)
    index = np.minimum(np.digitize(clipped, edges) - 1, plan.count - 1)
    assert np.array_equal(noiseless.quantize(x, plan), plan.quantizer.outputs[index])
    assert ratio <= MAX_SLOWDOWN


def test_exact_sum_throughput() -> None:
    x = np.random.default_rng(2).uniform(-1e6, 1e6, RECORDS)
    ours = _best(lambda: noiseless.exact_float_sum(x))
    fsum = _best(lambda: math.fsum(x))
    print(
        f"\nexact_float_sum: {RECORDS / ours / 1e6:.1f} M records/s;"
        f" math.fsum {RECORDS / fsum / 1e6:.1f} M/s; ours/fsum {ours / fsum:.2f}"
    )
    assert float(noiseless.exact_float_sum(x)) == math.fsum(x)
