"""Certificates: how many distinct outputs one record can cause, from public inputs.

Definition 1: ``M∘f`` is ε-noiselessly private iff for every record i and
every value x_{-i} of the others, |{M(f(x_i, x_{-i})) : x_i}| <= 2^ε. For a
quantized query the set {f(x_i, x_{-i}) : x_i} (the *slice image*) lies in a
closed interval of length S, the query's global replace-one sensitivity, and
has at most D points when one record can contribute only D different values
(a count: D = 2; an integer column with bounds [lo, hi]: D = hi − lo + 1). So
the number of outputs is at most the number of bins a length-S interval can
meet, and at most D. Everything here is exact (fractions); the service charges
log2 of these counts, never of what one dataset happens to show.

Choosing the number of levels: the paper's Theorem 8, q <= 2^ε·R/S, is off
by one (an interval of length S meets up to ⌈qS/R⌉ + 1 bins, not qS/R);
``paper_levels`` keeps it only to reproduce and refute it. The service
evaluates every query exactly (fractions) and indexes it exactly, so it uses
the exact corrected rule ``exact_levels`` with the exact certificate
``max_outputs_uniform``. ``safe_levels`` (spec §6.3), whose 1e-9 margin on S
costs one level, is kept for callers that evaluate f in floating point.
"""

from __future__ import annotations

import bisect
import itertools
import math
from fractions import Fraction

import numpy as np

from mechanisms.noiseless.bits import Bits, as_bits, at_most_power
from mechanisms.noiseless.quantizer import EdgeQuantizer, UniformQuantizer

#: relative margin on the sensitivity in the spec's floating-point-safe rule (§6.3)
TAU = Fraction(1, 10**9)


def _positive(x: Fraction | int | float, name: str) -> Fraction:
    value = Fraction(x)
    if value < 0:
        raise ValueError(f"{name} must be >= 0")
    return value


def max_outputs_uniform(levels: int, sensitivity: Fraction | int, span: Fraction | int) -> int:
    """Exact worst case: bins of width R/q met by a closed interval of length S.

    Proof: with t = (a − ymin)·q/R and s = qS/R, the interval [a, a + S]
    meets bins ⌊t⌋ … ⌊t + s⌋, i.e. ⌊t + s⌋ − ⌊t⌋ + 1 <= ⌈s⌉ + 1 of them
    (⌊t + s⌋ − ⌊t⌋ is s for integer s and ⌊s⌋ or ⌈s⌉ otherwise, and the
    maximum is reached by sliding t), and never more than q. S = 0 means the
    record cannot move the query: one output.
    """
    s_, r_ = _positive(sensitivity, "sensitivity"), _positive(span, "span")
    if r_ == 0:
        raise ValueError("span must be > 0")
    if s_ == 0:
        return 1
    return min(levels, math.ceil(levels * s_ / r_) + 1)


def certified_count_uniform(levels: int, sensitivity: Fraction | int, span: Fraction | int) -> int:
    """The spec's §6.3 certificate min(q, ⌊q·S(1 + τ)/R⌋ + 2) (never below the exact count).

    ⌊x⌋ + 2 >= ⌈x⌉ + 1 and S(1 + τ) >= S, so this bounds
    ``max_outputs_uniform``; it is 1 higher only when qS/R is an integer
    (or within τ below one), which ``safe_levels`` never lets matter.
    """
    s_, r_ = _positive(sensitivity, "sensitivity"), _positive(span, "span")
    if r_ == 0:
        raise ValueError("span must be > 0")
    if s_ == 0:
        return 1
    s_eff = s_ * (1 + TAU)
    if s_eff >= r_:
        return levels
    return min(levels, math.floor(levels * s_eff / r_) + 2)


def exact_levels(count: int, sensitivity: Fraction | int, span: Fraction | int) -> int:
    """Corrected Theorem 8, exact: the most levels whose worst case is <= count.

    q is admissible iff q <= K or ⌈qS/R⌉ <= K − 1, i.e. q <= (K − 1)R/S.
    """
    s_, r_ = _positive(sensitivity, "sensitivity"), _positive(span, "span")
    if count <= 1:
        return 1
    if s_ == 0:
        raise ValueError("a query no record can move needs no quantizer")
    return max(count, math.floor((count - 1) * r_ / s_))


def safe_levels(count: int, sensitivity: Fraction | int, span: Fraction | int) -> int:
    """Spec §6.3: q = max(K, ⌈(K − 1)R/S(1 + τ)⌉ − 1); q = K if S(1 + τ) >= R; 1 if K = 1.

    Fixed point: ``certified_count_uniform(safe_levels(K, S, R), S, R) == K``
    for every K >= 1 (q·S_eff/R lies in [K − 1 − S_eff/R, K − 1) with
    S_eff < R, so its floor is K − 2), which is what lets a charge of
    log2 K reproduce the same quantizer when ``run`` re-plans from it.
    """
    s_, r_ = _positive(sensitivity, "sensitivity"), _positive(span, "span")
    if count <= 1:
        return 1
    if s_ == 0:
        raise ValueError("a query no record can move needs no quantizer")
    s_eff = s_ * (1 + TAU)
    if s_eff >= r_:
        return count
    return max(count, math.ceil((count - 1) * r_ / s_eff) - 1)


def paper_levels(bits: Bits, sensitivity: Fraction | int, span: Fraction | int) -> int:
    """The paper's Theorem 8 as printed, q = ⌊2^ε·R/S⌋. UNSAFE: kept to reproduce Fig. 3.

    Its true level is log2(min(q, ⌈qS/R⌉ + 1)), up to log2(⌈2^ε⌉ + 1).
    """
    b = as_bits(bits)
    s_, r_ = _positive(sensitivity, "sensitivity"), _positive(span, "span")
    ratio = r_ / s_
    estimate = float(ratio) * 2.0 ** float(b)
    if not estimate < 2.0**50:
        raise ValueError("paper_levels is a reproduction helper for q < 2**50")
    q = max(1, math.floor(estimate) + 2)
    while q > 1 and not at_most_power(Fraction(q) / ratio, b):
        q -= 1
    return q


def certified_count_edges(
    edges: list[Fraction] | tuple[Fraction, ...], sensitivity: Fraction
) -> int:
    """Exact worst case for arbitrary edges e_0 < … < e_q (spec §6.6).

    The bins met by [a, a + S] run from bin(a) to bin(a + S). For a in bin k
    the last bin is largest as a approaches e_{k+1} from below, where a + S
    approaches z = e_{k+1} + S from below: that point lies in the bin whose
    index is the number of interior edges < z (or the last bin if z > e_q).
    """
    e = [Fraction(x) for x in edges]
    if len(e) < 2 or any(b <= a for a, b in itertools.pairwise(e)):
        raise ValueError("edges must be strictly increasing, at least two")
    s_ = _positive(sensitivity, "sensitivity")
    q = len(e) - 1
    if s_ == 0:
        return 1
    if s_ >= e[-1] - e[0]:
        return q
    interior = e[1:-1]
    best = 1
    for k in range(q):
        z = e[k + 1] + s_
        last = q - 1 if z > e[-1] else bisect.bisect_left(interior, z)
        best = max(best, last - k + 1)
    return min(best, q)


def certified_count(
    quantizer: UniformQuantizer | EdgeQuantizer,
    sensitivity: Fraction | int,
    domain_size: int | None = None,
) -> int:
    """Outputs one record can cause through ``quantizer`` applied to a query.

    Assumptions (public, checked by the caller): the query's slice image lies
    in an interval of length ``sensitivity`` and has at most ``domain_size``
    points (None: unbounded). Uniform quantizers use the §6.3 certificate,
    edge quantizers the exact §6.6 count over their nonempty bins.
    """
    if isinstance(quantizer, UniformQuantizer):
        count = certified_count_uniform(
            quantizer.levels, sensitivity, quantizer.upper - quantizer.lower
        )
    else:
        count = _count_float_edges(quantizer, Fraction(sensitivity))
    return count if domain_size is None else min(count, domain_size)


def _count_float_edges(quantizer: EdgeQuantizer, sensitivity: Fraction) -> int:
    """``certified_count_edges`` over the nonempty bins of a float quantizer.

    Empty bins [e, e) are dropped (no value reaches them). A degenerate
    closed last bin [e_q, e_q] holds the single point e_q, which the
    strictly increasing model cannot express: it is counted as one more
    output on top of the other bins (an upper bound).
    """
    nonempty = quantizer.nonempty_bins()
    total = int(np.count_nonzero(nonempty))
    span = Fraction(quantizer.upper) - Fraction(quantizer.lower)
    if sensitivity >= span:
        return total
    degenerate = bool(quantizer.edges[-2] == quantizer.edges[-1])
    keep = nonempty.copy()
    keep[-1] = not degenerate
    edges = [Fraction(float(x)) for x in quantizer.edges[:-1][keep]]
    edges.append(Fraction(quantizer.upper))
    if len(edges) < 2:
        return total
    return min(total, certified_count_edges(edges, sensitivity) + int(degenerate))
