"""Batched EM iteration on the simplex, optionally accelerated by SQUAREM.

EM for subset data converges linearly, and sublinearly when the MLE sits on
the boundary or the design is nearly non-identifiable (tens of thousands of
steps). SQUAREM (Varadhan & Roland 2008, scheme S3) extrapolates along two
EM steps, x' = x0 − 2αr + α²v with r = x1 − x0, v = x2 − 2x1 + x0 and
α = −‖r‖/‖v‖ ≤ −1, then takes one more EM step from x'. Safeguards keep the
defining properties of EM: α is pulled back towards −1 (plain EM) until x'
is strictly inside the simplex, and the result is kept only if its
log-likelihood is at least that of x2 — so the log-likelihood never
decreases. Many replicates (simulations, permutations) iterate together; a
replicate stops moving once converged.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
#: maps (points of the active replicates, their indices) to the next EM points
Step = Callable[[Array, NDArray[np.intp]], Array]
#: maps (points, indices) to each replicate's log-likelihood
LogLik = Callable[[Array, NDArray[np.intp]], Array]
#: halvings of α towards −1 before falling back to the plain double step
BACKTRACKS = 20


def iterate(
    step: Step,
    loglik: LogLik,
    start: Array,
    *,
    tol: float,
    max_iter: int,
    accelerate: bool = True,
    trace: list[float] | None = None,
) -> tuple[Array, int, NDArray[np.bool_]]:
    """Iterate ``step`` from ``start`` (B × d, rows on the simplex) until no coordinate moves
    more than ``tol`` in one iteration. Returns (points, iterations, converged per row).

    ``trace`` (single replicate) collects the log-likelihood after each iteration.
    """
    x = np.array(start, dtype=np.float64)
    converged = np.zeros(len(x), dtype=bool)
    active = np.arange(len(x))
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 - reported after the loop
        x0 = x[active]
        new = _accelerated(step, loglik, x0, active) if accelerate else step(x0, active)
        done = np.max(np.abs(new - x0), axis=1) < tol
        x[active] = new
        if trace is not None:
            trace.append(float(loglik(new[:1], active[:1])[0]))
        converged[active[done]] = True
        active = active[~done]
        if active.size == 0:
            break
    return x, iterations, converged


def _accelerated(step: Step, loglik: LogLik, x0: Array, index: NDArray[np.intp]) -> Array:
    """One safeguarded SQUAREM iteration (three EM steps)."""
    x1 = step(x0, index)
    x2 = step(x1, index)
    r = x1 - x0
    v = x2 - x1 - r
    rr, vv = (r * r).sum(axis=1), (v * v).sum(axis=1)
    alpha = np.minimum(-np.sqrt(np.divide(rr, vv, out=np.ones_like(rr), where=vv > 0)), -1.0)
    x = x0 - 2.0 * alpha[:, None] * r + (alpha**2)[:, None] * v
    for _ in range(BACKTRACKS):
        outside = np.any(x <= 0, axis=1)
        if not outside.any():
            break
        alpha[outside] = (alpha[outside] - 1.0) / 2.0
        a = alpha[outside][:, None]
        x[outside] = x0[outside] - 2.0 * a * r[outside] + a**2 * v[outside]
    outside = np.any(x <= 0, axis=1)
    x[outside] = x2[outside]
    x /= x.sum(axis=1, keepdims=True)
    x3 = step(x, index)
    better = loglik(x3, index) >= loglik(x2, index)
    result: Array = np.where(better[:, None], x3, x2)
    return result
