"""Privacy-safe selection (PSS) of the tuning parameters (spec §3.2, Sec. 4.4).

Tuning may depend only on public quantities: n, ε and the noise kernel,
never on the data (cross-validation would leak). These are the rate-optimal
orders of Corollary 15 / Remark 17 with constant 1.
"""

from __future__ import annotations

import math
from fractions import Fraction

from mechanisms.iclp.kernels import Kernel

#: η for kernels with super-polynomial decay (Gaussian, β = ∞): any η > 1 oversmooths
ETA_INFINITE_BETA = 1.5
#: KDE bandwidth constant c in h = c·n^(−1/5) on the unit domain (h = 0.05 at n = 1000)
BANDWIDTH_CONSTANT = 0.2
#: the KDE bandwidth is never below this many grid spacings
MIN_BANDWIDTH_SPACINGS = 2.0


def default_eta(kernel: Kernel) -> float:
    """η = 1 + 2/β: strictly above the oversmoothing threshold 1 + 1/β."""
    beta = kernel.beta
    return ETA_INFINITE_BETA if math.isinf(beta) else 1.0 + 2.0 / beta


def balanced_psi(n: int, epsilon: float | Fraction, eta: float, beta: float) -> float:
    """ψ = (nε²)^(−ηβ/(β+1)): privacy error of the same order as estimation, O(1/n)."""
    power = eta if math.isinf(beta) else eta * beta / (beta + 1.0)
    return float((n * float(epsilon) ** 2) ** (-power))


def free_psi(n: int) -> float:
    """ψ = 1/n: with η > 1 + 1/β the privacy error is o(1/n) ("free privacy")."""
    return 1.0 / n


def frl_components(n: int, epsilon: Fraction, available: int) -> int:
    """M = min(J, max(1, ⌊√n·ε⌋)), computed exactly (⌊√x⌋ = isqrt(⌊x⌋))."""
    root = math.isqrt(math.floor(n * Fraction(epsilon) ** 2))
    return min(available, max(1, root))


def kde_bandwidth(n: int, grid_size: int) -> float:
    """h = 0.2·n^(−1/5) on [0, 1] (Remark 17's rate), at least two grid spacings."""
    return max(BANDWIDTH_CONSTANT * n ** (-0.2), MIN_BANDWIDTH_SPACINGS / (grid_size - 1))
