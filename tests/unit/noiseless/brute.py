"""Brute-force counters of Definition 1, independent of the certificates under test.

They count distinct outputs by enumerating record values; nothing here
calls a certificate, so a test comparing the two compares two computations.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence
from fractions import Fraction


def sums_of_others(domain: Sequence[Fraction], others: int) -> set[Fraction]:
    """Every reachable sum of ``others`` records from ``domain`` (iterated sumset)."""
    sums = {Fraction(0)}
    for _ in range(others):
        sums = {s + v for s in sums for v in domain}
    return sums


def worst_slice_count(
    output: Callable[[Fraction], Hashable],
    domain: Sequence[Fraction],
    n: int,
) -> int:
    """max over others' sums s of |{output(s + v) : v in domain}| (sum-based queries)."""
    return max(len({output(s + v) for v in domain}) for s in sums_of_others(domain, n - 1))


def worst_tuple_count(
    query: Callable[[tuple[Fraction, ...]], Hashable],
    domain: Sequence[Fraction],
    n: int,
) -> int:
    """Definition 1 literally: max over i and x_{-i} in domain^{n-1} of distinct outputs."""
    worst = 1
    for i in range(n):
        for rest in itertools.product(domain, repeat=n - 1):
            outs = {query((*rest[:i], v, *rest[i:])) for v in domain}
            worst = max(worst, len(outs))
    return worst


def bins_met(index: Callable[[Fraction], int], points: Iterable[Fraction]) -> int:
    """Distinct bins of ``points``."""
    return len({index(p) for p in points})


def grid(m: int, lower: Fraction = Fraction(0), upper: Fraction = Fraction(1)) -> list[Fraction]:
    """{lower, lower + (upper − lower)/m, …, upper}."""
    return [lower + (upper - lower) * Fraction(k, m) for k in range(m + 1)]
