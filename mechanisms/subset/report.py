"""What a subset release says about itself: accuracy before, summary after.

``accuracy`` uses public inputs only — the design, n_rows, and a *uniform
prior* over each variable's categories, since every privacy metric depends
on the population. ``summarize`` reads only the released subsets: counts,
an estimate ŵ of the distribution, and the metrics under ŵ (never the raw
distribution, which would leak through the report itself).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms.subset import asymptotic, bitmask, composition, estimation, metrics
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import ENUMERATION_LIMIT, Design, DesignError
from mechanisms.subset.dummy import strip_dummies
from mechanisms.subset.plan import Plan, Variable

#: composing more pairs of subsets than this is not attempted in an accuracy statement
MAX_COMPOSE_PAIRS = 1 << 22
#: EM inside a release summary stops here (the estimate analysis can run longer)
SUMMARY_EM_MAX_ITER = 5_000
SUMMARY_EM_TOL = 1e-9


def accuracy(plan: Plan) -> dict[str, Any]:
    """Design constants, expected subset sizes, privacy and standard errors (uniform prior)."""
    variables = [_variable_accuracy(v, plan) for v in plan.variables]
    return {
        "n_rows": plan.n_rows,
        "prior": "uniform over each variable's categories (metrics depend on the population;"
                 " the release's result reports them for the distribution estimated from the"
                 " released subsets)",
        "one_draw_per_record_and_column": True,
        "variables": variables,
        "statement": " ".join(_statement(v) for v in variables),
    }


def _variable_accuracy(variable: Variable, plan: Plan) -> dict[str, Any]:
    doc = variable.describe()
    p = variable.domain.p
    flat = np.full(p, 1.0 / p)
    chosen = variable.design
    aug = variable.augmentation
    if aug is None:
        sizes = chosen.expected_size()
        doc["expected_subset_size"] = (float(sizes[0]) if chosen.is_uniform
                                       else [float(s) for s in sizes])
        doc["subset_size_range"] = _size_range(chosen)
        doc["privacy_under_uniform_prior"] = metrics.privacy_report(chosen, flat).to_json()
        doc["standard_errors_under_uniform_prior"] = _standard_errors(
            {"em": lambda: asymptotic.mle_covariance(chosen, flat),
             "mom": lambda: asymptotic.mom_covariance(chosen, flat)}, plan.n_rows)
        if plan.prior_draws:
            doc["composed"] = _composed(chosen, plan.prior_draws + 1, flat)
        return doc
    alpha = float(aug.effective_alpha(plan.n_rows)) if plan.n_rows else aug.alpha
    released = plan.n_rows + 2 * aug.dummy_count(plan.n_rows)
    doc["dummy"].update(
        alpha_effective=alpha,
        dummy_records_per_category=aug.dummy_count(plan.n_rows),
        released_records=released,
    )
    doc["coverage_floor"] = alpha
    doc["subset_size_range"] = [v + 1 for v in _size_range(chosen)]
    if aug.p_augmented <= ENUMERATION_LIMIT:
        doc["privacy_under_uniform_prior"] = aug.report(flat, alpha).to_json()
    else:
        tau = aug.size_coverage(flat, alpha)
        doc["privacy_under_uniform_prior"] = {"size_coverage": tau, "size_leakage": 1.0 - tau,
                                              "min_individual_coverage": alpha}
    doc["standard_errors_under_uniform_prior"] = _standard_errors(
        {"mom": lambda: asymptotic.dummy_mom_covariance(chosen, flat, alpha)}, released)
    return doc


def _size_range(chosen: Design) -> list[int]:
    if chosen.is_uniform:
        return [2, chosen.p - 2]
    masks, _ = chosen.law()
    sizes = bitmask.popcount(masks)
    return [int(sizes.min()), int(sizes.max())]


def _standard_errors(covariances: dict[str, Any], n: int) -> dict[str, Any]:
    """√(diag Σ / n) per category for each estimator (None where n = 0 or Σ is unavailable)."""
    out: dict[str, Any] = {"n": n}
    for name, compute in covariances.items():
        try:
            cov = compute()
        except (DesignError, np.linalg.LinAlgError):
            out[name] = None
            continue
        out[name] = [float(v) for v in np.sqrt(np.diag(cov) / n)] if n > 0 else None
    return out


def _composed(chosen: Design, draws: int, w: NDArray[np.float64],
              under: str = "under_uniform_prior") -> dict[str, Any]:
    """Metrics of the intersection of ``draws`` independent draws (what a re-draw would cost),
    for the population ``w``; keys end in ``under`` (which population it is)."""
    doc: dict[str, Any] = {"draws": draws}
    if not chosen.enumerable or (1 << chosen.p) * chosen.support_size > MAX_COMPOSE_PAIRS:
        doc["note"] = "not computed: the design has too many subsets to compose exactly"
        return doc
    composed = composition.compose([chosen] * draws)
    doc[f"disclosure_probability_{under}"] = composed.disclosure_probability(w)
    doc[f"privacy_{under}"] = composed.report(w).to_json()
    doc["note"] = ("the intersection of independent draws is what an observer of all of them"
                   " learns; a singleton intersection discloses the category exactly")
    return doc


def _statement(doc: dict[str, Any]) -> str:
    privacy = doc["privacy_under_uniform_prior"]
    text = (f"{doc['name']}: every released subset contains the record's true category;"
            f" under a uniform population the size coverage is"
            f" {privacy['size_coverage']:.4g}")
    if privacy.get("mi_bits") is not None:
        text += f", the mutual information {privacy['mi_bits']:.4g} bits"
    if privacy.get("prediction_risk") is not None:
        text += f" and the best guess is right with probability {privacy['prediction_risk']:.4g}"
    if "coverage_floor" in doc:
        text += f"; every record's coverage is at least {doc['coverage_floor']:.4g}"
    ses = doc["standard_errors_under_uniform_prior"]
    best = ses.get("em") or ses.get("mom")
    if best:
        text += f"; the distribution is estimable with standard error about {max(best):.3g}"
    return text + "."


# ---------------------------------------------------------------------- summaries


def observed(variable: Variable, masks: Masks, alpha_effective: float = 0.0
             ) -> estimation.Observed:
    """Aggregate a variable's released masks (dummy bits stripped, share fixed)."""
    if variable.augmentation is None:
        return estimation.observe(masks, variable.domain.p)
    real = strip_dummies(masks, variable.domain.p)
    return estimation.observe(real, variable.domain.p, dummy_alpha=alpha_effective)


def summarize_counts(variable: Variable, distinct: Masks, counts: NDArray[np.int64],
                     plan: Plan) -> dict[str, Any]:
    """``summarize`` of a variable without dummies from its released subsets aggregated
    (``distinct`` increasing, ``counts`` positive: ``bitmask.aggregate``), which any
    engine sums exactly over partitions of the records."""
    if variable.augmentation is not None:
        raise ValueError("a variable with dummy categories is summarized from its masks")
    doc = variable.describe()
    doc["table"] = plan.table_columns(variable)
    sizes = np.bincount(bitmask.popcount(distinct), weights=counts,
                        minlength=variable.p + 1).astype(np.int64)
    inclusion = (bitmask.bits(distinct, variable.p).astype(np.int64) * counts[:, None]).sum(
        axis=0, dtype=np.int64) if distinct.size else np.zeros(variable.p, dtype=np.int64)
    doc["counts"] = {
        "records": int(counts.sum()),
        "distinct_subsets": len(distinct),
        "subset_sizes": {str(s): int(c) for s, c in enumerate(sizes) if c},
        "inclusion": [int(v) for v in inclusion],
    }
    obs = estimation.Observed(variable.domain.p, distinct, counts)
    if obs.n == 0:
        return doc
    w_hat, how = _summary_estimate(variable.design, obs)
    doc["estimate"] = {"method": how, "w": [float(v) for v in w_hat],
                       "categories": list(variable.domain.labels)}
    doc["privacy"] = privacy_under(variable, w_hat, 0.0)
    if plan.prior_draws:
        doc["privacy"]["composed"] = _composed(variable.design, plan.prior_draws + 1, w_hat,
                                               under="under_estimate")
    return doc


def summarize(variable: Variable, masks: Masks, plan: Plan,
              dummy: dict[str, Any] | None = None) -> dict[str, Any]:
    """Counts, ŵ and the privacy metrics under ŵ, from the released subsets only."""
    doc = variable.describe()
    doc["table"] = plan.table_columns(variable)
    sizes = np.bincount(bitmask.popcount(masks), minlength=variable.p + 1)
    distinct, _ = bitmask.aggregate(masks, variable.p)
    doc["counts"] = {
        "records": len(masks),
        "distinct_subsets": len(distinct),
        "subset_sizes": {str(s): int(c) for s, c in enumerate(sizes) if c},
        "inclusion": [int(v) for v in bitmask.inclusion_counts(masks, variable.p)],
    }
    alpha = 0.0
    if dummy is not None:
        doc["dummy"].update(dummy)
        alpha = float(dummy["alpha_effective"])
    obs = observed(variable, masks, alpha)
    if obs.n == 0:
        return doc
    w_hat, how = _summary_estimate(variable.design, obs)
    doc["estimate"] = {"method": how, "w": [float(v) for v in w_hat],
                       "categories": list(variable.domain.labels)}
    doc["privacy"] = privacy_under(variable, w_hat, alpha)
    if plan.prior_draws and variable.augmentation is None:
        # earlier draws of these columns exist: what an observer of all of them learns is
        # the composed design's risk, for the same estimated population (issue #17 item 8)
        doc["privacy"]["composed"] = _composed(variable.design, plan.prior_draws + 1, w_hat,
                                               under="under_estimate")
    return doc


def _summary_estimate(chosen: Design, obs: estimation.Observed
                      ) -> tuple[NDArray[np.float64], str]:
    """EM when the distinct subsets are few enough; projected MoM otherwise."""
    if chosen.p <= ENUMERATION_LIMIT:  # m ≤ 2**16 distinct subsets
        fit = estimation.em(obs, tol=SUMMARY_EM_TOL, max_iter=SUMMARY_EM_MAX_ITER)
        return fit.w, "em" if fit.converged else "em (stopped before convergence)"
    return estimation.project_simplex(estimation.mom(obs, chosen)), "mom_projected"


def privacy_under(variable: Variable, w: NDArray[np.float64], alpha: float) -> dict[str, Any]:
    """The design's privacy metrics for the population ``w`` (augmented with dummies)."""
    aug = variable.augmentation
    if aug is None:
        doc = metrics.privacy_report(variable.design, w).to_json()
    elif aug.p_augmented <= ENUMERATION_LIMIT:
        doc = aug.report(w, alpha).to_json()
    else:
        tau = aug.size_coverage(w, alpha)
        doc = {"size_coverage": tau, "size_leakage": 1.0 - tau, "min_individual_coverage": alpha}
    doc["computed_from"] = "the distribution estimated from the released subsets"
    return doc
