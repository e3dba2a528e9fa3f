"""Integer-valued noise samplers and their exact tails.

Mironov (2012) showed that adding floating-point Laplace noise leaks the input
through the low bits of the output. The baselines therefore add *integer*
noise to a statistic expressed in units of a power-of-two grid, so every
released value is a lattice point whose distribution depends on the data only
through the statistic (DESIGN §6).

All samplers take the caller's ``np.random.Generator`` (never a module-level
one: forked workers would share it). They are vectorized; each draw is exact
up to the rounding of double-precision arithmetic on the uniforms, which
perturbs the pmf by a relative ~1e-16 that does not depend on the data.

Limits: ``discrete_laplace`` needs ``0 < scale <= MAX_SCALE`` and
``discrete_gaussian`` ``0 < sigma <= MAX_SIGMA``; both keep |X| far below
2**53 (P(|X| >= 2**53) < 1e-100), so ``grid * X`` is an exact double.
"""

from __future__ import annotations

import functools
import math
from typing import overload

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

#: largest discrete Laplace scale; P(|X| >= 2**53) <= 2 exp(-2**7) at this scale
MAX_SCALE = 2.0**46
#: largest discrete Gaussian sigma; the proposal scale floor(sigma) + 1 stays <= MAX_SCALE
MAX_SIGMA = 2.0**45
#: ``grid_for`` makes the lattice this many times finer than the noise
GRID_RESOLUTION = 2**10
#: up to this sigma, discrete Gaussian tails are summed term by term; above it
#: the Euler–Maclaurin bounds are tighter than 1e-6 relative
EXACT_SIGMA = 2.0**12

Size = int | tuple[int, ...]


def _check_positive(name: str, value: float, upper: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and 0.0 < value <= upper):
        raise ValueError(f"{name} must be in (0, {upper:g}], got {value!r}")
    return value


def _shape(size: Size) -> tuple[int, ...]:
    return (size,) if isinstance(size, int | np.integer) else tuple(int(s) for s in size)


def discrete_laplace(
    rng: np.random.Generator, scale: float | ArrayLike, size: Size
) -> NDArray[np.int64]:
    """Draw X with P(X = k) ∝ exp(-|k| / scale) on the integers (see ``discrete_laplace_float``)."""
    return discrete_laplace_float(rng, scale, size).astype(np.int64)


def discrete_laplace_float(
    rng: np.random.Generator, scale: float | ArrayLike, size: Size
) -> NDArray[np.float64]:
    """The discrete Laplace draws as float64 (exact integers, |X| < 2**53), for float pipelines.

    ``scale`` is a number or an array of scales, one per trailing coordinate:
    the result has shape ``size + np.shape(scale)``. How: see ``_signed_geometric``.
    """
    return _signed_geometric(rng, scale, size)[0]


def discrete_laplace_and_uniform(
    rng: np.random.Generator, scale: float, size: Size
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Discrete Laplace draws X (as ``discrete_laplace_float``) and uniforms V independent of X.

    The uniform U that chose X's case (zero, positive, negative) is uniform
    within that case, so rescaling A = |U − 1/2| over the case's range gives
    V ~ Unif[0, 1] independent of X, to about 52 bits: callers that need a
    fresh uniform next to each draw (DIP's randomized PIT) get it without
    drawing another one.
    """
    x, a, half_zero = _signed_geometric(rng, scale, size)
    assert isinstance(half_zero, float)
    zero_rows = np.flatnonzero(x == 0.0)
    flat = a.reshape(-1)
    inside = flat[zero_rows] / half_zero  # A uniform on [0, z/2] when X = 0
    rest = 0.5 - half_zero
    if rest > 0.0:  # A uniform on (z/2, 1/2] when X != 0
        a -= half_zero
        a *= 1.0 / rest
    flat[zero_rows] = inside
    return x, a


def _signed_geometric(
    rng: np.random.Generator, scale: float | ArrayLike, size: Size
) -> tuple[NDArray[np.float64], NDArray[np.float64], float | NDArray[np.float64]]:
    """(X, |U − 1/2|, z/2): the discrete Laplace from one exponential and one uniform.

    With p = exp(-1/scale), P(X = 0) = z = (1 - p)/(1 + p) = tanh(1/(2 scale))
    and, given X != 0, |X| - 1 is geometric (P(|X| - 1 >= k) = p**k) with a
    fair sign. One uniform U picks the case: X = 0 if |U − 1/2| <= z/2, else
    X has the sign of U − 1/2 and magnitude floor(scale * E) + 1, E ~ Exp(1)
    (P(scale*E >= k) = p**k). One ziggurat exponential and one uniform per
    draw are cheaper than the difference of two geometrics and than
    ``Generator.laplace``'s logarithm. A tiny scale gives z = 1: X = 0.
    """
    s: float | NDArray[np.float64]
    if np.ndim(scale) == 0:
        s = _check_positive("scale", float(scale), MAX_SCALE)  # type: ignore[arg-type]
        half_zero: float | NDArray[np.float64] = 0.5 * math.tanh(0.5 / s)
    else:
        s = np.asarray(scale, dtype=np.float64)
        if not np.all((s > 0.0) & (s <= MAX_SCALE)):
            raise ValueError(f"scales must be in (0, {MAX_SCALE:g}]")
        half_zero = 0.5 * np.tanh(0.5 / s)
    shape = (*_shape(size), *np.shape(s))
    x = rng.standard_exponential(shape)
    x *= s
    np.floor(x, out=x)
    x += 1.0
    a = rng.random(shape)
    a -= 0.5  # exact
    np.copysign(x, a, out=x)
    np.abs(a, out=a)
    np.multiply(x, a > half_zero, out=x)
    return x, a, half_zero


def discrete_gaussian(rng: np.random.Generator, sigma: float, size: Size) -> NDArray[np.int64]:
    """Draw X with P(X = k) ∝ exp(-k² / (2σ²)) on the integers.

    Canonne, Kamath & Steinke (2020), Algorithm 3: propose Y from the discrete
    Laplace with scale t = floor(σ) + 1 and accept with probability
    exp(-(|Y| - σ²/t)² / (2σ²)), in vectorized batches until ``size`` are
    accepted. The exponent is computed as (|Y|/σ - σ/t)²/2, which stays finite
    for tiny σ (σ² would underflow).
    """
    sigma = _check_positive("sigma", sigma, MAX_SIGMA)
    shape = _shape(size)
    n = math.prod(shape)
    t = math.floor(sigma) + 1
    out = np.empty(n, dtype=np.int64)
    filled = 0
    rate = 0.7  # acceptance is about 0.76 for large σ and above 0.4 for tiny σ
    while filled < n:
        need = n - filled
        batch = min(int(need / rate * 1.05) + 64, 1 << 22)
        y = discrete_laplace(rng, t, batch)
        with np.errstate(over="ignore"):  # z² = inf for tiny σ is the right answer: reject
            z = np.abs(y) / sigma - sigma / t
            accepted = y[rng.random(batch) < np.exp(-0.5 * z * z)]
        take = min(accepted.size, need)
        out[filled : filled + take] = accepted[:take]
        filled += take
        rate = max(accepted.size / batch, 0.2)
    return out.reshape(shape)


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
