"""The subset audit entries (``mechanisms.subset.audit``): they pass the registered
mechanisms, flag the leaky controls, and flag them *because* of the leak.

About 2 s in all: the entries take ~0.1 s each at "ci".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import registry, subset
from mechanisms.audit import entries
from mechanisms.subset import audit, bitmask
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.plan import Variable

ALIGNED = ("subset.uniform", "subset.custom", "subset.product")
SEED = 14


@pytest.mark.parametrize("name", [*ALIGNED, "subset.dummy"])
def test_entry_passes_the_mechanism_and_catches_its_control(name: str) -> None:
    assert entries.entries()[name] is (audit.audit_dummy if name == "subset.dummy"
                                      else audit.audit_aligned)
    report = entries.entries()[name](name, "ci", SEED)
    assert report.mechanism == name and report.notion == "subset"
    assert report.passed, report.detail
    assert report.control_caught, report.detail
    # one draw per column read; the combined uniform case and the product read two
    assert report.charged == {"subset.uniform": 2.0, "subset.product": 2.0}.get(name, 1.0)
    assert report.events_tried > 20
    assert 0.0 < report.certified < 1.0


def test_certified_risk_is_close_to_the_stated_risk() -> None:
    """The split-half bound is not vacuous: for the uniform p = 5 design under the uniform
    prior every guess is right with probability R = 2/5 (posteriors tie), so the bound is
    the held-out accuracy less the Clopper–Pearson margin (z at the per-test level); a
    further 3.3 standard errors covers the accuracy's own sampling error (1e-3)."""
    report = audit.audit_aligned("subset.uniform", "ci", SEED)
    se = math.sqrt(0.4 * 0.6 / (5 * audit.RECORDS["ci"] / 2))
    tests = sum(audit._tests_per_case(c) for c in audit.cases("subset.uniform", "ci"))
    margin = float(stats.norm.isf(audit.ALPHA / tests)) + 3.3
    assert 0.4 - margin * se < report.certified <= 0.4


Draws = list[tuple[audit.Case, list[Variable], list[Mapping[str, Any]], list[Masks],
                   list[Masks]]]


def _aligned_run(name: str, seed: int) -> Draws:
    """Each case's stated variables, stated privacy, and the two real draws."""
    mech = registry.get(name)
    rng = np.random.default_rng(seed)
    out = []
    for case in audit.cases(name, "ci"):
        first, _ = audit.release(mech, case.params, case.meta, case.data, rng)
        second, _ = audit.release(mech, case.params, case.meta, case.data, rng)
        stated = audit._stated(first)
        out.append((case, stated, audit.stated_privacy(first),
                    [audit._masks(first, v) for v in stated],
                    [audit._masks(second, v) for v in stated]))
    return out


@pytest.mark.parametrize("name", ALIGNED)
def test_control_differs_from_the_design(name: str) -> None:
    """Exactly: in some stratum the leaky law is far from the design's (TV), and the
    control's empirical release fits its own exact law — so the audit catches the leak,
    not a defect of the control or of the law test."""
    alpha = audit.ALPHA / 2
    for case, stated, _, first, second in _aligned_run(name, SEED):
        sizes = [v.p for v in stated]
        distances = []
        for combo in np.ndindex(*sizes):
            k = case.leak_variable
            honest = audit.conditional_law(stated[k].design, combo[k])
            target = int(case.telltale([np.array([j]) for j in combo], sizes)[0])
            distances.append(audit.total_variation(honest, audit.leaky_law(honest, target)))
        assert max(distances) > 0.02
        leaked = audit.leaky_masks(case, stated, first, second, np.random.default_rng(1))
        assert any(np.any(a != b) for a, b in zip(leaked, first, strict=True))
        rng = np.random.default_rng(2)
        own = audit.check_aligned(case, stated, _ignored(stated), leaked, rng, alpha,
                                  leaky=True)
        law_checks = [c for c in own.checks if c.name.endswith((": law", ": support"))]
        assert len(law_checks) == 2 and all(c.ok for c in law_checks), law_checks


def _ignored(stated: list[Variable]) -> list[Mapping[str, Any]]:
    """Placeholder stated privacy for tests that read only the law and support checks."""
    return [{"size_coverage": math.nan, "prediction_risk": math.inf,
             "min_individual_coverage": 0.0} for _ in stated]


def test_law_test_flags_another_valid_design() -> None:
    """A sampler drawing from a *different* valid design is subset-private (every subset
    holds the category, posteriors have the form (1)) but not what the release states:
    only the law test can see it, and it does."""
    case = audit.cases("subset.uniform", "ci")[0]
    out, _ = audit.release(registry.get("subset.uniform"), case.params, case.meta, case.data,
                           np.random.default_rng(0))
    (stated,) = audit._stated(out)
    other = subset.design_random(5, np.random.default_rng(3))
    masks = subset.privatize(case.data["u"], other, np.random.default_rng(4))
    found = audit.check_aligned(case, [stated], _ignored([stated]), [masks],
                                np.random.default_rng(5), 1e-3)
    by_name = {c.name.split(": ")[-1]: c.ok for c in found.checks}
    assert by_name["support"] and not by_name["law"]


def test_dummy_control_differs_and_fits_its_own_law() -> None:
    mech = registry.get("subset.dummy")
    honest, leaked = [], []
    rng = np.random.default_rng(SEED)
    for j, meta, data in audit.dummy_runs("ci"):
        out, _ = audit.release(mech, audit.dummy_params(), meta, data, rng)
        (variable,) = audit._stated(out)
        masks = audit._masks(out, variable)
        honest.append((j, out, masks))
        leaked.append((j, out, audit.dummy_leak(masks, j, audit.DUMMY_P, rng)))
        aug = variable.augmentation
        assert aug is not None
        m = out.result["variables"][0]["dummy"]["dummy_records_per_category"]
        law = audit.dummy_run_law(aug, j, meta.n_rows, m)
        assert math.isclose(float(law[1].sum()), 1.0, rel_tol=1e-12)
        assert audit.total_variation(law, audit.leaky_dummy_law(law, j, aug.p)) > 0.05
    n = audit.DUMMY_RECORDS["ci"]
    stated = honest[0][1].accuracy["variables"][0]["privacy_under_uniform_prior"]
    own = audit.check_dummy(leaked, n, stated, audit.ALPHA, leaky=True)
    assert all(c.ok for c in own.checks if not c.name.endswith("size coverage")), own.checks
    assert audit.check_dummy(honest, n, stated, audit.ALPHA).passed
    assert not audit.check_dummy(leaked, n, stated, audit.ALPHA).passed


def test_law_test_counts_impossible_outcomes_exactly() -> None:
    law = (np.array([3, 5, 6], dtype=np.uint64), np.array([0.5, 0.25, 0.25]))
    observed = np.array([3] * 50 + [5] * 25 + [6] * 25 + [1, 7], dtype=np.uint64)
    result = audit.law_test([(observed, law)])
    assert result.outside == 2
    # expected counts use all 102 records: 51, 25.5, 25.5
    assert result.statistic == pytest.approx(_pearson([50, 25, 25], [51.0, 25.5, 25.5]))
    assert result.df == 2 and result.cells == 3


def _pearson(obs: list[float], exp: list[float]) -> float:
    return sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))


def test_small_cells_are_pooled() -> None:
    law = (np.arange(4, dtype=np.uint64), np.array([0.97, 0.01, 0.01, 0.01]))
    observed = np.array([0] * 97 + [1, 2, 3], dtype=np.uint64)
    result = audit.law_test([(observed, law)])
    assert result.cells == 2 and result.df == 1  # the three 1-expected cells became one
    assert result.statistic == pytest.approx(0.0)


def test_mutual_information_and_risk_of_an_exact_sample() -> None:
    """The p = 4 uniform design under the uniform prior: I = 1 bit, R = 1/2, τ = 1/2.
    A sample holding every (category, subset) pair equally often is the law itself."""
    design = subset.design_uniform(4)
    truth, masks = [], []
    for j in range(4):
        subsets, _ = audit.conditional_law(design, j)
        for a in subsets:
            truth += [j] * 500
            masks += [int(a)] * 500
    x = np.asarray(truth, dtype=np.int64)
    a = np.asarray(masks, dtype=np.uint64)
    mi, se, df = audit.mutual_information(x, a)
    assert mi == pytest.approx(1.0, abs=1e-12)
    assert se == pytest.approx(0.0, abs=1e-12)  # log2 P(a|x)/P(a) = 1 for every record
    assert df == 12 - 6
    stated = subset.privacy_report(design, np.full(4, 0.25)).to_json()
    checks, bound = audit.metric_checks("exact", x, a, 4, stated, np.random.default_rng(0), 1e-3)
    assert all(c.ok for c in checks), checks
    assert 0.45 < bound <= 0.5
    # overstated privacy is flagged: every pair has L(a) = 1/2, not the 0.6 floor claimed
    claims = {**stated, "min_individual_coverage": 0.6, "mi_bits": 0.9, "prediction_risk": 0.4}
    checks, _ = audit.metric_checks("overstated", x, a, 4, claims, np.random.default_rng(0), 1e-3)
    failed = {c.name.split(": ")[-1] for c in checks if not c.ok}
    assert failed == {"individual coverage", "mutual information", "prediction risk"}


@settings(max_examples=25, deadline=None)
@given(p=st.integers(4, 7), j=st.integers(0, 6), target=st.integers(0, 6),
       seed=st.integers(0, 2**32 - 1))
def test_leaky_law_is_a_distribution_on_the_same_support(p: int, j: int, target: int,
                                                         seed: int) -> None:
    """The control's law sums to 1, never leaves the design's support (so only the law test,
    not the support check, can catch it), and equals the design iff the tell-tale is j."""
    design = subset.design_random(p, np.random.default_rng(seed))
    honest = audit.conditional_law(design, j % p)
    leaky = audit.leaky_law(honest, target % p)
    assert np.array_equal(leaky[0], honest[0])
    assert float(leaky[1].sum()) == pytest.approx(1.0, abs=1e-12)
    assert np.all(leaky[1] >= 0)
    assert np.all(bitmask.contains(leaky[0], np.full(len(leaky[0]), j % p)))
    same = audit.total_variation(honest, leaky) < 1e-12
    assert same == (target % p == j % p)
