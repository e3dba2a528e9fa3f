"""Event families of the adversarial DP audit, on released vectors of floats.

Every family turns runs on neighbours D (``x``, shape (runs, d)) and D' (``y``)
into one certified lower bound on the privacy loss, by the split-half rule of
``mechanisms.audit``: whatever is chosen (event, statistic, classifier) is
chosen on the first half of each sample only, and certified on the second half
with Clopper–Pearson bounds. The harness runs several families on the same
runs, so it gives each α/F (Bonferroni): all F bounds hold together with
probability >= 1 − α, and so does their maximum.

Families:

* ``interval``: intervals/half-lines of each released coordinate (the first
  ``MAX_COORDINATES``) and of caller-supplied scalar statistics (e.g. the
  Neyman–Pearson statistic of the claimed noise); the statistic with the best
  selection-half bound is certified.
* ``representation``: events on the float encoding of released values —
  lattice membership {v/2^j ∈ Z} for a range of j, alone and within one binade
  of v, the value of the last k mantissa bits, and caller-supplied events (DIP:
  "reachable from a zero noise draw"). Mironov's attack on float Laplace lives
  here.
* ``learned``: a logistic regression (scipy L-BFGS) on the values and their
  representation features, trained on the selection halves to tell D from D';
  its score is then audited like any scalar (DP-Sniper style).
* ``tail``: see ``support_gap``.
* ``work``: intervals of each run's work counters (proposals, coins, iterations,
  redraws), alone and jointly with cells of the released values: the run time an
  analyst sees through a release's timestamps and polling (issue #27; see
  ``work_family``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, special

from mechanisms.audit import (
    LEVELS,
    Event,
    candidate_edges,
    certified_epsilon,
    clopper_pearson_lower,
    select_event,
)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
#: released coordinates whose values and bits are examined (keeps the cost linear in runs)
MAX_COORDINATES = 8
#: lattice exponents j tried in {v / 2^j ∈ Z}: from far below any double's ulp to 2^16
LATTICE_EXPONENTS = np.arange(-80, 17)
#: binades (exponent of frexp) examined one by one: the most frequent ones
BINADES = 12
#: rows per chunk when counting representation events
CHUNK_ROWS = 20_000
#: a support gap: a neighbour lands beyond the other's reach at least this often ...
GAP_LEVEL = 0.01
#: ... on an event whose certified loss is at least this (the other almost never goes there)
GAP_LOSS = 5.0
#: value cells per released coordinate in the work family's joint (value, work) events
WORK_VALUE_CELLS = 16

#: x, y (runs, d) -> (runs, k) boolean events, for both samples at once (same k)
EventFn = Callable[[FloatArray], BoolArray]
#: x (runs, d) -> (runs,) scalar statistic
StatisticFn = Callable[[FloatArray], FloatArray]


@dataclass(frozen=True)
class FamilyResult:
    """One family's certified bound (test half only) and what produced it."""

    family: str
    events_tried: int
    certified: float  # log((p_lo − δ)/p_hi) on the test half; −inf if nothing
    what: str  # the chosen event, in words (no data values: only public positions)
    hits: tuple[int, int] = (0, 0)
    runs: tuple[int, int] = (0, 0)
    #: ``tail`` only: a neighbour's releases, with certified probability >= GAP_LEVEL + δ,
    #: lie beyond everything the other reached on fair and extreme random tapes
    gap: bool = False


def halves(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    h = x.shape[0] // 2
    return x[:h], x[h:]


def _certify_interval(event: Event, x: FloatArray, y: FloatArray, alpha: float,
                      delta: float) -> tuple[float, tuple[int, int], tuple[int, int]]:
    num, den = (x, y) if event.forward else (y, x)
    kn = int(np.count_nonzero((num >= event.lo) & (num < event.hi)))
    kd = int(np.count_nonzero((den >= event.lo) & (den < event.hi)))
    bound = float(certified_epsilon(kn, num.size, kd, den.size, alpha, delta))
    return bound, (kn, kd), (num.size, den.size)


def certify_scalars(sx: Sequence[FloatArray], sy: Sequence[FloatArray], names: Sequence[str],
                    alpha: float, delta: float, family: str) -> FamilyResult:
    """Interval events of several scalar statistics: the best on the selection half is
    certified on the test half (one certification, so no multiplicity correction)."""
    best: tuple[float, int, Event] = (-math.inf, 0, Event(-math.inf, math.inf, True))
    tried = 0
    for i, (a, b) in enumerate(zip(sx, sy, strict=True)):
        a_sel, b_sel = halves(a)[0], halves(b)[0]
        event, bound = select_event(a_sel, b_sel, alpha, delta)
        edges = candidate_edges(a_sel, b_sel, LEVELS).size
        tried += edges * (edges - 1)  # intervals, both directions
        if bound > best[0] or i == 0:
            best = (bound, i, event)
    _, i, event = best
    bound, hits, runs = _certify_interval(event, halves(sx[i])[1], halves(sy[i])[1], alpha,
                                          delta)
    side = "D over D'" if event.forward else "D' over D"
    what = f"{names[i]} in [{event.lo:.6g}, {event.hi:.6g}) ({side})"
    return FamilyResult(family, tried, bound, what, hits, runs)


# --------------------------------------------------------------------------- interval family


def interval_family(x: FloatArray, y: FloatArray, alpha: float, delta: float,
                    statistics: Sequence[tuple[str, StatisticFn]] = ()) -> FamilyResult:
    """Thresholds and intervals of each coordinate and of the given statistics."""
    d = min(x.shape[1], MAX_COORDINATES)
    sx = [x[:, j] for j in range(d)] + [f(x) for _, f in statistics]
    sy = [y[:, j] for j in range(d)] + [f(y) for _, f in statistics]
    names = [f"coordinate {j}" for j in range(d)] + [name for name, _ in statistics]
    return certify_scalars(sx, sy, names, alpha, delta, "interval")


# --------------------------------------------------------------------------- representation


def mantissa_bits(v: FloatArray) -> NDArray[np.uint64]:
    """The 52 stored mantissa bits of each double."""
    raw = np.ascontiguousarray(v, dtype=np.float64).view(np.uint64)
    out: NDArray[np.uint64] = raw & np.uint64((1 << 52) - 1)
    return out


def trailing_zeros(bits: NDArray[np.uint64]) -> FloatArray:
    """Trailing zero bits of each 52-bit mantissa (52 for a zero mantissa)."""
    lowest = bits & (~bits + np.uint64(1))  # the lowest set bit, a power of two < 2^52
    out: FloatArray = np.where(bits == 0, 52.0,
                               np.frexp(lowest.astype(np.float64))[1] - 1.0)
    return out


def lattice_membership(v: FloatArray, exponents: NDArray[np.int64] = LATTICE_EXPONENTS
                       ) -> BoolArray:
    """m[..., i] = v / 2^exponents[i] is an integer (exact: ldexp and floor are exact)."""
    scaled = np.ldexp(v[..., None], -exponents.astype(np.int32))
    with np.errstate(invalid="ignore"):
        out: BoolArray = np.isfinite(scaled) & (np.floor(scaled) == scaled)
    return out


def _binades(x: FloatArray, y: FloatArray) -> NDArray[np.int64]:
    """The BINADES most frequent frexp exponents of the pooled values."""
    e = np.concatenate([np.frexp(x)[1].ravel(), np.frexp(y)[1].ravel()])
    values, counts = np.unique(e, return_counts=True)
    keep = values[np.argsort(-counts, kind="stable")[:BINADES]]
    return np.asarray(np.sort(keep), dtype=np.int64)


def representation_events(v: FloatArray, binades: NDArray[np.int64]) -> tuple[BoolArray,
                                                                             list[str]]:
    """Boolean events on the encoding of one coordinate's values (see the module doc)."""
    lattice = lattice_membership(v)
    names = [f"v/2^{j} integer" for j in LATTICE_EXPONENTS]
    columns = [lattice]
    exponent = np.frexp(v)[1]
    for e in binades:
        inside = (exponent == e)[:, None]
        columns.append(lattice & inside)
        names += [f"v/2^{j} integer, v in binade 2^{e}" for j in LATTICE_EXPONENTS]
    bits = mantissa_bits(v)
    for k in (1, 2, 3, 4):
        low = (bits & np.uint64((1 << k) - 1)).astype(np.int64)
        columns.append(low[:, None] == np.arange(1 << k)[None, :])
        names += [f"last {k} mantissa bits = {p:0{k}b}" for p in range(1 << k)]
    return np.concatenate(columns, axis=1), names


def _representation_hits(v: FloatArray, extra: Sequence[tuple[str, EventFn]],
                         binades: Sequence[NDArray[np.int64]], d: int
                         ) -> tuple[NDArray[np.int64], list[str]]:
    """Hit counts of every representation event on the rows of ``v`` (in chunks)."""
    total: NDArray[np.int64] | None = None
    names: list[str] = []
    for start in range(0, max(v.shape[0], 1), CHUNK_ROWS):
        rows = v[start:start + CHUNK_ROWS]
        columns, names = [], []
        for j in range(d):
            ev, n = representation_events(rows[:, j], binades[j])
            columns.append(ev.sum(axis=0))
            names += [f"coordinate {j}: {s}" for s in n]
        for name, fn in extra:
            ev = fn(rows)
            columns.append(ev.sum(axis=0))
            names += [f"{name} [{i}]" for i in range(ev.shape[1])]
        hits = np.concatenate(columns).astype(np.int64)
        total = hits if total is None else total + hits
    assert total is not None
    return total, names


def representation_family(x: FloatArray, y: FloatArray, alpha: float, delta: float,
                          extra: Sequence[tuple[str, EventFn]] = ()) -> FamilyResult:
    """Float-encoding events of each coordinate, and the caller's own events.

    Split-half as everywhere: the event with the best bound on the selection
    halves is certified on the test halves (hit counts are summed in chunks,
    so memory stays bounded whatever the number of runs).
    """
    d = min(x.shape[1], MAX_COORDINATES)
    (sx, tx), (sy, ty) = halves(x), halves(y)
    binades = [_binades(sx[:, j], sy[:, j]) for j in range(d)]
    kx, names = _representation_hits(sx, extra, binades, d)
    ky, _ = _representation_hits(sy, extra, binades, d)
    fwd = certified_epsilon(kx, sx.shape[0], ky, sy.shape[0], alpha, delta)
    bwd = certified_epsilon(ky, sy.shape[0], kx, sx.shape[0], alpha, delta)
    i, j = int(np.argmax(fwd)), int(np.argmax(bwd))
    forward = bool(fwd[i] >= bwd[j])
    k = i if forward else j
    hx, _ = _representation_hits(tx, extra, binades, d)
    hy, _ = _representation_hits(ty, extra, binades, d)
    (kn, nn), (kd, nd) = ((hx[k], tx.shape[0]), (hy[k], ty.shape[0])) if forward else (
        (hy[k], ty.shape[0]), (hx[k], tx.shape[0]))
    bound = float(certified_epsilon(kn, nn, kd, nd, alpha, delta))
    side = "D over D'" if forward else "D' over D"
    return FamilyResult("representation", 2 * len(names), bound, f"{names[k]} ({side})",
                        (int(kn), int(kd)), (nn, nd))


# --------------------------------------------------------------------------- learned


def features(v: FloatArray) -> FloatArray:
    """Values of the first 4·MAX_COORDINATES coordinates, and the encoding of the first
    MAX_COORDINATES: the last 8 mantissa bits (scaled), trailing zero bits, the binade."""
    w = v[:, :MAX_COORDINATES]
    bits = mantissa_bits(w)
    low = (bits & np.uint64(255)).astype(np.float64) / 255.0
    binade = np.frexp(w)[1].astype(np.float64)
    return np.concatenate([v[:, :4 * MAX_COORDINATES], low, trailing_zeros(bits) / 52.0,
                           binade], axis=1)


def _standardize(train: FloatArray, *others: FloatArray) -> list[FloatArray]:
    mu = train.mean(axis=0)
    sd = train.std(axis=0)
    sd[~(sd > 0)] = 1.0
    return [(a - mu) / sd for a in (train, *others)]


def logistic_fit(f: FloatArray, label: FloatArray, ridge: float = 1e-3) -> FloatArray:
    """Weights (last one the intercept) of an L2-regularised logistic regression."""
    design = np.concatenate([f, np.ones((f.shape[0], 1))], axis=1)

    def loss(w: FloatArray) -> tuple[float, FloatArray]:
        z = design @ w
        p = special.expit(z)
        value = float(np.sum(np.logaddexp(0.0, z) - label * z)) / f.shape[0]
        grad = design.T @ (p - label) / f.shape[0]
        value += 0.5 * ridge * float(w[:-1] @ w[:-1])
        grad[:-1] += ridge * w[:-1]
        return value, grad

    res = optimize.minimize(loss, np.zeros(design.shape[1]), jac=True, method="L-BFGS-B",
                            options={"maxiter": 200})
    out: FloatArray = np.asarray(res.x, dtype=np.float64)
    return out


def learned_family(x: FloatArray, y: FloatArray, alpha: float, delta: float) -> FamilyResult:
    """A classifier of D vs D' fitted on the selection halves, its score audited."""
    fx, fy = features(x), features(y)
    (sx, tx), (sy, ty) = halves(fx), halves(fy)
    train = np.concatenate([sx, sy])
    train, fx_all, fy_all = _standardize(train, fx, fy)
    label = np.concatenate([np.ones(sx.shape[0]), np.zeros(sy.shape[0])])
    w = logistic_fit(train, label)
    score_x = fx_all @ w[:-1]
    score_y = fy_all @ w[:-1]
    del tx, ty
    result = certify_scalars([score_x], [score_y], ["logistic score"], alpha, delta, "learned")
    return FamilyResult("learned", result.events_tried + 1, result.certified,
                        f"{result.what} on {fx.shape[1]} features", result.hits, result.runs)


# --------------------------------------------------------------------------- tail


def support_gap(x: FloatArray, y: FloatArray, probe_x: FloatArray, probe_y: FloatArray,
                alpha: float, delta: float) -> FamilyResult:
    """Thresholds at the reach of each neighbour, and the support gap they reveal.

    For each coordinate and side, E = {v > everything D reached} (or below):
    the reach is taken over D's selection half and D's releases on extreme
    random tapes (``mechanisms.audit.tapes``), which drive an exact sampler
    j·44 scale units deep for j forced words. The event is certified on the
    test halves like any other (the family's ε). Sampling alone cannot certify
    ε above about log(runs) (an event of probability e^-45 is never seen), so a
    sampler whose tails stop at 44.43 scale units passes every ε bound at
    ε = 45; what shows it is D' landing, with certified probability >=
    GAP_LEVEL + δ, beyond D's reach on an event whose certified loss is at
    least GAP_LOSS — a support gap, which pure DP forbids. An exact sampler's
    extreme tapes reach past the other neighbour's releases, so it has none.
    """
    d = min(x.shape[1], MAX_COORDINATES)
    (sx, tx), (sy, ty) = halves(x), halves(y)
    best: FamilyResult | None = None
    tried = 0
    for j in range(d):
        for num_test, den_sel, den_test, den_probe, forward in (
                (ty, sx, tx, probe_x, False), (tx, sy, ty, probe_y, True)):
            reach = np.concatenate([den_sel[:, j], den_probe[:, j]])
            for upper in (True, False):
                tried += 1
                edge = float(reach.max() if upper else reach.min())
                kn = int(np.count_nonzero(num_test[:, j] > edge if upper
                                          else num_test[:, j] < edge))
                kd = int(np.count_nonzero(den_test[:, j] > edge if upper
                                          else den_test[:, j] < edge))
                n_num, n_den = num_test.shape[0], den_test.shape[0]
                bound = float(certified_epsilon(kn, n_num, kd, n_den, alpha, delta))
                p_lo = float(clopper_pearson_lower(kn, n_num, alpha / 2))
                gap = p_lo - delta >= GAP_LEVEL and bound >= GAP_LOSS
                side = "D over D'" if forward else "D' over D"
                what = (f"coordinate {j} {'above' if upper else 'below'} the other's reach"
                        f" ({side}; P >= {p_lo:.3g})")
                result = FamilyResult("tail", 0, bound, what, (kn, kd), (n_num, n_den), gap)
                if best is None or (gap, bound) > (best.gap, best.certified):
                    best = result
    assert best is not None
    return FamilyResult("tail", tried, best.certified, best.what, best.hits, best.runs,
                        best.gap)


# --------------------------------------------------------------------------- work


def _cell_edges(v: FloatArray, cells: int = WORK_VALUE_CELLS) -> FloatArray:
    """Edges of the value cells of one released coordinate (selection halves pooled):
    its distinct values when there are at most ``cells``, else quantile bins."""
    distinct = np.unique(v)
    inner = distinct if distinct.size <= cells else np.unique(
        np.quantile(v, np.linspace(0.0, 1.0, cells + 1)[1:-1]))
    return np.concatenate([[-np.inf], inner[inner > -np.inf], [np.inf]])


def _in_cells(v: FloatArray, edges: FloatArray) -> BoolArray:
    """masks[c] = v in cell c = [edges[c], edges[c + 1]) (the last one also holds +inf)."""
    cell = np.searchsorted(edges, v, side="right") - 1
    cell = np.clip(cell, 0, edges.size - 2)
    out: BoolArray = cell[None, :] == np.arange(edges.size - 1)[:, None]
    return out


@dataclass(frozen=True)
class _WorkEvent:
    """{released coordinate k in [vlo, vhi), work counter j in [lo, hi)}."""

    k: int
    vlo: float
    vhi: float
    j: int
    lo: float
    hi: float
    forward: bool

    def hits(self, v: FloatArray, w: FloatArray) -> int:
        inside = (w[:, self.j] >= self.lo) & (w[:, self.j] < self.hi)
        if self.k >= 0:
            inside &= (v[:, self.k] >= self.vlo) & (v[:, self.k] < self.vhi)
        return int(np.count_nonzero(inside))


def work_family(x: FloatArray, y: FloatArray, wx: FloatArray, wy: FloatArray, alpha: float,
                delta: float) -> FamilyResult:
    """Events on (output, work): what an analyst who sees a release's run time can test.

    ``wx``/``wy`` (runs, w) are the work counters (proposals, coins, iterations,
    redraws) of each run whose released values are ``x``/``y``. Candidates: intervals
    (thresholds included) of each counter, alone and within each value cell of each
    released coordinate (``_cell_edges``: joint (value, work) events). The best on the
    selection halves is certified on the test halves, as everywhere. When every run of
    both neighbours did the same work (a function of public inputs), no event on work
    adds anything to the value families: the family says so and certifies nothing.
    """
    if wx.size and wy.size and np.all(wx == wx[0]) and np.all(wy == wx[0]):
        return FamilyResult("work", 1, -math.inf,
                            "work identical on every run of D and D' (public inputs only)")
    (sx, tx), (sy, ty) = halves(x), halves(y)
    (swx, twx), (swy, twy) = halves(wx), halves(wy)
    n_x, n_y = sx.shape[0], sy.shape[0]
    best: tuple[float, _WorkEvent | None] = (-math.inf, None)
    tried = 0
    d = min(x.shape[1], MAX_COORDINATES)
    cells: list[tuple[int, float, float, BoolArray, BoolArray]] = [
        (-1, -math.inf, math.inf, np.ones(n_x, dtype=bool), np.ones(n_y, dtype=bool))]
    for k in range(d):
        edges = _cell_edges(np.concatenate([sx[:, k], sy[:, k]]))
        mx, my = _in_cells(sx[:, k], edges), _in_cells(sy[:, k], edges)
        cells += [(k, float(edges[c]), float(edges[c + 1]), mx[c], my[c])
                  for c in range(edges.size - 1)]
    for j in range(min(wx.shape[1], MAX_COORDINATES)):
        for k, vlo, vhi, mx, my in cells:
            a, b = swx[mx, j], swy[my, j]
            if a.size + b.size == 0:
                continue
            edges = candidate_edges(a, b, LEVELS)
            hx = _sorted_hits(a, edges)
            hy = _sorted_hits(b, edges)
            lo, hi = np.triu_indices(edges.size, k=1)
            tried += 2 * lo.size
            for forward, num, den, nn, nd in ((True, hx, hy, n_x, n_y),
                                              (False, hy, hx, n_y, n_x)):
                bounds = certified_epsilon(num[lo, hi], nn, den[lo, hi], nd, alpha, delta)
                i = int(np.argmax(bounds))
                if bounds[i] > best[0] or best[1] is None:
                    best = (float(bounds[i]), _WorkEvent(k, vlo, vhi, j, float(edges[lo[i]]),
                                                         float(edges[hi[i]]), forward))
    event = best[1]
    assert event is not None
    kx, ky = event.hits(tx, twx), event.hits(ty, twy)
    (kn, nn), (kd, nd) = ((kx, tx.shape[0]), (ky, ty.shape[0])) if event.forward else (
        (ky, ty.shape[0]), (kx, tx.shape[0]))
    bound = float(certified_epsilon(kn, nn, kd, nd, alpha, delta))
    side = "D over D'" if event.forward else "D' over D"
    cell = "" if event.k < 0 else (f", coordinate {event.k} in"
                                   f" [{event.vlo:.6g}, {event.vhi:.6g})")
    what = f"work counter {event.j} in [{event.lo:.6g}, {event.hi:.6g}){cell} ({side})"
    return FamilyResult("work", tried, bound, what, (kn, kd), (nn, nd))


def _sorted_hits(sample: FloatArray, edges: FloatArray) -> NDArray[np.int64]:
    """hits[i, j] = #{edges[i] <= s < edges[j]} (as ``mechanisms.audit``'s interval hits)."""
    below = np.searchsorted(np.sort(sample), edges, side="left").astype(np.int64)
    below[-1] = sample.size
    out: NDArray[np.int64] = below[None, :] - below[:, None]
    return out
