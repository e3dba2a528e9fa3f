"""Audit of ``interval.progressive_categorical``: Def 1 checked on real releases.

Def 1 says that given its output a record's category follows the prior restricted
to the released set. The audit draws categories from a skewed prior, runs the
registered mechanism, and in every output class (final set and rounds answered)
with enough records tests the categories against the restricted prior by a
chi-square test (Bonferroni over classes, level ``ALPHA``). ``certified`` is a
one-sided lower confidence bound on the mean leakage 1 − π(S) under that prior,
which must not exceed the charge (the worst case over priors). The negative
control stops after the first round whenever the value is category 0 (a stop
rule that reads the value, as the paper's Way II may): its classes are flagged.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from mechanisms import registry
from mechanisms.audit.entries import AuditReport, AuditSize, entry
from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.interval import categorical
from mechanisms.interval.categorical_entries import NAME

ALPHA = 1e-3
SIZES: dict[str, int] = {"ci": 20_000, "full": 1_000_000}
PROBS = np.array([0.4, 0.25, 0.15, 0.12, 0.08])
ROUNDS = 2
#: a class is tested when every category of its set expects at least this many records
MIN_EXPECTED = 5.0


def _check(codes: NDArray[np.int64], feasible: NDArray[np.bool_], rounds: NDArray[np.int64],
           probs: NDArray[np.float64]) -> tuple[float, int, str]:
    """Smallest Bonferroni-adjusted p-value over output classes, classes tested, worst."""
    k = probs.shape[0]
    bits = feasible.astype(np.int64) @ (np.int64(1) << np.arange(k, dtype=np.int64))
    key = bits * 64 + rounds
    classes, inverse = np.unique(key, return_inverse=True)
    tested, worst_p, worst = 0, 1.0, ""
    pvals = []
    for i, cls in enumerate(classes):
        members = inverse == i
        mask = feasible[np.argmax(members)]
        if mask.sum() < 2:
            continue  # a singleton set: the value is determined, nothing to test
        expected = probs[mask] / probs[mask].sum() * members.sum()
        if expected.min() < MIN_EXPECTED:
            continue
        observed = np.bincount(codes[members], minlength=k)[mask]
        p = float(stats.chisquare(observed, expected).pvalue)
        pvals.append(p)
        tested += 1
        if p < worst_p:
            worst_p, worst = p, f"set {int(cls) // 64:#x}, {int(cls) % 64} rounds"
    adjusted = min(1.0, worst_p * max(tested, 1))
    return adjusted, tested, worst


@entry(NAME)
def audit(mechanism: str, size: AuditSize, seed: int) -> AuditReport:
    n = SIZES[size]
    k = PROBS.shape[0]
    column = ColumnMeta("c", "categorical", categories=tuple(f"c{i}" for i in range(k)))
    meta = DatasetMeta(n, {"c": column})
    mech = registry.get(mechanism)
    params = mech.load_params({"column": "c", "rounds": ROUNDS})
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, meta)
    charged = float(next(iter(cost.values())))
    streams = np.random.SeedSequence([seed, 7]).spawn(3)
    codes = np.random.default_rng(streams[0]).choice(k, size=n, p=PROBS)
    out = mech.run({"c": codes}, params, cost, meta, np.random.default_rng(streams[1]))
    assert out.table is not None
    feasible = categorical.masks_from_table(dict(out.table), k)
    assert np.all(feasible[np.arange(n), codes]), "a released set misses the value"
    p_value, tested, worst = _check(codes, feasible, np.asarray(out.table["rounds"]), PROBS)
    leak = 1.0 - feasible.astype(np.float64) @ PROBS
    certified = float(leak.mean() - stats.norm.ppf(1 - ALPHA) * leak.std(ddof=1) / np.sqrt(n))

    # control: the same questions, but a record whose value is category 0 stops after
    # round 1 (the stop reads the value)
    design = categorical.ProgressiveCategorical(k, ROUNDS)
    keys = np.random.default_rng(streams[2]).random((n, ROUNDS, k))
    full = design.run(codes, keys)
    first = categorical.ProgressiveCategorical(k, 1).run(codes, keys[:, :1, :])
    stop = codes == 0
    c_feasible = np.where(stop[:, None], first.feasible, full.feasible)
    c_rounds = np.where(stop, first.rounds, full.rounds)
    c_p, c_tested, c_worst = _check(codes, c_feasible, c_rounds, PROBS)
    passed = p_value >= ALPHA and certified <= charged
    detail = (f"n={n}, k={k}, rounds={ROUNDS}; {tested} classes tested, worst {worst}"
              f" p={p_value:.3g}; certified leakage {certified:.4f} vs charged {charged:.4f}."
              f" Control (stop when the value is category 0): worst {c_worst}"
              f" p={c_p:.3g} over {c_tested} classes")
    return AuditReport(mechanism=mechanism, notion="interval", events_tried=tested + c_tested,
                       certified=certified, charged=charged, passed=passed,
                       control_caught=c_p < ALPHA, detail=detail)
