"""Noiseless privacy (Farokhi): deterministic quantization, ε in bits of output count.

A mechanism is ε-noiselessly private when, with every other record fixed at
any admissible value, one record can cause at most 2^ε distinct outputs
(bits, not nats; ε < 1 forces a constant). Budgets add under composition and
post-processing is free. Notebook use::

    from mechanisms import noiseless
    plan, out = noiseless.aggregate(x, "mean", bits=2, bounds=(0, 100))
    plan, out = noiseless.aggregate(x, "median", bits=3, bounds=(0, 100))
    plan, column = noiseless.local_release(x, bits=3, bounds=(0, 100))

Importing the package registers ``noiseless.aggregate`` and ``noiseless.local``.
"""

from __future__ import annotations

from mechanisms.noiseless.bits import (
    CHARGE_DENOMINATOR,
    at_most_power,
    bits_upper,
    charge,
    levels_for_bits,
    split_bits,
)
from mechanisms.noiseless.central import (
    MAX_COUNT,
    ORDER_STATISTICS,
    STATISTICS,
    Query,
    ScalarPlan,
    ScalarRelease,
    VectorPlan,
    aggregate,
    bounded_query,
    certify_scalar,
    evaluate,
    lattice_quantizer,
    plan,
    plan_edges,
    plan_paper,
    plan_vector,
    release,
    release_vector,
)
from mechanisms.noiseless.certify import (
    TAU,
    certified_count,
    certified_count_edges,
    certified_count_uniform,
    exact_levels,
    max_outputs_uniform,
    paper_levels,
    safe_levels,
)
from mechanisms.noiseless.exact import exact_float_sum, exact_int_sum
from mechanisms.noiseless.local import LocalPlan, local_release, plan_local, quantize
from mechanisms.noiseless.mechanism import NoiselessAggregate, NoiselessLocal, certify
from mechanisms.noiseless.quantizer import EdgeQuantizer, ExactEdgeQuantizer, UniformQuantizer

__all__ = [
    "CHARGE_DENOMINATOR",
    "MAX_COUNT",
    "ORDER_STATISTICS",
    "STATISTICS",
    "TAU",
    "EdgeQuantizer",
    "ExactEdgeQuantizer",
    "LocalPlan",
    "NoiselessAggregate",
    "NoiselessLocal",
    "Query",
    "ScalarPlan",
    "ScalarRelease",
    "UniformQuantizer",
    "VectorPlan",
    "aggregate",
    "at_most_power",
    "bits_upper",
    "bounded_query",
    "certified_count",
    "certified_count_edges",
    "certified_count_uniform",
    "certify",
    "certify_scalar",
    "charge",
    "evaluate",
    "exact_float_sum",
    "exact_int_sum",
    "exact_levels",
    "lattice_quantizer",
    "levels_for_bits",
    "local_release",
    "max_outputs_uniform",
    "paper_levels",
    "plan",
    "plan_edges",
    "plan_local",
    "plan_paper",
    "plan_vector",
    "quantize",
    "release",
    "release_vector",
    "safe_levels",
    "split_bits",
]
