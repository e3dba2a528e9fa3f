"""Composition adds bits (Theorem 6), and the sum can be needed; post-processing is free.

All counts are brute-forced over every value of the other records on a
finite grid, with the first record swept over its whole domain.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from fractions import Fraction

import numpy as np

from mechanisms import noiseless as nl
from tests.unit.noiseless.brute import grid, sums_of_others

F = Fraction
N = 4
DOMAIN = grid(24)


def _joint_worst(output: Callable[[Fraction], Hashable]) -> int:
    """max over others' sums of distinct joint outputs (queries depending on the sum only)."""
    return max(len({output(s + v) for v in DOMAIN}) for s in sums_of_others(DOMAIN, N - 1))


def test_two_releases_cost_the_sum_and_stay_within_it() -> None:
    mean = nl.plan(nl.bounded_query("mean", (0, 1), N), F(2))
    total = nl.plan(nl.bounded_query("sum", (0, 1), N), F(5, 2))
    spent = mean.bits + total.bits
    assert spent == 2 + nl.bits_upper(5)
    joint = _joint_worst(lambda t: (mean.quantizer.index(t / N), total.quantizer.index(t)))
    assert joint <= mean.count * total.count
    assert nl.at_most_power(joint, spent)  # joint outputs <= 2^(ε1 + ε2)
    # the library's vector plan charges the same sum
    vec = nl.plan_vector([mean.query, total.query], F(9, 2), shares=[F(2), F(5, 2)])
    assert vec.bits == spent and vec.count == mean.count * total.count


def test_offset_grids_need_the_sum_not_the_max() -> None:
    """Two 4-output quantizers, shifted by half a bin, together reveal more than 4 outputs."""
    plan = nl.plan(nl.bounded_query("mean", (0, 1), N), F(2))
    qz = plan.quantizer
    half = qz.width / 2
    shifted = nl.UniformQuantizer(qz.lower - half, qz.upper - half, qz.levels)
    alone = _joint_worst(lambda t: shifted.index(t / N))
    assert alone <= plan.count
    joint = _joint_worst(lambda t: (qz.index(t / N), shifted.index(t / N)))
    assert joint > max(plan.count, alone)  # charging max(ε1, ε2) would under-charge
    assert joint <= plan.count * alone


def test_adaptive_second_release_stays_within_the_sum() -> None:
    """The second budget depends on the first output (composition (iii) of the spec)."""
    first = nl.plan(nl.bounded_query("mean", (0, 1), N), F(1))
    seconds = {
        k: nl.plan(nl.bounded_query("sum", (0, 1), N), F(1 + k % 2))
        for k in range(first.quantizer.levels)
    }

    def both(t: Fraction) -> tuple[int, int]:
        k = first.quantizer.index(t / N)
        return k, seconds[k].quantizer.index(t)

    worst_charge = first.bits + max(p.bits for p in seconds.values())
    assert nl.at_most_power(_joint_worst(both), worst_charge)


def test_post_processing_never_adds_outputs() -> None:
    plan = nl.plan(nl.bounded_query("mean", (0, 1), N), F(3))

    def released(t: Fraction) -> float:
        return float(plan.quantizer.representative(plan.quantizer.index(t / N)))

    base = _joint_worst(released)
    maps: list[Callable[[float], Hashable]] = [
        lambda y: round(y, 1),
        lambda y: y > 0.5,
        lambda y: int(y * 1000) % 3,
    ]
    for g in maps:
        assert _joint_worst(lambda t, g=g: g(released(t))) <= base  # type: ignore[misc]
    # a replay is the identity map: the pair (release, replay) has the same outputs
    assert _joint_worst(lambda t: (released(t), released(t))) == base


def test_nested_coarsening_is_free() -> None:
    """A grid whose bins are unions of released bins adds no joint outputs (spec 5, 7(b))."""
    fine = nl.UniformQuantizer(0, 1, 22)
    coarse = nl.UniformQuantizer(0, 1, 11)
    for t in grid(500):
        assert coarse.index(t) == fine.index(t) // 2
    fine_alone = _joint_worst(lambda t: fine.index(t / N))
    assert _joint_worst(lambda t: (fine.index(t / N), coarse.index(t / N))) == fine_alone


def test_local_attributes_of_one_record_compose() -> None:
    """Start and end coordinates of one trip: per-attribute bits add (the taxi experiment)."""
    lat = nl.plan_local(F(3, 2), (40.49, 40.92))
    lon = nl.plan_local(F(3, 2), (-74.27, -73.68))
    assert lat.count == lon.count == 2
    rng = np.random.default_rng(6)
    trips = rng.uniform([40.49, -74.27], [40.92, -73.68], size=(5000, 2))
    cells = set(zip(nl.quantize(trips[:, 0], lat), nl.quantize(trips[:, 1], lon), strict=True))
    assert len(cells) == lat.count * lon.count
    assert lat.bits + lon.bits == 2  # log2 2 + log2 2: the charges, not the requests, add


def test_whole_column_costs_once() -> None:
    """Replacing one record changes one coordinate of the released column: q outputs, not q^n."""
    plan = nl.plan_local(2, (0, 1))
    others = np.random.default_rng(7).uniform(0, 1, 9)
    outputs = {tuple(nl.quantize(np.append(others, v), plan)) for v in np.linspace(0, 1, 1001)}
    assert len(outputs) == plan.count == 4
    assert len(set(itertools.chain.from_iterable(outputs))) <= plan.count
