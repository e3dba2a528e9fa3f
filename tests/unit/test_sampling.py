"""Integer noise samplers: exact distributions, tails, half-widths and the lattice.

Reference pmfs are recomputed here from their definitions (not from the module
under test) and every tolerance comes from the sampling error of the test
itself: chi-square p-values, or 4.5 binomial standard errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from randomgen import UserBitGenerator
from scipy import stats

from mechanisms import sampling
from mechanisms.rng import secure_generator

N = 200_000
Z = 4.5  # two-sided standard-normal quantile for a per-check false alarm of ~7e-6


def _laplace_pmf(scale: float, k: np.ndarray) -> np.ndarray:
    p = math.exp(-1.0 / scale)
    return (1.0 - p) / (1.0 + p) * np.exp(-np.abs(k) / scale)


def _gaussian_pmf(sigma: float, k: np.ndarray) -> np.ndarray:
    support = np.arange(-math.ceil(40 * sigma) - 40, math.ceil(40 * sigma) + 41)
    z = np.exp(-(support.astype(float) ** 2) / (2 * sigma**2)).sum()
    return np.exp(-(k.astype(float) ** 2) / (2 * sigma**2)) / z


def _chisquare(draws: np.ndarray, pmf: np.ndarray, support: np.ndarray) -> float:
    """p-value against ``pmf`` on ``support``; each tail is pooled into its neighbour.

    The cells with expected count >= 5 form an interval (the pmfs are
    unimodal); everything outside it is added to the interval's end cells.
    """
    n = draws.size
    inside = pmf * n >= 5
    lo, hi = int(support[inside].min()), int(support[inside].max())
    assert hi > lo, "need at least two cells"
    expected = pmf[inside] * n
    expected[0] += pmf[support < lo].sum() * n
    expected[-1] += pmf[support > hi].sum() * n
    observed = np.bincount(np.clip(draws, lo, hi) - lo, minlength=hi - lo + 1)
    return float(stats.chisquare(observed, expected * n / expected.sum()).pvalue)


@pytest.mark.parametrize("scale", [0.3, 1.0, 2.5, 40.0])
def test_discrete_laplace_matches_exact_pmf(scale: float) -> None:
    draws = sampling.discrete_laplace(np.random.default_rng(11), scale, N)
    support = np.arange(-math.ceil(60 * scale) - 5, math.ceil(60 * scale) + 6)
    assert _chisquare(draws, _laplace_pmf(scale, support), support) > 1e-3


@pytest.mark.parametrize("sigma", [0.35, 0.8, 3.7, 40.0, 300.0])
def test_discrete_gaussian_matches_exact_pmf(sigma: float) -> None:
    draws = sampling.discrete_gaussian(np.random.default_rng(12), sigma, N)
    support = np.arange(-math.ceil(12 * sigma) - 5, math.ceil(12 * sigma) + 6)
    assert _chisquare(draws, _gaussian_pmf(sigma, support), support) > 1e-3


@pytest.mark.parametrize(
    "draw",
    [
        lambda rng: sampling.discrete_laplace(rng, 3.0, N),
        lambda rng: sampling.discrete_gaussian(rng, 3.0, N),
    ],
    ids=["laplace", "gaussian"],
)
def test_samplers_are_symmetric(draw: Callable[[np.random.Generator], np.ndarray]) -> None:
    x = draw(np.random.default_rng(13))
    positive, negative = np.count_nonzero(x > 0), np.count_nonzero(x < 0)
    assert stats.binomtest(positive, positive + negative).pvalue > 1e-3
    assert abs(x.mean()) <= Z * x.std() / math.sqrt(x.size)


def test_outputs_are_int64_of_the_requested_shape() -> None:
    rng = np.random.default_rng(14)
    for x in (
        sampling.discrete_laplace(rng, 2.0, (3, 4)),
        sampling.discrete_gaussian(rng, 2.0, (3, 4)),
        sampling.discrete_laplace(rng, 2.0, 0),
        sampling.discrete_gaussian(rng, 2.0, 7),
    ):
        assert x.dtype == np.int64
    assert sampling.discrete_laplace(rng, 2.0, (3, 4)).shape == (3, 4)
    assert sampling.discrete_gaussian(rng, 2.0, (2, 5)).shape == (2, 5)
    assert sampling.discrete_gaussian(rng, 2.0, 0).shape == (0,)
    # a vector of scales adds a trailing axis, one scale per coordinate
    assert sampling.discrete_laplace(rng, np.array([1.0, 2.0, 8.0]), (4, 5)).shape == (4, 5, 3)
    spread = sampling.discrete_laplace(rng, np.array([0.01, 1e6]), 2000)
    assert not spread[:, 0].any()  # scale 0.01: P(X != 0) = 2e-43
    assert np.std(spread[:, 1]) > 1e6


def test_float_draws_are_exact_integers() -> None:
    x = sampling.discrete_laplace_float(np.random.default_rng(16), 2.0**40, 100_000)
    assert x.dtype == np.float64 and np.array_equal(x, np.rint(x))
    assert np.array_equal(
        sampling.discrete_laplace_float(np.random.default_rng(17), 3.0, 1000),
        sampling.discrete_laplace(np.random.default_rng(17), 3.0, 1000),
    )


def test_extreme_scales_stay_sane() -> None:
    rng = np.random.default_rng(15)
    assert not sampling.discrete_laplace(rng, 1e-300, 1000).any()
    assert not sampling.discrete_gaussian(rng, 1e-300, 1000).any()
    huge = sampling.discrete_laplace(rng, sampling.MAX_SCALE, 10_000)
    assert np.all(np.abs(huge) < 2**53)
    assert np.std(huge) > sampling.MAX_SCALE  # sd is √2 · scale
    wide = sampling.discrete_gaussian(rng, sampling.MAX_SIGMA, 10_000)
    assert np.all(np.abs(wide) < 2**53)
    assert 0.9 < np.std(wide) / sampling.MAX_SIGMA < 1.1


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, 2 * sampling.MAX_SCALE])
def test_bad_scales_are_refused(bad: float) -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        sampling.discrete_laplace(rng, bad, 3)
    with pytest.raises(ValueError):
        sampling.discrete_gaussian(rng, bad, 3)
    with pytest.raises(ValueError):
        sampling.discrete_laplace(rng, np.array([1.0, bad]), 3)


def test_discrete_laplace_tail_formula() -> None:
    for scale in (0.4, 3.0, 250.0):
        k = np.arange(-math.ceil(80 * scale) - 5, math.ceil(80 * scale) + 6)
        pmf = _laplace_pmf(scale, k)
        for j in (0, 1, 2, 5, math.ceil(scale) + 1):
            assert sampling.discrete_laplace_tail(scale, j) == pytest.approx(
                pmf[np.abs(k) >= j].sum(), rel=1e-9
            )


@pytest.mark.parametrize("scale", [0.05, 0.7, 3.0, 33.3, 5000.0])
@pytest.mark.parametrize("level", [0.5, 0.95, 0.999])
def test_discrete_laplace_halfwidth_is_the_smallest(scale: float, level: float) -> None:
    k = sampling.discrete_laplace_halfwidth(scale, level)
    assert 1.0 - sampling.discrete_laplace_tail(scale, k + 1) >= level
    if k > 0:
        assert 1.0 - sampling.discrete_laplace_tail(scale, k) < level


@pytest.mark.parametrize("sigma", [0.3, 1.0, 5.5, 300.0, 4000.0, 5000.0, 60000.0])
def test_discrete_gaussian_halfwidth_is_the_smallest(sigma: float) -> None:
    k = sampling.discrete_gaussian_halfwidth(sigma, 0.95)
    if sigma <= 5000:
        support = np.arange(-k - 1, k + 2)
        central = _gaussian_pmf(sigma, support)
        assert central[1:-1].sum() >= 0.95
        assert central[2:-2].sum() < 0.95
    else:  # beyond brute force: the continuous quantile to within one unit
        assert abs(k - sigma * stats.norm.ppf(0.975)) <= 1.5


@pytest.mark.parametrize(
    ("draw", "halfwidth", "exact"),
    [
        (
            lambda rng: sampling.discrete_laplace(rng, 2.5, N),
            sampling.discrete_laplace_halfwidth(2.5),
            lambda k: 1 - sampling.discrete_laplace_tail(2.5, k + 1),
        ),
        (
            lambda rng: sampling.discrete_gaussian(rng, 2.5, N),
            sampling.discrete_gaussian_halfwidth(2.5),
            lambda k: _gaussian_pmf(2.5, np.arange(-k, k + 1)).sum(),
        ),
    ],
    ids=["laplace", "gaussian"],
)
def test_halfwidth_coverage_monte_carlo(
    draw: Callable[[np.random.Generator], np.ndarray],
    halfwidth: int,
    exact: Callable[[int], float],
) -> None:
    x = draw(np.random.default_rng(16))
    covered = np.count_nonzero(np.abs(x) <= halfwidth) / x.size
    p = exact(halfwidth)
    assert p >= 0.95
    assert abs(covered - p) <= Z * math.sqrt(p * (1 - p) / x.size)


@pytest.mark.parametrize("sigma", [0.25, 0.9, 7.0, 4000.0, 4100.0, 20000.0])
def test_discrete_gaussian_tail_bounds_contain_the_exact_tail(sigma: float) -> None:
    support = np.arange(-math.ceil(14 * sigma) - 20, math.ceil(14 * sigma) + 21)
    pmf = _gaussian_pmf(sigma, support)
    upper_tail = np.cumsum(pmf[::-1])[::-1]  # P(X >= support[i])
    points = (-3 * sigma, -1, 0, 1, 2, sigma / 2, sigma, 2.5 * sigma, 5 * sigma, 9 * sigma)
    for k in (math.floor(point) for point in points):
        lo, hi = sampling.discrete_gaussian_sf_bounds(sigma, k)
        exact = upper_tail[k - support[0]]
        tol = 1e-11 * exact  # the brute-force reference itself rounds
        assert lo - tol <= exact <= hi + tol
        assert hi - lo <= 1e-5 * exact + 1e-300


def test_normalizer_and_pmf() -> None:
    for sigma in (0.1, 0.6, 1.0, 2.0, 50.0):
        k = np.arange(-math.ceil(40 * sigma) - 5, math.ceil(40 * sigma) + 6)
        assert sampling.discrete_gaussian_pmf(sigma, k).sum() == pytest.approx(1.0, rel=1e-12)
        assert np.allclose(sampling.discrete_gaussian_pmf(sigma, k), _gaussian_pmf(sigma, k))


powers = st.integers(min_value=-40, max_value=40).map(lambda e: math.ldexp(1.0, e))
values = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)


@given(values, powers)
def test_snap_returns_exact_multiples_of_the_grid(x: float, grid: float) -> None:
    s = sampling.snap(x, grid)
    assert (s / grid).is_integer()
    assert abs(s - x) <= grid / 2
    assert sampling.snap(s, grid) == s


@given(st.lists(values, min_size=1, max_size=20), powers)
def test_snap_vectorized_matches_scalar(xs: list[float], grid: float) -> None:
    snapped = sampling.snap(np.array(xs), grid)
    assert snapped.tolist() == [sampling.snap(x, grid) for x in xs]


@given(st.floats(min_value=1e-200, max_value=1e200))
def test_grid_for_is_the_largest_power_of_two_below(scale: float) -> None:
    g = sampling.grid_for(scale)
    assert sampling.is_power_of_two(g)
    assert g <= scale / sampling.GRID_RESOLUTION < 2 * g


def test_snap_refuses_a_grid_that_is_not_a_power_of_two() -> None:
    with pytest.raises(ValueError):
        sampling.snap(1.0, 0.3)
    with pytest.raises(ValueError):
        sampling.grid_for(1.0, resolution=1000)


@settings(max_examples=25, deadline=None)
@given(st.floats(min_value=0.01, max_value=1e6), st.integers(min_value=0, max_value=2**31))
def test_discrete_laplace_is_integer_and_scaled(scale: float, seed: int) -> None:
    x = sampling.discrete_laplace(np.random.default_rng(seed), scale, 64)
    assert x.dtype == np.int64
    assert np.all(np.abs(x) <= 60 * scale + 60)


# -- exactness: forced bit streams, boundary cells, the tiers ------------------------------


def _forced(words: list[int], seed: int = 0) -> np.random.Generator:
    """A generator whose raw 64-bit words are ``words``, then a seeded PCG64 stream.

    The samplers read only raw words, so this drives them with chosen bits.
    """
    queue = list(words)
    rest = np.random.default_rng(seed).bit_generator

    def next_64(_state: int) -> int:
        return queue.pop(0) if queue else int(rest.random_raw())

    return np.random.Generator(UserBitGenerator(next_64, 64))


def _threshold(scale: float, k: int, prec: int = 80) -> Decimal:
    """T_k = P(|X| >= k) = 2 p^k / (1 + p), p = e^(-1/scale), in high precision (k >= 1)."""
    with localcontext() as ctx:
        ctx.prec = prec
        p = (-1 / Decimal(scale)).exp()
        return 2 * p**k / (1 + p)


def _reference_magnitude(words: list[int], scale: float) -> int:
    """|X| from the definition: the k with T_(k+1) <= U < T_k, U's bits read as needed.

    Independent of the sampler: compares U's cell with the thresholds themselves
    (exp, not log) at 120 digits and reads another word while a threshold is
    inside the cell. ``words[0]`` carries the sign bit, which is dropped.
    """
    num, bits, i = words[0] & ((1 << 63) - 1), 63, 1
    c = math.log1p(math.tanh(0.5 / scale))
    while True:
        with localcontext() as ctx:
            ctx.prec = 120
            lo = Decimal(num) / Decimal(2) ** bits
            hi = Decimal(num + 1) / Decimal(2) ** bits

            def t(k: int) -> Decimal:
                return Decimal(1) if k == 0 else _threshold(scale, k, 120)

            if num:
                # float guesses only bracket the search: the thresholds decide
                lo_k = max(0, int(scale * (c - float(hi.ln()))) - 3)
                hi_k = int(scale * (c - float(lo.ln()))) + 3
                while t(lo_k) < hi:
                    lo_k //= 2
                while lo_k < hi_k:  # the largest k with T_k >= hi
                    mid = (lo_k + hi_k + 1) // 2
                    lo_k, hi_k = (mid, hi_k) if t(mid) >= hi else (lo_k, mid - 1)
                if t(lo_k + 1) <= lo:  # [lo, hi) inside [T_(k+1), T_k)
                    return lo_k
        num, bits, i = (num << 64) | words[i], bits + 64, i + 1


def test_zero_bits_give_values_far_beyond_the_old_cut() -> None:
    """Catches the cut tail: numpy's exponential never exceeds 44.43, so the old sampler
    never returned |X| > 44.43 s + 1. Here U's first 63 bits are zero (the sign bit too)
    and U = 2^40 2^-127 ~ 2^-87, so |X| = ⌊s (87 ln 2 + c)⌋ = 60 at s = 1."""
    words = [0, 1 << 40]
    x = int(sampling.discrete_laplace(_forced(words), 1.0, 1)[0])
    assert x == _reference_magnitude(words, 1.0) == 60
    assert x > 44.43 * 1.0 + 1
    # five zero words: U < 2^-383 and |X| ~ 383 ln 2 s; the top bit set makes it negative
    words = [1 << 63, 0, 0, 0, 0, 12345]
    x = int(sampling.discrete_laplace(_forced(words), 2.5, 1)[0])
    assert x == -_reference_magnitude(words, 2.5)
    assert x < -(383 * math.log(2) - 15) * 2.5


@pytest.mark.parametrize("scale", [0.4, 1.0, 7.3, 1000.0, 2.0**30, 2.0**36])
def test_boundary_cells_follow_the_exact_thresholds(scale: float) -> None:
    """At every threshold T_k: the cells just below and just above decide k and k - 1,
    and the cell containing T_k reads another word and decides by it, both ways.

    These are the cells where a float error would show; the decisions match the
    definition exactly, so each k gets probability T_k - T_(k+1) to the last bit.
    """
    ks = sorted({1, 2, 3, max(1, round(scale)), max(1, round(3 * scale)), round(40 * scale) + 1})
    for k in ks:
        t_k = _threshold(scale, k) * Decimal(2) ** 63
        r = int(t_k)  # the 63-bit cell containing T_k
        cases = [[r - 1], [r + 1]]
        below = int((t_k - r) * Decimal(2) ** 64)  # T_k inside the refined cell of word `below`
        cases += [[r, below - 1], [r, below + 1], [r, below, 0], [r, below, (1 << 64) - 1]]
        for words in cases:
            if not 0 <= words[-1] < 1 << 64:
                continue
            got = int(sampling.discrete_laplace(_forced(words, seed=k), scale, 1)[0])
            want = _reference_magnitude([*words, *np.random.default_rng(k).bit_generator
                                         .random_raw(4).tolist()], scale)
            assert got == want, (k, words)
        if r > scale * 2**20:  # the neighbouring cells are then inside one step of |X|
            assert int(sampling.discrete_laplace(_forced([r - 1]), scale, 1)[0]) == k
            assert int(sampling.discrete_laplace(_forced([r + 1]), scale, 1)[0]) == k - 1


@pytest.mark.parametrize("scale", [0.7, 5.0, 3.0e4, 2.0**36])
def test_every_tier_agrees_with_the_definition(scale: float) -> None:
    """Random words of every size class (tier 1: r >= 2^43; tier 2: 0 < r < 2^43; tier 3:
    r = 0, and cells straddling a threshold), against ``_reference_magnitude``."""
    rng = np.random.default_rng(21)
    for top in (63, 50, 43, 30, 10, 1, 0):
        for _ in range(12):
            first = int(rng.integers(0, 1 << top)) if top else 0
            words = [first, *rng.integers(0, 1 << 64, size=6, dtype=np.uint64).tolist()]
            got = int(sampling.discrete_laplace(_forced(words), scale, 1)[0])
            assert got == _reference_magnitude(words, scale), (top, words)


# -- large scales: |X| = 0 or 1 + m Q + R, from two words --------------------------------


def _count_below(t: Callable[[int], Decimal], words: list[int], guess: float) -> tuple[int, int]:
    """n = #{j >= 0 : U < t(j)} for a decreasing t, U's bits read from ``words`` as needed
    (an undecided cell reads the next word); returns n and the number of words read."""
    num, bits, i = words[0], 63, 1
    while True:
        with localcontext() as ctx:
            ctx.prec = 120
            lo = Decimal(num) / Decimal(2) ** bits
            hi = Decimal(num + 1) / Decimal(2) ** bits
            a, b = max(0, int(guess) - 3), max(3, int(guess) + 3)  # n in [a, b]: widened
            while a > 0 and t(a - 1) < hi:
                a = max(0, 2 * a - b - 1)
            while t(b) >= hi:
                b = 2 * b + 1
            while a < b:  # the first j with t(j) < hi
                mid = (a + b) // 2
                a, b = (mid + 1, b) if t(mid) >= hi else (a, mid)
            if t(a) <= lo:
                return a, i
        num, bits, i = (num << 64) | words[i], bits + 64, i + 1


def _reference_split(words: list[int], scale: float) -> int:
    """|X| for a scale above SPLIT_SCALE, from the thresholds themselves (120 digits).

    Q' = #{j >= 0 : U < T_(1 + m j)} - 1 (U's first word without its sign bit, then
    refinements), and when Q' >= 0, R = #{1 <= j < m : W >= (1 - p^j)/(1 - p^m)} from
    the next words (W's first word shifted right once): |X| = 1 + m Q' + R."""
    m = int(sampling._split_unit(scale))
    with localcontext() as ctx:
        ctx.prec = 120
        p = (-1 / Decimal(scale)).exp()
        pm = p**m

    def t_q(j: int) -> Decimal:
        with localcontext() as ctx:
            ctx.prec = 120
            return 2 * p ** (1 + m * j) / (1 + p)

    def t_r(i: int) -> Decimal:  # a_(m-1-i), a_j = (1 - p^j)/(1 - p^m): R >= j iff W >= a_j
        with localcontext() as ctx:
            ctx.prec = 120
            return (1 - p ** (m - 1 - i)) / (1 - pm) if i < m - 1 else Decimal(0)

    u = [words[0] & ((1 << 63) - 1), *words[1:]]
    first = u[0] / 2.0**63
    guess_q = -math.log(max(first, 2.0**-63)) * scale / m
    n, used = _count_below(t_q, u, guess_q)
    w = [words[used] >> 1, *words[used + 1 :]]
    guess_r = -scale * math.log1p(-(w[0] / 2.0**63) * -math.expm1(-m / scale))
    below, _ = _count_below(t_r, w, m - 1 - guess_r)
    r = m - 1 - below
    return 0 if n == 0 else 1 + m * (n - 1) + r


def _signed(words: list[int], scale: float) -> int:
    magnitude = _reference_split(words, scale)
    return -magnitude if words[0] >> 63 else magnitude


@pytest.mark.parametrize("scale", [2.0**36 * 1.5, 2.0**40, sampling.MAX_SCALE])
def test_split_boundary_cells_follow_the_exact_thresholds(scale: float) -> None:
    """Catches an inexact split: at Q's thresholds T_(1+mj) and R's thresholds, the cells
    on either side and the straddling cell refined both ways match the definition."""
    m = int(sampling._split_unit(scale))
    assert scale > sampling.SPLIT_SCALE and 2**19 <= scale / m < 2**20
    tail = np.random.default_rng(5).bit_generator.random_raw(6).tolist()
    cases: list[list[int]] = []
    with localcontext() as ctx:
        ctx.prec = 80
        for j in (0, 1, 3, 30):
            edge = _threshold(scale, 1 + m * j) * Decimal(2) ** 63
            r = int(edge)
            below = int((edge - r) * Decimal(2) ** 64)
            cases += [[r - 1, 1 << 61], [r + 1, 1 << 61]]
            cases += [[r, below - 1, 5 << 60], [r, below + 1, 7]]
        p = (-1 / Decimal(scale)).exp()
        for j in (1, 2, m // 3, m - 1):
            edge = (1 - p**j) / (1 - p**m) * Decimal(2) ** 63
            w = int(edge)
            below = int((edge - w) * Decimal(2) ** 64)
            u = 1 << 62  # Q' = 0 or so, decided by the first word
            cases += [[u, (w - 1) << 1], [u, (w + 1) << 1], [u, w << 1, below - 1]]
            cases += [[u, w << 1, below + 1], [u | 1 << 63, (w + 1) << 1 | 1]]
    cases += [[0, 1 << 40, 3 << 61], [1 << 63, 0, 0, 99, 5], [1 << 30, 1 << 62], [(1 << 63) - 1, 0]]
    for words in cases:
        if not all(0 <= word < 1 << 64 for word in words):
            continue  # the edge is within 2^-127 of a cell boundary (T_1 at MAX_SCALE)
        got = int(sampling.discrete_laplace(_forced(words, seed=5), scale, 1)[0])
        assert got == _signed([*words, *tail], scale), (scale, words)


@pytest.mark.parametrize("scale", [2.0**36 * 1.01, 2.0**43 / 3])
def test_split_tiers_agree_with_the_definition(scale: float) -> None:
    """Random words of every size class for Q (tier 1, tier 2 below 2^43, tier 3 at 0)."""
    rng = np.random.default_rng(22)
    for top in (63, 50, 43, 30, 1, 0):
        for _ in range(6):
            first = int(rng.integers(0, 1 << top)) if top else 0
            words = [first, *rng.integers(0, 1 << 64, size=6, dtype=np.uint64).tolist()]
            got = int(sampling.discrete_laplace(_forced(words), scale, 1)[0])
            assert got == _signed(words, scale), (top, words)


@pytest.mark.parametrize("scale", [2.5, 40.0])
def test_split_draws_match_exact_pmf(monkeypatch: pytest.MonkeyPatch, scale: float) -> None:
    """The decomposition itself, at scales where every cell is checkable: split every
    draw with s/m in [1/2, 1) (m = 4 at 2.5, 64 at 40) and compare with the pmf."""
    monkeypatch.setattr(sampling, "SPLIT_SCALE", 1.0)
    monkeypatch.setattr(sampling, "_SPLIT_BITS", 0)
    assert sampling._split_unit(scale) == (4.0 if scale == 2.5 else 64.0)
    draws = sampling.discrete_laplace(np.random.default_rng(33), scale, N)
    support = np.arange(-math.ceil(60 * scale) - 5, math.ceil(60 * scale) + 6)
    assert _chisquare(draws, _laplace_pmf(scale, support), support) > 1e-3
    mixed = sampling.discrete_laplace(np.random.default_rng(34), np.array([0.5, scale]), N)
    for column, s in ((0, 0.5), (1, scale)):
        assert _chisquare(mixed[:, column], _laplace_pmf(s, support), support) > 1e-3


def test_large_scale_quotient_and_remainder_frequencies() -> None:
    """At 2^40 (m = 2^20): P(|X| >= 1 + m j) = T_(1+mj) for j = 1, 2, 4 and the remainder
    (|X| - 1) mod m has P(R >= m/4) = (p^(m/4) - p^m)/(1 - p^m), within 4.5 standard errors."""
    scale, n = 2.0**40, 400_000
    m = int(sampling._split_unit(scale))
    x = np.abs(sampling.discrete_laplace(np.random.default_rng(35), scale, n))
    for k in (1 + m, 1 + 2 * m, 1 + 4 * m, 1 + int(scale)):
        p_k = sampling.discrete_laplace_tail(scale, k)
        assert abs(np.count_nonzero(x >= k) / n - p_k) <= Z * math.sqrt(p_k * (1 - p_k) / n)
    r = (x - 1) % m
    p = math.exp(-1 / scale)
    p_r = (p ** (m // 4) - p**m) / (1 - p**m)
    assert abs(np.count_nonzero(r >= m // 4) / n - p_r) <= Z * math.sqrt(p_r * (1 - p_r) / n)


def test_vector_scales_mix_split_and_one_word_draws() -> None:
    """Word order with a vector of scales: one word per coordinate (row-major), the
    refinements of the undecided ones, then one word per split coordinate for R."""
    scales = np.array([3.0, 2.0**40, 2.0**45])
    words = [1 << 62, 3 << 61, 0, 5 << 59, 1 << 63 | 1 << 50, 7 << 60]
    extra = [(1 << 64) - 5, 11 << 58, 13 << 59, 17 << 58, 19 << 58]
    got = sampling.discrete_laplace(_forced([*words, *extra]), scales, 2).reshape(-1)
    # word 2 (0) reads extra[0]; then R's words in order: extra[1:] for coordinates 1, 2, 4, 5
    want = [
        _reference_magnitude([words[0]], 3.0),
        _signed([words[1], extra[1]], 2.0**40),
        _signed([words[2], extra[0], extra[2]], 2.0**45),
        _reference_magnitude([words[3]], 3.0),
        _signed([words[4], extra[3]], 2.0**40),
        _signed([words[5], extra[4]], 2.0**45),
    ]
    assert got.tolist() == want


def test_vector_scales_are_exact_per_coordinate() -> None:
    """The ICLP form: one word per coordinate, each decided with its own scale."""
    scales = np.array([0.5, 3.0, 2.0**25])
    words = [5 << 50, 1 << 62, (1 << 63) - 1, 0, 1 << 50, 3 << 60]
    got = sampling.discrete_laplace(_forced(words), scales, 2)
    # the first row takes the words 0..2, the second 3..5; word 3 is zero, so its draw
    # (in tier 3) reads the next word of the stream, which is the seeded PCG64's first
    extra = np.random.default_rng(0).bit_generator.random_raw(2).tolist()
    want = [_reference_magnitude([w], s) for w, s in zip(words[:3], scales, strict=True)]
    want += [_reference_magnitude([words[3], *extra], scales[0])]
    want += [_reference_magnitude([w], s) for w, s in zip(words[4:], scales[1:], strict=True)]
    assert got.reshape(-1).tolist() == want


def test_a_broken_bit_source_raises_instead_of_truncating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "MAX_EXTRA_WORDS", 4)
    with pytest.raises(RuntimeError):
        sampling.discrete_laplace(_forced([0] * 10), 1.0, 1)


def test_numpy_logs_are_as_accurate_as_the_margins_assume() -> None:
    """Tiers 1 and 2 assume np.log errs by at most 4 ulp (then keep a 64-fold margin),
    and the Gaussian's acceptance table the same of np.exp: measured against correctly
    rounded decimal values, over the arguments they see."""
    rng = np.random.default_rng(22)
    r = np.concatenate([rng.integers(1 << 43, 1 << 63, 400), rng.integers(1, 1 << 43, 200)])
    for dtype in (np.float64, np.longdouble):
        u = r.astype(dtype) * dtype(2.0**-63)
        got = np.log(u)
        eps = Decimal(float(np.finfo(dtype).eps))
        with localcontext() as ctx:
            ctx.prec = 60
            for ui, gi in zip(u, got, strict=True):
                exact = _exact(ui).ln()
                assert abs(_exact(gi) - exact) <= 4 * eps * abs(exact)
    # the acceptance table assumes the same of np.exp on -γ in [-61, 0]
    g = -np.concatenate([rng.uniform(0.0, 61.0, 500), rng.uniform(0.0, 1e-6, 100)])
    with localcontext() as ctx:
        ctx.prec = 60
        for gi, ei in zip(g, np.exp(g), strict=True):
            exact = _exact(gi).exp()
            assert abs(_exact(ei) - exact) <= 4 * Decimal(2.0**-52) * exact


def _exact(x: np.floating) -> Decimal:
    num, den = x.as_integer_ratio()
    return Decimal(num) / Decimal(den)


def _accepters(sigma: float) -> tuple[sampling._AcceptTable, sampling._AcceptLog]:
    t = math.floor(sigma) + 1
    return sampling._AcceptTable(sigma, t), sampling._AcceptLog(sigma, t)


def _edge(gamma: Fraction) -> Decimal:
    """exp(-γ) 2^63 at 80 digits: V's cells below it accept, above it reject."""
    with localcontext() as ctx:
        ctx.prec = 80
        return (-(Decimal(gamma.numerator) / Decimal(gamma.denominator))).exp() * 2**63


@pytest.mark.parametrize("sigma", [0.3, 1.0, 4.6, 1000.0])
def test_gaussian_acceptance_at_the_exact_threshold(sigma: float) -> None:
    """V's cells next to exp(-γ): accept below, reject above, and the cell containing it
    reads more bits and decides by them; the table and the log test, and the exact tier."""
    t = math.floor(sigma) + 1
    gamma_of = sampling._GaussianExponent(sigma, t)
    for y in (0, 1, t, 2 * t, 3 * t + 1):
        gamma = gamma_of(y)
        edge = _edge(gamma)
        v = int(edge)
        if v < 2:
            continue
        below = int((edge - v) * Decimal(2) ** 64)
        cells = np.array([v - 1, v + 1, v, v], dtype=np.uint64)
        for accepts in _accepters(sigma):
            # the two cells at v are refined by the forced words, in order
            got = accepts(_forced([below - 1, below + 1]), np.full(4, y), cells.copy())
            assert got.tolist() == [True, False, True, False], (type(accepts), y)
        rng = np.random.default_rng(0)
        assert sampling.exact_accept(rng, v - 1, gamma) is True
        assert sampling.exact_accept(rng, v + 1, gamma) is False
        assert sampling.exact_accept(_forced([below - 1]), v, gamma) is True
        assert sampling.exact_accept(_forced([below + 1]), v, gamma) is False


@pytest.mark.parametrize("sigma", [1e-300, 0.3, 0.5, 1.0, 3.0, 4.6, 37.5, 1000.0, 4096.0])
def test_acceptance_table_brackets_the_exact_edges(sigma: float) -> None:
    """Catches a wrong table entry: lo_k <= exp(-γ_k) 2^63 <= hi_k for every k (at 80
    digits), hi_k - lo_k < _NEAR (so the one-table test sees every undecided cell), and
    the last entry, used for every larger k, rejects all but v = 0."""
    t = math.floor(sigma) + 1
    table = sampling._AcceptTable(sigma, t)
    gamma_of = sampling._GaussianExponent(sigma, t)
    ks = np.unique(np.linspace(0, table.lo.size - 1, 400).astype(int)).tolist()
    for k in ks:
        edge = _edge(gamma_of(k))
        assert int(table.lo[k]) <= edge <= int(table.hi[k]), (k, edge)
        assert int(table.hi[k]) - int(table.lo[k]) < int(sampling._NEAR)
    last = table.lo.size - 1
    assert gamma_of(last) > 50 and (table.lo[last], table.hi[last]) == (0, 1)


@pytest.mark.parametrize("sigma", [0.45, 2.2, 600.0])
def test_table_and_log_acceptance_agree(sigma: float) -> None:
    """Both acceptance tests are exact, so on random cells (a straddle has probability
    ~2^-60) they decide alike, also past the table's end and for tiny v (exact tier)."""
    t = math.floor(sigma) + 1
    table, log = _accepters(sigma)
    rng = np.random.default_rng(31)
    k = np.concatenate([np.arange(table.lo.size + 5), rng.integers(0, 4 * t, 3000)])
    k = np.repeat(k, 8)
    v = rng.integers(0, 1 << 63, k.size, dtype=np.uint64)
    v[::97] >>= np.uint64(30)  # some cells the log test leaves to the exact tier
    got_table = table(np.random.default_rng(1), k, v.copy())
    got_log = log(np.random.default_rng(1), k, v.copy())
    assert np.array_equal(got_table, got_log)
    assert 0.05 < got_table.mean() < 0.95


@pytest.mark.parametrize("sigma", [0.8, 3.7, 40.0])
def test_log_acceptance_matches_exact_pmf(monkeypatch: pytest.MonkeyPatch, sigma: float) -> None:
    """The large-σ path (log acceptance) at σ where the pmf is checkable cell by cell."""
    monkeypatch.setattr(sampling, "TABLE_SIGMA", 0.0)
    draws = sampling.discrete_gaussian(np.random.default_rng(32), sigma, N)
    support = np.arange(-math.ceil(12 * sigma) - 5, math.ceil(12 * sigma) + 6)
    assert _chisquare(draws, _gaussian_pmf(sigma, support), support) > 1e-3


def test_gaussian_tail_beyond_the_old_cut() -> None:
    """Catches the cut proposal tail: at σ = 1 (t = 2) the old exponential stopped at
    |Y| = 89; here U ~ 2^-87 gives |Y| = 120, accepted as V < exp(-γ) ~ 2^-10000.

    One draw runs a batch of 65 proposals: their words, the extra word of the first
    one (tier 3, r = 0), the 65 words of V (the first 0, the rest 1 - 2^-63, which
    reject), then zero words for the first V until it is below exp(-γ)."""
    magnitude = _reference_magnitude([0, 1 << 40], 2.0)
    assert magnitude > 89
    gamma = sampling._GaussianExponent(1.0, 2)(magnitude)
    zeros = math.ceil(float(gamma) / math.log(2) / 64) + 1
    words = [0] + [(1 << 63) - 1] * 64 + [1 << 40] + [0] + [(1 << 64) - 1] * 64
    x = sampling.discrete_gaussian(_forced([*words, *[0] * zeros, 1]), 1.0, 1)
    assert x.tolist() == [magnitude]


def test_tail_frequencies_at_a_fixed_seed() -> None:
    """P(|X| >= k) = T_k in the far tail too (k ~ 12 scale units, T_k ~ 6e-6)."""
    scale, n = 1.0, 2_000_000
    x = np.abs(sampling.discrete_laplace(np.random.default_rng(23), scale, n))
    for k in (5, 9, 12):
        p = sampling.discrete_laplace_tail(scale, k)
        assert abs(np.count_nonzero(x >= k) / n - p) <= Z * math.sqrt(p * (1 - p) / n)


def test_the_service_generator_drives_the_samplers() -> None:
    """randomgen's AESCounter (``mechanisms.rng``) gives raw words the same way."""
    rng = secure_generator(24)
    x = sampling.discrete_laplace(rng, 2.5, N)
    support = np.arange(-200, 201)
    assert _chisquare(x, _laplace_pmf(2.5, support), support) > 1e-3
    g = sampling.discrete_gaussian(rng, 3.7, N)
    support = np.arange(-60, 61)
    assert _chisquare(g, _gaussian_pmf(3.7, support), support) > 1e-3


def test_discrete_gaussian_trials_are_the_same_draws_with_their_proposals() -> None:
    """The audit's work counter: the same draws as ``discrete_gaussian`` from the same
    generator, each with the proposals it took (>= 1): geometric with the acceptance rate
    a = Σ_y L(y)·exp(−(|y| − σ²/t)²/(2σ²)) (L the discrete Laplace of scale t = ⌊σ⌋ + 1),
    fixed by σ whatever the data the noise is added to (mean 1/a within 4.5 SE)."""
    sigma, n = 2.5, 50_000
    plain = sampling.discrete_gaussian(np.random.default_rng(4), sigma, n)
    draws, trials = sampling.discrete_gaussian_trials(np.random.default_rng(4), sigma, n)
    assert np.array_equal(plain, draws)
    assert trials.min() >= 1 and trials.shape == draws.shape
    t = math.floor(sigma) + 1
    p = math.exp(-1.0 / t)
    y = np.arange(-400, 401)
    rate = float(np.sum((1 - p) / (1 + p) * p ** np.abs(y)
                        * np.exp(-((np.abs(y) - sigma**2 / t) ** 2) / (2 * sigma**2))))
    se = math.sqrt((1 - rate) / rate**2 / n)
    assert abs(trials.mean() - 1 / rate) <= 4.5 * se


@pytest.mark.parametrize("scale", [1.0, 7.3, 2.0**40])
def test_the_long_double_tier_does_the_same_work_whatever_the_noise(
        monkeypatch: pytest.MonkeyPatch, scale: float) -> None:
    """Issue 27: a draw whose U is below 2^-20 (the largest |X|) took the long-double tier
    and the others skipped it, so the run time told an extreme noise draw apart. Every call
    now runs that tier on ``tier2_slots`` words (the undecided ones, then padding): the
    same count for four ordinary words as for three and one tiny one, and the same value
    for the tiny one as the exact definition."""
    seen: list[int] = []
    slow = sampling._slow_magnitude

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(len(args[1]))  # type: ignore[arg-type]
        return slow(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sampling, "_slow_magnitude", spy)
    ordinary = [(1 << 62) + 12345 * i for i in range(1, 5)]
    extreme = [*ordinary[:3], 1 << 30]  # U ~ 2^-33: tier 1 leaves it undecided
    plain = sampling.discrete_laplace(_forced(ordinary + [7] * 8), scale, 4)
    tail = sampling.discrete_laplace(_forced(extreme + [7] * 8), scale, 4)
    assert seen[0] == seen[1] >= 8  # split draws size the band at s/m
    if scale <= sampling.SPLIT_SCALE:
        assert seen[0] == sampling.tier2_slots(4, scale)
    assert plain[:3].tolist() == tail[:3].tolist()
    if scale <= sampling.SPLIT_SCALE:
        assert abs(int(tail[3])) == _reference_magnitude([1 << 30], scale)


def test_the_exact_tier_runs_a_public_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: the exact (``decimal``) tier ran only for the rare draws the float tiers
    could not place, which depend on the noise's size. Now a call runs it at least
    ``exact_slots`` times (dummies after the real ones): once for ordinary words, once for
    a run of zero bits that needs it, and the value is still the exact one."""
    calls: list[int] = []
    exact = sampling._exact_magnitude

    def spy(*args: object, **kwargs: object) -> int:
        calls.append(1)
        return exact(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sampling, "_exact_magnitude", spy)
    assert sampling.exact_slots(1, sampling.laplace_exact_rate(1.0)) == 1
    sampling.discrete_laplace(_forced([(1 << 62) + 99]), 1.0, 1)
    ordinary = len(calls)
    words = [0, 1 << 40]  # U ~ 2^-87: only the exact tier can place it
    x = int(sampling.discrete_laplace(_forced(words), 1.0, 1)[0])
    assert ordinary == len(calls) - ordinary == 1
    assert x == _reference_magnitude(words, 1.0)


def test_padding_never_reads_the_jobs_stream() -> None:
    """The dummies use their own generator: the same seed gives the same draws and leaves
    the job's generator where the unpadded sampler left it (one word per draw here)."""
    rng = np.random.default_rng(5)
    sampling.discrete_laplace(rng, 2.0, 64)
    after = rng.bit_generator.state
    again = np.random.default_rng(5)
    sampling.raw_words(again, 64)
    assert after == again.bit_generator.state
