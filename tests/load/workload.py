"""What the soak asks for: one small mixed dataset, and a request for every mechanism.

Requests vary their parameters or budget at random so that most are new releases
(identical ones are replays and spend nothing); budgets are small against the caps
so a dataset runs out after a few dozen releases and later requests get 409.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

N_ROWS = 300
GRID = [i / 8 for i in range(9)]
PAIRS6 = [["a", "b"], ["c", "d"], ["a", "c"], ["b", "d"], ["a", "d"], ["b", "c"]]

#: caps: a few dozen releases per measure, a couple of draws per categorical column;
#: interval leakage stops at 1 per column (Thm 4), a release or two each
CAPS: dict[str, float] = {"epsilon": 3, "delta": 1e-5, "interval_leakage": 1,
                          "subset_draws": 2, "noiseless_bits": 10}
#: an analyst key gets this share of every cap (its own allocation, checked atomically)
ALLOCATION_SHARE = 0.5

METADATA: dict[str, Any] = {
    "name": "soak",
    "budgets": CAPS,
    # every mechanism runs on every dataset: noiseless and DP releases together (by
    # default the first of either kind would lock the dataset to its notion)
    "allow_mixed_noiseless_dp": True,
    # subset, interval, noiseless.local, dip...: one output per record, opted in
    "record_level": True,
    "columns": {
        "x": {"type": "continuous", "bounds": [-5, 5],
              "prior": {"family": "normal", "loc": 0, "scale": 1}},
        "w": {"type": "continuous", "bounds": [0, 1]},
        "age": {"type": "integer", "bounds": [0, 100]},
        "income": {"type": "continuous", "bounds": [0, 1000]},
        "group": {"type": "categorical", "categories": ["a", "b", "c"]},
        "c4": {"type": "categorical", "categories": ["a", "b", "c", "d"]},
        "race": {"type": "categorical", "categories": ["r1", "r2", "r3", "r4", "r5"]},
        "sex": {"type": "categorical", "categories": ["F", "M"]},
        "f": {"type": "functional", "grid": GRID, "norm_bound": 2},
    },
}


def dataset_csv(seed: int) -> str:
    """``N_ROWS`` rows fitting ``METADATA``; each upload gets its own seed."""
    rng = np.random.default_rng(seed)
    n = N_ROWS
    x = np.clip(rng.normal(0, 1, n), -5, 5)
    w = rng.random(n)
    age = rng.integers(18, 90, n)
    income = np.clip(rng.gamma(4, 60, n), 0, 1000)
    group = rng.choice(3, n, p=[0.5, 0.3, 0.2])
    c4 = rng.integers(0, 4, n)
    race = rng.choice(5, n, p=[0.05, 0.1, 0.15, 0.2, 0.5])
    sex = rng.integers(0, 2, n)
    curves = np.sin(2 * np.pi * np.array(GRID)) + 0.2 * rng.normal(size=(n, len(GRID)))
    header = ["x", "w", "age", "income", "group", "c4", "race", "sex"]
    header += [f"f.{i}" for i in range(len(GRID))]
    lines = [",".join(header)]
    for i in range(n):
        cells = [f"{x[i]:.4f}", f"{w[i]:.4f}", str(age[i]), f"{income[i]:.2f}", "abc"[group[i]],
                 "abcd"[c4[i]], f"r{race[i] + 1}", "FM"[sex[i]]]
        cells += [f"{v:.4f}" for v in curves[i]]
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n"


Request = tuple[dict[str, Any], dict[str, float]]  # (params, budget)


def _eps(rng: random.Random) -> float:
    return round(rng.uniform(0.05, 0.25), 3)


def _loc(rng: random.Random) -> float:
    return round(rng.uniform(-0.5, 0.5), 3)


def _laplace(rng: random.Random) -> Request:
    params: dict[str, Any] = rng.choice([
        {"statistic": "mean", "column": "age"},
        {"statistic": "sum", "column": "income"},
        {"statistic": "histogram", "column": "group"},
        {"statistic": "count", "condition": {"column": "age", "op": "ge", "value": 40}},
    ])
    return params, {"epsilon": _eps(rng)}


def _geometric(rng: random.Random) -> Request:
    params: dict[str, Any] = rng.choice([{"statistic": "histogram", "column": "race"},
                         {"statistic": "count",
                          "condition": {"column": "age", "op": "ge", "value": 30}}])
    return params, {"epsilon": _eps(rng)}


def _gaussian(rng: random.Random) -> Request:
    params = {"statistic": "count", "condition": {"column": "age", "op": "ge", "value": 40}}
    return params, {"epsilon": _eps(rng), "delta": 1e-7}


def _logistic(rng: random.Random) -> dict[str, Any]:
    return {"family": "logistic", "loc": _loc(rng), "scale": 1}


def _uniform(rng: random.Random) -> dict[str, Any]:
    return {"family": "uniform", "loc": _loc(rng), "scale": 2}


REQUESTS: dict[str, Callable[[random.Random], Request]] = {
    "laplace": _laplace,
    "geometric": _geometric,
    "gaussian": _gaussian,
    "interval.case1": lambda r: ({"column": "x", "anchors": _uniform(r)},
                                 {"interval_leakage": 0.5}),
    "interval.case2": lambda r: ({"column": "x", "anchors": _logistic(r)},
                                 {"interval_leakage": 0.6}),
    "interval.casek": lambda r: ({"column": "x", "m": 3, "offsets": [-1, 1],
                                  "anchors": _logistic(r)}, {"interval_leakage": 0.9}),
    "interval.ring": lambda r: ({"column": "x", "tau_floor": round(r.uniform(0.2, 0.4), 3)},
                                {"interval_leakage": 0.5}),
    "interval.selective": lambda r: ({"column": "x", "tau": 0.6, "anchors": _logistic(r)},
                                     {"interval_leakage": 0.5}),
    "interval.progressive": lambda r: ({"column": "w", "rounds": r.choice([2, 3])},
                                       {"interval_leakage": round(r.uniform(0.8, 0.95), 3)}),
    "interval.progressive_categorical": lambda r: ({"column": r.choice(["c4", "race"]),
                                                    "rounds": 1},
                                                   {"interval_leakage": 0.5}),
    "subset.uniform": lambda r: ({"column": r.choice(["c4", "race"])},
                                 {"subset_draws": 1}),
    "subset.custom": lambda r: ({"column": "c4", "design": {
        "type": "mu", "subsets": PAIRS6,
        "probabilities": [0.5, 0.5, 0.25, 0.25, 0.25, 0.25]}}, {"subset_draws": 1}),
    "subset.dummy": lambda r: ({"column": "sex", "alpha": 0.1}, {"subset_draws": 1}),
    "subset.product": lambda r: ({"columns": ["race", "c4"]}, {"subset_draws": 1}),
    "noiseless.aggregate": lambda r: ({"statistic": "mean", "column": "income"},
                                      {"noiseless_bits": r.choice([1, 2, 3])}),
    "noiseless.local": lambda r: ({"column": r.choice(["income", "w"])},
                                  {"noiseless_bits": r.choice([1, 2, 3])}),
    "noiseless.vector": lambda r: ({"queries": [
        {"statistic": r.choice(["median", "min"]), "column": "income", "bits": 1},
        {"statistic": "max", "column": r.choice(["w", "age"]), "bits": 1}]},
        {"noiseless_bits": 2}),
    "iclp.mean": lambda r: ({"column": "f"}, {"epsilon": _eps(r)}),
    "frl.mean": lambda r: ({"column": "f"}, {"epsilon": _eps(r)}),
    "iclp.kde": lambda r: ({"column": "income"}, {"epsilon": _eps(r)}),
    "bernstein.kde": lambda r: ({"column": "income"}, {"epsilon": _eps(r)}),
    "iclp.erm": lambda r: (r.choice([{"covariate": "x", "response": "income"},
                                     {"covariate": "income", "response": "w"}]),
                           {"epsilon": _eps(r)}),
    "iclp.cov": lambda r: ({"column": "f"}, {"epsilon": _eps(r)}),
    "iclp.fos": lambda r: ({"response": "f", "covariates": ["x"]}, {"epsilon": _eps(r)}),
    "iclp.kde2d": lambda r: ({"columns": ["x", "income"]}, {"epsilon": _eps(r)}),
    "iclp.ar": lambda r: ({"column": "f"}, {"epsilon": _eps(r)}),
    "bernstein.mean": lambda r: ({"column": "f"}, {"epsilon": _eps(r)}),
    "gp.adp": lambda r: ({"column": "f"}, {"epsilon": _eps(r), "delta": 1e-7}),
    "frl.kde": lambda r: ({"column": "income"}, {"epsilon": _eps(r)}),
    "dip": lambda r: ({"columns": r.choice([["income"], ["income", "group"]])},
                      {"epsilon": _eps(r)}),
    "lrm": lambda r: ({"columns": r.choice([["income"], ["income", "age"]])},
                      {"epsilon": _eps(r)}),
    "opm.mean": lambda r: ({"columns": ["income"], "center": r.choice(["zero", "midpoint"])},
                           {"epsilon": _eps(r)}),
    "opm.l2ball": lambda r: ({"column": r.choice(["w", "income"])}, {"epsilon": _eps(r)}),
    "exm": lambda r: ({"column": r.choice(["group", "race"]), "draws": r.choice([1, 5])},
                      {"epsilon": _eps(r)}),
}

#: mechanisms whose releases carry record-level data (served at /data as CSV)
WITH_DATA = frozenset(m for m in REQUESTS if m.startswith(("interval.", "subset."))
                      or m in {"dip", "noiseless.local", "lrm", "opm.l2ball", "exm"})

#: an analysis: name, params, and whether it pairs with another subset.uniform release
Analysis = tuple[str, dict[str, Any], bool]


def analyses_of(mechanism: str) -> list[Analysis]:
    """The free analyses the soak runs on a release of ``mechanism`` (none for most)."""
    if mechanism in {"interval.case1", "interval.progressive"}:  # uniform anchors: Ex. 2
        return [("npmle", {}, False), ("mean", {}, False), ("moments", {}, False)]
    if mechanism == "interval.progressive_categorical":
        return [("categories", {}, False)]
    if mechanism.startswith("interval."):
        return [("npmle", {}, False), ("moments", {}, False)]
    if mechanism == "subset.product":
        return [("estimate", {"column": "race"}, False), ("independence_test", {}, False)]
    if mechanism == "subset.uniform":
        return [("estimate", {}, False), ("independence_test", {}, True)]
    if mechanism.startswith("subset."):
        return [("estimate", {}, False)]
    return []


def release_body(rng: random.Random, dataset_id: str, mechanism: str) -> dict[str, Any]:
    params, budget = REQUESTS[mechanism](rng)
    return {"dataset_id": dataset_id, "mechanism": mechanism, "params": params,
            "budget": budget}
