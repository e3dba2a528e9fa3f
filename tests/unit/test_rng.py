"""The release generator: AES-CTR, a fresh key per generator, reproducible only when seeded."""

from __future__ import annotations

import math

import numpy as np
from randomgen import AESCounter
from scipy import stats

from mechanisms.rng import secure_generator

KS_QUANTILE = float(stats.kstwobign.isf(1e-6))


def test_generators_run_on_aes_ctr_with_fresh_keys() -> None:
    a, b = secure_generator(), secure_generator()
    assert isinstance(a.bit_generator, AESCounter)
    keys = {str(g.bit_generator.state["s"]["seed"]) for g in (a, b)}  # the AES key schedule
    assert len(keys) == 2
    assert not np.array_equal(a.random(8), b.random(8))


def test_a_seed_reproduces_and_different_seeds_differ() -> None:
    assert np.array_equal(secure_generator(7).random(16), secure_generator(7).random(16))
    assert not np.array_equal(secure_generator(7).random(16), secure_generator(8).random(16))
    assert secure_generator(2**63 - 1).random() != secure_generator(0).random()


def test_draws_are_uniform_and_exponential() -> None:
    rng = secure_generator(11)
    n = 200_000
    bound = KS_QUANTILE / math.sqrt(n)
    assert stats.kstest(rng.random(n), "uniform").statistic < bound
    assert stats.kstest(rng.standard_exponential(n), "expon").statistic < bound
