"""The noiseless audit entries (``mechanisms.noiseless.audit``): exhaustive counts pass the
registered mechanisms, reach their certificates, and refute the controls.

About 25 s: the aggregate entry enumerates ~12 000 datasets for the mechanism and its control,
the vector entry ~2 000.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import registry
from mechanisms.audit import entries
from mechanisms.base import ColumnMeta
from mechanisms.noiseless import audit
from mechanisms.noiseless.mechanism import certify

SEED = 14


@pytest.mark.parametrize("name", ["noiseless.aggregate", "noiseless.local", "noiseless.vector"])
def test_entry_passes_the_mechanism_and_catches_its_control(name: str) -> None:
    assert entries.entries()[name] is audit.audit_noiseless
    report = entries.entries()[name](name, "ci", SEED)
    assert report.mechanism == name and report.notion == "noiseless"
    assert report.passed, report.detail
    assert report.control_caught, report.detail
    assert report.certified <= report.charged  # log2 of the worst count vs the charge
    assert report.events_tried > 30


@pytest.mark.parametrize("name", ["noiseless.aggregate", "noiseless.local"])
def test_search_reaches_every_certificate(name: str) -> None:
    """The audit is not vacuous: in every case some slice attains the certified count
    (what ``cost`` charges log2 of), so one output more would be caught."""
    cases = audit._cases(name, "ci")
    tallies = audit.audit_with(registry.get(name), cases, SEED)
    for case, tally in zip(cases, tallies, strict=True):
        runner = audit.Runner(registry.get(name), case)
        count = certify(registry.get(name), runner.params, {"noiseless_bits": case.bits},
                        runner.meta)
        assert tally.worst == count, tally.text()
        assert tally.passed, tally.text()


def test_paper_control_is_off_by_one_bin_and_keeps_the_charge() -> None:
    """Theorem 8 as printed: mean of n = 4 records on [0, 4], 1 bit. The honest quantizer
    has the exact corrected q* = (2 − 1)·4 = 4 levels; the paper's has ⌊2·4⌋ = 8, charged
    the same 1 bit, and with the others at 0 the slice {0, 1/4, …, 1} meets bins 0, 1 and
    2: 3 outputs > 2^1."""
    case = audit.aggregate_cases("ci")[0]
    honest = audit.Runner(registry.get("noiseless.aggregate"), case)
    broken = audit.Runner(audit.control("noiseless.aggregate"), case)
    assert honest.accuracy["levels"] == 4 and broken.accuracy["levels"] == 8
    assert honest.charged == broken.charged == 1
    outputs = {broken.run([0, 0, 0, x]).result["bin_index"] for x in range(5)}
    assert outputs == {0, 1, 2}
    assert len({honest.run([0, 0, 0, x]).result["bin_index"] for x in range(5)}) <= 2
    tally = audit.audit_aggregate_with(broken.mechanism, case)
    assert tally.worst == 3 and not tally.passed


def test_extra_level_control_differs_and_keeps_the_charge() -> None:
    case = audit.local_cases("ci")[0]
    honest = audit.Runner(registry.get("noiseless.local"), case)
    broken = audit.Runner(audit.control("noiseless.local"), case)
    assert broken.accuracy["levels"] == honest.accuracy["levels"] + 1 == 9
    assert broken.charged == honest.charged == 3
    values = np.linspace(0, 10, 101)
    runs = [audit.Runner(m, case, n=len(values)).run(values.tolist())
            for m in (registry.get("noiseless.local"), audit.control("noiseless.local"))]
    released = [np.asarray(r.table["x"]) for r in runs if r.table is not None]
    assert len(np.unique(released[0])) == 8 and len(np.unique(released[1])) == 9


def test_aggregate_error_check_uses_an_independent_exact_value() -> None:
    """``_exact`` clips, rounds integers and maps NaN to the lower bound as the spec says;
    a released value off by more than the stated half-width would be counted."""
    case = audit.aggregate_cases("ci")[0]  # mean of integers on [0, 4], n = 4
    assert audit._exact(case, [0, 9, -3, 2.6]) == Fraction(0 + 4 + 0 + 3, 4)
    real = audit.aggregate_cases("ci")[3]  # mean of reals on [-3.7, 12.1], n = 3
    assert audit._exact(real, [float("nan"), 100.0, 0.5]) == (
        Fraction(-3.7) + Fraction(12.1) + Fraction(0.5)) / 3


def test_continuous_slices_target_the_bin_edges() -> None:
    """Every slice places the others' exact sum so that the slice image starts or ends
    within a float step of a bin edge (or on the coarse grid), and sweeps edge preimages."""
    case = audit.aggregate_cases("ci")[3]
    runner = audit.Runner(registry.get("noiseless.aggregate"), case)
    edges = audit._edges(runner)
    lo, hi = (Fraction(b) for b in case.column.bounds or (0, 0))
    slices = list(audit.aggregate_slices(case, runner))
    assert len(slices) > 2 * len(edges)
    hits = 0
    for _, others, sweep in slices:
        s = sum((Fraction(v) for v in others), Fraction(0))
        ends = ((s + lo) / case.n, (s + hi) / case.n)
        hits += any(abs(end - e) < Fraction(1, 10**12) for end in ends for e in edges)
        assert float(lo) in sweep and float(hi) in sweep
    assert hits >= 2 * (len(edges) - 2)


@settings(max_examples=12, deadline=None)
@given(hi=st.integers(1, 5), n=st.integers(2, 3), bits=st.sampled_from(
    [Fraction(1), Fraction(3, 2), Fraction(2), Fraction(5, 2), Fraction(3)]),
    statistic=st.sampled_from(["mean", "sum"]))
def test_honest_aggregate_never_exceeds_its_charge(hi: int, n: int, bits: Fraction,
                                                   statistic: str) -> None:
    """Definition 1 on every small integer domain: worst count <= 2^charge, and equal to the
    certified count (the certificate is exact on these domains)."""
    case = audit.Case("random", {"statistic": statistic, "column": "k"},
                      ColumnMeta("k", "integer", bounds=(0, hi)), n, bits,
                      audit._integers(0, hi))
    tally = audit.audit_aggregate_with(registry.get("noiseless.aggregate"), case)
    assert tally.passed, tally.text()
    runner = audit.Runner(registry.get("noiseless.aggregate"), case)
    assert tally.worst <= runner.accuracy["certified_count"]


def test_vector_joint_count_between_max_and_product_and_max_charge_is_caught() -> None:
    """Composition is a sum of bits (a product of counts): the joint worst count of two
    coordinates exceeds the larger coordinate's count, so charging the max (the control)
    is refuted, while the honest sum is never exceeded."""
    cases = audit.vector_cases("ci")
    name = "noiseless.vector"
    honest = audit.audit_with(registry.get(name), cases, SEED)
    broken = audit.audit_with(audit.control(name), cases, SEED)
    for case, good, bad in zip(cases, honest, broken, strict=True):
        runner = audit.Runner(registry.get(name), case)
        parts = [c["certified_count"] for c in runner.accuracy["coordinates"]]
        assert max(parts) < good.worst <= certify(registry.get(name), runner.params,
                                                  {"noiseless_bits": case.bits}, runner.meta)
        assert good.passed, good.text()
        assert not bad.passed and bad.charged == max(
            Fraction(c["bits"]) for c in runner.accuracy["coordinates"])


def test_order_statistics_and_exact_cases_reach_their_certificates() -> None:
    """Median, min and max (S = R, q = K; S = R/2 for an even-n median) and the exactly
    released mean and even-n median attain, and never exceed, the certified count on every
    dataset of their domains."""
    cases = [c for c in audit.aggregate_cases("ci")
             if c.params["statistic"] in ("median", "min", "max") or "exact" in c.label]
    assert len(cases) == 6
    mech = registry.get("noiseless.aggregate")
    for case, tally in zip(cases, audit.audit_with(mech, cases, SEED), strict=True):
        runner = audit.Runner(mech, case)
        assert tally.worst == runner.accuracy["certified_count"] and tally.passed, tally.text()
        if "exact" in case.label:
            assert runner.accuracy["exact"] and runner.accuracy["max_error"] == 0
