"""Permute-and-flip with exact coins and a fixed, public amount of work.

Permute-and-flip (McKenna & Sheldon 2020) visits m public candidates in a uniformly
random order and releases the first whose coin Bernoulli(exp(−γ_c)) comes up heads,
γ_c = ε(u* − u(c))/(2Δ) (the best candidate has γ = 0: its coin always does). It is
ε-DP, and its expected utility is never below the exponential mechanism's. A
candidate is released only if its own coin is heads, so P(c) <= exp(−γ_c), and a
union bound gives P(u* − u(output) >= (2Δ/ε)(ln m + t)) <= e^−t; ``worst_case_gap`` is
the exact worst case, about (2Δ/ε)·ln 2 less.

Why fixed work: stopping at the first head (or rejection sampling the exponential
mechanism) makes the number of coins — and the run time an analyst sees in a
release's timestamps and while polling — a function of the utilities, i.e. of the
data (issue #27). Here every draw evaluates **all m coins**, in permutation order,
and then takes the first head: per draw, one permutation of m (Fisher–Yates with
public bounds) and m coins, one 63-bit word each. The output's law is exactly
permute-and-flip's (the coins after the first head are simply not used).

Exact coins: V's cell [v, v + 1)·2^-63 lies below exp(−γ) when v + 1 <= E and above
it when v >= E, E = exp(−γ)·2^63. ``Coins`` holds integers lo <= E <= hi,
lo = ⌊Ê(1 − r)⌋, hi = max(1, ⌈Ê(1 + r)⌉), Ê = exp(−ĝ)·2^63 in long double (x87
extended, u = 2^-64 per rounding; the margin r = 2^13·2u = 2^-50): ĝ = k·scale, the
scale as its double plus the double of its remainder, is within 3 ulps of γ, and exp
adds at most 4 ulps, so for γ <= 60 Ê is within 184 ulps of E relative, 44 times
inside r; a larger ĝ
means E < 1, so lo = 0 and hi = 1. v < lo accepts and v >= hi rejects with one
integer comparison; lo <= v < hi goes to ``sampling.exact_accept`` (``decimal``,
reading more of V's bits; for γ > 0 rational, E is transcendental, never a cell
edge). γ = 0 always accepts.

The exact tier is the only work left that the data could move: a coin needs it with
probability (hi − lo)/2^63 <= 2r + 2^-62 < 2^-48, whatever the data, and it costs about
60 µs. So every call runs it at least ``sampling.exact_slots(N, 2^-48)`` times (N coins;
dummies on their own generator after the real ones): the work changes only when a call
needs more exact coins than that, with probability p below about (N·2^-48)², and the pair
(output, run time) is (ε, (1 + e^ε)·p)-DP: P_D(E) <= P_D(output ∈ E_0) + p <= e^ε P_D'(E)
+ (1 + e^ε) p, E_0 the outputs E holds with the padded work. ``Flips.refined`` counts the
real exact coins for the audit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray
from scipy import optimize

from mechanisms import sampling

#: coins evaluated per block: draws are processed in blocks of ⌊2^20 / m⌋ (memory bounded)
BLOCK_COINS = 1 << 20
_LD = np.longdouble
#: relative margin of the integer thresholds: 2^13 ulps of the long double (x87: 2^-50),
#: 44 times the error bound of Ê (γ within 3 ulps, times γ <= 60, plus exp's 4 ulps)
_REL = _LD(2.0**13) * _LD(np.finfo(_LD).eps)
#: above this float γ, E = exp(−γ)·2^63 < 1 (the thresholds are 0 and 1)
_FAR = 60.0
_TOP = np.uint64(1 << 63)


def _thresholds(g: NDArray[np.longdouble], zero: NDArray[np.bool_]
                ) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """lo <= exp(−γ)·2^63 <= hi from ĝ (see the module doc); where γ is exactly 0 (``zero``)
    lo = hi = 2^63."""
    far = ~(g <= _FAR)
    e = np.exp(-np.where(far, _LD(0.0), g)) * _LD(2.0**63)
    lo = np.floor(e * (_LD(1.0) - _REL))
    hi = np.maximum(np.ceil(e * (_LD(1.0) + _REL)), _LD(1.0))
    lo[far], hi[far] = 0.0, 1.0
    lo_u, hi_u = lo.astype(np.uint64), hi.astype(np.uint64)
    lo_u[zero], hi_u[zero] = _TOP, _TOP  # every v < 2^63: always heads
    return lo_u, hi_u


def _ld(x: Fraction) -> np.longdouble:
    """x in long double within one ulp: its double plus the double of the remainder."""
    head = float(x)
    return _LD(head) + _LD(float(x - Fraction(head)))


@dataclass(frozen=True)
class Coins:
    """Exact Bernoulli(exp(−γ_c)) coins for m candidates, γ_c = scale·k_c >= 0 rational."""

    scale: Fraction
    numerators: tuple[int, ...]
    lo: NDArray[np.uint64]
    hi: NDArray[np.uint64]

    @staticmethod
    def of(gammas: Sequence[Fraction]) -> Coins:
        """Coins for any rational γ_c >= 0 (kept over their common denominator; each ĝ is
        γ_c's own long double, within one ulp)."""
        gs = [Fraction(x) for x in gammas]
        if any(x < 0 for x in gs):
            raise ValueError("a coin's gamma must be >= 0")
        d = math.lcm(*(x.denominator for x in gs))
        g = np.array([_ld(x) for x in gs], dtype=_LD)
        zero = np.array([x == 0 for x in gs], dtype=bool)
        return Coins(Fraction(1, d), tuple(int(x * d) for x in gs), *_thresholds(g, zero))

    @staticmethod
    def scaled(scale: Fraction, numerators: Sequence[int] | NDArray[np.int64], bound: int
               ) -> Coins:
        """Coins with γ_c = scale·k_c (integers 0 <= k_c <= ``bound``, scale > 0), vectorised:
        ``exm``'s and the quantiles' γ are an exact fraction times integer gaps. ``bound``
        is public (from n and the params), so the path taken does not depend on the data."""
        scale = Fraction(scale)
        ks = [int(k) for k in numerators]
        if scale <= 0 or any(not 0 <= k <= bound for k in ks):
            raise ValueError("coins need scale > 0 and numerators in [0, bound]")
        if bound >= 2**63:  # beyond int64: one exact conversion per coin
            return Coins.of([scale * k for k in ks])
        k = np.array(ks, dtype=np.int64)
        g = k.astype(_LD) * _ld(scale)  # within 3 ulps of γ
        return Coins(scale, tuple(ks), *_thresholds(g, k == 0))

    def gamma(self, c: int) -> Fraction:
        """Candidate c's γ, exactly (for the exact tier)."""
        return self.scale * self.numerators[c]

    @property
    def size(self) -> int:
        return len(self.numerators)

    def flip(self, rng: np.random.Generator, which: NDArray[np.int64]
             ) -> tuple[NDArray[np.bool_], NDArray[np.intp]]:
        """One exact coin for each entry of ``which`` (candidate indices, any shape):
        heads, and the flat positions of the coins that needed the exact tier."""
        v = sampling.raw_words(rng, which.size).reshape(which.shape) >> np.uint64(1)
        lo, hi = self.lo[which], self.hi[which]
        heads = v < lo
        near = np.flatnonzero((v >= lo) & (v < hi))
        flat_heads, flat_v, flat_which = heads.reshape(-1), v.reshape(-1), which.reshape(-1)
        for i in near:
            flat_heads[i] = sampling.exact_accept(rng, int(flat_v[i]),
                                                   self.gamma(int(flat_which[i])))
        sampling.pad_exact_tier(near.size, sampling.exact_slots(which.size, 2.0**-48))
        return heads, near


@dataclass(frozen=True)
class Flips:
    """``draws`` permute-and-flip outputs and the work that produced them."""

    chosen: NDArray[np.int64]
    #: coins evaluated: draws · m, a function of public inputs
    coins: int
    #: per draw, coins that needed the exact tier (probability <= 2^-48 each, whatever
    #: the data): the only work that is not a function of public inputs
    refined: NDArray[np.int64]


def permute_and_flip(rng: np.random.Generator, coins: Coins, draws: int) -> Flips:
    """``draws`` i.i.d. permute-and-flip choices (candidate indices), every coin evaluated."""
    m = coins.size
    if m < 1 or min(coins.numerators) != 0:
        raise ValueError("permute-and-flip needs a candidate with gamma = 0")
    block = max(1, BLOCK_COINS // m)
    out = np.empty(draws, dtype=np.int64)
    refined = np.zeros(draws, dtype=np.int64)
    candidates = np.arange(m, dtype=np.int64)
    for start in range(0, draws, block):
        k = min(block, draws - start)
        order = rng.permuted(np.broadcast_to(candidates, (k, m)), axis=1)
        heads, near = coins.flip(rng, order)
        refined[start:start + k] = np.bincount(near // m, minlength=k)
        out[start:start + k] = order[np.arange(k), np.argmax(heads, axis=1)]
    return Flips(out, draws * m, refined)


def probabilities(gammas: Sequence[float]) -> NDArray[np.float64]:
    """Permute-and-flip's exact output law for coin probabilities p_c = exp(−γ_c).

    c is released iff its coin is heads and every candidate ahead of it is tails. Give
    each candidate an i.i.d. uniform time (the order); given c's time t, each other
    candidate is ahead of it independently with probability t, so
    P(c) = p_c ∫_0^1 Π_{d≠c} (1 − p_d t) dt. Exact up to rounding; for tests (m small).
    """
    p = np.exp(-np.asarray(gammas, dtype=np.float64))
    # ∫_0^1 Π_{d≠c}(1 − p_d t) dt by Gauss–Legendre, exact for a degree-(m − 1) polynomial
    nodes, weights = np.polynomial.legendre.leggauss(max(1, math.ceil(len(p) / 2) + 1))
    t = 0.5 * (nodes + 1.0)
    w = 0.5 * weights
    factors = 1.0 - p[:, None] * t[None, :]  # (m, nodes)
    out = np.empty(p.size)
    for c in range(p.size):
        others = np.prod(np.delete(factors, c, axis=0), axis=0)
        out[c] = p[c] * float(np.sum(w * others))
    return out


def worst_bad_probability(p: float, m: int) -> float:
    """Permute-and-flip's largest chance of releasing a candidate whose coin is at most
    ``p`` among ``m``: one best candidate and m − 1 at p (raising a bad coin, or lowering
    a good one, only helps the bad), the best's position B uniform among the m and each
    candidate ahead of it tails with probability 1 − p, 1 − E[(1 − p)^B] =
    1 − (1 − (1 − p)^m) / (m p)."""
    if m <= 1 or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0 - 1.0 / m
    return float(1.0 + math.expm1(m * math.log1p(-p)) / (m * p))


def worst_case_gap(epsilon: Fraction | float, m: int, level: float) -> float:
    """The smallest T with P(u* − u(output) > T) <= 1 − level for every utility vector,
    coins exp(−ε(u* − u)/2) over m candidates (sensitivity 1), rounded up: about
    (2/ε)·ln 2 below the union bound's (2/ε)(ln m + ln(1/(1 − level))), and attained."""
    if m <= 1:
        return 0.0
    alpha = 1.0 - level
    # the bad probability grows with p from 0 to 1 − 1/m (p = 1): below that, a root
    if alpha >= 1.0 - 1.0 / m:
        return 0.0
    # at p = α/(e·m) it is <= (m − 1)p/2 < α, and m·p is not small enough to cancel
    log_p = optimize.brentq(lambda lp: worst_bad_probability(math.exp(lp), m) - alpha,
                            math.log(alpha / m) - 1.0, 0.0, xtol=1e-13, rtol=1e-13)
    # a slightly smaller p (larger T) only lowers the bad probability: step past the root
    return math.nextafter(-2.0 * (log_p - 1e-9) / float(epsilon), math.inf)
