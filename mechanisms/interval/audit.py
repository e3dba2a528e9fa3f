"""Adversarial audit of the interval mechanisms: Def 1 checked on real releases.

Interval privacy (Def 1) says the posterior of Y given an output z is the
prior restricted to the released range S_z. Equivalently, within each output
class, the PIT of the truth under the restricted prior,

    PIT(y) = P_Y(S_z ∩ (−∞, y]) / P_Y(S_z),

is Uniform(0, 1). The audit runs the registered mechanism (``registry.get``,
``load_params``, ``cost``, ``run``) on values drawn from the declared prior,
groups records by output class (range index; rounds answered; null), and

* tests the PIT of every class that claims Def 1 with a chi-square test
  (Bonferroni over classes, level ``ALPHA``);
* bounds the leakage the outputs carry from below: in each class, a bin of
  the PIT with posterior share f over prior share 1/b is a posterior/prior
  ratio of b·f relative to the restricted prior, so a record's coverage is at
  most L(S_z)/max(1, b·f_lo) with f_lo a Clopper–Pearson lower bound
  (Bonferroni over all bins). ``certified`` is a one-sided lower confidence
  bound on the mean of 1 − that coverage; for a Def-1 output it is just
  1 − L(S_z), for a selective null (not Def 1) it is 1 − 1/(its ratio).

The mechanism passes when no Def-1 class is rejected and ``certified`` does
not exceed the ledger charge. Each entry also runs a deliberately broken
variant (the negative control) through the same check: partition mechanisms
that redraw their anchors after peeking at the value, progressive narrowing
with the paper's value-dependent stop rule and its old charge, and selective
collection charged and described as if a null were the whole line (the old
accounting). The control must be flagged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from mechanisms import registry
from mechanisms.audit.entries import AuditReport, AuditSize, entry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.interval import entries
from mechanisms.interval.coverage import expected_coverage, integrate
from mechanisms.interval.designs import (
    IntervalMechanism,
    Progressive,
    Release,
    Selective,
    pieces_from_table,
)
from mechanisms.interval.ranges import FloatArray, Law, Pieces
from mechanisms.interval.transforms import PushforwardLaw

#: a check's false-alarm probability (chi-square rejections and confidence bounds)
ALPHA = 1e-3
#: records per audited release, and PIT bins per output class
SIZES: dict[str, tuple[int, int]] = {"ci": (20_000, 10), "full": (1_000_000, 40)}
NAMES = ("interval.case1", "interval.case2", "interval.casek", "interval.ring",
         "interval.selective", "interval.progressive")

_NORMAL = ColumnMeta("x", "continuous", prior={"family": "normal", "loc": 0.0, "scale": 1.0})
_BOUNDED = ColumnMeta("x", "continuous", (-2.0, 3.0),
                      prior={"family": "normal", "loc": 0.5, "scale": 1.0})
_LOGIS1 = {"family": "logistic", "scale": 1.0}

#: the audited request of each mechanism: (column metadata, params)
REQUESTS: dict[str, tuple[ColumnMeta, dict[str, Any]]] = {
    "interval.case1": (_NORMAL, {"column": "x", "anchors": _LOGIS1}),
    "interval.case2": (_NORMAL, {"column": "x", "anchors": {"family": "normal", "scale": 1.5}}),
    # a pullback: ranges of Y² map back to two pieces of the data line
    "interval.casek": (_NORMAL, {"column": "x", "m": 4, "transform": "square",
                                 "anchors": _LOGIS1}),
    "interval.ring": (_NORMAL, {"column": "x", "tau_floor": 0.3}),
    "interval.selective": (_NORMAL, {"column": "x", "tau": 0.6, "anchors": _LOGIS1}),
    "interval.progressive": (_BOUNDED, {"column": "x", "rounds": 4, "tau_stop": 0.15}),
}


# --------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class Check:
    """What the Def-1 check found on one release."""

    #: lower confidence bound on the expected leakage the outputs carry
    certified: float
    #: realised mean of 1 − L(S_z) (a null counted as the whole line)
    realized: float
    #: Bonferroni-adjusted chi-square p-value of the worst class that claims Def 1
    p_value: float
    worst_class: str
    #: largest posterior/restricted-prior ratio lower bound over classes, and its class
    ratio: float
    ratio_class: str
    #: checks made: one chi-square per tested class plus one bound per bin
    tried: int

    def flagged(self, charged: float) -> bool:
        return self.p_value < ALPHA or self.certified > charged


def pit(pieces: Pieces, y: FloatArray, law: Law) -> tuple[FloatArray, FloatArray]:
    """(L(S), P_Y(S ∩ (−∞, y]) / L(S)) for each record's range S (NaN where L = 0)."""
    v = y.reshape(-1, 1)
    right = np.minimum(pieces.right, v)
    right_closed = np.where(pieces.right <= v, pieces.right_closed, True)
    below = law.mass(pieces.left, right, pieces.left_closed, right_closed)
    below = np.where(pieces.empty() | (right < pieces.left), 0.0, below).sum(axis=1)
    mass = pieces.mass(law)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(mass > 0, np.clip(below / mass, 0.0, 1.0), np.nan)
    return mass, u


def _cp_lower(k: NDArray[np.int64], n: int, alpha: float) -> FloatArray:
    out = stats.beta.ppf(alpha, np.maximum(k, 1), n - k + 1)
    return np.asarray(np.where(k > 0, out, 0.0), dtype=np.float64)


def check_release(y: FloatArray, table: Mapping[str, NDArray[Any]], law: Law, bins: int,
                  nulls_def1: bool = True) -> Check:
    """Def 1 and leakage of one release (columns as ``Release.table``), truth ``y``."""
    n = y.shape[0]
    released = np.asarray(table["released"]) == 1
    exact = ~np.isnan(np.asarray(table["exact"], dtype=np.float64))
    mass, u = pit(pieces_from_table(table), y, law)
    # a null releases no range: its posterior support is the whole line
    mass = np.where(released, mass, 1.0)
    u = np.where(released, u, np.clip(law.cdf(y), 0.0, 1.0))
    key = np.asarray(table["rounds"] if "rounds" in table else table["index"], dtype=np.int64)
    label = np.where(exact | ~(mass > 0), -1, np.where(released, key, 0))
    classes = [int(k) for k in np.unique(label) if k >= 0]
    names = {k: ("null" if k == 0 else f"{'rounds' if 'rounds' in table else 'index'}={k}")
             for k in classes}
    ratios = np.ones(n)
    total_bins = bins * max(1, len(classes))
    p_values: list[tuple[float, str]] = []
    ratio, ratio_class = 1.0, "-"
    for k in classes:
        members = label == k
        size = int(members.sum())
        counts = np.histogram(u[members], bins=bins, range=(0.0, 1.0))[0]
        f_lo = _cp_lower(counts, size, ALPHA / total_bins)
        r = max(1.0, bins * float(f_lo.max()))
        ratios[members] = r
        if r > ratio:
            ratio, ratio_class = r, names[k]
        if size >= 5 * bins and (k > 0 or nulls_def1):
            p_values.append((float(stats.chisquare(counts).pvalue), names[k]))
    leak = np.where(label < 0, 1.0, 1.0 - mass / ratios)
    z = float(stats.norm.ppf(1.0 - ALPHA))
    certified = float(leak.mean() - z * leak.std(ddof=1) / math.sqrt(n))
    worst_p, worst = min(p_values, default=(1.0, "-"))
    return Check(certified, float(np.mean(np.where(label < 0, 1.0, 1.0 - mass))),
                 min(1.0, worst_p * max(1, len(p_values))), worst, ratio, ratio_class,
                 len(p_values) + total_bins)


# --------------------------------------------------------------------------- broken variants


@dataclass(frozen=True)
class ValueStopProgressive(Progressive):
    """NEGATIVE CONTROL, never registered: the paper's Way-II rule, which stops when the
    side *holding Y* would have prior mass below tau_stop (the pre-#14 behaviour)."""

    def run(self, y: FloatArray, uniforms: FloatArray) -> Release:
        assert self.law is not None
        n = y.shape[0]
        lo, hi = np.full(n, self.support[0]), np.full(n, self.support[1])
        lo_closed, active = np.ones(n, bool), np.ones(n, bool)
        anchors = np.full((n, self.rounds), np.nan)
        done = np.zeros(n, np.int64)
        for h in range(self.rounds):
            u = lo + (hi - lo) * uniforms[:, h]
            le = y <= u
            new_lo, new_hi = np.where(le, lo, u), np.where(le, u, hi)
            new_closed = np.where(le, lo_closed, False)
            active &= self.law.mass(new_lo, new_hi, new_closed, True) >= self.tau_stop
            anchors[:, h] = np.where(active, u, np.nan)
            lo, hi = np.where(active, new_lo, lo), np.where(active, new_hi, hi)
            lo_closed = np.where(active, new_closed, lo_closed)
            done += active
        pieces = Pieces.single(lo, hi, lo_closed, True)
        return Release(anchors, done, pieces, np.full(n, np.nan), done > 0, {"rounds": done})


def peeking_release(design: IntervalMechanism, y: FloatArray, law: Law,
                    rng: np.random.Generator) -> Release:
    """NEGATIVE CONTROL: anchors redrawn once when g(Y) lies in the lower half (by prior
    mass) of its first range on the g-scale, i.e. anchors that depend on the value. (On
    the data scale a pullback range of Y² is symmetric, and a redraw keyed to the sign
    of Y would change nothing.)"""
    n = y.shape[0]
    first = design.assign(y, design.sample_anchors(rng, n))
    g_law: Law = law
    if not design.transform.identity:
        g_law = PushforwardLaw(law, design.transform,
                               design.transform.image_support(*design.support))
    g_cell = design.partition.cell(first.anchors, first.index)
    redo = pit(g_cell, design.transform.forward(y), g_law)[1] < 0.5
    anchors = np.where(redo[:, None], design.sample_anchors(rng, n), first.anchors)
    return design.assign(y, anchors)


def old_selective_leakage(design: Selective, law: Law) -> float:
    """NEGATIVE CONTROL: the pre-#14 charge, a null counted as coverage 1."""

    def integrand(q: FloatArray) -> FloatArray:
        c = design.base.cell_coverage(design.base.partition.anchors(q), law)
        kept = design.rho * (c >= design.tau)
        out: FloatArray = np.sum(c * (kept * c + (1.0 - kept)), axis=1)
        return out

    return integrate(integrand, design.dims).leakage_bound


# --------------------------------------------------------------------------- the entry


@entry(*NAMES)
def audit(mechanism: str, size: AuditSize, seed: int) -> AuditReport:
    """Run ``mechanism``'s audited request and its negative control through the check."""
    n, bins = SIZES[size]
    column, raw = REQUESTS[mechanism]
    meta = DatasetMeta(n, {column.name: column})
    mech = registry.get(mechanism)
    params = mech.load_params(raw)
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, meta)
    charged = float(next(iter(cost.values())))
    assert isinstance(mech, entries.Interval)
    plan = entries.plan(mech.kind, params, meta)
    law = plan.prior
    streams = np.random.SeedSequence([seed, NAMES.index(mechanism)]).spawn(4)
    y = np.asarray(law.ppf(np.random.default_rng(streams[0]).random(n)), dtype=np.float64)
    out = mech.run({column.name: y}, params, cost, meta, np.random.default_rng(streams[1]))
    assert out.table is not None
    selective = isinstance(plan.design, Selective)
    found = check_release(y, out.table, law, bins, nulls_def1=not selective)

    design = plan.design
    control_rng = np.random.default_rng(streams[2])
    table: Mapping[str, NDArray[Any]]
    if isinstance(design, Progressive):
        broken = ValueStopProgressive(design.support, design.rounds, design.tau_stop, law)
        control_charge = expected_coverage(broken, law).leakage_bound
        table = broken.release(y, control_rng).table(law)
        what = "value-dependent stop rule"
    elif isinstance(design, Selective):
        # the same output, described and charged as before #14: nulls as the whole line
        control_charge = old_selective_leakage(design, law)
        table = out.table
        what = "nulls counted as full coverage"
    else:
        assert isinstance(design, IntervalMechanism)
        control_charge = charged
        table = peeking_release(design, y, law, control_rng).table(law)
        what = "anchors redrawn after peeking at the value"
    control = check_release(y, table, law, bins, nulls_def1=True)
    passed = not found.flagged(charged)
    detail = (
        f"n={n}, bins={bins}; worst Def-1 class {found.worst_class} p={found.p_value:.3g};"
        f" max ratio {found.ratio:.3g} ({found.ratio_class}); realized leakage"
        f" {found.realized:.4f}. Control ({what}): certified {control.certified:.4f} vs"
        f" charged {control_charge:.4f}, worst p={control.p_value:.3g}"
        f" ({control.worst_class})"
    )
    return AuditReport(
        mechanism=mechanism, notion="interval", events_tried=found.tried + control.tried,
        certified=found.certified, charged=charged, passed=passed,
        control_caught=control.flagged(control_charge), detail=detail)


# the categorical progressive mechanism's entry, and the adaptive composition family's,
# register on import of this module
from mechanisms.interval import categorical_audit as _categorical_audit  # noqa: E402, F401
from mechanisms.interval import composition_audit as _composition_audit  # noqa: E402, F401
