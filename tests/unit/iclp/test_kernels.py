"""Kernels: closed forms against the Bessel formula, density normalisers, decay exponents."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special

from mechanisms.iclp import kernels
from mechanisms.iclp.kernels import Kernel

R = np.linspace(0.0, 1.0, 41)


def _bessel_matern(nu: float, rho: float, r: np.ndarray) -> np.ndarray:
    """The textbook formula evaluated directly (r > 0)."""
    z = math.sqrt(2.0 * nu) * r / rho
    return 2.0 ** (1.0 - nu) / special.gamma(nu) * z**nu * special.kv(nu, z)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5, 0.8, 3.7])
def test_matern_matches_the_bessel_formula(nu: float) -> None:
    k = kernels.matern(nu, 0.2)
    r = R[1:]
    np.testing.assert_allclose(k.correlation(r), _bessel_matern(nu, 0.2, r), rtol=1e-10)
    assert k.correlation(np.array([0.0]))[0] == 1.0


def test_exponential_is_matern_one_half_and_gaussian_is_rbf() -> None:
    np.testing.assert_allclose(
        kernels.exponential(0.3).correlation(R), kernels.matern(0.5, 0.3).correlation(R),
        rtol=1e-14,
    )
    np.testing.assert_allclose(
        kernels.gaussian(0.3).correlation(R), np.exp(-(R**2) / (2 * 0.09)), rtol=1e-14
    )


@pytest.mark.parametrize(
    "kernel",
    [kernels.gaussian(0.07), kernels.exponential(0.05), kernels.matern(1.5, 0.1),
     kernels.matern(2.5, 0.1), kernels.matern(0.8, 0.04)],
    ids=lambda k: f"{k.family}-{k.nu}",
)
def test_density_kernel_integrates_to_one(kernel: Kernel) -> None:
    d = kernel.density()
    total, err = integrate.quad(lambda x: float(d(0.0, x)), -np.inf, np.inf, limit=200)
    assert total == pytest.approx(1.0, abs=1e-8 + err)
    assert d(0.0, 0.0) == pytest.approx(1.0 / kernel.integral, rel=1e-15)


def test_decay_exponents() -> None:
    assert kernels.matern(1.5, 0.1).beta == 4.0
    assert kernels.matern(2.5, 0.1).beta == 6.0
    assert kernels.exponential(0.1).beta == 2.0
    assert math.isinf(kernels.gaussian(0.1).beta)


def test_gram_matrix_is_symmetric_with_unit_diagonal() -> None:
    k = kernels.matern(1.5, 0.1).matrix(np.linspace(0, 1, 30))
    assert np.array_equal(k, k.T)
    assert np.all(np.diag(k) == 1.0)


def test_kernels_are_hashable_cache_keys() -> None:
    assert kernels.matern(1.5, 0.1) == Kernel("matern", 0.1, 1.5)
    assert len({kernels.matern(1.5, 0.1), Kernel("matern", 0.1, 1.5)}) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("cubic", 0.1, None), "unknown kernel family"),
        (("gaussian", 0.0, None), "rho"),
        (("gaussian", math.inf, None), "rho"),
        (("matern", 0.1, None), "nu is required"),
        (("gaussian", 0.1, 1.5), "only for it"),
        (("matern", 0.1, -1.0), "nu must be"),
    ],
)
def test_bad_kernels_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Kernel(*args)
