"""The noise step of DIP, in its exact discrete form (spec §7.8).

The paper adds float Laplace noise e ~ Laplace(0, 1/ε) to u in [0, 1] and
returns G(u + e). Float Laplace samples leak the input through their low
bits (Mironov 2012), so the released randomness here is an integer:

1. quantize k = ⌊u·K⌋ + 1 ∈ {1..K} (K a power of two, so u·K is exact;
   the spec's ⌈u·K⌉ differs only on the grid, and either is uniform);
2. W = k + D with D two-sided geometric, P(D = d) ∝ exp(−|d|/s),
   s = (K − 1)/ε rounded up, drawn exactly by ``sampling.discrete_laplace``
   and added in int64 — neighbouring k differ by at most K − 1, so W is
   ε-DP exactly;
3. g = G_K(W − 1) + V·P(W) with V ~ Unif(0, 1) a fresh draw from the
   generator, independent of W and of the data: the randomized PIT of W
   under its own law when u is uniform, so g ~ Unif(0, 1) exactly and
   distribution invariance is kept. Everything after W is post-processing
   of W alone. (V used to be recycled from D's uniform; given D = 0 that V
   lay on a grid ~2^22 times coarser than otherwise, and the grid showed in
   the released float, so whether g was reproducible by a zero-noise draw
   told the neighbours apart: issue #14.)

For K → ∞ this is the paper's G(u + e); at the default K = 2^20 the
difference is below 1e-6 in every output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from mechanisms import sampling
from mechanisms.exact import float_up

FloatArray = NDArray[np.float64]

#: default quantization of u: 2**20 levels, far finer than the noise at any sane ε
DEFAULT_RESOLUTION = 2**20
MIN_RESOLUTION = 2**4
MAX_RESOLUTION = 2**30


@dataclass(frozen=True)
class NoiseStep:
    """One column's noise: resolution K and the integer noise scale s for budget ε."""

    resolution: int
    scale: float

    @classmethod
    def calibrate(
        cls, epsilon: Fraction | float, resolution: int = DEFAULT_RESOLUTION
    ) -> NoiseStep:
        """s = (K − 1)/ε rounded up to a double, so exp((K − 1)/s) <= e^ε holds exactly."""
        if resolution < MIN_RESOLUTION or resolution > MAX_RESOLUTION or (
            resolution & (resolution - 1)
        ):
            raise ValueError(
                f"resolution must be a power of two in [{MIN_RESOLUTION}, {MAX_RESOLUTION}]"
            )
        eps = Fraction(epsilon)
        if eps <= 0:
            raise ValueError("epsilon must be positive")
        scale = float_up(Fraction(resolution - 1) / eps)
        if not scale <= sampling.MAX_SCALE:
            raise ValueError("epsilon too small: the noise would exceed the sampler's range")
        return cls(resolution, scale)

    @property
    def epsilon(self) -> float:
        """The ε actually guaranteed, (K − 1)/s (at most the requested one)."""
        return (self.resolution - 1) / self.scale

    @property
    def b(self) -> float:
        """Equivalent Laplace scale on the u-axis, s/K (the paper's 1/ε)."""
        return self.scale / self.resolution

    def cell(self, u: FloatArray) -> FloatArray:
        """k − 1 = min(⌊u·K⌋, K − 1) as an exact float: the cell [(k − 1)/K, k/K) of u.

        Clamping keeps the sensitivity K − 1 whatever u is (``fmax`` sends
        NaN, never produced by DIP, to the first cell).
        """
        cell = np.multiply(u, float(self.resolution))
        np.floor(cell, out=cell)
        np.fmax(cell, 0.0, out=cell)
        np.minimum(cell, self.resolution - 1.0, out=cell)
        return cell

    def quantize(self, u: FloatArray) -> NDArray[np.int64]:
        """k = ⌊u·K⌋ + 1 clipped to {1..K}, uniform on {1..K} when u is uniform."""
        cell = self.cell(u)
        cell += 1.0
        return cell.astype(np.int64)

    def _release_minus_one(self, u: FloatArray, rng: np.random.Generator) -> FloatArray:
        """W − 1 = k − 1 + D, the only data-dependent randomness (ε-DP per entry).

        The sum is formed in int64, so it is exactly W − 1 whatever D is; the
        float conversion afterwards is post-processing of W (exact below 2**53).
        """
        w = self.cell(u).astype(np.int64)
        w += sampling.discrete_laplace(rng, self.scale, np.shape(u))
        return w.astype(np.float64)

    def uniformize(
        self, w: NDArray[np.int64], rng: np.random.Generator, exact_upper: bool = True
    ) -> tuple[FloatArray, FloatArray]:
        """Post-processing: (g, 1 − g) with g = G_K(W − 1) + V·P(W) ~ Unif(0, 1).

        ``exact_upper=False`` returns 1 − g as computed (for bounded references,
        whose quantiles never need the upper tail to more than absolute precision).
        """
        t = np.asarray(w, dtype=np.float64) - 1.0
        return self._uniformize(t, rng.random(t.shape), exact_upper)

    def _uniformize(
        self, t: FloatArray, v: FloatArray, exact_upper: bool
    ) -> tuple[FloatArray, FloatArray]:
        """``uniformize`` of t = W − 1 with V = v (both overwritten).

        W's law is symmetric about (K + 1)/2, so each W is reflected into the
        lower half, t = min(W − 1, K − W), where the tail probability
        s = G_K(t) + V·P(W) (P(W) = P(t + 1) by symmetry) is small and computed
        directly; g is s or 1 − s (using V for 1 − V in the upper half changes
        nothing in law). With α = e^{−a}, t⁺ = max(t, 0), A = α^|t|,
        E = α^(K − 2t⁺), B = A/(1 + α) and 1[t >= 0] (two exponentials):

            K·G_K(t) = t⁺ + α/(1 − α)·B(1 − E),
            K·P      = 1[t >= 0]·(1 − A) + B(1 − E),

        one expression for the interior (t >= 0) and the tails (t < 0, where
        G_K and P are α^|t| times their values at t = 0). 1 − E comes from
        ``expm1``, so nothing cancels: g errs by a few 1e−16 absolutely at any
        ε, and the tails keep a relative precision of about 1e−15.
        """
        k, a = self.resolution, 1.0 / self.scale
        alpha = math.exp(-a)
        c2 = alpha / -math.expm1(-a)  # α/(1 − α)
        other = (k - 1.0) - t  # K − W
        up = np.empty_like(t)
        np.greater(t, other, out=up)  # 1.0 in the upper half
        np.minimum(t, other, out=t)
        big_a = np.abs(t)
        big_a *= -a
        np.exp(big_a, out=big_a)  # A = α^|t|
        inside = t >= 0.0
        np.maximum(t, 0.0, out=t)  # t⁺
        bf = t * (2.0 * a)
        bf -= a * k
        np.expm1(bf, out=bf)  # E − 1, E = α^(K − 2t⁺), without cancellation
        bf *= big_a
        bf *= -1.0 / (1.0 + alpha)  # B(1 − E)
        small = bf * c2
        small += t  # K·G_K(t)
        np.subtract(1.0, big_a, out=big_a)
        big_a *= inside
        big_a += bf  # K·P(W)
        big_a *= v
        small += big_a
        small *= 1.0 / k
        # s <= 1/2, so g = |1[upper] − s| is s below the middle and 1 − s above; h likewise
        g = np.subtract(up, small)
        np.abs(g, out=g)
        if exact_upper:
            np.subtract(1.0, up, out=up)
            h = np.subtract(up, small, out=up)
            np.abs(h, out=h)
        else:
            h = np.subtract(1.0, g)
        return g, h

    def __call__(
        self, u: FloatArray, rng: np.random.Generator, exact_upper: bool = True
    ) -> tuple[FloatArray, FloatArray]:
        """Noise then uniformize: u in [0, 1] -> (g, 1 − g), g uniform when u is."""
        t = self._release_minus_one(u, rng)
        return self._uniformize(t, rng.random(t.shape), exact_upper)


def privatize_uniform(
    u: FloatArray,
    epsilon: Fraction | float,
    rng: np.random.Generator,
    resolution: int = DEFAULT_RESOLUTION,
) -> tuple[FloatArray, FloatArray]:
    """The ε-DP noise step on values u in [0, 1]: returns (g, 1 − g), g ~ Unif(0, 1) if u is."""
    return NoiseStep.calibrate(epsilon, resolution)(np.asarray(u, dtype=np.float64), rng)
