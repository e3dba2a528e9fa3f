"""Fidelity, anchor independence, Def-1 posterior and reproducibility (spec §7.5 1–3, 11)."""

from __future__ import annotations

import inspect

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import interval
from mechanisms.interval.designs import Partition

from .conftest import LOGIS1, NORMAL, case1, rng

# ---------------------------------------------------------------- 1. containment (fidelity)

# small integers make ties y == anchor frequent; ±5 are the declared bounds
_value = st.one_of(st.integers(-5, 5).map(float),
                   st.floats(-5, 5, allow_nan=False, allow_subnormal=False))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), m=st.integers(2, 5), bounded=st.booleans(),
       transform=st.sampled_from(["identity", "square", "abs", "exp"]))
def test_every_range_holds_its_value_canonical(data: st.DataObject, m: int, bounded: bool,
                                               transform: str) -> None:
    n = data.draw(st.integers(1, 12))
    y = np.array(data.draw(st.lists(_value, min_size=n, max_size=n)))
    g = interval.Transform(transform)
    # anchors on the g-scale, often exactly g(y) of some record (ties on the released scale)
    pool = st.one_of(_value, st.sampled_from(list(g.forward(y))))
    anchors = np.sort(np.array(data.draw(st.lists(
        st.lists(pool, min_size=m - 1, max_size=m - 1), min_size=n, max_size=n))), axis=1)
    support = (-5.0, 5.0) if bounded else (-np.inf, np.inf)
    ends = data.draw(st.none() | st.lists(_value, min_size=2, max_size=2).map(sorted))
    exact_range = None if ends is None else (ends[0], ends[1])
    mech = interval.IntervalMechanism(interval.Canonical(LOGIS1, m), g, support,
                                      exact_range=exact_range)
    rel = mech.assign(y, anchors)
    assert rel.contains(y).all()
    # the released index is the one whose cell holds g(y) (ties go left)
    z = g.forward(y)
    edges = np.hstack([np.full((n, 1), -np.inf), anchors, np.full((n, 1), np.inf)])
    rows = np.arange(n)
    assert np.all(edges[rows, rel.index - 1] < z) and np.all(z <= edges[rows, rel.index])


@settings(max_examples=100, deadline=None)
@given(y=st.lists(_value, min_size=1, max_size=10), data=st.data())
def test_every_range_holds_its_value_ring_and_log(y: list[float], data: st.DataObject) -> None:
    v = np.array(y)
    n = v.size
    pairs = np.sort(np.array(data.draw(st.lists(st.lists(
        st.one_of(_value, st.sampled_from(y)), min_size=2, max_size=2), min_size=n,
        max_size=n))), axis=1)
    ring = interval.IntervalMechanism(interval.Ring(NORMAL, 0.3), support=(-5.0, 5.0))
    assert ring.assign(v, pairs).contains(v).all()
    # log pullback on a positive support; anchors at log(y) exactly
    pos = np.abs(v) + 0.5
    logs = interval.Transform("log")
    u = np.log(pos)[:, None] if data.draw(st.booleans()) else np.full((n, 1), 0.3)
    mech = interval.IntervalMechanism(interval.Canonical(LOGIS1, 2), logs, (0.5, 5.5))
    assert mech.assign(pos, u).contains(pos).all()


@settings(max_examples=100, deadline=None)
@given(y=st.lists(st.integers(0, 10).map(float), min_size=1, max_size=10), data=st.data())
def test_progressive_ranges_hold_integer_values(y: list[float], data: st.DataObject) -> None:
    v = np.array(y)
    rounds = data.draw(st.integers(1, 4))
    # uniforms in {0, 1/2, 1} put anchors on the bounds and on integers: ties everywhere
    q = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, 0.3]),
                                             min_size=rounds, max_size=rounds),
                                    min_size=v.size, max_size=v.size)))
    prog = interval.Progressive((0.0, 10.0), rounds)
    assert prog.run(v, q).contains(v).all()


def test_containment_over_many_draws_of_every_mechanism() -> None:
    y = rng(1).normal(size=100_000)
    y[:50] = 0.0  # repeated values
    mechs = [
        case1(),
        interval.IntervalMechanism(interval.Canonical(LOGIS1, 3)),
        interval.IntervalMechanism(interval.Canonical(LOGIS1, 6)),
        interval.IntervalMechanism(interval.Canonical(LOGIS1, 3, (-1.0, 1.0)), exact_cells=(2,)),
        interval.IntervalMechanism(interval.Ring(NORMAL, 0.3)),
        interval.IntervalMechanism(interval.Canonical(LOGIS1, 3), interval.Transform("square")),
        interval.Selective(case1(), 0.6, 0.75, NORMAL),
    ]
    for mech in mechs:
        assert mech.release(y, rng(2)).contains(y).all()
    u = interval.clean(rng(3).random(100_000), (0.0, 1.0), 0.0)
    prior = interval.make_prior(None, (0.0, 1.0))
    assert interval.Progressive((0.0, 1.0), 3, 0.2, prior).release(u, rng(4)).contains(u).all()
    exact = mechs[3].release(y, rng(5))
    hit = ~np.isnan(exact.exact)
    assert hit.any() and np.array_equal(exact.exact[hit], y[hit])


# ---------------------------------------------------------------- 2. anchors independent of Y


def test_anchor_samplers_never_see_data() -> None:
    for cls in [interval.Canonical, interval.Ring, Partition]:
        assert list(inspect.signature(cls.sample).parameters) == ["self", "rng", "n"]
        assert list(inspect.signature(cls.anchors).parameters) == ["self", "q"]
    # same generator state, different data: identical anchors
    mech = interval.IntervalMechanism(interval.Canonical(LOGIS1, 3))
    a = mech.release(np.zeros(1000), rng(7)).anchors
    b = mech.release(rng(8).normal(size=1000) * 100, rng(7)).anchors
    assert np.array_equal(a, b)


def test_anchor_marginal_and_correlation() -> None:
    n = 20_000
    y = rng(10).normal(size=n)
    rel = case1().release(y, rng(11))
    u = rel.anchors[:, 0]
    assert stats.kstest(u, stats.logistic(0, 1).cdf).pvalue > 1e-3
    # under independence corr ~ N(0, 1/n): |corr| < 4/sqrt(n) fails with prob 6e-5
    assert abs(np.corrcoef(u, y)[0, 1]) < 4 / np.sqrt(n)
    # Case-II: the pair is the order statistics of two iid draws
    pair = interval.Canonical(interval.AnchorDist("normal", 1.0, 2.0), 3).sample(rng(12), n)
    assert np.all(pair[:, 0] <= pair[:, 1])
    f = stats.norm(1, 2).cdf(pair)
    # P(max <= v) = F(v)^2 and P(min <= u) = 1 - (1 - F(u))^2: both transforms are uniform
    assert stats.kstest(f[:, 1] ** 2, "uniform").pvalue > 1e-3
    assert stats.kstest(1 - (1 - f[:, 0]) ** 2, "uniform").pvalue > 1e-3
    for dist in [interval.AnchorDist("laplace", 0, 1), interval.uniform(-2, 3),
                 interval.optimal(NORMAL, "mean")]:
        draws = dist.sample(rng(13), n)
        assert stats.kstest(draws, dist.cdf).pvalue > 1e-3
        # the transport map used by the coverage integrator is the same law
        assert stats.ks_2samp(draws, dist.ppf(rng(14).random(n))).pvalue > 1e-3


# ---------------------------------------------------------------- 3. posterior (Def 1)


def _pit(prior: interval.Prior, y: np.ndarray, pieces: interval.Pieces) -> np.ndarray:
    """F(y | S) for one-piece ranges: uniform on (0,1) iff Y | S is the prior cut to S."""
    lo = prior.cdf(pieces.left[:, 0])
    hi = prior.cdf(pieces.right[:, 0])
    return (prior.cdf(y) - lo) / (hi - lo)


def test_posterior_is_the_prior_restricted_to_the_range() -> None:
    n = 1_000_000
    y = rng(20).normal(size=n)
    rel = case1().release(y, rng(21))
    u = rel.anchors[:, 0]
    # the spec's check: U in [0.95, 1.05] and delta = 1 -> Y ~ N(0,1) truncated to (-inf, 1]
    sel = (u >= 0.95) & (u <= 1.05) & (rel.index == 1)
    assert sel.sum() > 15_000
    truncated = stats.truncnorm(-np.inf, 1.0)
    assert stats.kstest(y[sel], truncated.cdf).pvalue > 0.01
    # every record at once: the PIT within its own range is uniform
    assert stats.kstest(_pit(NORMAL, y[:200_000], rel.pieces.take(np.arange(200_000))),
                        "uniform").pvalue > 0.01


def test_negative_control_value_centred_interval_is_rejected() -> None:
    """(Y − W, Y + W] reveals Y as its midpoint: the Def-1 test must reject."""
    n = 20_000
    y = rng(22).normal(size=n)
    w = rng(23).uniform(0.5, 1.5, n)
    centred = interval.Pieces.single(y - w, y + w)
    assert centred.contains(y).all()  # fidelity alone is not privacy
    assert stats.kstest(_pit(NORMAL, y, centred), "uniform").pvalue < 1e-10


# ---------------------------------------------------------------- 11. reproducibility


def test_same_seed_same_records_byte_for_byte() -> None:
    y = rng(30).normal(size=5000)
    for mech in [case1(), interval.IntervalMechanism(interval.Ring(NORMAL, 0.2)),
                 interval.Selective(case1(), 0.6, 0.7, NORMAL)]:
        a = mech.release(y, rng(31)).table(NORMAL)
        b = mech.release(y, rng(31)).table(NORMAL)
        assert list(a) == list(b)
        assert all(a[k].tobytes() == b[k].tobytes() for k in a)
