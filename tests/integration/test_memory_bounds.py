"""Each family's memory bound is honest (issue #30 item 6): at 10^5 stored rows the
worker's measured peak (``tests/memory_probe.py``: tracemalloc and a fresh Arrow pool,
in a fresh interpreter, the worker's own ``_run`` on a real stored version, seeds fixed)
is at most ``Mechanism.memory`` and the bound at most 3x the peak: a bound far above
would refuse releases a worker could serve, one below would let a worker be killed. At
5,000 rows, where the fixed terms dominate, the bound holds too.

The figures are allocations, deterministic for a given library build; the factor 3
leaves the 1.2 margin of the calibration, the load transient's margin (1.5 widest
columns) and the cells term (32 B a named cell) room, while a per-row figure off by
2x in either direction fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mechanisms import memory, registry
from mechanisms.base import StreamingMechanism
from service.storage.dataset_files import ROW_GROUP_ROWS
from tests.memory_probe import FAMILIES, budget, meta, peaks, stored

ROWS = 100_000
#: a small version, where the fixed terms dominate: the bound must hold there too
FEW_ROWS = 5000
#: the bound may be this many times the measured peak, at most
SLACK = 3.0


@pytest.fixture(scope="module")
def probe_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    roots = {}
    for rows in (ROWS, FEW_ROWS):
        roots[rows] = tmp_path_factory.mktemp(f"probe{rows}")
        stored(roots[rows], rows)
    return roots


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_bound_holds_the_measured_peak_within_three_times(probe_roots: dict[int, Path],
                                                              family: str) -> None:
    cases = FAMILIES[family]
    for rows in (ROWS, FEW_ROWS):
        measured = peaks(probe_roots[rows], rows, cases)
        for (name, raw, spend), peak in zip(cases, measured, strict=True):
            mech = registry.get(name)
            params = mech.load_params(raw)
            mech.cost(params, budget(spend), meta(rows))  # the case is a valid request
            bound = mech.memory(params, meta(rows)).bytes
            assert peak <= bound, (name, raw, rows, peak, bound)
            if rows == ROWS:  # where the rows, not the fixed terms, decide
                assert bound <= SLACK * peak, (name, raw, peak, bound)


def test_every_registered_mechanism_is_measured() -> None:
    measured = {name for cases in FAMILIES.values() for name, _, _ in cases}
    assert measured == set(registry.names())


def test_a_streamed_bound_does_not_grow_with_rows() -> None:
    """A streaming mechanism holds one row group, the rows the store writes at most."""
    assert memory.BATCH_ROWS == ROW_GROUP_ROWS
    streamed = [(name, raw) for cases in FAMILIES.values() for name, raw, _ in cases
                if isinstance(registry.get(name), StreamingMechanism)]
    assert {name for name, _ in streamed} >= {
        "iclp.mean", "iclp.kde", "iclp.kde2d", "iclp.cov", "iclp.fos", "iclp.erm",
        "noiseless.vector", *(name for name, _, _ in FAMILIES["baselines"])}
    for name, raw in streamed:
        mech = registry.get(name)
        params = mech.load_params(raw)
        assert mech.memory(params, meta(10**9)) == mech.memory(params, meta(ROW_GROUP_ROWS))
