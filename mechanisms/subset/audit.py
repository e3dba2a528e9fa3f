"""Audit entries for the subset mechanisms: the released subsets follow the stated design.

Subset privacy has no ε. A release is private because, given the true
category j, the released subset A follows exactly the design the release
states, P(A = a | X = j) = μ_a·1{j ∈ a} (Definition 2), so A says nothing
beyond "X ∈ A" (Definition 1), and the numbers it states — size coverage
τ, mutual information I(X;A), prediction risk R — are functions of that law.
So the audit runs the *registered* mechanism (``load_params``, ``cost``,
``run``) on synthetic data with known categories and checks, per case:

* exactly: every released subset lies in the support of the law stated for its
  record (so it holds the record's category, has an allowed size, and with
  dummies holds exactly one dummy category);
* one omnibus Pearson χ² of the released subsets' counts, stratified by the
  true category (strata summed, df summed), against the exact probabilities of
  the design read back from the release's own description;
* τ, I(X;A) and R, stated under the uniform prior, against their definitions
  evaluated on the empirical joint law of (X, A) (the data are uniform over
  the categories, so that prior is the truth), and the stated smallest
  individual coverage min L(a) against every released subset (exact);
* ``certified``: a Clopper–Pearson lower bound on the accuracy of the MAP
  guesser of X chosen on one half of the records and scored on the other —
  a lower bound on the true prediction risk, which must not exceed the stated R.

``subset.dummy`` interleaves simulated records at unpublished positions, so
its records' categories are unknown: each stratum is a dataset whose real
records all share one category, its law the mixture of that category and the
two dummies with the released dummy counts, and the per-record checks are the
coverage floor and τ (``certified`` is the worst individual size leakage
1 − L(A), at most 1 − α_eff).

Records are independent given their categories (each is privatized on its
own; ``subset.product`` columns on independent streams), which is what makes
one large run a sample of many. Tolerances come from sampling error: the
audit of one mechanism falsely fails a correct one with probability at most
``ALPHA`` (Bonferroni over its tests; fixed seeds make runs reproducible).

The negative control is the same check on a deliberately leaky variant built
from two real runs: where the first run's subset holds a *tell-tale* category
(the next category after the record's own; for the product, the second
column's subset holding the first column's category), with probability
``LEAK`` the second run's subset is released instead — a sampler whose law
depends on the category beyond the design. For the dummy mechanism the
variant picks the first dummy category more often when the subset holds the
records' category. Exact laws of these variants are in ``leaky_law``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from mechanisms import registry
from mechanisms.audit.entries import AuditReport, AuditSize, entry
from mechanisms.base import ColumnMeta, DatasetMeta, Mechanism, Output
from mechanisms.subset import bitmask
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import Design
from mechanisms.subset.dummy import DummyAugmentation
from mechanisms.subset.plan import MEASURE, Variable

#: probability that the audit of one mechanism fails a correct implementation
ALPHA = 1e-3
#: how often the leaky control swaps in the second draw when the tell-tale is present
LEAK = 0.25
#: χ² cells with a smaller expected count are pooled (per stratum)
MIN_EXPECTED = 5.0
#: records per stratum (true category, or combination for the product) by audit size
RECORDS = {"ci": 6000, "full": 60_000}
#: the product has 20 strata: fewer records each
PRODUCT_RECORDS = {"ci": 1500, "full": 15_000}
#: real records per dummy run (one run per category)
DUMMY_RECORDS = {"ci": 8000, "full": 80_000}
#: float slack when comparing a computed bound with a stated metric
SLACK = 1e-12

#: outcome codes (uint64: one mask, or several masks side by side) and their probabilities
Law = tuple[NDArray[np.uint64], NDArray[np.float64]]


# --------------------------------------------------------------------------- exact laws


def conditional_law(design: Design, j: int) -> Law:
    """P(A = a | X = j) = μ_a on the subsets a ∋ j (masks increasing)."""
    masks, mu = design.law()
    holds = bitmask.contains(masks, np.full(len(masks), j))
    return masks[holds], mu[holds]


def leaky_law(law: Law, target: int) -> Law:
    """The control's law: redraw with probability LEAK when the subset holds ``target``.

    P'(a) = P(a)·(1 − β·1{t ∈ a} + β·π_t) with π_t = P(t ∈ A): a subset
    without the tell-tale becomes likelier whenever 0 < π_t < 1.
    """
    masks, probs = law
    has = bitmask.contains(masks, np.full(len(masks), target))
    pi = float(probs[has].sum())
    return masks, probs * (1.0 - LEAK * has + LEAK * pi)


def product_law(laws: Sequence[Law], sizes: Sequence[int]) -> Law:
    """Joint law of independent variables, masks side by side (variable k at bit offset)."""
    codes = np.zeros(1, dtype=np.uint64)
    probs = np.ones(1)
    shift = 0
    for (masks, p_k), p in zip(laws, sizes, strict=True):
        codes = (codes[:, None] | (masks[None, :] << np.uint64(shift))).ravel()
        probs = (probs[:, None] * p_k[None, :]).ravel()
        shift += p
    order = np.argsort(codes)
    return codes[order], probs[order]


def dummy_run_law(aug: DummyAugmentation, j: int, n: int, m: int) -> Law:
    """Released subsets of a run whose n real records are all j, plus m dummies of each kind.

    A uniformly chosen released record is real with category j (weight n) or
    a dummy record of dummy d (weight m each); each follows μ'_{a'}·1{x ∈ a'}.
    """
    masks, mu = aug.law()
    p = aug.p
    weight = (n * bitmask.contains(masks, np.full(len(masks), j))
              + m * bitmask.contains(masks, np.full(len(masks), p))
              + m * bitmask.contains(masks, np.full(len(masks), p + 1)))
    probs = mu * weight / (n + 2 * m)
    keep = probs > 0
    return masks[keep], probs[keep]


def leaky_dummy_law(law: Law, j: int, p: int) -> Law:
    """The dummy control's law: a subset holding j switches to dummy p w.p. LEAK."""
    masks, probs = law
    holds = bitmask.contains(masks, np.full(len(masks), j))
    second = bitmask.contains(masks, np.full(len(masks), p + 1))
    moved = holds & second
    target = masks[moved] ^ bitmask.bit(p + 1) ^ bitmask.bit(p)
    out = dict(zip(masks.tolist(), (probs * np.where(moved, 1.0 - LEAK, 1.0)).tolist(),
                   strict=True))
    for mask, prob in zip(target.tolist(), (LEAK * probs[moved]).tolist(), strict=True):
        out[mask] = out.get(mask, 0.0) + prob
    codes = np.array(sorted(out), dtype=np.uint64)
    return codes, np.array([out[c] for c in codes.tolist()])


def total_variation(a: Law, b: Law) -> float:
    """½ Σ |P_a − P_b| over the union of the two supports."""
    codes = np.union1d(a[0], b[0])
    pa = np.zeros(len(codes))
    pb = np.zeros(len(codes))
    pa[np.searchsorted(codes, a[0])] = a[1]
    pb[np.searchsorted(codes, b[0])] = b[1]
    return float(0.5 * np.abs(pa - pb).sum())


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class LawTest:
    """Omnibus Pearson χ² over strata, and the observations the law calls impossible."""

    statistic: float
    df: int
    p_value: float
    cells: int
    #: released outcomes outside the stratum's support (exact violations)
    outside: int


def law_test(strata: Sequence[tuple[NDArray[np.uint64], Law]]) -> LawTest:
    """Σ over strata of Pearson's statistic against n·P (small cells pooled), df summed."""
    statistic, df, cells, outside = 0.0, 0, 0, 0
    for observed, (codes, probs) in strata:
        order = np.argsort(codes)
        codes, probs = codes[order], probs[order]
        values, counts = np.unique(observed, return_counts=True)
        pos = np.clip(np.searchsorted(codes, values), 0, len(codes) - 1)
        inside = codes[pos] == values
        outside += int(counts[~inside].sum())
        obs = np.zeros(len(codes))
        np.add.at(obs, pos[inside], counts[inside])
        expected = len(observed) * probs
        small = expected < MIN_EXPECTED
        if small.any():
            obs = np.append(obs[~small], obs[small].sum())
            expected = np.append(expected[~small], expected[small].sum())
        keep = expected > 0
        obs, expected = obs[keep], expected[keep]
        statistic += float(((obs - expected) ** 2 / expected).sum())
        df += len(expected) - 1
        cells += len(expected)
    p_value = float(stats.chi2.sf(statistic, df)) if df > 0 else 1.0
    return LawTest(statistic, df, p_value, cells, outside)


@dataclass(frozen=True)
class Check:
    """One check of a case: what was compared and whether it held."""

    name: str
    ok: bool
    text: str


def _size(masks: Masks, w: NDArray[np.float64], p: int) -> NDArray[np.float64]:
    """L(a) = Σ_{x∈a} w_x for each released subset (computed per distinct subset)."""
    distinct, inverse = np.unique(masks, return_inverse=True)
    sizes: NDArray[np.float64] = bitmask.indicators(distinct, p) @ w
    return sizes[inverse.reshape(-1)]


def _joint_counts(truth: NDArray[np.int64], masks: Masks
                  ) -> tuple[NDArray[np.uint64], NDArray[np.int64], NDArray[np.intp]]:
    """Distinct (subset, category) keys, their counts, and each record's key index."""
    keys = (masks.astype(np.uint64) << np.uint64(6)) | truth.astype(np.uint64)
    distinct, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return distinct, counts, inverse.reshape(-1)


def mutual_information(truth: NDArray[np.int64], masks: Masks) -> tuple[float, float, int]:
    """Plug-in I(X;A) in bits, its delta-method standard error, and its degrees of freedom.

    The plug-in estimate is biased upwards by about df/(2N ln 2) with df the
    joint cells minus the subset cells (categories are fixed by design);
    the standard error is that of the mean of log2 P̂(x,a)/(P̂(x)P̂(a)) over
    records (its influence function), which the caller widens by the bias.
    """
    n = len(truth)
    keys, joint, inverse = _joint_counts(truth, masks)
    subset_of_key = keys >> np.uint64(6)
    cat_of_key = (keys & np.uint64(63)).astype(np.int64)
    a_values, a_inverse = np.unique(subset_of_key, return_inverse=True)
    a_inverse = a_inverse.reshape(-1)
    a_counts = np.bincount(a_inverse, weights=joint)  # records per subset
    x_counts = np.bincount(truth, minlength=int(cat_of_key.max()) + 1)
    ratio = np.log2(joint * n / (a_counts[a_inverse] * x_counts[cat_of_key]))
    mi = float((joint * ratio).sum() / n)
    per_record = ratio[inverse]
    se = float(per_record.std() / math.sqrt(n))
    return mi, se, len(keys) - len(a_values)


def risk_lower_bound(truth: NDArray[np.int64], masks: Masks, w: NDArray[np.float64],
                     rng: np.random.Generator, alpha: float) -> tuple[float, int, int]:
    """Clopper–Pearson (1 − α) lower bound on the prediction risk, split-half.

    The guesser names, for each subset seen in the first half, its most
    frequent category there (unseen subsets: the prior mode within the
    subset); its accuracy on the second half estimates the accuracy of a
    fixed rule, which is at most R = max over rules. Returns the bound,
    hits and records scored.
    """
    order = rng.permutation(len(truth))
    first, second = order[: len(order) // 2], order[len(order) // 2:]
    keys, counts, _ = _joint_counts(truth[first], masks[first])
    subsets = keys >> np.uint64(6)
    cats = (keys & np.uint64(63)).astype(np.int64)
    best = np.lexsort((cats, -counts, subsets))  # per subset: most frequent, then lowest code
    subsets, cats = subsets[best], cats[best]
    head = np.r_[True, subsets[1:] != subsets[:-1]]
    table, guess = subsets[head], cats[head]
    scored = masks[second]
    pos = np.clip(np.searchsorted(table, scored), 0, max(len(table) - 1, 0))
    seen = table[pos] == scored if len(table) else np.zeros(len(scored), bool)
    prior = np.where(bitmask.bits(scored, len(w)) > 0, w[None, :], -1.0).argmax(axis=1)
    guesses = np.where(seen, guess[pos], prior)
    hits = int(np.count_nonzero(guesses == truth[second]))
    n = len(second)
    bound = float(stats.beta.ppf(alpha, hits, n - hits + 1)) if hits > 0 else 0.0
    return bound, hits, n


def metric_checks(name: str, truth: NDArray[np.int64], masks: Masks, p: int,
                  stated: Mapping[str, Any], rng: np.random.Generator, alpha: float
                  ) -> tuple[list[Check], float]:
    """τ, I(X;A) and R stated under the uniform prior against their definitions.

    The data are uniform over the p categories, so the stated prior is the
    empirical distribution of X. Each check is at level ``alpha``; returns
    the checks and the certified lower bound on the prediction risk.
    """
    n = len(truth)
    w = np.bincount(truth, minlength=p) / n
    z = float(stats.norm.isf(alpha / 2))
    sizes = _size(masks, w, p)
    tau, tau_se = float(sizes.mean()), float(sizes.std() / math.sqrt(n))
    tau_stated = float(stated["size_coverage"])
    checks = [Check(f"{name}: size coverage", abs(tau - tau_stated) <= z * tau_se + SLACK,
                    f"tau {tau:.5f} vs stated {tau_stated:.5f} (se {tau_se:.1e})")]
    floor = float(stated["min_individual_coverage"])
    checks.append(Check(f"{name}: individual coverage", float(sizes.min()) >= floor - SLACK,
                        f"smallest L(A) {float(sizes.min()):.4f} vs stated floor {floor:.4f}"))
    mi, mi_se, df = mutual_information(truth, masks)
    if stated.get("mi_bits") is not None:
        mi_stated = float(stated["mi_bits"])
        tol = z * mi_se + (df + z * math.sqrt(2 * df)) / (2 * n * math.log(2))
        checks.append(Check(f"{name}: mutual information", abs(mi - mi_stated) <= tol + SLACK,
                            f"I {mi:.5f} vs stated {mi_stated:.5f} bits (tol {tol:.1e})"))
    bound, hits, scored = risk_lower_bound(truth, masks, w, rng, alpha)
    risk_stated = float(stated["prediction_risk"])
    checks.append(Check(f"{name}: prediction risk", bound <= risk_stated + SLACK,
                        f"held-out MAP accuracy {hits}/{scored}, lower bound {bound:.4f} vs"
                        f" stated R {risk_stated:.4f}"))
    return checks, bound


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One audited request: params, metadata, and the records' true categories per column."""

    label: str
    params: Mapping[str, Any]
    meta: DatasetMeta
    data: Mapping[str, NDArray[np.int64]]
    #: which variable the control leaks through, and its tell-tale category per record
    leak_variable: int = 0
    telltale: Callable[[Sequence[NDArray[np.int64]], Sequence[int]], NDArray[np.int64]] = field(
        default=lambda truths, sizes: (truths[0] + 1) % sizes[0])


def _meta(n: int, columns: Mapping[str, int]) -> DatasetMeta:
    return DatasetMeta(n, {name: ColumnMeta(name, "categorical",
                                            categories=tuple(f"{name}{k}" for k in range(p)))
                           for name, p in columns.items()})


def _repeated(p: int, per: int) -> NDArray[np.int64]:
    return np.repeat(np.arange(p, dtype=np.int64), per)


def _cycle_design() -> dict[str, Any]:
    """The p = 5 'cycle' conditional design (μ = 1/2 on neighbouring pairs): 1.32 bits."""
    return {"type": "mu", "subsets": [[f"c{k}", f"c{(k + 1) % 5}"] for k in range(5)],
            "probabilities": [0.5] * 5}


def _random_nu(p: int) -> dict[str, Any]:
    """ν ∝ U(0,1) on the subsets of size 2..p−2 (fixed draw: the paper's random design)."""
    masks = bitmask.all_masks(p)
    sizes = bitmask.popcount(masks)
    support = masks[(sizes >= 2) & (sizes <= p - 2)]
    weights = np.random.default_rng(2107).random(len(support))
    return {"type": "nu",
            "subsets": [[f"r{j}" for j in bitmask.members(m)] for m in support],
            "probabilities": (weights / weights.sum()).tolist()}


def cases(mechanism: str, size: AuditSize) -> list[Case]:
    """The audited requests of one mechanism (``subset.dummy`` has its own runs)."""
    per = RECORDS[size]
    if mechanism == "subset.uniform":
        sex, income = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
        return [
            Case("uniform p=5", {"column": "u"}, _meta(5 * per, {"u": 5}),
                 {"u": _repeated(5, per)}),
            # the small-domain strategy: a binary and a ternary column joined (p = 6)
            Case("uniform combined 2 x 3", {"column": "s", "combine_with": ["i"]},
                 _meta(6 * per, {"s": 2, "i": 3}),
                 {"s": np.repeat(sex.ravel(), per), "i": np.repeat(income.ravel(), per)}),
        ]
    if mechanism == "subset.custom":
        return [
            Case("cycle mu p=5", {"column": "c", "design": _cycle_design()},
                 _meta(5 * per, {"c": 5}), {"c": _repeated(5, per)}),
            Case("random nu p=6", {"column": "r", "design": _random_nu(6)},
                 _meta(6 * per, {"r": 6}), {"r": _repeated(6, per)}),
        ]
    if mechanism == "subset.product":
        each = PRODUCT_RECORDS[size]
        x, y = np.meshgrid(np.arange(4), np.arange(5), indexing="ij")
        return [Case(
            "product p=4 x p=5", {"columns": ["x", "y"]}, _meta(20 * each, {"x": 4, "y": 5}),
            {"x": np.repeat(x.ravel(), each), "y": np.repeat(y.ravel(), each)},
            leak_variable=1,
            # the second column's tell-tale is the FIRST column's category: a cross-column leak
            telltale=lambda truths, sizes: truths[0] % sizes[1])]
    raise KeyError(mechanism)


# --------------------------------------------------------------------------- running


def release(mechanism: Mechanism, case_params: Mapping[str, Any], meta: DatasetMeta,
            data: Mapping[str, np.ndarray], rng: np.random.Generator
            ) -> tuple[Output, dict[str, Fraction]]:
    """The service's path: validate params, price one draw per column, run."""
    params = mechanism.load_params(dict(case_params))
    cost = mechanism.cost(params, {MEASURE: Fraction(1)}, meta)
    return mechanism.run(data, params, cost, meta, rng), cost


def _stated(out: Output) -> list[Variable]:
    """The variables (designs, dummies) as the release describes them."""
    return [Variable.from_json(doc) for doc in out.result["variables"]]


def _masks(out: Output, variable: Variable) -> Masks:
    assert out.table is not None
    return bitmask.as_masks(out.table[variable.name])


@dataclass(frozen=True)
class Outcome:
    """What the checks of one mechanism (or its control) found."""

    checks: list[Check]
    events: int
    certified: float

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> str:
        return "; ".join(c.name for c in self.checks if not c.ok) or "none"


def _strata(truths: Sequence[NDArray[np.int64]], sizes: Sequence[int]
            ) -> tuple[NDArray[np.int64], list[tuple[int, ...]]]:
    """Joint category code of each record, and the category tuple of each code."""
    code = np.zeros(len(truths[0]), dtype=np.int64)
    for t, p in zip(truths, sizes, strict=True):
        code = code * p + t
    combos = list(np.ndindex(*sizes))
    return code, combos


def check_aligned(case: Case, stated: Sequence[Variable], privacy: Sequence[Mapping[str, Any]],
                  masks: Sequence[Masks], rng: np.random.Generator, alpha: float, *,
                  leaky: bool = False) -> Outcome:
    """The law test and metric checks of a row-aligned release (records in row order).

    ``leaky`` compares with the control's exact law instead of the stated
    design (used by the tests to show the check accepts the control's true law).
    """
    truths = variable_truths(case, stated)
    sizes = [v.p for v in stated]
    code, combos = _strata(truths, sizes)
    joint = np.zeros(len(code), dtype=np.uint64)
    shift = 0
    for m, p in zip(masks, sizes, strict=True):
        joint |= m << np.uint64(shift)
        shift += p
    strata = []
    for k, combo in enumerate(combos):
        laws = [conditional_law(v.design, j) for v, j in zip(stated, combo, strict=True)]
        if leaky:
            target = case.telltale([np.array([j]) for j in combo], sizes)[0]
            laws[case.leak_variable] = leaky_law(laws[case.leak_variable], int(target))
        strata.append((joint[code == k], product_law(laws, sizes)))
    test = law_test(strata)
    checks = [
        Check(f"{case.label}: support", test.outside == 0,
              f"{test.outside} released subsets outside the stated law's support"),
        Check(f"{case.label}: law", test.p_value >= alpha,
              f"chi2 {test.statistic:.1f} on {test.df} df, p = {test.p_value:.2e}"),
    ]
    certified = 0.0
    for v, t, m, said in zip(stated, truths, masks, privacy, strict=True):
        found, bound = metric_checks(f"{case.label}: {v.name}", t, m, v.p, said, rng, alpha)
        checks += found
        certified = max(certified, bound)
    return Outcome(checks, test.cells + len(checks) - 2, certified)


def stated_privacy(out: Output) -> list[Mapping[str, Any]]:
    """Each variable's metrics under the uniform prior, from the accuracy statement."""
    return [doc["privacy_under_uniform_prior"] for doc in out.accuracy["variables"]]


def _tests_per_case(case: Case) -> int:
    """Statistical tests in one case: the χ² and three metrics per variable."""
    return 1 + 3 * len(case.params.get("columns", [None]))


def variable_truths(case: Case, stated: Sequence[Variable]) -> list[NDArray[np.int64]]:
    """Each privatized variable's true category per record (joint code if combined)."""
    for v in stated:
        if v.domain.artificial_levels > 1:
            raise ValueError("an artificial variable's categories are drawn inside the run")
    return [v.domain.encode([case.data[c] for c in v.columns]) for v in stated]


def leaky_masks(case: Case, stated: Sequence[Variable], first: Sequence[Masks],
                second: Sequence[Masks], rng: np.random.Generator) -> list[Masks]:
    """The control's release: the second draw where the tell-tale is present (w.p. LEAK)."""
    truths = variable_truths(case, stated)
    k = case.leak_variable
    target = case.telltale(truths, [v.p for v in stated])
    swap = bitmask.contains(first[k], target) & (rng.random(len(target)) < LEAK)
    out = list(first)
    out[k] = np.where(swap, second[k], first[k])
    return out


@entry("subset.uniform", "subset.custom", "subset.product")
def audit_aligned(mechanism: str, size: AuditSize, seed: int) -> AuditReport:
    """``subset.uniform``, ``.custom``, ``.product``: records keep their row order."""
    mech = registry.get(mechanism)
    chosen = cases(mechanism, size)
    alpha = ALPHA / sum(_tests_per_case(c) for c in chosen)
    honest: list[Outcome] = []
    control: list[Outcome] = []
    charged = 0.0
    for case, stream in zip(chosen, np.random.default_rng(seed).spawn(len(chosen)),
                            strict=True):
        run_a, run_b, split_a, split_b, coin = stream.spawn(5)
        out, cost = release(mech, case.params, case.meta, case.data, run_a)
        charged = max(charged, float(sum(cost.values())))
        stated = _stated(out)
        first = [_masks(out, v) for v in stated]
        said = stated_privacy(out)
        honest.append(check_aligned(case, stated, said, first, split_a, alpha))
        again, _ = release(mech, case.params, case.meta, case.data, run_b)
        second = [_masks(again, v) for v in stated]
        leaked = leaky_masks(case, stated, first, second, coin)
        control.append(check_aligned(case, stated, said, leaked, split_b, alpha))
    return _report(mechanism, honest, control, charged)


def _report(mechanism: str, honest: Sequence[Outcome], control: Sequence[Outcome],
            charged: float) -> AuditReport:
    passed = all(o.passed for o in honest)
    caught = not all(o.passed for o in control)
    certified = max(o.certified for o in honest)
    detail = (f"failed: {'; '.join(o.failures() for o in honest)}; control failed:"
              f" {'; '.join(o.failures() for o in control)}; control certified"
              f" {max(o.certified for o in control):.4f}")
    return AuditReport(mechanism=mechanism, notion="subset",
                       events_tried=sum(o.events for o in honest), certified=certified,
                       charged=charged, passed=passed, control_caught=caught, detail=detail)


# --------------------------------------------------------------------------- dummy


#: the dummy case: a ternary column (the p < 4 use of dummies) with share alpha
DUMMY_P = 3
DUMMY_ALPHA = 0.1


def dummy_params() -> dict[str, Any]:
    return {"column": "t", "alpha": DUMMY_ALPHA}


def dummy_runs(size: AuditSize) -> list[tuple[int, DatasetMeta, dict[str, NDArray[np.int64]]]]:
    """One dataset per category j, all its real records j."""
    n = DUMMY_RECORDS[size]
    meta = _meta(n, {"t": DUMMY_P})
    return [(j, meta, {"t": np.full(n, j, dtype=np.int64)}) for j in range(DUMMY_P)]


def dummy_leak(masks: Masks, j: int, p: int, rng: np.random.Generator) -> Masks:
    """The dummy control: a subset holding j moves to the first dummy w.p. LEAK."""
    move = bitmask.contains(masks, np.full(len(masks), j)) & (rng.random(len(masks)) < LEAK)
    first = (masks & bitmask.full(p)) | bitmask.bit(p)
    return np.where(move, first, masks)


def check_dummy(runs: Sequence[tuple[int, Output, Masks]], size_n: int,
                stated_privacy: Mapping[str, Any], alpha: float, *, leaky: bool = False
                ) -> Outcome:
    """Law test per run (mixture of j and the dummies), the coverage floor and τ."""
    strata = []
    checks: list[Check] = []
    pooled: list[NDArray[np.float64]] = []
    worst_leakage = 0.0
    for j, out, masks in runs:
        (variable,) = _stated(out)
        aug = variable.augmentation
        assert aug is not None
        p = aug.p
        doc = out.result["variables"][0]["dummy"]
        m = int(doc["dummy_records_per_category"])
        alpha_eff = Fraction(doc["alpha_effective_exact"])
        consistent = (len(masks) == size_n + 2 * m and m == aug.dummy_count(size_n)
                      and alpha_eff == Fraction(m, size_n + 2 * m))
        checks.append(Check(f"dummy run {j}: counts", consistent,
                            f"{len(masks)} records, {m} dummies per category, alpha_eff"
                            f" {alpha_eff}"))
        law = dummy_run_law(aug, j, size_n, m)
        if leaky:
            law = leaky_dummy_law(law, j, p)
        strata.append((masks, law))
        one_dummy = np.isin(masks >> np.uint64(p), [1, 2])
        w = np.asarray(aug.population(np.full(p, 1.0 / p), float(alpha_eff)))
        sizes = _size(masks, w, p + 2)
        floor_ok = bool(one_dummy.all()) and float(sizes.min()) >= float(alpha_eff) - SLACK
        worst_leakage = max(worst_leakage, 1.0 - float(sizes.min()))
        checks.append(Check(f"dummy run {j}: coverage floor", floor_ok,
                            f"{int((~one_dummy).sum())} subsets without exactly one dummy;"
                            f" smallest coverage {float(sizes.min()):.4f} vs alpha_eff"
                            f" {float(alpha_eff):.4f}"))
        pooled.append(sizes)
    test = law_test(strata)
    checks.append(Check("dummy: support", test.outside == 0,
                        f"{test.outside} released subsets outside the stated law's support"))
    checks.append(Check("dummy: law", test.p_value >= alpha,
                        f"chi2 {test.statistic:.1f} on {test.df} df, p = {test.p_value:.2e}"))
    # every run has the same real/dummy split, so pooling the runs gives the augmented
    # uniform population the accuracy statement assumes; the sd over pooled records
    # includes between-run spread, which makes the interval conservative
    sizes = np.concatenate(pooled)
    z = float(stats.norm.isf(alpha / 2))
    tau, tau_se = float(sizes.mean()), float(sizes.std() / math.sqrt(len(sizes)))
    tau_stated = float(stated_privacy["size_coverage"])
    checks.append(Check("dummy: size coverage", abs(tau - tau_stated) <= z * tau_se + SLACK,
                        f"tau {tau:.5f} vs stated {tau_stated:.5f} (se {tau_se:.1e})"))
    return Outcome(checks, test.cells + len(checks) - 2, worst_leakage)


@entry("subset.dummy")
def audit_dummy(mechanism: str, size: AuditSize, seed: int) -> AuditReport:
    """``subset.dummy``: one run per category; dummy rows sit at unpublished positions."""
    mech = registry.get(mechanism)
    runs = dummy_runs(size)
    n = runs[0][1].n_rows
    alpha = ALPHA / 2  # the χ² and τ
    honest, leaked = [], []
    charged = 0.0
    accuracy: Mapping[str, Any] = {}
    for (j, meta, data), stream in zip(runs, np.random.default_rng(seed).spawn(len(runs)),
                                       strict=True):
        run, coin = stream.spawn(2)
        out, cost = release(mech, dummy_params(), meta, data, run)
        charged = max(charged, float(sum(cost.values())))
        accuracy = out.accuracy["variables"][0]["privacy_under_uniform_prior"]
        (variable,) = _stated(out)
        masks = _masks(out, variable)
        honest.append((j, out, masks))
        leaked.append((j, out, dummy_leak(masks, j, DUMMY_P, coin)))
    good = check_dummy(honest, n, accuracy, alpha)
    bad = check_dummy(leaked, n, accuracy, alpha)
    return _report(mechanism, [good], [bad], charged)
