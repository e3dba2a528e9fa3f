"""Two variables released with a product design: the pair table and the joint W (§3.6).

P(A=a, B=b) = μ^A_a μ^B_b 1_aᵀW1_b, so the data enter only through the
table of distinct (a, b) pairs. Cells are kept as a list (index into the
distinct a's, index into the distinct b's, count): the observed cells for one
table, or all m_a·m_b cells for a batch of tables (permutations,
simulations), where counts is B × K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import bitmask, estimation, squarem
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import Design

JOINT_TOL = 1e-10
JOINT_MAX_ITER = 20_000
#: MoM joint estimates are clipped to at least this before the LRT takes logs
MOM_FLOOR = 1e-6


@dataclass(frozen=True)
class Paired:
    """Paired subsets of the same records: distinct a's and b's and the observed cells."""

    p: int
    q: int
    masks_a: Masks
    masks_b: Masks
    rows_a: NDArray[np.float64]
    rows_b: NDArray[np.float64]
    margin_a: NDArray[np.int64]
    margin_b: NDArray[np.int64]
    cell_a: NDArray[np.intp]
    cell_b: NDArray[np.intp]
    cell_n: NDArray[np.int64]

    @property
    def n(self) -> int:
        return int(self.cell_n.sum())

    def observed_a(self) -> estimation.Observed:
        return estimation.Observed(self.p, self.masks_a, self.margin_a)

    def observed_b(self) -> estimation.Observed:
        return estimation.Observed(self.q, self.masks_b, self.margin_b)

    def all_cells(self) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """Every (a, b) combination of the distinct subsets, row-major."""
        ia, ib = np.meshgrid(np.arange(len(self.masks_a)), np.arange(len(self.masks_b)),
                             indexing="ij")
        return ia.ravel(), ib.ravel()

    def dense(self) -> NDArray[np.int64]:
        """The m_a × m_b table."""
        table = np.zeros((len(self.masks_a), len(self.masks_b)), dtype=np.int64)
        table[self.cell_a, self.cell_b] = self.cell_n
        return table


def pair(a: ArrayLike, b: ArrayLike, p: int, q: int) -> Paired:
    """Aggregate two releases of the same rows (row i of ``a`` and of ``b`` is one record)."""
    masks_a, masks_b = bitmask.as_masks(a), bitmask.as_masks(b)
    if masks_a.shape != masks_b.shape or masks_a.ndim != 1:
        raise ValueError("the two releases must hold the same records (equal lengths)")
    if masks_a.size and (int(masks_a.max()) > int(bitmask.full(p))
                         or int(masks_b.max()) > int(bitmask.full(q))):
        raise ValueError("a subset holds a category outside the domain")
    da, ia = np.unique(masks_a, return_inverse=True)
    db, ib = np.unique(masks_b, return_inverse=True)
    cells, counts = np.unique(ia.astype(np.int64) * len(db) + ib, return_counts=True)
    return Paired(
        p, q, da, db, bitmask.indicators(da, p), bitmask.indicators(db, q),
        np.bincount(ia, minlength=len(da)).astype(np.int64),
        np.bincount(ib, minlength=len(db)).astype(np.int64),
        (cells // len(db)).astype(np.intp), (cells % len(db)).astype(np.intp),
        counts.astype(np.int64),
    )


def joint_likelihoods(
    rows_a: NDArray[np.float64], rows_b: NDArray[np.float64], w: NDArray[np.float64]
) -> NDArray[np.float64]:
    """1_{a_k}ᵀ W_b 1_{b_k} for cell rows (K × p, K × q) and W of shape B × p × q → B × K."""
    result: NDArray[np.float64] = (np.matmul(rows_a[None], w) * rows_b[None]).sum(axis=-1)
    return result


def em_joint(
    rows_a: NDArray[np.float64],
    rows_b: NDArray[np.float64],
    counts: NDArray[Any],
    *,
    tol: float = JOINT_TOL,
    max_iter: int = JOINT_MAX_ITER,
    accelerate: bool = True,
) -> tuple[NDArray[np.float64], int, NDArray[np.bool_]]:
    """Joint MLE of W by EM for B count vectors over K cells (rows_* are the cells' rows).

    W_xy ← W_xy Σ_k c_k 1{x∈a_k}1{y∈b_k}/(1_{a_k}ᵀW1_{b_k}) / n, accelerated by
    safeguarded SQUAREM unless ``accelerate=False``. Returns (W as B × p × q,
    iterations, converged per table).
    """
    c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    p, q = rows_a.shape[1], rows_b.shape[1]
    n = c.sum(axis=1)
    n = np.where(n > 0, n, 1.0)

    def step(flat: NDArray[np.float64], index: NDArray[np.intp]) -> NDArray[np.float64]:
        w = flat.reshape(-1, p, q)
        lik = joint_likelihoods(rows_a, rows_b, w)
        cc = c[index]
        ratio = np.divide(cc, lik, out=np.zeros_like(lik), where=cc > 0)
        grad = np.matmul(rows_a.T[None], ratio[:, :, None] * rows_b[None])
        result: NDArray[np.float64] = (w * grad / n[index][:, None, None]).reshape(len(w), -1)
        return result

    def loglik(flat: NDArray[np.float64], index: NDArray[np.intp]) -> NDArray[np.float64]:
        lik = joint_likelihoods(rows_a, rows_b, flat.reshape(-1, p, q))
        cc = c[index]
        with np.errstate(divide="ignore"):
            terms = np.where(cc > 0, cc * np.log(np.where(cc > 0, lik, 1.0)), 0.0)
        result: NDArray[np.float64] = terms.sum(axis=1)
        return result

    start = np.full((len(c), p * q), 1.0 / (p * q))
    flat, iterations, converged = squarem.iterate(step, loglik, start, tol=tol,
                                                  max_iter=max_iter, accelerate=accelerate)
    return flat.reshape(-1, p, q), iterations, converged


def mom_joint(
    rows_a: NDArray[np.float64],
    rows_b: NDArray[np.float64],
    counts: NDArray[Any],
    design_a: Design,
    design_b: Design,
) -> NDArray[np.float64]:
    """Raw MoM Ŵ = Q_A⁻¹ Γ̂ Q_B⁻¹ with Γ̂ = n⁻¹Σ 1_a1_bᵀ, for B count vectors over K cells."""
    c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    n = c.sum(axis=1)[:, None, None]
    gamma = np.matmul(rows_a.T[None], c[:, :, None] * rows_b[None]) / np.where(n > 0, n, 1.0)
    result: NDArray[np.float64] = (
        np.linalg.inv(design_a.Q)[None] @ gamma @ np.linalg.inv(design_b.Q)[None]
    )
    return result


def clip_joint(w: NDArray[np.float64], floor: float = MOM_FLOOR) -> NDArray[np.float64]:
    """Clip a (batch of) joint estimate(s) to ≥ floor and renormalize: a usable LRT plug-in."""
    clipped = np.maximum(w, floor)
    result: NDArray[np.float64] = clipped / clipped.sum(axis=(-2, -1), keepdims=True)
    return result


def estimate_joint(
    a: ArrayLike,
    b: ArrayLike,
    design_a: Design,
    design_b: Design,
    method: str = "em",
    *,
    tol: float = JOINT_TOL,
    max_iter: int = JOINT_MAX_ITER,
) -> NDArray[np.float64]:
    """Ŵ (p × q) from paired releases by EM (MLE) or moments (clipped onto the simplex)."""
    paired = pair(a, b, design_a.p, design_b.p)
    rows_a, rows_b = paired.rows_a[paired.cell_a], paired.rows_b[paired.cell_b]
    if method == "em":
        return em_joint(rows_a, rows_b, paired.cell_n, tol=tol, max_iter=max_iter)[0][0]
    if method == "mom":
        raw = mom_joint(rows_a, rows_b, paired.cell_n, design_a, design_b)
        return clip_joint(raw, 0.0)[0]
    raise ValueError("method must be 'em' or 'mom'")
