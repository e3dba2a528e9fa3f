"""Record-level releases as partition maps (issue #30 item 4): per-partition generators
from a job secret, the ``RecordMechanism`` contract, and the partitioned release
(``mechanisms.record_maps``) against the whole-column ``run``."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import ColumnMeta, DatasetMeta, get, record_maps
from mechanisms.base import RecordMechanism
from mechanisms.rng import (
    PARTITION_DOMAIN,
    SECRET_BYTES,
    SPAWN_DOMAIN,
    job_secret,
    partition_generator,
    secure_generator,
)
from mechanisms.statistics import ColumnSums, compute

SECRET = bytes(range(SECRET_BYTES))
N = 40_000
META = DatasetMeta(N, {
    "x": ColumnMeta("x", "continuous", (0.0, 10.0)),
    "k": ColumnMeta("k", "integer", (0, 20)),
    "c": ColumnMeta("c", "categorical", categories=("a", "b", "c")),
    "g": ColumnMeta("g", "categorical", categories=tuple("uvwxyz")),
    "h": ColumnMeta("h", "categorical", categories=tuple("pqrs")),
})
#: (mechanism, params, cost): the ported record-level mechanisms, DIP's mapped references
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("lrm", {"columns": ["x", "k"]}, {"epsilon": Fraction(1)}),
    ("lrm", {"columns": ["x"], "round_to": 0.5}, {"epsilon": Fraction(1, 2)}),
    ("noiseless.local", {"column": "x"}, {"noiseless_bits": Fraction(3)}),
    ("dip", {"columns": ["x", "k"]}, {"epsilon": Fraction(2)}),
    ("dip", {"columns": ["x", "c"], "order": "random"}, {"epsilon": Fraction(2)}),
    # the copula: marginals noised, then a second exact pass (``refit``)
    ("dip", {"columns": ["x", "k", "c"], "reference": {"kind": "dp", "model": "copula"}},
     {"epsilon": Fraction(2)}),
    ("dip", {"columns": ["x"], "reference": {"kind": "parametric", "family": "normal",
                                            "params": {"loc": 5, "scale": 2}}},
     {"epsilon": Fraction(1)}),
    ("interval.case1", {"column": "x", "anchors": {"family": "uniform", "low": 0, "high": 10}},
     {"interval_leakage": Fraction(1, 2)}),
    ("interval.ring", {"column": "x", "tau_floor": 0.3}, {"interval_leakage": Fraction(1, 2)}),
    ("interval.selective", {"column": "x", "base": "ring", "tau": 0.3, "tau_floor": 0.3},
     {"interval_leakage": Fraction(1, 2)}),
    ("interval.progressive", {"column": "x", "rounds": 3},
     {"interval_leakage": Fraction(9, 10)}),
    # the data-width designs: an even transform's and an exact range's extra pieces
    ("interval.casek", {"column": "x", "m": 3, "transform": "square",
                        "anchors": {"family": "uniform", "low": 0, "high": 100}},
     {"interval_leakage": Fraction(1, 2)}),
    ("interval.casek", {"column": "x", "m": 3, "exact_range": [1, 2],
                        "anchors": {"family": "uniform", "low": 0, "high": 10}},
     {"interval_leakage": Fraction(9, 10)}),
    ("interval.ring", {"column": "x", "transform": "abs", "tau_floor": 0.3},
     {"interval_leakage": Fraction(1, 2)}),
    ("interval.progressive_categorical", {"column": "g", "rounds": 3},
     {"interval_leakage": Fraction(1)}),
    ("subset.uniform", {"column": "g", "format": "both"}, {"subset_draws:g": 1}),
    ("subset.product", {"columns": ["g", "h"]}, {"subset_draws:g": 1, "subset_draws:h": 1}),
]
IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)]


def _data(n: int = N, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.gamma(2.0, 1.5, n).clip(0, 10), "k": rng.integers(0, 21, n),
            "c": rng.integers(0, 3, n), "g": rng.integers(0, 6, n), "h": rng.integers(0, 4, n)}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal arrays, NaN equal to NaN in float ones (the interval tables' unused cells)."""
    return np.array_equal(a, b, equal_nan=np.asarray(a).dtype.kind == "f")


def _mechanism(name: str) -> RecordMechanism:
    mech = get(name)
    assert isinstance(mech, RecordMechanism)
    return mech


def _split(data: dict[str, np.ndarray], sizes: list[int]) -> list[dict[str, np.ndarray]]:
    bounds = np.cumsum([0, *sizes])
    return [{k: v[a:b] for k, v in data.items()} for a, b in itertools.pairwise(bounds)]


# -- generators ------------------------------------------------------------------------


def test_partition_generators_are_aes_ctr_under_derived_keys() -> None:
    """Exact, against an independent AES (``cryptography``, a dev dependency through
    moto): partition p draws AES-128_{K_p}(0), AES-128_{K_p}(1), ... with K_p the first 16
    bytes of SHAKE-256(domain ‖ secret ‖ p as 8 little-endian bytes)."""
    for p in (0, 1, 7, 2**40):
        key = hashlib.shake_256(PARTITION_DOMAIN + SECRET + p.to_bytes(8, "little")).digest(16)
        blocks = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(
            b"".join(j.to_bytes(16, "little") for j in range(3)))
        drawn = partition_generator(SECRET, p).bit_generator.random_raw(6)
        assert drawn.tolist() == np.frombuffer(blocks, "<u8").tolist()
    with pytest.raises(ValueError):
        partition_generator(SECRET[:16], 0)
    with pytest.raises(ValueError):
        partition_generator(SECRET, -1)


def test_spawned_children_follow_from_the_secret() -> None:
    """A partition generator's children (``spawn``, subset's per-variable streams) are AES
    under SHAKE-256(spawn domain ‖ parent key ‖ i)[:16], i counted over its spawns: the same
    from the same secret, whichever process."""
    parent = hashlib.shake_256(PARTITION_DOMAIN + SECRET + (3).to_bytes(8, "little")).digest(16)
    rng = partition_generator(SECRET, 3)
    first, second = rng.spawn(2)
    third, = rng.spawn(1)
    for i, child in enumerate((first, second, third)):
        key = hashlib.shake_256(SPAWN_DOMAIN + parent + i.to_bytes(8, "little")).digest(16)
        blocks = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(bytes(16))
        assert child.bit_generator.random_raw(2).tolist() == np.frombuffer(blocks,
                                                                           "<u8").tolist()
    again = partition_generator(SECRET, 3).spawn(3)
    assert [g.random() for g in again] == [g.random() for g in
                                           partition_generator(SECRET, 3).spawn(3)]


def test_partition_streams_are_distinct_and_uniform() -> None:
    """Different partitions, different secrets: different streams; each stream and their
    concatenation pass a KS test for uniformity (bound at level 1e-6)."""
    draws = [partition_generator(SECRET, p).random(20_000) for p in range(5)]
    other = partition_generator(bytes(SECRET_BYTES), 0).random(20_000)
    assert len({d[:4].tobytes() for d in [*draws, other]}) == 6
    bound = float(stats.kstwobign.isf(1e-6))
    for sample in [*draws, np.concatenate(draws)]:
        assert stats.kstest(sample, "uniform").statistic < bound / math.sqrt(sample.size)
    # pairs of partitions are uncorrelated: |r| < 5/sqrt(n) (5 sd)
    for a in range(4):
        assert abs(np.corrcoef(draws[a], draws[a + 1])[0, 1]) < 5 / math.sqrt(20_000)


def test_job_secrets_are_fresh_unless_seeded() -> None:
    assert len(job_secret()) == SECRET_BYTES and job_secret() != job_secret()
    assert job_secret(7) == job_secret(7) != job_secret(8)


# -- the contract ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "raw", "budget"), CASES, ids=IDS)
def test_partitioned_release_maps_each_partition_with_its_own_generator(
        name: str, raw: dict[str, Any], budget: dict[str, Any]) -> None:
    """The release's table is each partition's ``privatize`` with its own generator, in
    row order; its result is ``describe`` of the summary over that table; the run over one
    partition with one generator is fit then map, the draws in that order."""
    mech = _mechanism(name)
    data = _data()
    params = mech.load_params(raw)
    cost = mech.cost(params, budget, META)
    sizes = [10_000, 16_384, 5, 13_611]
    job = record_maps.fit(mech, lambda cols: [data], params, cost, META, secure_generator(3),
                          SECRET)
    out = record_maps.release(job, _split(data, sizes))
    assert out.table is not None
    expected = record_maps.concatenate([
        job.privatize(p, start, part) for p, (start, part) in enumerate(
            zip(np.cumsum([0, *sizes[:-1]]).tolist(), _split(data, sizes), strict=True))])
    assert list(out.table) == list(expected)
    for column, values in expected.items():
        assert _same(out.table[column], values), column
    summary = job.summary()
    released = None if summary is None else compute(summary, [expected])[1]
    assert repr(out.result) == repr(job.describe(released).result)
    assert out.row_column == mech.run(data, params, cost, META, secure_generator(3)).row_column
    # run = fit and map with one generator
    rng = secure_generator(4)
    whole = mech.run(data, params, cost, META, rng)
    again = secure_generator(4)
    model = mech.fit(params, job_partial(mech, params, cost, data), cost, META, again)
    second = mech.refit_statistic(params, cost, META, model)
    if second is not None:
        model = mech.refit(params, model, compute(second, [data])[1], cost, META, again)
    table = mech.privatize(data, 0, params, cost, META, model, again)
    assert whole.table is not None
    for column, values in table.items():
        assert _same(whole.table[column], values), column
    with pytest.raises(ValueError, match="n_rows"):
        record_maps.release(job, _split(data, [100]))


def job_partial(mech: RecordMechanism, params: Any, cost: Any, data: Any) -> Any:
    statistic = mech.fit_statistic(params, cost, META)
    return None if statistic is None else compute(statistic, [data])[1]


def test_lrm_noise_has_the_same_law_over_one_or_many_partitions() -> None:
    """Constant data, so a released value is the lattice point plus noise: over one
    partition and over 9, the noise's variance is the plan's (sd of a sample variance of
    discrete Laplace noise: sigma² sqrt((kurtosis - 1)/n), kurtosis <= 6; 6 sd allowed),
    and the two samples agree (two-sample KS at level 1e-6)."""
    n = 90_000
    meta = DatasetMeta(n, {"x": ColumnMeta("x", "continuous", (0.0, 10.0))})
    mech = _mechanism("lrm")
    params = mech.load_params({"columns": ["x"]})
    cost = {"epsilon": Fraction(2)}
    data = {"x": np.full(n, 5.0)}
    job = record_maps.fit(mech, lambda cols: [data], params, cost, meta, secure_generator(1),
                          SECRET)
    one = record_maps.release(job, [data])
    many = record_maps.release(record_maps.MapJob(mech, params, cost, meta, job.model,
                                                  job_secret(2)), _split(data, [10_000] * 9))
    variance = mech.accuracy(params, cost, meta)["columns"]["x"]["noise_variance"]
    samples = []
    for out in (one, many):
        assert out.table is not None
        noise = out.table["x"] - 5.0
        samples.append(noise)
        assert abs(noise.var() - variance) < 6 * variance * math.sqrt(5 / n)
        assert abs(noise.mean()) < 6 * math.sqrt(variance / n)
    critical = math.sqrt(-math.log(1e-6 / 2) / 2) * math.sqrt(2 / n)
    assert stats.ks_2samp(*samples).statistic < critical


def test_dip_records_have_the_same_law_over_one_or_many_partitions() -> None:
    """The same fitted histogram reference; one partition or 8: the released column's
    distribution agrees (two-sample KS at level 1e-6) and so does the rank correlation
    with the input (within 6 sd of Fisher's z, sd 1/sqrt(n - 3))."""
    mech = _mechanism("dip")
    data = _data()
    params = mech.load_params({"columns": ["x"]})
    cost = {"epsilon": Fraction(2)}
    job = record_maps.fit(mech, lambda cols: [data], params, cost, META, secure_generator(5),
                          SECRET)
    one = record_maps.release(job, [data])
    many = record_maps.release(record_maps.MapJob(mech, params, cost, META, job.model,
                                                  job_secret(6)), _split(data, [5_000] * 8))
    assert one.table is not None and many.table is not None
    critical = math.sqrt(-math.log(1e-6 / 2) / 2) * math.sqrt(2 / N)
    assert stats.ks_2samp(one.table["x"], many.table["x"]).statistic < critical
    z = [math.atanh(stats.spearmanr(data["x"], t["x"]).statistic)
         for t in (one.table, many.table)]
    assert abs(z[0] - z[1]) < 6 * math.sqrt(2 / (N - 3))
    assert np.array_equal(many.table["_row"], np.arange(N))


def test_unmapped_params_run_whole_columns() -> None:
    """DIP's hold-out is no row map, nor are subset's dummy records: ``run`` reads whole
    columns. Every interval design is one (its width is the design's), and DIP's copula."""
    subset = _mechanism("subset.dummy")
    assert not subset.mappable(subset.load_params({"column": "g", "alpha": 0.1}), META)
    uniform = _mechanism("subset.uniform")
    assert not uniform.mappable(uniform.load_params({"column": "g", "format": "categories"}),
                                META)
    interval = _mechanism("interval.casek")
    assert interval.mappable({"column": "x", "transform": "square"}, META)
    assert interval.mappable({"column": "x", "exact_range": [1, 2]}, META)
    assert interval.mappable({"column": "x", "transform": "log"}, META)
    mech = _mechanism("dip")
    assert not mech.mappable({"columns": ["x"], "reference": {"kind": "holdout"}}, META)
    assert mech.mappable({"columns": list("abcde")}, META)  # copula by default
    assert mech.mappable({"columns": ["x", "k"], "reference": {"model": "copula"}}, META)
    assert mech.mappable({"columns": ["x", "k"]}, META)
    # with Spark configured they are bounded as the embedded run they are (``memory.held``)
    from mechanisms import memory

    for unmapped, params in ((mech, {"columns": ["x"], "reference": {"kind": "holdout"}}),
                             (subset, subset.load_params({"column": "g", "alpha": 0.1}))):
        assert memory.held(unmapped, params, META, distributed=True,
                           held_rows=100) == unmapped.memory(params, META)
    assert memory.held(mech, {"columns": ["x", "k"]}, META, distributed=True,
                       held_rows=100).bytes < mech.memory({"columns": ["x", "k"]}, META).bytes


@pytest.mark.parametrize(("transform", "exact_range", "width"), [
    ("square", None, 2), ("abs", [-1.0, 1.0], 4), ("identity", [2.0, 3.0], 2)])
def test_interval_tables_have_the_design_width_whatever_the_rows(
        transform: str, exact_range: list[float] | None, width: int) -> None:
    """An even transform's and an exact range's pieces: every partition's table has the
    design's piece columns (``piece_width``), whether its rows' ranges use them or not,
    and its ranges are the unpadded release's, padded with empty pieces."""
    from mechanisms.interval.designs import pieces_from_table

    meta = DatasetMeta(600, {"s": ColumnMeta("s", "continuous", (-5.0, 5.0))})
    mech = _mechanism("interval.casek")
    raw: dict[str, Any] = {"column": "s", "m": 3, "transform": transform,
                           "anchors": {"family": "uniform", "low": 0, "high": 25}}
    if transform == "identity":
        raw["anchors"] = {"family": "uniform", "low": -5, "high": 5}
    if exact_range is not None:
        raw["exact_range"] = exact_range
    params = mech.load_params(raw)
    cost = mech.cost(params, {"interval_leakage": Fraction(1)}, meta)
    job = record_maps.fit(mech, lambda cols: [], params, cost, meta, secure_generator(5),
                          SECRET)
    assert job.model.design.piece_width == width
    rng = np.random.default_rng(8)
    # one partition of a single repeated value, one spread over the support
    parts = [{"s": np.full(300, 4.5)}, {"s": rng.uniform(-5.0, 5.0, 300)}]
    tables = [job.privatize(p, 300 * p, part) for p, part in enumerate(parts)]
    assert list(tables[0]) == list(tables[1])
    for p, (part, table) in enumerate(zip(parts, tables, strict=True)):
        pieces = pieces_from_table(table)
        assert pieces.width == width
        bare = job.model.design.release(part["s"], partition_generator(SECRET, p)).pieces
        assert bare.width <= width
        assert np.array_equal(pieces.left, bare.padded(width).left, equal_nan=True)
        assert np.array_equal(pieces.right, bare.padded(width).right, equal_nan=True)
        assert np.array_equal(pieces.left_closed, bare.padded(width).left_closed)
        assert np.all(pieces.empty()[:, bare.width:])
    out = mech.run({"s": np.concatenate([part["s"] for part in parts])}, params, cost, meta,
                   secure_generator(5))
    assert out.table is not None and list(out.table) == list(tables[0])
    assert out.result["columns"] == list(tables[0])


def test_copula_fit_over_partitions_is_the_whole_column_copula() -> None:
    """DIP's copula fitted from partitions (per-column counts, the marginals' noise, the
    correlation sums under them as a second exact pass, their noise) is ``dp_copula`` on
    the whole columns with the same generator, exactly: marginals, correlation matrix."""
    from mechanisms.dip.copula import Copula, dp_copula

    mech = _mechanism("dip")
    data = _data()
    data["k"] = np.clip(np.rint(2 * data["x"]), 0, 20).astype(np.int64)  # k follows x
    params = mech.load_params({"columns": ["x", "k", "c"], "order": ["x", "k", "c"],
                               "reference": {"kind": "dp", "model": "copula"}})
    cost = mech.cost(params, {"epsilon": Fraction(2)}, META)
    parts = _split(data, [9_000, 1, 20_000, 10_999])
    job = record_maps.fit(mech, lambda columns: parts, params, cost, META,
                          secure_generator(6), SECRET)
    plan = job.model.plan
    whole = dp_copula({c: data[c] for c in plan.names}, plan.continualizers, plan.bins,
                      plan.epsilon_marginal, plan.epsilon_corr, secure_generator(6))
    mapped = job.model.reference
    assert isinstance(mapped, Copula)
    assert np.array_equal(mapped.correlation, whole.correlation)
    assert mapped.correlation[0, 1] > 0.9  # the refit ran: k follows x
    for c in plan.names:
        assert np.array_equal(mapped.marginals[c].xs, whole.marginals[c].xs), c
        assert np.array_equal(mapped.marginals[c].ys, whole.marginals[c].ys), c
    assert mapped.edge == whole.edge


def test_interval_summary_is_exact_over_partitions() -> None:
    """The released counts, the rounds histogram and the mean coverage (rounded once)
    of a partitioned interval release are those of its table."""
    mech = _mechanism("interval.progressive")
    data = _data()
    params = mech.load_params({"column": "x", "rounds": 3})
    cost = mech.cost(params, {"interval_leakage": Fraction(9, 10)}, META)
    job = record_maps.fit(mech, lambda cols: [data], params, cost, META, secure_generator(2),
                          SECRET)
    out = record_maps.release(job, _split(data, [7_000] * 5 + [5_000]))
    assert out.table is not None
    table = out.table
    assert out.result["released"] == int(np.count_nonzero(table["released"]))
    assert out.result["nulls"] == N - out.result["released"]
    assert out.result["exact_reports"] == int(np.count_nonzero(~np.isnan(table["exact"])))
    assert out.result["rounds_histogram"] == np.bincount(table["rounds"], minlength=4).tolist()
    assert out.result["realized_mean_coverage"] == float(
        sum(map(Fraction, table["coverage"].tolist())) / N)
    assert out.result["columns"] == list(table)


def test_subset_summary_counts_the_released_subsets_over_partitions() -> None:
    """A partitioned subset release's summary (counts, sizes, inclusion, the EM estimate)
    is the whole table's, as the whole-column summary computes it from the masks."""
    from mechanisms.subset import report

    mech = _mechanism("subset.uniform")
    data = _data()
    params = mech.load_params({"column": "g"})
    cost = mech.cost(params, {"subset_draws:g": Fraction(1)}, META)
    job = record_maps.fit(mech, lambda cols: [data], params, cost, META, secure_generator(2),
                          SECRET)
    out = record_maps.release(job, _split(data, [9_000] * 4 + [4_000]))
    assert out.table is not None
    plan = job.model
    expected = report.summarize(plan.variables[0], out.table["g"].astype(np.uint64), plan)
    assert json.dumps(out.result["variables"][0]) == json.dumps(expected)


@given(st.lists(st.floats(-1e300, 1e300, allow_nan=False), min_size=1, max_size=200),
       st.integers(1, 50))
@settings(max_examples=80, deadline=None)
def test_column_sums_give_correctly_rounded_means_from_any_split(
        values: list[float], cut: int) -> None:
    """ColumnSums' mean is the exact mean rounded once, whatever the batches."""
    x = np.array(values)
    statistic = ColumnSums(("x",))
    halves = [{"x": x[:cut]}, {"x": x[cut:]}]
    mean = statistic.means(compute(statistic, halves)[1])["x"]
    assert mean == float(sum(map(Fraction, values)) / len(values))
    assert mean == statistic.means(compute(statistic, [{"x": x}])[1])["x"]


def test_the_worker_maps_a_stored_version_row_group_by_row_group(tmp_path: Path) -> None:
    """``run._run`` on a version of three row groups: partition p is row group p, mapped
    with ``partition_generator(job_secret(seed), p)``, the records in row order (the
    service orders them after), engine ``embedded``."""
    from service.releases import run
    from service.storage.dataset_files import ROW_GROUP_ROWS, DatasetStore
    from service.storage.objects import LocalStore

    n = 2 * ROW_GROUP_ROWS + 1000
    meta = DatasetMeta(n, {"x": ColumnMeta("x", "continuous", (0.0, 10.0))})
    store = DatasetStore(LocalStore(tmp_path / "o"), staging_dir=tmp_path / "s")
    x = np.random.default_rng(4).uniform(0, 10, n)
    store.write("ds_map", 1, {"kind": "test"}, {"x": x})
    mech = _mechanism("lrm")
    params = mech.load_params({"columns": ["x"]})
    cost = mech.cost(params, {"epsilon": Fraction(1)}, meta)
    output, engine = run._run(store, run._Job("ds_map", 1, mech, params, cost, meta, seed=9))
    assert engine == "embedded" and output.table is not None
    plans = mech.fit(params, None, cost, meta, secure_generator(9))
    secret = job_secret(9)
    for p, start in enumerate(range(0, n, ROW_GROUP_ROWS)):
        rows = {"x": x[start:start + ROW_GROUP_ROWS]}
        expected = mech.privatize(rows, start, params, cost, meta, plans,
                                  partition_generator(secret, p))
        for column, values in expected.items():
            assert np.array_equal(output.table[column][start:start + ROW_GROUP_ROWS],
                                  values), (p, column)
