"""The ICLP functionals and ``noiseless.vector`` as streaming statistics (issue #30 item 3).

Oracles: the whole-column code before the port (``streaming_outputs.json``, computed on
main before any change: every pinned output must come back bit for bit; issue #32 re-pinned
iclp.cov's, one smoother for both moments, and iclp.fos's hashes, result.rmse added with
the coefficients unchanged; and the defaults that changed: iclp.mean, frl.mean, frl.kde
(FRL's min-risk M), iclp.kde2d (bandwidth), iclp.erm (logistic, then square-loss ψ),
iclp.cov and iclp.fos (reference-risk ψ)), and ``run``
itself: the partials of any split of the rows (empty batches, batches of one row), updated
in any order and merged in any tree shape, must equal the whole columns' exactly, and the
release from them ``run``'s output with the same generator.
"""

from __future__ import annotations

import hashlib
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import memory, registry
from mechanisms.base import StreamingMechanism
from mechanisms.selection import PASSES
from mechanisms.statistics import SCALE, Joint, Partial, compute_over, product_sums, whole
from tests.unit.iclp.streaming_cases import CASES, IDS, SEED, data, meta, outputs
from tests.unit.streams import batches, streamed

PINNED = json.loads((Path(__file__).parent / "streaming_outputs.json").read_text())


def _setup(index: int, n: int) -> tuple[StreamingMechanism, dict[str, Any], Any]:
    name, raw, budget = CASES[index]
    mech = registry.get(name)
    assert isinstance(mech, StreamingMechanism), name
    params = mech.load_params(raw)
    return mech, params, mech.cost(params, budget, meta(n))


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
@pytest.mark.parametrize("n", [1, 7, 300])
def test_outputs_are_the_whole_column_code_s_bit_for_bit(index: int, n: int) -> None:
    mech, params, cost = _setup(index, n)
    out = mech.run(data(n, SEED + n), params, cost, meta(n), np.random.default_rng(n))
    pinned = PINNED[f"{IDS[index]}/{n}"]
    result = json.loads(outputs(out.result))
    released = result["values"] if "coordinates" in result else result["coefficients"]
    assert released == pinned["released"]
    assert hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest() == \
        pinned["sha256"]
    assert out.guarantee == pinned["guarantee"]


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), data_=st.data())
def test_any_batches_give_the_whole_partial_and_run_s_output(
        index: int, n: int, seed: int, data_: st.DataObject) -> None:
    mech, params, cost = _setup(index, n)
    columns = data(n, seed)
    cuts = data_.draw(st.lists(st.integers(0, n), max_size=8))
    if data_.draw(st.booleans()):
        cuts += list(range(n))  # a batch per row, and empty ones where cuts repeat
    pieces = batches(columns, cuts)
    order = data_.draw(st.permutations(range(len(pieces))))
    picks = data_.draw(st.lists(st.integers(0, 10**6), max_size=10))
    statistic = mech.statistic(params, cost, meta(n))
    last, partial = streamed(statistic, pieces, order, picks)
    assert partial == whole(statistic, columns)
    assert Partial.from_json(partial.to_json()) == partial
    released = mech.release(params, partial, cost, meta(n), np.random.default_rng(seed), last)
    assert repr(released) == repr(mech.run(columns, params, cost, meta(n),
                                           np.random.default_rng(seed)))


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_the_memory_bound_is_flat_in_the_rows(index: int) -> None:
    mech, params, _ = _setup(index, 10)
    assert mech.memory(params, meta(10**9)) == mech.memory(params, meta(memory.BATCH_ROWS))
    assert mech.memory(params, meta(10**9)).bytes < 2**30


def test_a_short_or_long_column_is_refused_without_its_values() -> None:
    mech, params, cost = _setup(0, 12)
    curves = np.full((11, 12), 0.123456789)
    with pytest.raises(ValueError, match="n_rows") as refused:
        mech.run({"f": curves}, params, cost, meta(12), np.random.default_rng(0))
    assert "0.1234" not in str(refused.value)
    statistic = mech.statistic(params, cost, meta(12))
    with pytest.raises(ValueError, match="2-D column"):
        statistic.update(statistic.empty(), {"f": curves[:, :5]})


def test_a_list_column_as_arrow_gives_it_is_read_as_its_rows() -> None:
    """Arrow's ``to_numpy`` of a fixed-size list column: a 1-D array of row arrays."""
    mech, params, cost = _setup(0, 6)
    curves = data(6, 3)["f"]
    statistic = mech.statistic(params, cost, meta(6))
    rows = np.empty(6, dtype=object)
    rows[:] = list(curves)
    assert statistic.update(statistic.empty(), {"f": rows}) == \
        statistic.update(statistic.empty(), {"f": curves})
    assert statistic.update(statistic.empty(), {"f": rows[:0]}) == statistic.empty()


def test_a_vector_reads_the_rows_once_per_pass_of_its_longest_query() -> None:
    """Six passes for the median, not 1 + 6 + 1 + 6 + 1 reads: the finished members ride
    in the carry."""
    mech, params, cost = _setup([name for name, _, _ in CASES].index("noiseless.vector"), 50)
    statistic = mech.statistic(params, cost, meta(50))
    assert isinstance(statistic, Joint)
    reads = []

    def read(columns: Any) -> list[dict[str, np.ndarray]]:
        reads.append(tuple(columns))
        return [{c: data(50, 1)[c] for c in columns}]

    _, partial = compute_over(statistic, read)
    assert len(reads) == PASSES and set(reads[0]) == {"x", "y", "race", "k", "b"}
    assert reads[-1] == ("y", "k")  # only the order statistics read the later passes
    assert Joint.member(partial, 0).parts.keys() == {"total"}


def test_product_sums_are_the_exact_sums_of_the_rounded_products() -> None:
    rng = np.random.default_rng(4)
    a = rng.normal(size=(300, 3)) * 10.0 ** rng.integers(-150, 150, (300, 3))
    b = rng.normal(size=(300, 4))
    pairs = (np.repeat(np.arange(3), 4), np.tile(np.arange(4), 3))
    got = product_sums(a, b, pairs)
    for (i, j), total in zip(zip(*pairs, strict=True), got, strict=True):
        assert Fraction(total, 1 << SCALE) == sum(Fraction(float(v)) for v in a[:, i] * b[:, j])
        assert total / (1 << SCALE) == math.fsum(a[:, i] * b[:, j])


@pytest.mark.parametrize("n", [1, 7, 300, 5000])
def test_the_exact_summaries_are_within_the_calibrated_float_error_of_the_old_ones(
        n: int) -> None:
    """The non-private coefficients before the lattice (rounded once from exact sums) may
    differ from the whole-column float accumulation they replace, by no more than the
    float error the noise calibration already allows for (``mean.make_plan``,
    ``cov.plan_iclp_cov``): the old formulas are the oracle here."""
    from mechanisms.iclp import cov, domain, mean, spectral

    columns = data(n, SEED)
    grid, tau = meta(n).columns["f"].grid or (), 1.5
    plan = mean.plan_iclp_mean(grid, tau, n, 1.5)
    x = columns["f"]
    old = plan.filter * ((domain.clipped_mean(x, plan.eig.weights, plan.tau)
                          * plan.eig.weights) @ plan.basis)
    size = math.sqrt(spectral.bessel_factor(plan.eig)) * tau * mean.TAU_SLACK
    allowed = plan.filter * size * (n + len(grid) + 8) * 2.0**-52
    assert np.all(np.abs(plan.summary(x) - old) <= allowed)

    second = cov.plan_iclp_cov(grid, tau, n, 1.5, centred=False)
    clipped = domain.clip_curves(x, second.eig.weights, tau)
    xi = (clipped * second.eig.weights) @ second.eig.vectors[:, :second.components]
    old = (second.product_filter * ((xi.T @ xi) / n))[second.upper]
    size = spectral.bessel_factor(second.eig) * (tau * mean.TAU_SLACK) ** 2
    allowed = (second.product_filter * size)[second.upper] * (n + 2 * len(grid) + 16) \
        * 2.0**-52
    assert np.all(np.abs(second.summary(x) - old) <= allowed)
