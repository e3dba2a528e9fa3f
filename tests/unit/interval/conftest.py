"""Shared priors and designs for the interval-privacy tests."""

from __future__ import annotations

import numpy as np

from mechanisms import interval

NORMAL = interval.make_prior({"family": "normal", "loc": 0.0, "scale": 1.0})
LOGIS1 = interval.AnchorDist("logistic", 0.0, 1.0)


def case1(dist: interval.AnchorDist = LOGIS1,
          support: tuple[float, float] = (-np.inf, np.inf)) -> interval.IntervalMechanism:
    return interval.IntervalMechanism(interval.Canonical(dist, 2), support=support)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
