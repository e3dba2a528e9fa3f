"""The shared precompute cache: exact replay, cross-process sharing, the gate.

On the old code every process (and every fresh ``_PLANS``) re-ran interval
calibration and the ICLP eigen-decomposition for each request: the
cross-process tests below fail there because the second process counts a miss.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mechanisms import precompute, registry
from mechanisms.base import ColumnMeta, DatasetMeta, MechanismInputError
from mechanisms.iclp import kernels, spectral
from mechanisms.interval import entries as interval_entries

META = DatasetMeta(n_rows=1000, columns={
    "x": ColumnMeta("x", "continuous", prior={"family": "normal", "loc": 0, "scale": 1}),
    "w": ColumnMeta("w", "continuous", (0.0, 1.0)),
})

#: cheap but calibrated requests of every plan shape (main path, selective, progressive)
REQUESTS: list[tuple[str, dict[str, Any], Fraction]] = [
    ("interval.case1", {"column": "x", "calibrate": True}, Fraction(1, 10)),
    ("interval.selective", {"column": "x", "tau": 0.6, "calibrate": True}, Fraction(1, 5)),
    ("interval.progressive", {"column": "w", "rounds": 3, "calibrate": True}, Fraction(1, 2)),
    ("interval.ring", {"column": "x", "tau_floor": 0.3}, Fraction(1, 2)),
]


def _summary(p: interval_entries.Plan) -> dict[str, Any]:
    return {"charge": p.charge, "estimate": p.estimate, "calibrated": p.calibrated,
            "notes": p.notes, "m": p.m, "fill": p.fill,
            "design": json.dumps(interval_entries._describe(p), sort_keys=True, default=str)}


@pytest.mark.parametrize(("name", "raw", "budget"), REQUESTS)
def test_replayed_plan_is_the_computed_one(tmp_path: Path, name: str, raw: dict[str, Any],
                                           budget: Fraction) -> None:
    """A warm plan (replayed from the store) equals the cold one field by field, and the
    warm resolution counts a hit, not a miss (the heavy results are not recomputed)."""
    mech = registry.get(name)
    params = mech.load_params(raw)
    kind = name.split(".")[1]
    target = budget if params.get("calibrate") else None
    store = precompute.DirectoryStore(tmp_path)
    with precompute.use(store):
        interval_entries._PLANS.clear()
        cold = interval_entries.plan(kind, params, META, target)
        interval_entries._PLANS.clear()
        hits = precompute.STATS.hits
        warm = interval_entries.plan(kind, params, META, target)
    interval_entries._PLANS.clear()
    assert precompute.STATS.hits == hits + 1
    assert warm is not cold
    assert _summary(warm) == _summary(cold)


def test_refusals_are_shared_too(tmp_path: Path) -> None:
    """A calibration that fails costs as much as one that succeeds: its refusal is stored,
    so repeating the request does not buy the work again."""
    params = registry.get("interval.progressive").load_params(
        {"column": "w", "rounds": 3, "calibrate": True})
    with precompute.use(precompute.DirectoryStore(tmp_path)):
        for expect_hit in (False, True):
            interval_entries._PLANS.clear()
            hits = precompute.STATS.hits
            with pytest.raises(MechanismInputError) as err:
                interval_entries.plan("progressive", params, META, Fraction(1, 10**9))
            assert err.value.field == "budget.interval_leakage"
            assert precompute.STATS.hits == hits + int(expect_hit)
    interval_entries._PLANS.clear()


def test_eigen_system_replay_is_bit_exact(tmp_path: Path) -> None:
    """The stored eigen-system is the computed one, bit for bit (the sensitivity and the
    noise must use the very same system in the API and in the worker)."""
    kernel = kernels.Kernel("matern", 0.123456789, nu=1.5)
    grid = np.linspace(0.0, 1.0, 57)
    with precompute.use(precompute.DirectoryStore(tmp_path)):
        spectral.cache_clear()
        cold = spectral.eigen_system(kernel, grid)
        spectral.cache_clear()
        hits = precompute.STATS.hits
        warm = spectral.eigen_system(kernel, grid)
    spectral.cache_clear()
    assert precompute.STATS.hits == hits + 1
    for a, b in ((cold.values, warm.values), (cold.vectors, warm.vectors),
                 (cold.weights, warm.weights), (cold.positions, warm.positions)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
        assert not b.flags.writeable
    assert (cold.defect, cold.dropped) == (warm.defect, warm.dropped)


def test_corrupt_entry_is_a_miss(tmp_path: Path) -> None:
    """A truncated or foreign file never crashes a request: it is recomputed and rewritten."""
    store = precompute.DirectoryStore(tmp_path)
    key = precompute.key("t", "code", [1, 2.5])
    store.put(key, b"\x00not json")
    calls: list[int] = []
    with precompute.use(store):
        got = precompute.cached(key, lambda: calls.append(1) or {"v": 0.1},
                                precompute.encode_json, precompute.decode_json)
    assert got == {"v": 0.1} and calls == [1]
    assert json.loads(store.get(key) or b"") == {"v": 0.1}


def test_gate_runs_only_on_a_miss(tmp_path: Path) -> None:
    """The service's gate (its bound on concurrent cold work) is entered for a miss only:
    a warm request is never refused as busy."""
    entered: list[int] = []

    @contextlib.contextmanager
    def gate() -> Iterator[None]:
        entered.append(1)
        yield

    key = precompute.key("t", "code", "gate")
    with precompute.use(precompute.DirectoryStore(tmp_path), gate):
        for _ in range(3):
            precompute.cached(key, lambda: 1.5, precompute.encode_json, precompute.decode_json)
    assert entered == [1]


def test_busy_gate_refuses_cold_work(tmp_path: Path) -> None:
    """A gate that raises Busy stops the computation before it starts."""
    def gate() -> contextlib.AbstractContextManager[None]:
        raise precompute.Busy

    ran = threading.Event()
    with precompute.use(precompute.DirectoryStore(tmp_path), gate), \
            pytest.raises(precompute.Busy):
        precompute.cached(precompute.key("t", "c", 0), lambda: ran.set(),
                          precompute.encode_json, precompute.decode_json)
    assert not ran.is_set()


_CHILD = """
import json, sys
from fractions import Fraction
from mechanisms import precompute, registry
from mechanisms.iclp import kernels, spectral
from tests.unit.test_precompute import META
params = registry.get("interval.selective").load_params(
    {"column": "x", "tau": 0.6, "calibrate": True})
with precompute.use(precompute.DirectoryStore(sys.argv[1])):
    cost = registry.get("interval.selective").cost(params, {"interval_leakage": 0.2}, META)
    eig = spectral.eigen_system(kernels.Kernel("gaussian", 0.05), [i / 99 for i in range(100)])
print(json.dumps({"cost": {k: str(v) for k, v in cost.items()}, "trace": eig.trace.hex(),
                  "hits": precompute.STATS.hits, "misses": precompute.STATS.misses}))
"""


def test_two_processes_share_the_work(tmp_path: Path) -> None:
    """The second process computes nothing: both its precomputations are hits, and its
    cost and eigen-system are exactly the first one's."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def child() -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "cache")],
                             capture_output=True, text=True, env=env, timeout=300,
                             check=True)
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result

    first, second = child(), child()
    assert (first["hits"], first["misses"]) == (0, 2)
    assert (second["hits"], second["misses"]) == (2, 0)
    assert first["cost"] == second["cost"] and first["trace"] == second["trace"]


def test_work_limit_refuses_before_any_work(tmp_path: Path) -> None:
    """Beyond the context's work limit the request is refused naming the parameter that
    drives the work, before anything is computed (no miss counted), cached or not."""
    mech = registry.get("interval.selective")
    params = mech.load_params({"column": "x", "tau": 0.6, "base": "casek", "m": 64,
                               "calibrate": True})
    field_name, work = interval_entries._work("selective", params)
    assert field_name == "params.m"
    misses = precompute.STATS.misses
    with precompute.use(precompute.DirectoryStore(tmp_path), max_work=work / 2), \
            pytest.raises(MechanismInputError) as err:
        mech.cost(params, {"interval_leakage": 0.5}, META)
    assert err.value.field == "params.m" and "limit" in err.value.message
    assert precompute.STATS.misses == misses
    assert not any(tmp_path.iterdir())


def test_default_work_limit_admits_every_schema_valid_design() -> None:
    """The default ceiling keeps every request the schemas accept (the largest: selective
    Case-K with m = MAX_M, calibrated), and the estimate grows with what drives the work."""
    from mechanisms.interval.schemas import MAX_M, MAX_ROUNDS
    from service.config import Config

    largest = [
        interval_entries._work("selective", {"base": "casek", "m": MAX_M, "calibrate": True}),
        interval_entries._work("casek", {"m": MAX_M, "calibrate": True}),
        interval_entries._work("progressive", {"rounds": MAX_ROUNDS, "calibrate": True}),
        interval_entries._work("selective", {"base": "ring", "calibrate": True}),
    ]
    assert max(w for _, w in largest) <= Config().max_precompute_work
    assert (interval_entries._work("casek", {"m": 8, "calibrate": True})[1]
            < interval_entries._work("casek", {"m": 16, "calibrate": True})[1]
            < largest[1][1] < largest[0][1])
    assert (interval_entries._work("case1", {})[1]
            < interval_entries._work("case1", {"calibrate": True})[1])


def test_directory_store_is_bounded_and_drops_least_recently_used(tmp_path: Path) -> None:
    """Callers choose the (public) inputs, so they could fill the disk with distinct
    entries: the store keeps about max_bytes, dropping the least recently used first."""
    store = precompute.DirectoryStore(tmp_path, max_bytes=10_000)
    keys = [precompute.key("t", "c", i) for i in range(30)]
    for i, k in enumerate(keys):
        store.put(k, bytes(1000))
        os.utime(store._path(k), (1000.0 + i, 1000.0 + i))  # a clear order of use
        if i == 5:
            assert store.get(keys[0]) is not None  # read: now the most recently used
            os.utime(store._path(keys[0]), (1e9, 1e9))
    total = sum(p.stat().st_size for p in tmp_path.glob("*/*"))
    assert total <= 10_000
    assert store.get(keys[0]) is not None and store.get(keys[-1]) is not None
    assert store.get(keys[1]) is None  # the oldest unused ones went first
