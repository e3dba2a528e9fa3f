"""Subset privacy (Wang & Ding, "Draw from an obfuscated urn"; specs/subset.md).

Each record's category X is released as a random subset A ∋ X that says
nothing beyond "X ∈ A". A notebook can use the library directly::

    from mechanisms import subset
    design = subset.design_uniform(5)
    masks = subset.privatize(codes, design, rng)          # uint64 bitmasks
    fit = subset.estimate(masks, design, "em")            # ŵ, SEs, KKT check
    subset.privacy_report(design, fit.w)                  # τ, I(X;A) bits, prediction risk

Importing the package also registers the service mechanisms
``subset.uniform``, ``subset.custom``, ``subset.dummy`` and ``subset.product``.
"""

from __future__ import annotations

from mechanisms.subset import bitmask, release  # release registers the mechanisms
from mechanisms.subset.bitmask import MAX_P
from mechanisms.subset.composition import Composed, compose
from mechanisms.subset.design import Design, DesignError, r_p
from mechanisms.subset.design import from_json as design_from_json
from mechanisms.subset.design import from_mu as design_from_mu
from mechanisms.subset.design import from_nu as design_from_nu
from mechanisms.subset.design import proper as design_proper
from mechanisms.subset.design import random as design_random
from mechanisms.subset.design import uniform as design_uniform
from mechanisms.subset.domain import Domain, Factor
from mechanisms.subset.dummy import (
    DummyAugmentation,
    DummyRelease,
    base_design,
    privatize_with_dummies,
    strip_dummies,
)
from mechanisms.subset.estimation import (
    Estimate,
    Observed,
    em,
    estimate,
    kkt,
    log_likelihood,
    mom,
    mom_closed,
    observe,
    one_step,
    project_simplex,
)
from mechanisms.subset.independence import TestResult, auc, independence_tests
from mechanisms.subset.joint import estimate_joint, pair
from mechanisms.subset.metrics import (
    PrivacyReport,
    fully_private_report,
    individual_report,
    non_private_report,
    posterior,
    privacy_report,
)
from mechanisms.subset.sampler import (
    privatize,
    privatize_product,
    survey_answer,
    survey_question,
)

__all__ = [
    "MAX_P",
    "Composed",
    "Design",
    "DesignError",
    "Domain",
    "DummyAugmentation",
    "DummyRelease",
    "Estimate",
    "Factor",
    "Observed",
    "PrivacyReport",
    "TestResult",
    "auc",
    "base_design",
    "bitmask",
    "compose",
    "design_from_json",
    "design_from_mu",
    "design_from_nu",
    "design_proper",
    "design_random",
    "design_uniform",
    "em",
    "estimate",
    "estimate_joint",
    "fully_private_report",
    "independence_tests",
    "individual_report",
    "kkt",
    "log_likelihood",
    "mom",
    "mom_closed",
    "non_private_report",
    "observe",
    "one_step",
    "pair",
    "posterior",
    "privacy_report",
    "privatize",
    "privatize_product",
    "privatize_with_dummies",
    "project_simplex",
    "r_p",
    "release",
    "strip_dummies",
    "survey_answer",
    "survey_question",
]
