"""Integer-valued noise samplers, exact to the last integer, and their exact tails.

Mironov (2012) showed that adding floating-point Laplace noise leaks the input
through the low bits of the output. The baselines therefore add *integer*
noise to a statistic expressed in units of a power-of-two grid, so every
released value is a lattice point whose distribution depends on the data only
through the statistic (DESIGN §6). For that argument to hold the integer noise
must have exactly its law: a sampler whose tail is cut (numpy's
``standard_exponential`` never exceeds 44.4) makes a pure ε-DP release fail
with δ ≈ e^-(44.4 - ε)/2.

Exactness. Each draw reads raw 64-bit words from the caller's generator and
treats them as the leading bits of an infinite-precision uniform U: a word r
(63 bits after the sign bit is taken) says U lies in the cell
[r, r + 1)·2^-63, and every further word refines the cell by 64 bits. With
p = e^(-1/s), the discrete Laplace magnitude is

    |X| = #{k >= 1 : U < T_k},  T_k = 2 p^k / (1 + p) = P(|X| >= k),

so P(|X| >= k) = T_k exactly, and an independent sign bit gives
P(X = ±k) = p^k (1 - p)/(1 + p) and P(X = 0) = 1 - T_1 = (1 - p)/(1 + p).
In logarithms, |X| = ⌊y⌋ with y = s(c - ln U), c = ln(2/(1 + p)) =
log1p(tanh(1/(2s))) (y is never an integer: T_k is transcendental by
Lindemann's theorem, a cell edge is dyadic). The sampler outputs ⌊y⌋ only
once it has *proved* that ⌊y⌋ is the same for every U in the current cell;
otherwise it draws more bits or computes more precisely. As U's bits are fair
and independent, the output is a deterministic function of an exact uniform U
and so has exactly the target law: no truncation and no gaps (a run of zero
words makes U, and y, as extreme as the bits say).

The proofs, tier by tier (each tier passes what it cannot decide on):

1. float64, vectorized, for r >= 2^43 (U >= 2^-20, so y <= 15 s and the
   cell's y-width s·ln(1 + 1/r) is below s·2^-43): numpy's log is documented
   within 4 ulp (glibc's below 1; ``test_sampling`` measures it), so the
   computed y errs by at most 2^-52 (11 y + 2 s) (conversion of r, log,
   c, one subtraction and one product). The tier certifies only when y's
   distance to both neighbouring integers exceeds 2^-42 (y + s) + s 2^-43,
   64 times that bound plus the cell.
2. long double (x87 extended: 11 more bits, and r converts exactly), same
   argument with its epsilon, a 64-fold margin, and the exact cell width.
   Every call runs it on ``tier2_slots`` words, what tier 1 left padded with
   dummies: which draws tier 1 leaves (U < 2^-20: the largest |X|) would
   otherwise show in the run time (issue #27).
3. exact, per element: Python integers for the cell and ``decimal`` (whose
   exp and ln are correctly rounded) at a precision P that grows with every
   refinement; a bound S (6B + 9)·10^(1-P) on the absolute error of y over
   the ~10 roundings (B = bits read) is used with a 16-fold margin. Each
   undecided round draws 64 more bits and adds 20 digits, so the tier ends
   with probability one.

Large scales. Above ``SPLIT_SCALE`` (2^36) y reaches 2^45 and float64 can
no longer place it between integers, so a draw is split instead. With m the
power of two that brings s/m into [2^19, 2^20), the draw's word gives
Q' = ⌊z⌋, z = (s/m)(ln T_1 - ln U), decided by the same three tiers (z is
y - 1 over m, and may be negative: Q' = -1 iff U >= T_1). Since
z >= j iff U < T_(1+mj), P(Q' >= j) = T_(1+mj) = T_1 (p^m)^j: the event
|X| >= 1 has its exact probability T_1, and given it Q' is geometric with
ratio p^m. One more word W gives R = ⌊-s ln(1 - W q)⌋, q = 1 - p^m, on
{0, .., m - 1} with P(R >= j) = (p^j - p^m)/(1 - p^m), independent of Q'.
Then |X| = 0 if Q' = -1, else 1 + m Q' + R, and for k >= 0, with
k = m a + b, P(|X| = 1 + k) = T_1 (1 - p^m) p^(ma) · p^b (1 - p)/(1 - p^m)
= T_1 (1 - p) p^k: exactly the law above. R's thresholds are never cell
edges (rational functions of the transcendental e^(-1/(s d))), its float64
value errs by less than 2^-48.6 m, and its exact tier is ``decimal`` again.
All the words of Q' (and their refinements) come before the words of R, so
a run of zero words after the sign bit still gives a deep draw.

The discrete Gaussian is Canonne, Kamath & Steinke (2020), Algorithm 3:
propose Y from the exact discrete Laplace with scale t = ⌊σ⌋ + 1 and accept
iff a second lazy uniform V < exp(-γ), γ = (|Y| - σ²/t)² / (2σ²), so the
acceptance probability is exactly exp(-γ). γ is rational (σ is a float) and
never 0 (σ² = |Y| t has no solution with t = ⌊σ⌋ + 1), so exp(-γ) 2^63 is
never an integer. Up to σ = ``TABLE_SIGMA`` the test is a table look-up:
integers lo_k <= exp(-γ_k) 2^63 <= hi_k, two apart in 2^35 relative,
decide V's 63-bit cell by integer comparison (``_AcceptTable``); above it,
one float64 log per proposal with a 2^-30 margin (``_AcceptLog``). What
either leaves undecided goes to the exact ``decimal`` tier (γ from exact
integers, one correctly rounded division), which reads more of V's bits.
Accepted proposals of i.i.d. trials are i.i.d. draws of the target, so
keeping the first ``size`` of them is exact.

Guard: after ``MAX_EXTRA_WORDS`` refinements of one cell (probability
below 2^-65000 from a working generator: every refinement but the ones
forced by a straddled boundary needs 64 zero bits) the sampler raises
``RuntimeError`` instead of looping forever on a broken bit source. It never
returns a truncated value.

All samplers take the caller's ``np.random.Generator`` (never a module-level
one: forked workers would share it) and read it only through
``integers(0, 2**64, dtype=uint64)``, which is the raw bit stream for
numpy's and randomgen's bit generators alike. Limits: ``discrete_laplace``
needs ``0 < scale <= MAX_SCALE`` and ``discrete_gaussian``
``0 < sigma <= MAX_SIGMA``; |X| stays below 2**62 (the guard bounds U from
below), so the int64 results never overflow.
"""

from __future__ import annotations

import functools
import math
from decimal import ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction
from typing import overload

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

#: largest discrete Laplace scale (|X| stays below 2^62 even on the guard's deepest U)
MAX_SCALE = 2.0**46
#: above this scale a draw is split as 1 + m Q + R (module docstring, "Large scales")
SPLIT_SCALE = 2.0**36
#: a split draw's Q has the scale s/m in [2^(_SPLIT_BITS - 1), 2^_SPLIT_BITS)
_SPLIT_BITS = 20
#: a split draw's remainder is certified when its fraction keeps m 2^-43 from 0 and 1
_SPLIT_MARGIN = 2.0**-43
#: largest discrete Gaussian sigma; the proposal scale floor(sigma) + 1 stays <= MAX_SCALE
MAX_SIGMA = 2.0**45
#: ``grid_for`` makes the lattice this many times finer than the noise
GRID_RESOLUTION = 2**10
#: up to this sigma, discrete Gaussian tails are summed term by term; above it
#: the Euler–Maclaurin bounds are tighter than 1e-6 relative
EXACT_SIGMA = 2.0**12
#: refinements of one uniform's cell before the sampler declares its bit source broken
MAX_EXTRA_WORDS = 1024

Size = int | tuple[int, ...]

_SIGN = np.uint64(1 << 63)
_MASK = np.uint64((1 << 63) - 1)
#: float64 tier: U >= 2^-20 (r >= 2^43), so the cell's y-width is below s 2^-43
_FAST_MIN_WORD = 1 << 43
_FAST_REL = 2.0**-42  # 64 x the 2^-52 (11 y + 2 s) rounding bound, as 2^-42 (y + s)
_FAST_CELL = 2.0**-43
#: discrete Gaussian acceptance: absolute margin on ln V + γ (its float error is below 2^-44)
_ACCEPT_MARGIN = 2.0**-30
#: up to this σ the acceptance test is a table look-up (about 11 σ entries)
TABLE_SIGMA = 2.0**12
#: table acceptance: relative margin on exp(-γ) 2^63 (its float error is below 2^-43)
_TABLE_REL = 2.0**-36
#: hi_k - lo_k is below this, so v - lo_k >= _NEAR (mod 2^64) is decided by lo_k alone
_NEAR = np.uint64(1 << 29)
#: proposals per block of the discrete Gaussian: ~10 arrays of this length stay in L2
_BLOCK = 1 << 15
_LD = np.longdouble
_LD_EPS = float(np.finfo(_LD).eps)


def _check_positive(name: str, value: float, upper: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and 0.0 < value <= upper):
        raise ValueError(f"{name} must be in (0, {upper:g}], got {value!r}")
    return value


def _shape(size: Size) -> tuple[int, ...]:
    return (size,) if isinstance(size, int | np.integer) else tuple(int(s) for s in size)


def raw_words(rng: np.random.Generator, n: int) -> NDArray[np.uint64]:
    """n raw 64-bit words: the full-range ``integers`` call is the bit stream itself."""
    return rng.integers(0, 1 << 64, size=n, dtype=np.uint64)


def raw_word(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 1 << 64, dtype=np.uint64))


def discrete_laplace(
    rng: np.random.Generator, scale: float | ArrayLike, size: Size
) -> NDArray[np.int64]:
    """Draw X with P(X = k) = (1 - p)/(1 + p) p^|k|, p = e^(-1/scale), exactly.

    ``scale`` is a number or an array of scales, one per trailing coordinate:
    the result has shape ``size + np.shape(scale)``. One 64-bit word per draw
    (its top bit is the sign), two above ``SPLIT_SCALE``, plus refinements for
    the rare draws the float tiers cannot certify; see the module docstring.
    """
    s: float | NDArray[np.float64]
    if np.ndim(scale) == 0:
        s = _check_positive("scale", float(scale), MAX_SCALE)  # type: ignore[arg-type]
    else:
        s = np.asarray(scale, dtype=np.float64)
        if not np.all((s > 0.0) & (s <= MAX_SCALE)):
            raise ValueError(f"scales must be in (0, {MAX_SCALE:g}]")
    return _apply_sign(*_magnitude_and_sign(rng, s, (*_shape(size), *np.shape(s))))


def _magnitude_and_sign(
    rng: np.random.Generator, s: float | NDArray[np.float64], shape: tuple[int, ...]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """|X| (exact, through the three tiers) and a sign mask (0 or -1).

    One word per draw, plus one for the remainder R of each draw whose scale
    exceeds ``SPLIT_SCALE`` (module docstring, "Large scales").
    """
    words = raw_words(rng, math.prod(shape)).reshape(shape)
    sign = words.view(np.int64) >> 63  # arithmetic shift: -1 where the top bit is set
    words &= _MASK
    if np.max(s) <= SPLIT_SCALE:
        magnitude, undecided = _fast_magnitude(words, s, _log1p_tanh(s))
        flat = magnitude.reshape(-1)
        flat[undecided] = _slow_magnitude(rng, *_tier2_inputs(
            words.reshape(-1), np.broadcast_to(s, shape).reshape(-1), None, undecided, s))
        return magnitude, sign
    return _split_magnitude(rng, words, s), sign


def tier2_slots(draws: int, s: float | NDArray[np.float64]) -> int:
    """How many words every call runs through the long-double tier, padded with dummies:
    a public function of the number of draws and the largest scale, far above the draws
    tier 1 leaves undecided (U < 2^-20, i.e. the largest |X|, plus a margin band of about
    s 2^-37 of them), so whether the drawn noise was extreme does not change the work.
    More undecided draws than slots (probability below 2^-50 per call) run them all."""
    expected = draws * (2.0**-20 + float(np.max(s)) * 2.0**-36)
    return 8 + math.ceil(4.0 * expected)


def _tier2_inputs(
    words: NDArray[np.uint64], scales: NDArray[np.float64], units: NDArray[np.float64] | None,
    undecided: NDArray[np.intp], s: float | NDArray[np.float64],
) -> tuple[NDArray[np.uint64], NDArray[np.float64], NDArray[np.float64] | None, int, int]:
    """The undecided draws' inputs to ``_slow_magnitude``, padded to ``tier2_slots`` with
    dummy words (U = 1/2, never sent to the exact tier), how many are real, and the
    exact tier's slots for all the draws."""
    real = undecided.size
    pad = max(0, tier2_slots(words.size, s) - real)
    w = np.concatenate([words[undecided], np.full(pad, 1 << 62, dtype=np.uint64)])
    filler = scales[0] if scales.size else 1.0
    sc = np.concatenate([scales[undecided], np.full(pad, filler)])
    un = None if units is None else np.concatenate([units[undecided], np.ones(pad)])
    return w, sc, un, real, exact_slots(words.size, laplace_exact_rate(float(np.max(s))))


def _split_magnitude(
    rng: np.random.Generator, words: NDArray[np.uint64], s: float | NDArray[np.float64]
) -> NDArray[np.int64]:
    """|X| = 0 or 1 + m Q + R for the scales above SPLIT_SCALE (the rest as usual).

    Q' = ⌊z⌋, z = (s/m)(ln T_1 - ln U), from the draw's word (Q' = -1 iff
    U >= T_1, i.e. |X| = 0); R from one more word per draw, all of them
    read after the words of Q' and their refinements.
    """
    big: bool | NDArray[np.bool_]
    if isinstance(s, float):
        big, m = True, _split_unit(s)
        mult, const = s / m, _log_t1(s)
    else:
        big = s > SPLIT_SCALE
        m = np.where(big, _split_unit(s), 1.0)
        mult = s / m
        const = np.where(big, _log_t1(s), _log1p_tanh(s))
    q, undecided = _fast_magnitude(words, mult, const)
    flat = q.reshape(-1)
    flat[undecided] = _slow_magnitude(rng, *_tier2_inputs(
        words.reshape(-1), np.broadcast_to(s, q.shape).reshape(-1),
        np.broadcast_to(m, q.shape).reshape(-1).astype(np.float64), undecided, mult))
    if isinstance(big, bool):
        r = _remainder(rng, q.size, s, m).reshape(q.shape)
        # Q' = -1 gives (1 - m) + ... masked to 0; else 1 + m Q' + R
        return np.where(q >= 0, q * int(m) + 1 + r, 0)
    big_flat = np.broadcast_to(big, q.shape).reshape(-1)
    idx = np.flatnonzero(big_flat)
    flat = q.reshape(-1)
    scales = np.broadcast_to(s, q.shape).reshape(-1)[idx]
    units = np.broadcast_to(m, q.shape).reshape(-1)[idx]
    r = _remainder(rng, idx.size, scales, units)
    qi = flat[idx]
    flat[idx] = np.where(qi >= 0, qi * units.astype(np.int64) + 1 + r, 0)
    return q


def _split_unit(s: float | NDArray[np.float64]) -> float | NDArray[np.float64]:
    """m: the power of two that brings s/m into [2^(b-1), 2^b), b = _SPLIT_BITS (m >= 1)."""
    _, e = np.frexp(s)  # s = f 2^e, f in [1/2, 1)
    unit = np.ldexp(1.0, np.maximum(e - _SPLIT_BITS, 0))
    return float(unit) if isinstance(s, float) else unit


def _log_t1(s: float | NDArray[np.float64]) -> float | NDArray[np.float64]:
    """ln T_1 = ln(2p/(1 + p)) = -log1p(expm1(1/s)/2): accurate relative to itself."""
    if isinstance(s, float):
        return -math.log1p(0.5 * math.expm1(1.0 / s))
    return -np.log1p(0.5 * np.expm1(1.0 / s))


def _remainder(
    rng: np.random.Generator,
    n: int,
    s: float | NDArray[np.float64],
    m: float | NDArray[np.float64],
) -> NDArray[np.int64]:
    """R on {0, .., m - 1} with P(R >= j) = (p^j - p^m)/(1 - p^m), from n fresh words.

    R = ⌊y⌋, y = -s log1p(-W q), q = 1 - p^m = -expm1(-m/s) and W's cell
    [w, w + 1) 2^-63. y < m, and y's float64 relative error is below
    2^-48.6 (w and 1/(s/m) rounded, expm1 and log1p within 4 ulp with
    condition numbers below 1 + 2^-22, three products), so below 2^-48.6 m,
    and W's cell spans at most 2^-62 m in y: ⌊y⌋ is certified when the
    fraction keeps 2^-43 m (over 20 times both) from 0 and 1, else
    ``_exact_remainder`` decides it.
    """
    w = raw_words(rng, n)
    w >>= np.uint64(1)
    q = -np.expm1(-np.divide(m, s))
    y = w.view(np.int64).astype(np.float64)
    y *= 2.0**-63
    y *= q
    np.negative(y, out=y)
    np.log1p(y, out=y)
    y *= np.negative(s)
    r = np.floor(y)
    y -= r
    margin = np.multiply(m, _SPLIT_MARGIN)
    ok = y > margin
    ok &= y < 1.0 - margin  # exact: the margin is a power of two >= 2^-43
    out = r.astype(np.int64)
    if not ok.all():
        ss = np.broadcast_to(s, (n,))
        mm = np.broadcast_to(m, (n,))
        for i in np.flatnonzero(~ok):
            out[i] = _exact_remainder(rng, int(w[i]), float(ss[i]), int(mm[i]))
    return out


def _exact_remainder(rng: np.random.Generator, word: int, scale: float, unit: int) -> int:
    """⌊y⌋ for y = -s ln(1 - W q), W in [word, word + 1) 2^-63, refined until decided.

    At precision P: q = 1 - exp(-m/s) errs by at most 2·10^(1-P), W q (N/2^B
    rounded, two products) by 3·10^(1-P) more, and 1 - W q and ln by
    10^(1-P) each relative; y's slope in W q is at most 1.01 s, so y errs
    by less than 8 s 10^(1-P), and ``tol`` is 12 times more.
    """
    s = Decimal(scale)  # exact
    num, bits = word, 63
    prec = 40 + max(0, math.ceil(math.log10(scale)))
    for _ in range(MAX_EXTRA_WORDS):
        with localcontext() as ctx:
            ctx.prec = prec
            q = 1 - (-Decimal(unit) / s).exp()
            tol = s * Decimal(10) ** (3 - prec)
            scale_w = q / Decimal(2) ** bits
            low = -s * (1 - num * scale_w).ln() - tol
            high = -s * (1 - (num + 1) * scale_w).ln() + tol
            k = low.to_integral_value(rounding=ROUND_FLOOR)
            if k < low and high < k + 1:
                return int(k)
        prec += 20
        num, bits = (num << 64) | raw_word(rng), bits + 64
    raise RuntimeError("the bit generator returned too many zero bits; is it broken?")


def _apply_sign(magnitude: NDArray[np.int64], sign: NDArray[np.int64]) -> NDArray[np.int64]:
    """(m xor sign) - sign is m or -m, branch-free (``np.where`` stalls on random signs)."""
    magnitude ^= sign
    magnitude -= sign
    return magnitude


def discrete_laplace_float(
    rng: np.random.Generator, scale: float | ArrayLike, size: Size
) -> NDArray[np.float64]:
    """``discrete_laplace`` as float64: exact while |X| < 2**53 (probability >= 1 - 2^-185
    per draw at MAX_SCALE); pipelines that need every draw exact add in int64."""
    return discrete_laplace(rng, scale, size).astype(np.float64)


def _log1p_tanh(s: float | NDArray[np.float64]) -> float | NDArray[np.float64]:
    """c = ln(2/(1 + p)) = log1p(tanh(1/(2s))): accurate relative to c at any scale."""
    if isinstance(s, float):
        return math.log1p(math.tanh(0.5 / s))
    return np.log1p(np.tanh(0.5 / s))


def _fast_magnitude(
    words: NDArray[np.uint64],
    s: float | NDArray[np.float64],
    c: float | NDArray[np.float64],
) -> tuple[NDArray[np.int64], NDArray[np.intp]]:
    """Tier 1: ⌊y⌋ for every word, and the flat indices where it is not certified.

    The margin is 2^-42 (y + s) + s 2^-43 (module docstring); up to a scale
    of 2^24 it is taken at y's largest value 15 s, as one constant per scale,
    which saves passes and costs a certified fraction of only ~s 2^-37.
    """
    y = words.view(np.int64).astype(np.float64)  # the sign bit is cleared: r < 2^63
    y *= 2.0**-63  # exact: U's cell starts at r 2^-63
    with np.errstate(divide="ignore"):
        np.log(y, out=y)
    np.subtract(c, y, out=y)
    y *= s
    k = np.floor(y)
    with np.errstate(invalid="ignore"):  # inf - inf where r = 0, which tier 3 takes
        y -= k  # the fraction, exactly
    if np.max(s) <= 2.0**24:
        low = np.multiply(s, 16.0 * _FAST_REL + _FAST_CELL)
        ok = y > low
        ok &= y < np.nextafter(1.0 - low, 0.0)  # 1 - low rounded down
    else:
        err = y + k
        err += s
        err *= _FAST_REL
        err += np.multiply(s, _FAST_CELL)
        ok = y > err
        err += y
        ok &= err < 1.0  # y + err < 1 computed; the margin covers the rounding
    ok &= words >= _FAST_MIN_WORD
    with np.errstate(invalid="ignore"):
        magnitude = k.astype(np.int64)
    if ok.all():
        return magnitude, np.empty(0, dtype=np.intp)
    return magnitude, np.flatnonzero(~ok)


def _slow_magnitude(
    rng: np.random.Generator,
    words: NDArray[np.uint64],
    scales: NDArray[np.float64],
    units: NDArray[np.float64] | None = None,
    real: int | None = None,
    exact_pad: int = 1,
) -> NDArray[np.int64]:
    """Tier 2 (long double) on what tier 1 left, then tier 3 (exact) on the rest, for the
    first ``real`` words (default: all); the others are padding (``_tier2_inputs``), run
    through tier 2 only and dropped. The exact tier runs at least ``exact_pad`` times
    (``exact_slots``: dummies after the real ones).

    With ``units`` (m > 1: a split draw) the value is z = (s/m)(ln T_1 - ln U),
    which can be negative, so ⌊z⌋ = 0 is certified like any other integer.
    """
    real = words.size if real is None else real
    r = words.astype(_LD)  # exact with a 64-bit mantissa; else rounded, which the bound covers
    s = scales.astype(_LD)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.log1p(np.tanh(_LD(0.5) / s))
        split = np.zeros(words.shape, dtype=bool) if units is None else units > 1.0
        if units is not None:
            c = np.where(split, -np.log1p(np.expm1(_LD(1.0) / s) / 2), c)
            s = s / units.astype(_LD)  # exact: m is a power of two
        y = s * (c - np.log(r * _LD(2.0**-63)))
        k = np.floor(y)
        frac = y - k
        # 64 x the 2^-52 (11 |y| + 2 s) bound of tier 1 with this epsilon, plus the cell
        err = (64.0 * _LD_EPS) * (11.0 * np.abs(y) + 2.0 * s) + s / r * _LD(1.001) + _LD_EPS
        ok = (1.0 - frac > err) & ((frac > err) | ((k == 0.0) & ~split)) & (words > 0)
        out = np.where(ok, k, 0.0).astype(np.int64)
    exact = np.flatnonzero(~ok[:real])
    for i in exact:
        unit = 1 if units is None else int(units[i])
        out[i] = _exact_magnitude(rng, int(words[i]), float(scales[i]), unit)
    pad_exact_tier(exact.size, exact_pad, magnitude=True)
    return out[:real]


def _exact_magnitude(rng: np.random.Generator, word: int, scale: float, unit: int = 1) -> int:
    """Tier 3: ⌊y⌋ for U in [word, word + 1)·2^-63, refined until it is decided.

    y(U) = s (B ln 2 - ln N + c) at U = N 2^-B. Inputs N, B, s are exact;
    the ~10 correctly rounded operations at precision P leave an absolute
    error below s (6B + 9)·10^(1-P), and ``tol`` is 16 times more. For a
    split draw (m = ``unit`` > 1) the value is z = (s/m)(B ln 2 - ln N + c - 1/s),
    with c - 1/s = ln T_1 (one more rounding), and may be negative.
    """
    s = Decimal(scale)  # exact
    num, bits = word, 63
    prec = 40 + max(0, math.ceil(math.log10(scale)))
    for _ in range(MAX_EXTRA_WORDS):
        with localcontext() as ctx:
            ctx.prec = prec
            ln2 = Decimal(2).ln()
            c = ln2 - (1 + (-1 / s).exp()).ln()
            mult = s
            if unit > 1:
                c -= 1 / s
                mult = s / unit  # exact: a power of two
            top = bits * ln2 + c
            tol = mult * (bits + 2) * Decimal(10) ** (3 - prec)
            low = mult * (top - Decimal(num + 1).ln()) - tol  # at the cell's right end, minus
            high = mult * (top - Decimal(num).ln()) + tol if num else None
            if high is not None:
                if high < 1 and unit == 1:  # y > 0 always
                    return 0
                k = low.to_integral_value(rounding=ROUND_FLOOR)
                if k < low and high < k + 1:
                    return int(k)
        # a zero prefix needs no more digits (only B ln 2 is compared), a straddle does
        prec += 20 if num else 0
        num, bits = (num << 64) | raw_word(rng), bits + 64
    raise RuntimeError("the bit generator returned too many zero bits; is it broken?")


def discrete_gaussian(rng: np.random.Generator, sigma: float, size: Size) -> NDArray[np.int64]:
    """Draw X with P(X = k) ∝ exp(-k² / (2σ²)) on the integers, exactly.

    Canonne, Kamath & Steinke (2020), Algorithm 3 (see the module docstring),
    in blocks of at most ``_BLOCK`` proposals (their ~10 arrays stay in
    cache) until ``size`` are accepted; only accepted proposals are gathered
    and signed. Blocks are consecutive i.i.d. trials, so the first ``size``
    accepted ones, in order, are i.i.d. draws of the target.
    """
    return discrete_gaussian_trials(rng, sigma, size)[0]


def discrete_gaussian_trials(rng: np.random.Generator, sigma: float, size: Size
                             ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``discrete_gaussian`` (same draws from the same generator) and, per draw, the
    proposals it took (this one included): i.i.d. geometric in an acceptance rate fixed
    by σ, whatever the value the noise is added to (the audit's work counter)."""
    sigma = _check_positive("sigma", sigma, MAX_SIGMA)
    shape = _shape(size)
    n = math.prod(shape)
    t = math.floor(sigma) + 1
    accepts: _AcceptTable | _AcceptLog
    accepts = _AcceptTable(sigma, t) if sigma <= TABLE_SIGMA else _AcceptLog(sigma, t)
    out = np.empty(n, dtype=np.int64)
    trials = np.empty(n, dtype=np.int64)
    filled = 0
    proposed = 0  # proposals before the current block
    last = -1  # index of the last accepted proposal
    rate = 0.7  # acceptance is about 0.76 for large σ, 0.52 at σ = 0.5 and above 0.4 below
    while filled < n:
        need = n - filled
        batch = min(int(need / rate * 1.05) + 64, _BLOCK)
        magnitude, sign = _magnitude_and_sign(rng, float(t), (batch,))
        v = raw_words(rng, batch)
        v >>= np.uint64(1)  # V's cell [v, v + 1) 2^-63
        accepted = np.flatnonzero(accepts(rng, magnitude, v))
        rate = max(accepted.size / batch, 0.2)
        accepted = accepted[:need]
        out[filled : filled + accepted.size] = _apply_sign(magnitude[accepted], sign[accepted])
        at = proposed + accepted
        trials[filled : filled + accepted.size] = np.diff(at, prepend=last)
        if accepted.size:
            last = int(at[-1])
        proposed += batch
        filled += accepted.size
    return out.reshape(shape), trials.reshape(shape)


class _AcceptTable:
    """CKS acceptance for σ <= TABLE_SIGMA by one table look-up and integer comparisons.

    With E_k = exp(-γ_k) 2^63 for |Y| = k, V's cell [v, v + 1) 2^-63 lies below
    exp(-γ_k) when v + 1 <= E_k and above it when v >= E_k. The table holds
    lo_k = ⌊Ê_k (1 - 2^-36)⌋ and hi_k = max(1, ⌈Ê_k (1 + 2^-36)⌉) for the
    float64 Ê_k = exp(-ĝ_k) 2^63: v < lo_k accepts and v >= hi_k rejects,
    and lo_k <= v < hi_k (width below 2^29, so below ``_NEAR``) goes to the
    exact tier. Proof that lo_k <= E_k <= hi_k: ĝ = (k/σ - σ/t)²/2 in
    float64 errs by at most 2^-53 (7γ + 4√(2γ)) (two quotients, a
    difference, a square), below 2^-44 while γ <= 61; numpy's exp adds at
    most 4 ulp (``test_sampling`` measures it), so Ê_k is within 2^-43
    relative of E_k, 128 times less than 2^-36, which also absorbs the
    products' roundings. A computed ĝ > 60 (also inf for tiny σ) means
    γ > 59 and E_k < 1, so lo_k = 0 and hi_k = 1 there, and for every
    k >= K, whose γ_k exceeds 50 (K = ⌈σ²/t + 10σ⌉ + 1, the last entry,
    which ``np.take(..., mode="clip")`` uses for larger k).
    """

    def __init__(self, sigma: float, t: int) -> None:
        self.gamma = _GaussianExponent(sigma, t)
        top = math.ceil(sigma / t * sigma + 10.0 * sigma) + 1
        k = np.arange(top + 1, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            z = k / sigma - sigma / t
            g = 0.5 * (z * z)
        e = np.exp(-g) * 2.0**63
        far = ~(g <= 60.0)  # also NaN-safe
        far[-1] = True
        e[far] = 0.0
        self.lo = np.floor(e * (1.0 - _TABLE_REL)).astype(np.uint64)
        self.hi = np.maximum(np.ceil(e * (1.0 + _TABLE_REL)), 1.0).astype(np.uint64)

    def __call__(
        self, rng: np.random.Generator, magnitude: NDArray[np.int64], v: NDArray[np.uint64]
    ) -> NDArray[np.bool_]:
        """Accept (exactly) each proposal of magnitude k with V's cell starting at v."""
        lo = np.take(self.lo, magnitude, mode="clip")
        accept = v < lo
        np.subtract(v, lo, out=lo)  # v - lo_k mod 2^64: below _NEAR only near the edge
        near = lo < _NEAR
        exact = 0
        if near.any():
            for i in np.flatnonzero(near):
                k = min(int(magnitude[i]), self.lo.size - 1)
                if v[i] >= self.hi[k]:
                    continue
                accept[i] = exact_accept(rng, int(v[i]), self.gamma(int(magnitude[i])))
                exact += 1
        pad_exact_tier(exact, exact_slots(v.size, TABLE_EXACT_RATE))
        return accept


class _AcceptLog:
    """CKS acceptance for large σ: one float64 log per proposal, then the exact tier.

    e = ln v - 63 ln 2 + γ, with γ = z², z = |Y|/(σ√2) - σ/(t√2). For v >= 2^43
    (λ = -ln V <= 13.9, and the cell spans at most 2^-43 in λ) and γ <= 32,
    the computed e errs by less than 2^-43 (ln v within 4 ulp of 44, z within
    2^-48 of at most 5.7), and 2^-30 is the margin: accept iff e < -2^-30,
    reject iff e > 2^-30. A larger (or infinite) computed γ means a true
    γ > 31 > λ + 1: a certain rejection, which e > 2^-30 says too.
    """

    def __init__(self, sigma: float, t: int) -> None:
        self.gamma = _GaussianExponent(sigma, t)
        self.inv = 1.0 / (sigma * math.sqrt(2.0))
        self.shift = sigma / (t * math.sqrt(2.0))

    def __call__(
        self, rng: np.random.Generator, magnitude: NDArray[np.int64], v: NDArray[np.uint64]
    ) -> NDArray[np.bool_]:
        """Accept (exactly) each proposal of magnitude k with V's cell starting at v."""
        e = magnitude.astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            e *= self.inv
            e -= self.shift
            np.square(e, out=e)
        lv = v.view(np.int64).astype(np.float64)
        with np.errstate(divide="ignore"):
            np.log(lv, out=lv)
        e += lv
        e -= 63.0 * math.log(2.0)
        accept = e < -_ACCEPT_MARGIN
        np.abs(e, out=e)
        undecided = e <= _ACCEPT_MARGIN
        undecided |= v < np.uint64(_FAST_MIN_WORD)
        exact = np.flatnonzero(undecided)
        for i in exact:
            accept[i] = exact_accept(rng, int(v[i]), self.gamma(int(magnitude[i])))
        pad_exact_tier(exact.size, exact_slots(v.size, LOG_EXACT_RATE))
        return accept


class _GaussianExponent:
    """γ(Y) = (|Y| t - σ²)² / (2 σ² t²) as an exact fraction (σ is a dyadic rational)."""

    def __init__(self, sigma: float, t: int) -> None:
        self.sigma2 = Fraction(sigma) ** 2
        self.t = t

    def __call__(self, y: int) -> Fraction:
        return (abs(y) * self.t - self.sigma2) ** 2 / (2 * self.sigma2 * self.t**2)


#: padding's own generator: a dummy evaluation must never read the job's stream (it is
#: decided in its first round anyway: V = 1/2 against exp(-1/2))
_PAD_RNG = np.random.default_rng(0)
_PAD_WORD, _PAD_GAMMA = 1 << 62, Fraction(1, 2)
#: exact-tier rates per draw, fixed by public parameters (bounds, not estimates): a
#: Gaussian proposal near its table edge; a Gaussian proposal of the log test (V < 2^-20,
#: or within the 2^-30 margin); a discrete Laplace draw is ``laplace_exact_rate(s)``
TABLE_EXACT_RATE = 2.0**-33
LOG_EXACT_RATE = 2.0**-20 + 2.0**-28


def laplace_exact_rate(s: float) -> float:
    """A discrete Laplace draw reaches tier 3 when tier 2 cannot place y: U's cell spans
    about s/r in y (r < 2^43 there), so over r the chance is about s 2^-56, plus the
    long double's own margin band."""
    return 2.0**-40 + s * 2.0**-54


def exact_slots(draws: int, rate: float) -> int:
    """How many exact-tier evaluations a call runs at least (the real ones, then dummies):
    a public count, 4 times the expected number and at least one, so whether a call's
    noise needed the exact tier (which depends on its size: issue #27) does not show in
    the run time unless more than that did, which is rarer than the square of
    ``draws·rate``."""
    return max(1, math.ceil(4.0 * draws * rate))


def pad_exact_tier(done: int, slots: int, magnitude: bool = False) -> None:
    """Run the exact tier ``slots - done`` more times on a dummy (see ``exact_slots``): the
    acceptance test, or with ``magnitude`` the discrete Laplace's ⌊y⌋."""
    for _ in range(slots - done):
        if magnitude:
            _exact_magnitude(_PAD_RNG, _PAD_WORD, 1.0)
        else:
            exact_accept(_PAD_RNG, _PAD_WORD, _PAD_GAMMA)


def exact_accept(rng: np.random.Generator, word: int, gamma: Fraction) -> bool:
    """Tier 3 of the acceptance: -ln V > γ for V in [word, word + 1)·2^-63, refined as needed.

    λ(N) = B ln 2 - ln N errs by at most (4B + 1)·10^(1-P) and γ by γ·10^(1-P);
    ``tol`` is 25 times their sum.
    """
    num, bits = word, 63
    prec = 40
    for _ in range(MAX_EXTRA_WORDS):
        with localcontext() as ctx:
            ctx.prec = prec
            g = Decimal(gamma.numerator) / Decimal(gamma.denominator)
            top = bits * Decimal(2).ln()
            tol = (bits + 1 + g) * Decimal(10) ** (3 - prec)
            if top - Decimal(num + 1).ln() - tol > g:
                return True
            if num and top - Decimal(num).ln() + tol < g:
                return False
        # a zero prefix needs no more digits (only B ln 2 is compared), a straddle does
        prec += 20 if num else 0
        num, bits = (num << 64) | raw_word(rng), bits + 64
    raise RuntimeError("the bit generator returned too many zero bits; is it broken?")


def discrete_laplace_tail(scale: float, k: int) -> float:
    """P(|X| >= k) for the discrete Laplace: 2 p**k / (1 + p) for k >= 1, p = e^(-1/scale)."""
    if k <= 0:
        return 1.0
    return 2.0 * math.exp(-k / scale) / (1.0 + math.exp(-1.0 / scale))


def discrete_laplace_halfwidth(scale: float, level: float = 0.95) -> int:
    """Smallest integer k with P(|X| <= k) >= level, from the exact tail formula."""
    scale = _check_positive("scale", scale, MAX_SCALE)
    alpha = _check_alpha(level)
    p = math.exp(-1.0 / scale)
    # P(|X| <= k) >= level  <=>  tail(k + 1) <= alpha  <=>  k + 1 >= -scale log(alpha (1+p) / 2)
    k = max(0, math.ceil(-scale * math.log(alpha * (1.0 + p) / 2.0)) - 1)
    while k > 0 and discrete_laplace_tail(scale, k) <= alpha:
        k -= 1
    while discrete_laplace_tail(scale, k + 1) > alpha:
        k += 1
    return k


def _check_alpha(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return 1.0 - level


def discrete_gaussian_normalizer(sigma: float) -> float:
    """Σ_k exp(-k²/(2σ²)).

    For σ >= 1 by Poisson summation, σ√(2π)(1 + 2 Σ_m exp(-2π²σ²m²)), whose
    terms vanish below double precision after m = 1; for smaller σ by direct
    summation.
    """
    if sigma >= 1.0:
        theta = 1.0 + 2.0 * math.exp(-2.0 * (math.pi * sigma) ** 2)
        return sigma * math.sqrt(2.0 * math.pi) * theta
    k = np.arange(1, math.ceil(10.0 * sigma) + 3, dtype=np.float64)
    return 1.0 + 2.0 * float(np.sum(np.exp(-(k * k) / (2.0 * sigma * sigma))))


def discrete_gaussian_pmf(sigma: float, k: ArrayLike) -> NDArray[np.float64]:
    """Normalized pmf P(X = k) of the discrete Gaussian."""
    kf = np.asarray(k, dtype=np.float64)
    return np.exp(-(kf * kf) / (2.0 * sigma * sigma)) / discrete_gaussian_normalizer(sigma)


def discrete_gaussian_sf_bounds(sigma: float, k: int) -> tuple[float, float]:
    """Lower and upper bounds on P(X >= k) for the discrete Gaussian.

    For σ <= EXACT_SIGMA the pmf is summed over [k, k + 10σ + 10] (the
    remainder is below 1e-19 of the sum) and the bounds are the sum ± 1e-12
    relative, to cover rounding. Above it, Euler–Maclaurin with the
    first-derivative term: Σ_{y>=k} f(y) = σ√(2π) Φ̄(k/σ) + f(k)/2 + k f(k)/(12σ²)
    + R, |R| <= ∫_k^∞ |f''| / 12, which has a closed form because f'' changes
    sign only at σ; Z = σ√(2π) exactly in double precision there.
    """
    sigma = _check_positive("sigma", sigma, MAX_SIGMA)
    if k <= 0:
        lo, hi = discrete_gaussian_sf_bounds(sigma, 1 - k)
        return 1.0 - hi, 1.0 - lo
    if sigma <= EXACT_SIGMA:
        y = np.arange(k, k + math.ceil(10.0 * sigma) + 10, dtype=np.float64)
        s = float(np.sum(np.exp(-(y * y) / (2.0 * sigma * sigma)))) / discrete_gaussian_normalizer(
            sigma
        )
        return s * (1.0 - 1e-12), s * (1.0 + 1e-12)
    x = k / sigma
    root = sigma * math.sqrt(2.0 * math.pi)
    fk = math.exp(-0.5 * x * x)
    slope = x * fk / sigma  # -f'(k)
    main = root * float(special.ndtr(-x)) + fk / 2.0 + slope / 12.0
    # ∫_k^∞ |f''|: f'' < 0 on [0, σ) and > 0 beyond, and f'(σ) = -e^(-1/2)/σ
    curvature = slope if k >= sigma else 2.0 * math.exp(-0.5) / sigma - slope
    r = curvature / 12.0
    return max(0.0, (main - r) / root), min(1.0, (main + r) / root)


@functools.lru_cache(maxsize=1024)
def discrete_gaussian_halfwidth(sigma: float, level: float = 0.95) -> int:
    """Smallest integer k with P(|X| <= k) >= level.

    Exact for σ <= EXACT_SIGMA; above it, k is chosen from the upper tail
    bound so P(|X| <= k) >= level still holds, and it can exceed the exact
    answer by one only when the level falls within ~1e-6 of a step.
    """
    sigma = _check_positive("sigma", sigma, MAX_SIGMA)
    alpha = _check_alpha(level)
    if sigma <= EXACT_SIGMA:
        # The discrete Gaussian is σ²-subgaussian, so k <= σ sqrt(2 ln(2/α)).
        top = math.ceil(sigma * math.sqrt(2.0 * math.log(2.0 / alpha))) + 2
        pmf = discrete_gaussian_pmf(sigma, np.arange(0, top + 1))
        central = np.cumsum(2.0 * pmf) - pmf[0]  # P(|X| <= k) for k = 0..top
        return int(np.argmax(central >= level)) if central[-1] >= level else top

    def fits(k: int) -> bool:
        return 2.0 * discrete_gaussian_sf_bounds(sigma, k + 1)[1] <= alpha

    k = max(0, math.floor(sigma * float(special.ndtri(1.0 - alpha / 2.0))) - 1)
    while k > 0 and fits(k - 1):
        k -= 1
    while not fits(k):
        k += 1
    return k


def grid_for(scale: float, resolution: int = GRID_RESOLUTION) -> float:
    """The largest power of two g with g <= scale / resolution.

    ``resolution`` must be a power of two so that ``scale / resolution`` is
    exact and g never exceeds the true ratio.
    """
    scale = _check_positive("scale", scale, math.inf)
    if resolution < 1 or resolution & (resolution - 1):
        raise ValueError("resolution must be a power of two")
    _, exponent = math.frexp(scale / resolution)
    grid = math.ldexp(1.0, exponent - 1)
    if grid < np.finfo(np.float64).tiny:
        raise ValueError("scale too small for a normal power-of-two grid")
    return grid


def is_power_of_two(grid: float) -> bool:
    """True for a positive finite power of two (including 2**-k)."""
    return math.isfinite(grid) and grid > 0.0 and math.frexp(grid)[0] == 0.5


@overload
def snap(value: float, grid: float) -> float: ...
@overload
def snap(value: NDArray[np.float64], grid: float) -> NDArray[np.float64]: ...
def snap(value: float | NDArray[np.float64], grid: float) -> float | NDArray[np.float64]:
    """Round to the nearest multiple of a power-of-two ``grid`` (ties to even).

    Division and multiplication by a power of two are exact, so the result is
    exactly ``grid * round(value / grid)`` while |value| / grid < 2**1023.
    """
    if not is_power_of_two(grid):
        raise ValueError(f"grid must be a power of two, got {grid!r}")
    snapped = np.rint(np.asarray(value, dtype=np.float64) / grid) * grid
    if np.ndim(value) == 0:
        return float(snapped)
    return snapped
