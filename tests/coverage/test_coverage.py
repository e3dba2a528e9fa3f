"""Every accuracy statement's stated level against simulation (issue #32).

CI runs the cases in ``tests.coverage.cases.CI`` small (a few hundred seeded runs each);
``make audit`` runs every case at length (``-m coverage_full``) and writes the table that
docs/coverage.md shows. A registered mechanism with neither a case nor an exemption
fails here, and so does a harness that cannot fail (the negative controls).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import mechanisms
from tests.coverage.cases import CASES, CI, EXEMPT
from tests.coverage.harness import HEADER, hits_floor, rms_check, row, run_case, scaled_errors

#: where the long run writes its table (``make audit``: var/coverage.md)
TABLE = Path(os.environ.get("PRIVRELEASE_COVERAGE_OUT", "var/coverage.md"))


def test_every_registered_mechanism_is_covered_or_exempt() -> None:
    """A new mechanism fails here until it has a case or a stated reason for none."""
    covered = {case.mechanism for case in CASES.values()}
    registered = set(mechanisms.names())
    assert covered | set(EXEMPT) == registered, sorted(registered ^ (covered | set(EXEMPT)))
    assert not covered & set(EXEMPT), sorted(covered & set(EXEMPT))
    assert all(reason.strip() for reason in EXEMPT.values())
    assert set(CI) <= set(CASES), sorted(set(CI) - set(CASES))


@pytest.mark.parametrize("label", sorted(CI))
def test_stated_level_holds(label: str) -> None:
    """Per cell, and jointly where the statement claims it, the truth is inside the stated
    interval as often as the level says, up to the binomial error of the runs."""
    outcome = run_case(CASES[label], "ci")
    assert outcome.passed, (row(outcome), outcome.failures)


@pytest.mark.parametrize(("label", "shrink"), [
    ("laplace.mean", 0.6),            # one number: 95 % stated, ~84 % left
    ("laplace.count_table", 0.5),     # per cell
    ("laplace.count_table.simultaneous", 0.75),
    ("noiseless.aggregate.mean", 0.8),  # a deterministic bound: one miss fails
])
def test_a_narrower_interval_is_caught(label: str, shrink: float) -> None:
    """Negative controls: the same runs with every interval shrunk must fail."""
    outcome = run_case(dataclasses.replace(CASES[label], shrink=shrink), "ci")
    assert not outcome.passed, row(outcome)


@pytest.mark.parametrize("runs", [1, 7, 50, 400, 5000])
@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99])
def test_hits_floor_is_the_binomial_tail(runs: int, level: float) -> None:
    """The floor k is the least count not refuted: P(Bin <= k) >= α > P(Bin <= k - 1)."""
    alpha = 1e-3
    k = hits_floor(runs, level, alpha)
    assert stats.binom.cdf(k, runs, level) >= alpha
    assert k == 0 or stats.binom.cdf(k - 1, runs, level) < alpha
    assert hits_floor(runs, 1.0, alpha) == runs


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.floats(-50, 50), st.floats(0.01, 20), st.floats(0.01, 20), st.floats(-50, 50))
def test_scaled_error_is_at_most_one_exactly_inside(estimate: float, below: float,
                                                     above: float, truth: float) -> None:
    """|error| over the half-width on the truth's side: <= 1 iff inside (asymmetric too)."""
    e = scaled_errors(np.array([truth]), np.array([estimate]), np.array([estimate - below]),
                      np.array([estimate + above]))[0]
    inside = estimate - below <= truth <= estimate + above
    margin = 1e-6 * (1 + abs(truth))
    if estimate - below + margin < truth < estimate + above - margin:
        assert e < 1
    elif not (estimate - below - margin <= truth <= estimate + above + margin):
        assert e > 1
    assert (e <= 1) == inside or abs(e - 1) < 1e-6


@pytest.mark.coverage_full
def test_every_case_at_length() -> None:
    """``make audit``: every case at full size; the table goes to ``TABLE`` (all rows,
    failing ones too), then the failures are named."""
    outcomes = [run_case(CASES[label], "full") for label in sorted(CASES)]
    lines = [HEADER, *(row(o) for o in outcomes)]
    failed = [o for o in outcomes if not o.passed]
    notes = [f"- `{o.label}`: {'; '.join(o.failures)}" for o in failed]
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text("\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else ""))
    assert not failed, [o.label for o in failed]


@pytest.mark.parametrize(("rmse", "passes"), [(0.9, False), (1.02, True), (1.2, True)])
def test_an_understated_rmse_is_caught(rmse: float, passes: bool) -> None:
    """Squared errors of mean 1 (4000 runs of N(0, 1)²): a stated rmse of 0.9 is refuted
    by the runs' lower bound on the mean square, 1.02 and 1.2 are not."""
    squares = np.random.default_rng(5).standard_normal(4000) ** 2
    base = run_case(CASES["laplace.mean"], "ci")
    checked = rms_check(base, rmse, squares)
    assert checked.passed is passes
    assert checked.rms_ratio == pytest.approx(rmse / float(np.sqrt(squares.mean())))
