"""Certificates against brute force, the corrected level rule, and the paper's off-by-one.

The brute-force counters slide a length-S interval across the bins at every
adversarial alignment (edges and edges − S, ± a tiny shift), all in exact
fractions, so they check the closed forms rather than re-derive them.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import noiseless as nl
from tests.unit.noiseless.brute import grid, worst_slice_count

F = Fraction
TINY = F(1, 10**9)
ONE = F(1)


def _aligned_starts(edges: list[Fraction], s: Fraction) -> set[Fraction]:
    """Interval starts that put an end on, just before or just after an edge."""
    starts: set[Fraction] = set()
    for e in edges:
        for a in (e, e - s):
            starts.update((a, a - TINY * s, a + TINY * s))
    return {a for a in starts if edges[0] <= a and a + s <= edges[-1]}


def _brute_uniform(q: int, s: Fraction, r: Fraction = ONE) -> int:
    quantizer = nl.UniformQuantizer(0, r, q)
    edges = [r * k / q for k in range(q + 1)]
    return max(
        (quantizer.index(a + s) - quantizer.index(a) + 1 for a in _aligned_starts(edges, s)),
        default=1,
    )


def _brute_edges(edges: list[Fraction], s: Fraction) -> int:
    def index(y: Fraction) -> int:
        inner = sum(1 for e in edges[1:-1] if e <= y)
        return min(inner, len(edges) - 2)

    return max(
        (index(a + s) - index(a) + 1 for a in _aligned_starts(edges, s)),
        default=1,
    )


@pytest.mark.parametrize("q", [1, 2, 3, 5, 8, 13, 21, 29])
def test_max_outputs_uniform_equals_brute_force(q: int) -> None:
    for k in range(1, 41):
        s = F(k, 40)
        assert nl.max_outputs_uniform(q, s, 1) == _brute_uniform(q, s)


def test_certified_count_uniform_is_exact_or_one_above_on_integer_ratios() -> None:
    for q in range(1, 30):
        for k in range(1, 41):
            s = F(k, 40)
            exact = nl.max_outputs_uniform(q, s, 1)
            cert = nl.certified_count_uniform(q, s, 1)
            assert cert >= exact
            if cert > exact:
                assert cert == exact + 1
                assert (q * s).denominator == 1  # qS/R an integer: the documented +1
    assert nl.certified_count_uniform(7, 0, 1) == nl.max_outputs_uniform(7, 0, 1) == 1


@pytest.mark.parametrize(
    ("n", "bits", "paper_q", "paper_count", "exact_q", "safe_q"),
    [  # spec §6.2 worked table (mean of n records in [0, 1]: R/S = n)
        (4, 1, 8, 3, 4, 3),
        (4, 2, 16, 5, 12, 11),
        (8, 3, 64, 9, 56, 55),
        (100, 1, 200, 3, 100, 99),
        (100, 2, 400, 5, 300, 299),
        (2, 2, 8, 5, 6, 5),
    ],
)
def test_spec_level_table(
    n: int, bits: int, paper_q: int, paper_count: int, exact_q: int, safe_q: int
) -> None:
    s, r = F(1, n), F(1)
    k = nl.levels_for_bits(bits)
    assert nl.paper_levels(bits, s, r) == paper_q
    assert nl.max_outputs_uniform(paper_q, s, r) == paper_count > k
    assert nl.exact_levels(k, s, r) == exact_q
    assert nl.max_outputs_uniform(exact_q, s, r) <= k
    assert nl.max_outputs_uniform(exact_q + 1, s, r) > k  # exact_levels is the largest
    assert nl.safe_levels(k, s, r) == safe_q
    assert nl.certified_count_uniform(safe_q, s, r) == k


def test_paper_rule_exceeds_its_budget_on_the_spec_counterexample() -> None:
    """Mean of n = 4 records in [0, 1], ε = 1: the paper's q = 8 lets one record cause 3 > 2."""
    n, bits = 4, 1
    q = nl.paper_levels(bits, F(1, n), F(1))
    assert q == 8
    quantizer = nl.UniformQuantizer(0, 1, q)
    others_at_zero = [quantizer.index((0 + v) / n) for v in grid(64)]  # x_i sweeps [0, 1]
    assert len(set(others_at_zero)) == 3 > 2**bits
    # Definition 1 by brute force over a finite domain: the same violation
    assert worst_slice_count(lambda t: quantizer.index(t / n), grid(8), n) == 3
    # the corrected rule on the same query stays within 2 outputs
    safe = nl.UniformQuantizer(0, 1, nl.safe_levels(2, F(1, n), F(1)))
    assert worst_slice_count(lambda t: safe.index(t / n), grid(8), n) <= 2


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 2**20),
    st.fractions(min_value=F(1, 10**6), max_value=2, max_denominator=10**6),
)
def test_safe_levels_fixed_point(count: int, ratio: Fraction) -> None:
    """certificate(safe_levels(K)) == K for every K and S/R; never finer than the exact rule."""
    s, r = ratio, F(1)
    q = nl.safe_levels(count, s, r)
    assert nl.certified_count_uniform(q, s, r) == count
    assert nl.max_outputs_uniform(q, s, r) <= count
    assert q <= nl.exact_levels(count, s, r)


def test_certified_count_edges_matches_brute_force_on_random_partitions() -> None:
    rnd = random.Random(7)
    for _ in range(300):
        q = rnd.randint(1, 12)
        cuts = sorted({F(rnd.randint(1, 999), 1000) for _ in range(q - 1)})
        edges = [F(0), *cuts, F(1)]
        s = F(rnd.randint(1, 1000), 1000)
        assert nl.certified_count_edges(edges, s) == _brute_edges(edges, s)


def test_certified_count_edges_uniform_equals_closed_form() -> None:
    for q in range(1, 25):
        edges = [F(k, q) for k in range(q + 1)]
        for k in range(1, 30):
            s = F(k, 29)
            assert nl.certified_count_edges(edges, s) == nl.max_outputs_uniform(q, s, 1)


def test_certified_count_dispatches_and_caps_by_domain() -> None:
    uniform = nl.UniformQuantizer(0, 1, 11)
    assert nl.certified_count(uniform, F(1, 4)) == nl.certified_count_uniform(11, F(1, 4), 1)
    assert nl.certified_count(uniform, F(1, 4), domain_size=2) == 2
    edged = nl.EdgeQuantizer([0.0, 0.25, 0.5, 0.75, 1.0])
    assert nl.certified_count(edged, F(1, 4)) == nl.max_outputs_uniform(4, F(1, 4), 1)
    assert nl.certified_count(edged, F(1)) == 4
    # empty bins (repeated edges) are never reached, so never counted
    repeated = nl.EdgeQuantizer([0.0, 0.5, 0.5, 0.5, 1.0])
    assert nl.certified_count(repeated, F(1)) == 2
    # a degenerate closed last bin [1, 1] is one more output
    point = nl.EdgeQuantizer([0.0, 0.5, 1.0, 1.0])
    assert nl.certified_count(point, F(1)) == 3
    # short slices meet at most 2 of those 3 outputs; the certificate may count the point on top
    assert 2 <= nl.certified_count(point, F(1, 10)) <= 3


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        nl.max_outputs_uniform(3, F(-1), 1)
    with pytest.raises(ValueError):
        nl.max_outputs_uniform(3, F(1), 0)
    with pytest.raises(ValueError):
        nl.safe_levels(3, 0, 1)
    with pytest.raises(ValueError):
        nl.certified_count_edges([F(0), F(0)], F(1))
    assert nl.safe_levels(1, 0, 1) == nl.exact_levels(1, 0, 1) == 1
    assert math.isclose(nl.paper_levels(2, F(1, 10), 1), 40)
