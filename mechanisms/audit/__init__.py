"""Empirical privacy audit: a certified lower bound on ε from runs on neighbours.

A mechanism M is (ε, δ)-DP only if P[M(D) ∈ E] <= e^ε P[M(D') ∈ E] + δ for
every event E and neighbours D, D' (both orders). So for any E,

    ε >= log((P[M(D) ∈ E] − δ) / P[M(D') ∈ E]),

and replacing the two probabilities by a Clopper–Pearson lower bound on the
first and an upper bound on the second (each at level α/2) gives a lower bound
on the mechanism's true ε that holds with probability >= 1 − α. A mechanism
whose certified bound exceeds the ε it claims is refuted at that confidence.

Choosing E on the same runs that certify it would make the bound optimistic
(the best of many events is biased upwards), so the runs are split in half:
the first half of each sample picks the event among candidates, the second
half — independent of the choice — certifies it, with no multiplicity
correction needed. Candidates are the intervals of a scalar test statistic
between quantiles of the selection half (half-lines included), in both
directions (D over D' and D' over D); the caller chooses the statistic, e.g.
the released value, or for vector outputs a projection or the privacy-loss
statistic of the claimed noise (Neyman–Pearson: its level sets are the most
powerful events).

This module only does the statistics on samples of the statistic; drawing
the samples (many runs of a mechanism on D and D') is the caller's job.
``mechanisms.dip.audit`` is different: it computes DIP's exact output laws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

#: default confidence of a certified bound: it holds with probability 1 − ALPHA
ALPHA = 1e-3
#: default quantile levels whose pairs bound the candidate intervals: a uniform grid, and
#: geometric steps into both tails, where the events of approximate DP live
_TAILS = np.geomspace(1e-4, 0.03, 8)
LEVELS: NDArray[np.float64] = np.unique(np.concatenate(
    [np.linspace(0.0, 1.0, 33), _TAILS, 1.0 - _TAILS]))


@dataclass(frozen=True)
class Event:
    """{lo <= statistic < hi}; ``forward``: D is the numerator (else D')."""

    lo: float
    hi: float
    forward: bool


@dataclass(frozen=True)
class AuditResult:
    """A certified lower bound on ε and the evidence behind it (test half only)."""

    epsilon_lb: float  # log((p_lo − δ)/p_hi); −inf when p_lo <= δ
    event: Event
    hits: tuple[int, int]  # runs in E: numerator's, denominator's
    runs: tuple[int, int]  # test-half runs: numerator's, denominator's
    p_lo: float  # Clopper–Pearson lower bound on P[numerator ∈ E]
    p_hi: float  # Clopper–Pearson upper bound on P[denominator ∈ E]
    selection_lb: float  # the chosen event's bound on the selection half (optimistic)
    delta: float
    alpha: float


def clopper_pearson_lower(hits: ArrayLike, runs: ArrayLike, alpha: float) -> NDArray[np.float64]:
    """One-sided (1 − α) lower confidence bound on a binomial probability (0 at 0 hits)."""
    k = np.asarray(hits, dtype=np.float64)
    n = np.broadcast_to(np.asarray(runs, dtype=np.float64), k.shape)
    out = stats.beta.ppf(alpha, np.maximum(k, 1.0), n - k + 1.0)
    return np.asarray(np.where(k > 0, out, 0.0), dtype=np.float64)


def clopper_pearson_upper(hits: ArrayLike, runs: ArrayLike, alpha: float) -> NDArray[np.float64]:
    """One-sided (1 − α) upper confidence bound on a binomial probability (1 at n hits)."""
    k = np.asarray(hits, dtype=np.float64)
    n = np.broadcast_to(np.asarray(runs, dtype=np.float64), k.shape)
    out = stats.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1.0))
    return np.asarray(np.where(k < n, out, 1.0), dtype=np.float64)


def certified_epsilon(hits_num: ArrayLike, runs_num: ArrayLike, hits_den: ArrayLike,
                      runs_den: ArrayLike, alpha: float = ALPHA,
                      delta: float = 0.0) -> NDArray[np.float64]:
    """log((p_lo − δ)/p_hi), each Clopper–Pearson bound at α/2: valid w.p. >= 1 − α."""
    p_lo = clopper_pearson_lower(hits_num, runs_num, alpha / 2)
    p_hi = clopper_pearson_upper(hits_den, runs_den, alpha / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(np.maximum(p_lo - delta, 0.0)) - np.log(p_hi)
    return np.asarray(out, dtype=np.float64)


def candidate_edges(a: ArrayLike, b: ArrayLike, levels: ArrayLike = LEVELS) -> NDArray[np.float64]:
    """Interval end points: quantiles of the pooled sample (distinct), with ±inf."""
    pooled = np.concatenate([np.asarray(a, dtype=np.float64).ravel(),
                             np.asarray(b, dtype=np.float64).ravel()])
    inner = np.unique(np.quantile(pooled, np.asarray(levels, dtype=np.float64)))
    # the pooled maximum as a lower end is {s >= max}; as an upper end it would drop the max
    return np.concatenate([[-np.inf], inner, [np.inf]])


def _interval_hits(sample: NDArray[np.float64], edges: NDArray[np.float64]
                   ) -> NDArray[np.int64]:
    """hits[i, j] = #{edges[i] <= s < edges[j]} (negative or 0 unless i < j)."""
    below = np.searchsorted(np.sort(sample), edges, side="left").astype(np.int64)
    below[-1] = sample.size  # s < +inf always
    return below[None, :] - below[:, None]


def select_event(a: ArrayLike, b: ArrayLike, alpha: float = ALPHA, delta: float = 0.0,
                 levels: ArrayLike = LEVELS) -> tuple[Event, float]:
    """The candidate event with the largest certified bound on (a, b), and that bound."""
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    edges = candidate_edges(x, y, levels)
    hx, hy = _interval_hits(x, edges), _interval_hits(y, edges)
    i, j = np.triu_indices(edges.size, k=1)
    best: tuple[float, Event] = (-math.inf, Event(-math.inf, math.inf, True))
    for forward, (num, den, n_num, n_den) in ((True, (hx, hy, x.size, y.size)),
                                              (False, (hy, hx, y.size, x.size))):
        bounds = certified_epsilon(num[i, j], n_num, den[i, j], n_den, alpha, delta)
        k = int(np.argmax(bounds))
        if bounds[k] > best[0]:
            best = (float(bounds[k]), Event(float(edges[i[k]]), float(edges[j[k]]), forward))
    return best[1], best[0]


def audit(a: ArrayLike, b: ArrayLike, alpha: float = ALPHA, delta: float = 0.0,
          levels: ArrayLike = LEVELS) -> AuditResult:
    """Split-half audit of samples of a scalar statistic on D (``a``) and D' (``b``).

    The first half of each sample selects the event, the second certifies it:
    with probability >= 1 − α, the mechanism's ε (at this δ) is at least
    ``epsilon_lb``. Runs must be independent (their order is not otherwise used).
    """
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.size < 4 or y.size < 4:
        raise ValueError("need at least 4 runs on each dataset")
    if not (0.0 < alpha < 1.0 and 0.0 <= delta < 1.0):
        raise ValueError("alpha must be in (0, 1) and delta in [0, 1)")
    hx, hy = x.size // 2, y.size // 2
    event, selection = select_event(x[:hx], y[:hy], alpha, delta, levels)
    num, den = (x[hx:], y[hy:]) if event.forward else (y[hy:], x[hx:])
    k_num = int(np.count_nonzero((num >= event.lo) & (num < event.hi)))
    k_den = int(np.count_nonzero((den >= event.lo) & (den < event.hi)))
    p_lo = float(clopper_pearson_lower(k_num, num.size, alpha / 2))
    p_hi = float(clopper_pearson_upper(k_den, den.size, alpha / 2))
    bound = float(certified_epsilon(k_num, num.size, k_den, den.size, alpha, delta))
    return AuditResult(bound, event, (k_num, k_den), (num.size, den.size), p_lo, p_hi,
                       selection, delta, alpha)
