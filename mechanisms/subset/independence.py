"""Testing X ⊥ Y from paired subsets under a product design (§4).

Under a product design X ⊥ Y ⇔ A ⊥ B. Four statistics:

* ``pearson`` — Σ (n_ab − e_ab)²/e_ab over all s·r supported cells with
  e_ab = n μ_a L̂_X(a) μ_b L̂_Y(b) from the marginal MLEs. Since Σ e_ab = n
  it equals Σ_observed n_ab²/e_ab − n, so empty cells need no listing. The
  paper's χ²_{sr} reference ignores the (p−1)+(q−1) fitted parameters and
  the multinomial constraint; the default ``df_mode="model"`` uses
  sr − p − q + 1.
* ``lrt_mle`` — 2 Σ n_ab ln(1_aᵀŴ1_b / 1_aᵀŵ_X ŵ_Yᵀ1_b) with the joint and
  marginal MLEs (EM), χ²_{(p−1)(q−1)}.
* ``lrt_mom`` — the same with moment estimates (Ŵ clipped at 1e-6 and
  renormalized, marginals projected onto the simplex and floored the same
  way): the paper's pick.
  Plug-ins that are not MLEs can make it negative (kept: permutation
  calibration handles any statistic; the χ² p-value is then 1).
* ``bonferroni`` — Pearson (no Yates correction) on each of the pq 2×2
  tables of (x ∈ A, y ∈ B); p-value min(1, pq·min p_xy).

Permutation calibration permutes the A's against fixed B's. The induced
table has the Fisher–Freeman–Halton law given its margins, which
``scipy.stats.random_table`` samples directly (no O(n) shuffle per draw);
the margins — hence the marginal fits — are the same for every permutation.
p = (1 + #{T_b ≥ T_obs})/(B + 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from mechanisms.subset import estimation, joint
from mechanisms.subset.design import Design, DesignError
from mechanisms.subset.joint import Paired

TestMethod = Literal["pearson", "lrt_mle", "lrt_mom", "bonferroni"]
TEST_METHODS: tuple[TestMethod, ...] = ("pearson", "lrt_mle", "lrt_mom", "bonferroni")
Calibration = Literal["asymptotic", "permutation"]
#: permuted tables are processed in blocks of at most this many cells in total
PERMUTATION_BLOCK = 1 << 21
#: refuse permutation LRT:MLE beyond this many cell-updates (tables × cells × p × q)
MAX_PERMUTATION_WORK = 5e8
#: refuse permutation calibration when the table of distinct pairs has more cells
MAX_PERMUTATION_CELLS = 1 << 22
#: relative slack when counting permuted statistics ≥ the observed one (float ties)
TIE_SLACK = 1e-9


@dataclass(frozen=True)
class TestResult:
    """One test's outcome (JSON via ``to_json``)."""

    method: str
    statistic: float
    df: int | None
    p_value: float
    reject: bool
    alpha: float
    calibration: str
    n: int
    n_perm: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        statistic = self.statistic if np.isfinite(self.statistic) else None
        return {
            "method": self.method, "statistic": statistic, "df": self.df,
            "p_value": self.p_value, "reject": self.reject, "alpha": self.alpha,
            "calibration": self.calibration, "n": self.n, "n_perm": self.n_perm,
            **self.details, "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class _Null:
    """Everything the statistics need that permutations leave unchanged."""

    paired: Paired
    design_a: Design | None
    design_b: Design | None
    lik_a_mle: NDArray[np.float64]  # 1_aᵀŵ_X over the distinct a (marginal MLE)
    lik_b_mle: NDArray[np.float64]
    lik_a_mom: NDArray[np.float64] | None
    lik_b_mom: NDArray[np.float64] | None
    em_tol: float
    em_max_iter: int


def _null(paired: Paired, design_a: Design | None, design_b: Design | None,
          methods: Sequence[str], em_tol: float, em_max_iter: int) -> _Null:
    obs_a, obs_b = paired.observed_a(), paired.observed_b()
    w_x = estimation.em(obs_a, tol=em_tol, max_iter=em_max_iter).w
    w_y = estimation.em(obs_b, tol=em_tol, max_iter=em_max_iter).w
    lik_a_mom = lik_b_mom = None
    if "lrt_mom" in methods:
        assert design_a is not None and design_b is not None
        lik_a_mom = paired.rows_a @ _mom_marginal(obs_a, design_a)
        lik_b_mom = paired.rows_b @ _mom_marginal(obs_b, design_b)
    return _Null(paired, design_a, design_b, paired.rows_a @ w_x, paired.rows_b @ w_y,
                 lik_a_mom, lik_b_mom, em_tol, em_max_iter)


def _mom_marginal(obs: estimation.Observed, design: Design) -> NDArray[np.float64]:
    """Projected MoM floored like the joint plug-in, so no observed subset gets mass 0."""
    w = np.maximum(estimation.project_simplex(estimation.mom(obs, design)), joint.MOM_FLOOR)
    result: NDArray[np.float64] = w / w.sum()
    return result


def _statistics(method: str, null: _Null, ia: NDArray[np.intp], ib: NDArray[np.intp],
                counts: NDArray[Any]) -> NDArray[np.float64]:
    """The statistic for B tables given as counts (B × K) over the cells (ia, ib)."""
    c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    paired = null.paired
    n = float(paired.n)
    if method == "pearson":
        assert null.design_a is not None and null.design_b is not None
        prob_a = null.design_a.mu_of(paired.masks_a) * null.lik_a_mle
        prob_b = null.design_b.mu_of(paired.masks_b) * null.lik_b_mle
        expected = n * prob_a[ia] * prob_b[ib]
        impossible = np.any((c > 0) & (expected <= 0)[None, :], axis=1)
        ratio = np.divide(c**2, expected[None, :], out=np.zeros_like(c), where=c > 0)
        return np.where(impossible, np.inf, ratio.sum(axis=1) - n)
    if method == "bonferroni":
        rows_a, rows_b = paired.rows_a[ia], paired.rows_b[ib]
        n11 = np.matmul(rows_a.T[None], c[:, :, None] * rows_b[None])  # B × p × q
        r1 = (paired.margin_a @ paired.rows_a)[None, :, None]
        c1 = (paired.margin_b @ paired.rows_b)[None, None, :]
        denominator = r1 * (n - r1) * c1 * (n - c1)
        numerator = n * (n11 * (n - r1 - c1 + n11) - (r1 - n11) * (c1 - n11)) ** 2
        chi = np.divide(numerator, denominator, out=np.zeros_like(n11), where=denominator > 0)
        result: NDArray[np.float64] = chi.reshape(len(c), -1).max(axis=1)
        return result
    rows_a, rows_b = paired.rows_a[ia], paired.rows_b[ib]
    if method == "lrt_mle":
        w = joint.em_joint(rows_a, rows_b, c, tol=null.em_tol, max_iter=null.em_max_iter)[0]
        lik_a, lik_b = null.lik_a_mle, null.lik_b_mle
    elif method == "lrt_mom":
        assert null.design_a is not None and null.design_b is not None
        assert null.lik_a_mom is not None and null.lik_b_mom is not None
        w = joint.clip_joint(joint.mom_joint(rows_a, rows_b, c, null.design_a, null.design_b))
        lik_a, lik_b = null.lik_a_mom, null.lik_b_mom
    else:
        raise ValueError(f"unknown test {method!r}")
    lik_joint = joint.joint_likelihoods(rows_a, rows_b, w)
    lik_null = (lik_a[ia] * lik_b[ib])[None, :]
    terms = np.divide(lik_joint, lik_null, out=np.ones_like(lik_joint),
                      where=(c > 0) & (lik_null > 0))
    stat: NDArray[np.float64] = 2.0 * (c * np.log(terms)).sum(axis=1)
    if method == "lrt_mle":  # an unfinished EM can dip just below the null fit
        stat = np.maximum(stat, 0.0)
    return stat


def _df(method: str, paired: Paired, design_a: Design | None, design_b: Design | None,
        df_mode: str) -> int:
    p, q = paired.p, paired.q
    if method == "bonferroni":
        return 1
    if method == "pearson":
        assert design_a is not None and design_b is not None
        cells = design_a.support_size * design_b.support_size
        return cells if df_mode == "paper" else cells - p - q + 1
    return (p - 1) * (q - 1)


def _p_value(method: str, statistic: float, df: int, paired: Paired) -> float:
    if method == "bonferroni":
        return float(min(1.0, paired.p * paired.q * stats.chi2.sf(statistic, 1)))
    return float(stats.chi2.sf(statistic, df))


def independence_tests(
    a: ArrayLike | Paired,
    b: ArrayLike | None = None,
    design_a: Design | None = None,
    design_b: Design | None = None,
    methods: Sequence[str] = ("lrt_mom",),
    *,
    alpha: float = 0.05,
    calibration: Calibration = "asymptotic",
    n_perm: int = 999,
    df_mode: Literal["model", "paper"] = "model",
    rng: np.random.Generator | None = None,
    em_tol: float = joint.JOINT_TOL,
    em_max_iter: int = joint.JOINT_MAX_ITER,
) -> dict[str, TestResult]:
    """Run the named tests on paired releases ``a``, ``b`` (masks of the same rows).

    ``pearson`` and ``lrt_mom`` need both designs; ``lrt_mle`` and
    ``bonferroni`` need none (the μ factors cancel). Permutation
    calibration needs ``rng`` (the caller's generator; never a global one).
    """
    unknown = sorted(set(methods) - set(TEST_METHODS))
    if unknown or not methods:
        raise ValueError(f"methods must be among {', '.join(TEST_METHODS)}")
    if any(m in ("pearson", "lrt_mom") for m in methods) and (design_a is None
                                                              or design_b is None):
        raise ValueError("pearson and lrt_mom need both designs")
    if isinstance(a, Paired):
        paired = a
    else:
        if design_a is None or design_b is None or b is None:
            raise ValueError("give the paired masks and both designs (or a Paired table)")
        paired = joint.pair(a, b, design_a.p, design_b.p)
    if paired.n == 0:
        raise ValueError("no records to test")
    if calibration == "permutation" and rng is None:
        raise ValueError("permutation calibration needs a random generator")
    null = _null(paired, design_a, design_b, methods, em_tol, em_max_iter)
    observed = {m: float(_statistics(m, null, paired.cell_a, paired.cell_b,
                                      paired.cell_n)[0]) for m in methods}
    permuted: dict[str, NDArray[np.float64]] = {}
    if calibration == "permutation":
        assert rng is not None
        permuted = _permutation_statistics(null, methods, n_perm, rng)
    results: dict[str, TestResult] = {}
    for method in methods:
        stat = observed[method]
        df = _df(method, paired, design_a, design_b, df_mode)
        warnings = _warnings(method, paired, design_a, design_b)
        details: dict[str, Any] = {}
        if method == "pearson":
            details["df_mode"] = df_mode
        if method == "bonferroni":
            details["min_cell_p_value"] = float(stats.chi2.sf(stat, 1))
        if calibration == "permutation":
            exceed = int(np.count_nonzero(permuted[method] >= stat - TIE_SLACK * abs(stat)))
            p_value = (1 + exceed) / (n_perm + 1)
            details["asymptotic_p_value"] = _p_value(method, stat, df, paired)
        else:
            p_value = _p_value(method, stat, df, paired)
        results[method] = TestResult(method, stat, df, p_value, p_value < alpha, alpha,
                                     calibration, paired.n,
                                     n_perm if calibration == "permutation" else None,
                                     details, warnings)
    return results


def _permutation_statistics(null: _Null, methods: Sequence[str], n_perm: int,
                            rng: np.random.Generator) -> dict[str, NDArray[np.float64]]:
    """Statistics of ``n_perm`` tables with the observed margins (A's permuted)."""
    paired = null.paired
    k = len(paired.masks_a) * len(paired.masks_b)
    if k > MAX_PERMUTATION_CELLS:
        raise DesignError("calibration", "too many distinct subset pairs to calibrate by"
                                         " permutation; use asymptotic calibration")
    ia, ib = paired.all_cells()
    if "lrt_mle" in methods and n_perm * k * paired.p * paired.q > MAX_PERMUTATION_WORK:
        raise DesignError("calibration", "too many cells to calibrate lrt_mle by permutation;"
                                         " use lrt_mom or asymptotic calibration")
    sampler = stats.random_table(paired.margin_a, paired.margin_b)
    block = max(1, PERMUTATION_BLOCK // max(k, 1))
    out: dict[str, list[NDArray[np.float64]]] = {m: [] for m in methods}
    for start in range(0, n_perm, block):
        size = min(block, n_perm - start)
        tables = sampler.rvs(size=size, random_state=rng).reshape(size, k)
        for method in methods:
            out[method].append(_statistics(method, null, ia, ib, tables))
    return {m: np.concatenate(v) for m, v in out.items()}


def _warnings(method: str, paired: Paired, design_a: Design | None,
              design_b: Design | None) -> list[str]:
    if method != "pearson":
        return []
    assert design_a is not None and design_b is not None
    cells = design_a.support_size * design_b.support_size
    if len(paired.cell_n) < cells or int(paired.cell_n.min()) < 5:
        return ["some of the s*r cells have fewer than 5 records: the chi-square"
                " approximation is poor (use permutation calibration)"]
    return []


def auc(p_null: ArrayLike, p_alternative: ArrayLike) -> float:
    """ROC-AUC of p-values as scores: P(p_dep < p_indep) + ½ P(tie) (rank formula)."""
    x, y = np.asarray(p_null, float), np.asarray(p_alternative, float)
    u = stats.mannwhitneyu(x, y, alternative="two-sided").statistic
    return float(u / (len(x) * len(y)))
