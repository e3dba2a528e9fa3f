"""Eigen-systems on weighted grids: orthonormality, trace, truncation, signs, cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.iclp import domain, kernels, spectral

GRID = np.linspace(0.0, 1.0, 100)
MATERN = kernels.matern(1.5, 0.1)


def _gram(eig: spectral.EigenSystem) -> np.ndarray:
    return eig.vectors.T @ (eig.weights[:, None] * eig.vectors)


@pytest.mark.parametrize(
    "kernel", [MATERN, kernels.matern(2.5, 0.1), kernels.exponential(0.1), kernels.gaussian(0.1)],
    ids=lambda k: k.family + str(k.nu or ""),
)
def test_orthonormal_under_the_weights_and_trace_identity(kernel: kernels.Kernel) -> None:
    eig = spectral.eigen_system(kernel, GRID)
    assert np.max(np.abs(_gram(eig) - np.eye(eig.size))) < 1e-10
    assert eig.defect < 1e-10
    assert np.all(np.diff(eig.values) <= 0) and np.all(eig.values > 0)
    assert eig.values[-1] > spectral.REL_FLOOR * eig.values[0]
    if eig.dropped == 0:  # Σλ_j = Σ_k w_k C(t_k, t_k) = 1 when nothing is dropped
        assert eig.trace == pytest.approx(1.0, rel=1e-10)
    else:
        assert eig.trace == pytest.approx(1.0, rel=1e-8)


def test_golden_leading_eigenvalues() -> None:
    # spec §5.6 prints them to 4 decimals: a half unit of the last digit is the tolerance
    eig = spectral.eigen_system(MATERN, GRID)
    np.testing.assert_allclose(
        eig.values[:5], [0.2178, 0.1894, 0.1527, 0.1164, 0.0856], atol=5e-5
    )
    assert eig.size == 100
    assert eig.values[-1] == pytest.approx(4.4e-6, rel=0.05)


def test_gaussian_kernel_drops_non_positive_eigenvalues() -> None:
    eig = spectral.eigen_system(kernels.gaussian(0.1), GRID)
    assert eig.size < 100 and eig.dropped == 100 - eig.size


def test_sign_convention_and_determinism() -> None:
    eig = spectral.eigen_system(MATERN, GRID)
    lead = eig.vectors[np.argmax(np.abs(eig.vectors), axis=0), np.arange(eig.size)]
    assert np.all(lead > 0)
    spectral.cache_clear()
    again = spectral.eigen_system(MATERN, GRID)
    assert again is not eig
    assert np.array_equal(again.vectors, eig.vectors)


def test_cached_and_read_only() -> None:
    a = spectral.eigen_system(MATERN, GRID)
    assert spectral.eigen_system(MATERN, list(GRID)) is a
    with pytest.raises(ValueError, match="read-only"):
        a.values[0] = 1.0


def test_cap_keeps_a_prefix() -> None:
    full = spectral.eigen_system(MATERN, GRID)
    capped = spectral.eigen_system(MATERN, GRID, max_components=7)
    assert capped.size == 7 and capped.dropped == 93
    np.testing.assert_array_equal(capped.values, full.values[:7])
    np.testing.assert_array_equal(capped.vectors, full.vectors[:, :7])


def test_projection_is_idempotent_and_lies_in_the_span() -> None:
    eig = spectral.eigen_system(kernels.gaussian(0.1), GRID)
    f = np.random.default_rng(3).standard_normal(100)
    p = eig.project(f)
    np.testing.assert_allclose(eig.project(p), p, atol=1e-12)
    residual = p - eig.vectors @ np.linalg.lstsq(eig.vectors, p, rcond=None)[0]
    assert np.max(np.abs(residual)) < 1e-12


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=5, max_size=40))
def test_non_uniform_grids_are_orthonormal(gaps: list[float]) -> None:
    grid = np.concatenate([[0.0], np.cumsum(gaps)])
    w = domain.quadrature_weights(grid)
    eig = spectral.eigen_system(MATERN, domain.unit_positions(grid), w)
    assert w.sum() == pytest.approx(1.0, rel=1e-14)
    assert np.max(np.abs(_gram(eig) - np.eye(eig.size))) < 1e-9


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        spectral.eigen_system(MATERN, [0.5])
    with pytest.raises(ValueError, match="positive"):
        spectral.eigen_system(MATERN, [0.0, 1.0], [0.5, 0.0])
    with pytest.raises(ValueError, match="max_components"):
        spectral.eigen_system(MATERN, GRID, max_components=0)


def test_warm_lookup_is_memoised_on_the_arrays_bytes() -> None:
    """A warm lookup (issue 16 item 3) hits the byte-keyed memo and never rebuilds the
    per-point float tuples of the slow key: ``_cached`` sees no call at all."""
    spectral.cache_clear()
    grid = np.linspace(0.0, 1.0, 300)
    weights = np.full(300, 1.0 / 300)
    first = spectral.eigen_system(MATERN, grid, weights)
    slow = spectral._cached.cache_info()
    again = spectral.eigen_system(MATERN, grid.copy(), list(weights))
    assert again is first
    assert spectral._cached.cache_info() == slow
    assert spectral._memo.cache_info().hits >= 1
