"""CPU time of the statistics' data pass on 10^7 rows: whole columns vs batches (issue #30).

``python tests/bench/stream_cpu.py [rows] [batch]`` prints, per statistic, the process
CPU seconds of the whole-column exact pass (``lattice_values``, ``TablePlan.exact``,
``QuantilePlan.ranks``, ``MomentPlan.exact``: the same calls before and after the port,
so running it on both trees compares them) and, where ``mechanisms.statistics`` exists,
of the streamed pass (updates over batches of ``batch`` rows, partials merged).
"""

from __future__ import annotations

import contextlib
import sys
import time
from fractions import Fraction
from typing import Any

import numpy as np

from mechanisms.base import ColumnMeta, DatasetMeta
from mechanisms.dp import baselines, moments, quantiles, tables
from mechanisms.noiseless import central

CASES: list[tuple[str, dict[str, Any]]] = [
    ("count", {"statistic": "count", "condition": {"column": "wage", "op": "le", "value": 5e4}}),
    ("int sum", {"statistic": "sum", "column": "age"}),
    ("real mean", {"statistic": "mean", "column": "wage"}),
    ("histogram", {"statistic": "histogram", "column": "wage", "bins": 100}),
    ("table sums", {"statistic": "sum", "column": "wage", "group_by": ["race", "sex"]}),
    ("quantiles", {"statistic": "quantile", "column": "wage", "quantiles": [0.5]}),
    ("variance", {"statistic": "variance", "column": "wage"}),
    ("covariance 3", {"statistic": "covariance", "columns": ["hours", "age", "score"]}),
]


def main(rows: int, batch: int) -> None:
    meta = DatasetMeta(rows, {
        "age": ColumnMeta("age", "integer", (17, 90)),
        "wage": ColumnMeta("wage", "continuous", (0.0, 200_000.0)),
        "hours": ColumnMeta("hours", "continuous", (0.0, 80.0)),
        "score": ColumnMeta("score", "continuous", (0.0, 100.0)),
        "race": ColumnMeta("race", "categorical", categories=tuple("ABCDE")),
        "sex": ColumnMeta("sex", "categorical", categories=("F", "M")),
    })
    rng = np.random.default_rng(0)
    data = {"age": rng.integers(0, 100, rows), "wage": rng.lognormal(10.0, 1.0, rows),
            "hours": rng.uniform(0.0, 90.0, rows), "score": rng.normal(50.0, 20.0, rows),
            "race": rng.integers(0, 5, rows),
            "sex": rng.integers(0, 2, rows)}
    amounts = {"epsilon": Fraction(1)}
    batches = [{k: v[a:a + batch] for k, v in data.items()} for a in range(0, rows, batch)]
    with contextlib.suppress(ImportError):  # the tree before the port: whole columns only
        from mechanisms.statistics import compute
    print(f"{rows} rows, batches of {batch}; CPU seconds")
    for label, params in CASES:
        exact: Any
        if baselines.extended(params):
            plan: Any = baselines.extended_plan("laplace", params, amounts, meta)
            exact = {tables.TablePlan: tables.TablePlan.exact,
                     quantiles.QuantilePlan: quantiles.QuantilePlan.ranks,
                     moments.MomentPlan: moments.MomentPlan.exact}[type(plan)]
        else:
            plan = baselines.LaplaceMechanism()._plan(params, amounts, meta)
            exact = baselines.lattice_values
        start = time.process_time()
        exact(plan, data)
        whole = time.process_time() - start
        line = f"{label:14s} whole {whole:7.3f}"
        statistic = getattr(baselines.laplace, "statistic", None)
        if statistic is not None:
            start = time.process_time()
            compute(statistic(params, amounts, meta), batches)
            line += f"   streamed {time.process_time() - start:7.3f}"
        print(line, flush=True)
    for label, query in (("nl median", "median"), ("nl sum", "sum")):
        q = central.bounded_query(query, (0.0, 200_000.0), rows)
        start = time.process_time()
        central.evaluate(q, data["wage"])
        line = f"{label:14s} whole {time.process_time() - start:7.3f}"
        try:
            from mechanisms.noiseless import passes
        except ImportError:
            print(line)
            continue
        start = time.process_time()
        compute(passes.statistic(passes.Records(q, "wage")), batches)
        print(f"{line}   streamed {time.process_time() - start:7.3f}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10**7,
         int(sys.argv[2]) if len(sys.argv) > 2 else 10**5)
