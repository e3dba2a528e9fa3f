"""ICLP releases against the plain numpy statistic of the same data, in the same run.

``iclp.mean`` on 10^4 curves x 200 grid points against ``X.mean(axis=0)``, and
``iclp.kde`` on 10^6 values against ``np.histogram`` with as many bins as the
KDE grid; both through the registry entry (plan, clipping/binning, lattice
noise, JSON result, accuracy), best of 5 with the eigen-system cached, plus
the first (cold) call that also builds it. The bounds on the ratios are loose
(the machine is shared): they catch an accidental O(n·M·J) or O(n·M) blow-up.
Run with ``make bench`` (or ``pytest tests/bench -o addopts="" -s``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mechanisms import registry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.iclp import spectral
from mechanisms.rng import secure_generator

pytestmark = pytest.mark.bench

REPEATS = 5
#: the release may cost at most this many plain computations of the same statistic
MAX_MEAN_RATIO = 25.0
MAX_KDE_RATIO = 10.0
BUDGET = {"epsilon": Fraction(1)}


def _best(call: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def _cold(call: Callable[[], Any]) -> float:
    spectral.cache_clear()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def test_iclp_mean_against_numpy_mean() -> None:
    n, m = 10**4, 200
    grid = np.linspace(0.0, 1.0, m)
    rng = np.random.default_rng(1)
    curves = np.sin(2 * np.pi * grid) + rng.standard_normal((n, m)) * 0.5
    meta = DatasetMeta(n, {"f": ColumnMeta("f", "functional", grid=tuple(grid), norm_bound=2.0)})
    mech = registry.get("iclp.mean")
    params = mech.load_params({"column": "f"})

    def release() -> Any:
        cost = mech.cost(params, BUDGET, meta)
        return mech.run({"f": curves}, params, cost, meta, secure_generator())

    cold = _cold(release)
    ours = _best(release)
    plain = _best(lambda: curves.mean(axis=0))
    ratio = ours / plain
    print(
        f"\niclp.mean {n} x {m}: {ours * 1e3:.1f} ms warm, {cold * 1e3:.1f} ms cold"
        f" (eigen-decomposition included); numpy mean {plain * 1e3:.2f} ms; ratio {ratio:.1f}"
    )
    assert ratio <= MAX_MEAN_RATIO


def test_iclp_kde_against_numpy_histogram() -> None:
    n, bins = 10**6, 200
    rng = np.random.default_rng(2)
    values = np.clip(np.where(rng.random(n) < 0.4, rng.normal(30, 8, n), rng.normal(70, 10, n)),
                     0.0, 100.0)
    meta = DatasetMeta(n, {"x": ColumnMeta("x", "continuous", (0.0, 100.0))})
    mech = registry.get("iclp.kde")
    params = mech.load_params({"column": "x", "grid_size": bins})

    def release() -> Any:
        cost = mech.cost(params, BUDGET, meta)
        return mech.run({"x": values}, params, cost, meta, secure_generator())

    cold = _cold(release)
    ours = _best(release)
    plain = _best(lambda: np.histogram(values, bins=bins, range=(0.0, 100.0)))
    ratio = ours / plain
    print(
        f"\niclp.kde {n} values, {bins}-point grid: {ours * 1e3:.1f} ms warm, {cold * 1e3:.1f}"
        f" ms cold; numpy histogram {plain * 1e3:.1f} ms; ratio {ratio:.2f}"
    )
    assert ratio <= MAX_KDE_RATIO
