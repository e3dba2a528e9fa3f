"""Eigen-decomposition of a kernel's integral operator on a weighted grid.

The discrete operator (Cf)(t_i) = Σ_k C(t_i, t_k) w_k f(t_k) is symmetrised as
A = W^½ K W^½ and diagonalised with ``scipy.linalg.eigh``; eigenfunctions on
the grid are v_j = u_j / √w, orthonormal under the quadrature weights
(spec §2.2). Numerically non-positive eigenvalues are dropped with a relative
floor, and every consumer (summary projection, sensitivity, noise) uses the
*same* truncated system, which is what keeps the release exactly ε-DP for the
discrete problem (spec §2.5). The system depends only on public inputs, so it
is cached per (kernel, grid, weights, floor, cap): in memory, and through
``mechanisms.precompute`` in the store the service shares between processes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import linalg

from mechanisms import precompute
from mechanisms.iclp import kernels
from mechanisms.iclp.kernels import Kernel

#: keep λ_j > REL_FLOOR · λ_1 (spec §2.2)
REL_FLOOR = 1e-10
#: eigen-systems kept in memory (each holds an M × J matrix)
CACHE_SIZE = 16
_UNIT = 2.0**-53


@dataclass(frozen=True, eq=False)
class EigenSystem:
    """The truncated eigen-system (λ_j, v_j), j = 1..J, of a kernel on a grid.

    ``vectors[k, j] = v_j(t_k)`` with Σ_k w_k v_j(t_k) v_l(t_k) = δ_jl up to
    ``defect``, a public bound on ‖UᵀU − I‖₂ of the computed orthonormal
    factor that the sensitivity bounds fold in (Bessel's inequality holds
    with a factor 1 + defect). Arrays are read-only: instances are shared
    through the cache.
    """

    kernel: Kernel
    positions: NDArray[np.float64]  # grid on [0, 1], shape (M,)
    weights: NDArray[np.float64]  # quadrature weights, shape (M,)
    values: NDArray[np.float64]  # λ_1 >= … >= λ_J > 0, shape (J,)
    vectors: NDArray[np.float64]  # v_j(t_k), shape (M, J)
    dropped: int  # M − J eigenpairs removed by the floor or the cap
    rel_floor: float
    defect: float

    @property
    def size(self) -> int:
        """J, the number of retained eigenpairs."""
        return int(self.values.size)

    @property
    def trace(self) -> float:
        """tr C on the retained system, Σ_j λ_j (E‖X‖² of a unit ICLP)."""
        return float(self.values.sum())

    def coefficients(self, f: ArrayLike) -> NDArray[np.float64]:
        """⟨f, v_j⟩ = Σ_k w_k f(t_k) v_j(t_k) for f of shape (..., M)."""
        return (np.asarray(f, dtype=np.float64) * self.weights) @ self.vectors

    def synthesize(self, coefficients: ArrayLike) -> NDArray[np.float64]:
        """Σ_j c_j v_j(t_k) for c of shape (..., J): grid values of the expansion."""
        return np.asarray(coefficients, dtype=np.float64) @ self.vectors.T

    def project(self, f: ArrayLike) -> NDArray[np.float64]:
        """P_J f: the part of f in the span of the retained eigenfunctions."""
        return self.synthesize(self.coefficients(f))


def eigen_system(
    kernel: Kernel,
    positions: Sequence[float] | ArrayLike,
    weights: Sequence[float] | ArrayLike | None = None,
    rel_floor: float = REL_FLOOR,
    max_components: int | None = None,
) -> EigenSystem:
    """The (cached) truncated eigen-system of ``kernel`` on ``positions`` in [0, 1].

    ``weights`` default to 1/M. ``max_components`` caps J after the floor.
    """
    pos = np.ascontiguousarray(positions, dtype=np.float64).ravel()
    if pos.size < 2:
        raise ValueError("a grid needs at least 2 points")
    w = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64).ravel()
    if w is not None and (w.size != pos.size or not np.all(w > 0)):
        raise ValueError("weights must be positive, one per grid point")
    if not 0 <= rel_floor < 1:
        raise ValueError("rel_floor must be in [0, 1)")
    if max_components is not None and max_components < 1:
        raise ValueError("max_components must be at least 1")
    # The raw bytes are the memo key: hashing them is one pass in C, where the
    # tuples of Python floats that ``_cached`` (and the shared store) key on cost
    # ~M object allocations per lookup on every warm release.
    return _memo(kernel, pos.tobytes(), None if w is None else w.tobytes(),
                 float(rel_floor), max_components)


@functools.lru_cache(maxsize=4 * CACHE_SIZE)
def _memo(kernel: Kernel, positions: bytes, weights: bytes | None, rel_floor: float,
          max_components: int | None) -> EigenSystem:
    """Byte-keyed front of ``_cached`` (same eigen-system objects; -0.0 and 0.0 differ here,
    which only costs a second lookup in ``_cached``)."""
    pos = tuple(np.frombuffer(positions, dtype=np.float64).tolist())
    w = None if weights is None else tuple(np.frombuffer(weights, dtype=np.float64).tolist())
    return _cached(kernel, pos, w, rel_floor, max_components)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _cached(
    kernel: Kernel,
    positions: tuple[float, ...],
    weights: tuple[float, ...] | None,
    rel_floor: float,
    max_components: int | None,
) -> EigenSystem:
    t = np.array(positions)
    m = t.size
    w = np.full(m, 1.0 / m) if weights is None else np.array(weights)
    inputs = [dataclasses.asdict(kernel), positions, weights, rel_floor, max_components]
    arrays = precompute.cached(
        precompute.key("iclp.eigen_system", _CODE, inputs),
        lambda: _decompose(kernel, t, w, rel_floor, max_components),
        precompute.encode_arrays, precompute.decode_arrays)
    lam, vectors = arrays["values"], arrays["vectors"]
    for arr in (t, w, lam, vectors):
        arr.setflags(write=False)
    return EigenSystem(
        kernel=kernel,
        positions=t,
        weights=w,
        values=lam,
        vectors=vectors,
        dropped=m - lam.size,
        rel_floor=rel_floor,
        defect=float(arrays["defect"]),
    )


#: the code whose output the shared cache holds (a change is a new key space)
_CODE = precompute.code_fingerprint([__file__, kernels.__file__])


def _decompose(kernel: Kernel, t: NDArray[np.float64], w: NDArray[np.float64],
               rel_floor: float, max_components: int | None) -> dict[str, NDArray[np.float64]]:
    """The heavy part (O(M³)): eigenpairs and the defect bound, as plain arrays so the
    precompute store can share them between processes."""
    m = t.size
    root = np.sqrt(w)
    a = root[:, None] * kernel.matrix(t) * root[None, :]
    a = 0.5 * (a + a.T)  # exactly symmetric before eigh
    lam, u = linalg.eigh(a)
    lam, u = lam[::-1], u[:, ::-1]  # descending
    if not lam[0] > 0:
        raise ValueError("kernel matrix has no positive eigenvalue")
    keep = int(np.count_nonzero(lam > rel_floor * lam[0]))
    # eigh sorts ascending, so the kept ones are a prefix after reversal
    keep = min(keep, max_components) if max_components is not None else keep
    lam, u = lam[:keep].copy(), u[:, :keep].copy()
    # Deterministic signs: the largest-|·| entry of each u_j is positive.
    lead = u[np.argmax(np.abs(u), axis=0), np.arange(keep)]
    u *= np.where(lead < 0, -1.0, 1.0)
    gram = u.T @ u
    gram[np.diag_indices(keep)] -= 1.0
    # Frobenius >= spectral norm; the second term bounds the rounding in forming UᵀU.
    defect = float(np.linalg.norm(gram)) + keep * (m + 2) * 2.0 * _UNIT
    vectors = u / root[:, None]
    return {"values": lam, "vectors": vectors, "defect": np.array(defect)}


def bessel_factor(eig: EigenSystem) -> float:
    """Public bound on Σ_j ⟨h, v_j⟩² / ‖h‖² for the computed system.

    (1 + defect) bounds ‖UᵀU‖₂; the extra 2^-40 covers the relative rounding
    of v = u/√w and of the weighted inner products (≈ M·2^-53 with M ≤ 10^4).
    """
    return (1.0 + eig.defect) * (1.0 + 2.0**-40)


def cache_clear() -> None:
    """Forget cached eigen-systems (tests and memory pressure)."""
    _memo.cache_clear()
    _cached.cache_clear()

