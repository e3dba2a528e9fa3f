"""Subset privacy throughput (best of 3): privatizing and estimating 10**6 records, p = 8.

Targets: privatizing 10**6 records under the p = 8 uniform design (rejection
sampler, uint64 bitmasks) in under 1 s; EM on them, aggregation included,
in under 1 s. EM works on the m ≤ 2**p distinct subsets with their counts
(m = 238 here), so one iteration costs O(m·p) instead of O(n·p); a plain
per-record EM is timed in the same run for comparison (a few iterations,
extrapolated to the iteration count the aggregated plain EM needed).
Run with ``make bench`` (or ``pytest tests/bench -o addopts="" -s``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from mechanisms import subset
from mechanisms.subset import bitmask

pytestmark = pytest.mark.bench

N = 10**6
P = 8
REPEATS = 3
TARGET_SECONDS = 1.0
PER_RECORD_ITERATIONS = 10
W = np.array([0.02, 0.05, 0.08, 0.1, 0.12, 0.15, 0.18, 0.3])


def _best(run: Callable[[], Any]) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(REPEATS):
        start = time.perf_counter()
        value = run()
        best = min(best, time.perf_counter() - start)
    return best, value


def _per_record_em(masks: NDArray[np.uint64], iterations: int) -> NDArray[np.float64]:
    """The textbook EM, w_j ← n⁻¹ Σ_i w_j 1{j∈a_i}/(1_{a_i}ᵀw), over every record."""
    rows = bitmask.indicators(masks, P)
    w = np.full(P, 1.0 / P)
    for _ in range(iterations):
        w = w * (rows / (rows @ w)[:, None]).mean(axis=0)
    return w


def test_privatize_a_million_records() -> None:
    rng = np.random.default_rng(1)
    x = rng.choice(P, N, p=W)
    design = subset.design_uniform(P)
    seconds, masks = _best(lambda: subset.privatize(x, design, rng))
    assert np.all(bitmask.contains(masks, x))
    print(f"\nprivatize 10^6 records, p = {P}: {seconds:.3f} s (target < {TARGET_SECONDS} s)")
    assert seconds < TARGET_SECONDS


def test_em_a_million_records() -> None:
    rng = np.random.default_rng(2)
    design = subset.design_uniform(P)
    masks = subset.privatize(rng.choice(P, N, p=W), design, rng)

    def aggregated(accelerate: bool) -> subset.estimation.EMFit:
        return subset.em(subset.observe(masks, P), accelerate=accelerate)

    fast, fit = _best(lambda: aggregated(True))
    plain, plain_fit = _best(lambda: aggregated(False))
    assert fit.converged and plain_fit.converged
    assert np.max(np.abs(fit.w - plain_fit.w)) < 1e-8
    assert np.max(np.abs(fit.w - W)) < 0.01  # sampling error at n = 10**6 is ~0.001
    per_record, w_few = _best(lambda: _per_record_em(masks, PER_RECORD_ITERATIONS))
    obs = subset.observe(masks, P)
    few = subset.em(obs, tol=0.0, max_iter=PER_RECORD_ITERATIONS, accelerate=False)
    assert np.allclose(w_few, few.w, atol=1e-12)  # the same iterates, computed per record
    per_iteration = per_record / PER_RECORD_ITERATIONS
    aggregated_iteration = plain / plain_fit.iterations
    print(
        f"\nEM on 10^6 records, p = {P} ({len(obs.masks)} distinct subsets):"
        f"\n  aggregated + SQUAREM: {fast:.3f} s ({fit.iterations} cycles)"
        f" (target < {TARGET_SECONDS} s)"
        f"\n  aggregated plain EM:  {plain:.3f} s ({plain_fit.iterations} iterations)"
        f"\n  per-record plain EM:  {per_iteration * 1e3:.1f} ms/iteration, so"
        f" ~{per_iteration * plain_fit.iterations:.1f} s for {plain_fit.iterations} iterations"
        f" ({per_iteration / aggregated_iteration:.0f}x the aggregated cost per iteration)"
    )
    assert fast < TARGET_SECONDS
    assert plain < TARGET_SECONDS
    assert per_iteration * plain_fit.iterations > 10 * plain
