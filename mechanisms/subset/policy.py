"""Operator thresholds on a subset design's risk (spec §9.4): gating before anything is spent.

An operator puts ``subset_policy: {min_size_coverage, max_mi_bits,
max_prediction_risk}`` on the dataset (a default for every column) and/or on
a categorical column (overrides the default key by key). A variable that
reads several columns (``combine_with``) obeys the strictest of them.

The values checked are the design's metrics under the *uniform prior* over
the variable's categories — public inputs only, never the data (the raw
distribution would leak through the refusal itself). For any design that
treats categories alike (the uniform design, and the dummy augmentation of
it), the uniform prior is the worst case of the two population-dependent
risks that have one: τ = 1/r + (1 − 1/r)Σw² is smallest at uniform w, and
I(X;A) is concave in w and invariant under relabelling, so its maximum
(the channel capacity) is at uniform w. The prediction risk has no useful
worst case (a point mass makes it 1 for every design), so the uniform
prior is its reference population. When earlier draws of the same columns
exist (``prior_draws``, from the ledger), the values are those of the
composed design (the intersection of all draws, spec §1.5): that is what
an observer of every release learns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mechanisms.base import DatasetMeta, PolicyViolation
from mechanisms.subset import composition, metrics
from mechanisms.subset.design import ENUMERATION_LIMIT
from mechanisms.subset.plan import Plan, Variable

#: threshold name -> (the metric it bounds, True for a lower bound)
THRESHOLDS: dict[str, tuple[str, bool]] = {
    "min_size_coverage": ("size_coverage", True),
    "max_mi_bits": ("mi_bits", False),
    "max_prediction_risk": ("prediction_risk", False),
}
#: composing more (mask pairs) than this to check a policy is refused rather than attempted
MAX_COMPOSE_PAIRS = 1 << 22
#: tolerance for comparing a computed metric with a threshold (float sums over subsets)
TOLERANCE = 1e-12


@dataclass(frozen=True)
class Threshold:
    """One effective threshold and the metadata field it came from."""

    name: str
    value: float
    source: str

    def satisfied(self, computed: float) -> bool:
        lower = THRESHOLDS[self.name][1]
        return computed >= self.value - TOLERANCE if lower else computed <= self.value + TOLERANCE


def effective(meta: DatasetMeta, columns: tuple[str, ...]) -> dict[str, Threshold]:
    """The thresholds a variable reading ``columns`` obeys: per key, each column's own value
    or else the dataset's default; across columns the strictest."""
    found: dict[str, Threshold] = {}
    default = meta.subset_policy or {}
    for name in columns:
        own = meta.columns[name].subset_policy or {}
        for key in THRESHOLDS:
            if key in own:
                candidate = Threshold(key, float(own[key]),
                                      f"metadata.columns.{name}.subset_policy.{key}")
            elif key in default:
                candidate = Threshold(key, float(default[key]), f"metadata.subset_policy.{key}")
            else:
                continue
            held = found.get(key)
            lower = THRESHOLDS[key][1]
            if held is None or (candidate.value > held.value if lower
                                else candidate.value < held.value):
                found[key] = candidate
    return found


def design_metrics(variable: Variable, n_rows: int, prior_draws: int) -> dict[str, Any]:
    """The public metrics the thresholds are compared with (uniform prior; composed over
    ``prior_draws + 1`` draws when earlier draws exist). None where not computable."""
    p = variable.domain.p
    flat = np.full(p, 1.0 / p)
    aug = variable.augmentation
    draws = prior_draws + 1
    values: dict[str, Any] = {"prior": "uniform over the variable's categories",
                              "draws": draws}
    if aug is not None:
        alpha = float(aug.effective_alpha(n_rows)) if n_rows else aug.alpha
        if aug.p_augmented <= ENUMERATION_LIMIT:
            report = aug.report(flat, alpha).to_json()
        else:
            tau = aug.size_coverage(flat, alpha)
            report = {"size_coverage": tau, "mi_bits": None, "prediction_risk": None}
    elif draws > 1:
        chosen = variable.design
        if not chosen.enumerable or (1 << p) * chosen.support_size > MAX_COMPOSE_PAIRS:
            report = {"size_coverage": None, "mi_bits": None, "prediction_risk": None}
        else:
            composed = composition.compose([chosen] * draws)
            report = composed.report(flat).to_json()
            values["disclosure_probability"] = composed.disclosure_probability(flat)
    else:
        report = metrics.privacy_report(variable.design, flat).to_json()
    for metric, _ in THRESHOLDS.values():
        value = report.get(metric)
        values[metric] = None if value is None or not math.isfinite(value) else float(value)
    return values


def check(plan: Plan, meta: DatasetMeta) -> list[dict[str, Any]]:
    """Raise PolicyViolation (422 ``policy_violation``) for a variable whose design breaks
    a threshold, or whose metric cannot be computed although a threshold bounds it;
    otherwise the per-variable evaluation (what ``estimate`` shows)."""
    out = []
    for variable in plan.variables:
        thresholds = effective(meta, variable.columns)
        if not thresholds:
            continue
        computed = design_metrics(variable, plan.n_rows, plan.prior_draws)
        shown = {t.name: t.value for t in thresholds.values()}
        for threshold in thresholds.values():
            metric = THRESHOLDS[threshold.name][0]
            value = computed[metric]
            if value is not None and threshold.satisfied(value):
                continue
            if value is None:
                why = (f"{metric} of this design cannot be computed exactly (too many"
                       " subsets), so the operator's threshold cannot be verified")
            else:
                relation = "below" if THRESHOLDS[threshold.name][1] else "above"
                why = (f"{metric} {value:.6g} is {relation} the operator's"
                       f" {threshold.name} {threshold.value:.6g}")
            draws = computed["draws"]
            raise PolicyViolation(
                threshold.source,
                f"variable {variable.name!r}: {why} (design metrics under a uniform prior over"
                f" its categories{f', composed over {draws} draws' if draws > 1 else ''});"
                " choose another design (more dummies, a coarser or custom design) or ask"
                " the operator",
                threshold=threshold.name, limit=threshold.value, computed=value,
                variable=variable.name)
        out.append({"variable": variable.name, "thresholds": shown,
                    "sources": {t.name: t.source for t in thresholds.values()},
                    "computed": computed, "satisfied": True})
    return out


def describe(evaluation: list[dict[str, Any]]) -> Mapping[str, Any] | None:
    """The ``policy`` block of an accuracy statement (None when no threshold applies)."""
    if not evaluation:
        return None
    return {"variables": evaluation,
            "note": "operator thresholds on the design's public risk (uniform prior over"
                    " each variable's categories; composed when earlier draws exist);"
                    " a release that breaks one is refused before anything is spent"}
