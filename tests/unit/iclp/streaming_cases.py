"""Releases whose outputs the streaming port must keep bit for bit: the data, params and
budgets of ``test_streaming.py``'s regression test, whose expected outputs
(``streaming_outputs.json``) were computed by the whole-column code before the port."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import numpy as np

from mechanisms.base import ColumnMeta, DatasetMeta

GRID = 12
COLUMNS = {
    "x": ColumnMeta("x", "continuous", (0.0, 100.0)),
    "y": ColumnMeta("y", "continuous", (-1.0, 1.0)),
    "b": ColumnMeta("b", "continuous", (0.0, 1.0)),
    "k": ColumnMeta("k", "integer", (0.0, 100.0)),
    "race": ColumnMeta("race", "categorical", categories=("A", "B", "C")),
    "f": ColumnMeta("f", "functional", grid=tuple(np.linspace(0.0, 2.0, GRID).tolist()),
                    norm_bound=1.5),
    "g": ColumnMeta("g", "functional", grid=(0.0, 0.1, 0.35, 0.4, 0.8, 1.0, 1.7),
                    norm_bound=2.0),
}
EPS = {"epsilon": Fraction(3, 2)}
BITS = {"noiseless_bits": Fraction(9)}
#: (mechanism, params, budget)
CASES: list[tuple[str, dict[str, Any], dict[str, Fraction]]] = [
    ("iclp.mean", {"column": "f"}, EPS),
    ("iclp.mean", {"column": "g", "smoothing": {"psi": 0.01}, "max_components": 4}, EPS),
    ("iclp.mean", {"column": "f", "kernel": {"rho": 0.2}, "smoothing": {"psi": "balanced"}},
     EPS),
    ("frl.mean", {"column": "g"}, EPS),
    ("iclp.kde", {"column": "x"}, EPS),
    ("iclp.kde", {"column": "y", "grid_size": 40, "normalize": False}, EPS),
    ("iclp.kde2d", {"columns": ["x", "y"], "grid_size": 16}, EPS),
    ("iclp.cov", {"column": "f"}, EPS),
    ("iclp.cov", {"column": "g", "centred": False}, EPS),
    ("iclp.fos", {"response": "f", "covariates": ["x", "k"]}, EPS),
    ("iclp.fos", {"response": "g", "covariates": ["y"], "intercept": False}, EPS),
    ("iclp.erm", {"covariate": "x", "response": "y"}, EPS),
    ("iclp.erm", {"covariate": "y", "response": "b", "loss": "logistic", "grid_size": 30},
     EPS),
    ("noiseless.vector", {"queries": [
        {"statistic": "mean", "column": "x", "bits": 2},
        {"statistic": "median", "column": "y", "bits": 2},
        {"statistic": "count", "condition": {"column": "race", "op": "in",
                                             "value": ["A", "C"]}, "bits": 2},
        {"statistic": "max", "column": "k", "bits": 1},
        {"statistic": "sum", "column": "b", "bits": 2}]}, BITS),
    ("frl.kde", {"column": "x", "grid_size": 50}, EPS),
]
IDS = [f"{i}-{name}" for i, (name, _, _) in enumerate(CASES)]
SEED = 20261129


def meta(n: int) -> DatasetMeta:
    return DatasetMeta(n, COLUMNS)


def data(n: int, seed: int) -> dict[str, np.ndarray]:
    """Rows as stored, with NaN, values past the bounds, undeclared codes and curves far
    longer than their norm bound (clipped), some with NaN or infinite cells."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-10.0, 110.0, n)
    x[rng.random(n) < 0.05] = np.nan
    y = np.clip(np.sin(x / 20.0) + 0.3 * rng.normal(size=n), -1.5, 1.5)
    y[::17] = np.nan
    b = (rng.random(n) < 0.5 + 0.4 * np.tanh(np.nan_to_num(y))).astype(np.float64)
    grid_f = np.array(COLUMNS["f"].grid or ())
    grid_g = np.array(COLUMNS["g"].grid or ())
    z = rng.uniform(-1.0, 1.0, n)
    f = np.sin(np.pi * grid_f)[None, :] + np.outer(z, grid_f) \
        + 0.4 * rng.normal(size=(n, GRID))
    f[::13] *= 50.0  # far past τ: clipped
    f[5::29, 3] = np.nan
    g = np.cos(grid_g)[None, :] * rng.normal(1.0, 1.0, (n, 1)) \
        + 0.2 * rng.normal(size=(n, grid_g.size))
    g[7::31, 2] = np.inf
    g[::11] *= 1e-200
    return {"x": x, "y": y, "b": b, "k": rng.integers(-5, 106, n),
            "race": rng.integers(-1, 4, n), "f": f, "g": g}


def outputs(result: Any) -> str:
    """An output's result as canonical JSON (floats by repr: exact)."""
    from mechanisms.iclp.release import jsonable

    return json.dumps(jsonable(result), sort_keys=True)
