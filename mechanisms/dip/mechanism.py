"""The registered ``dip`` mechanism: pure ε-DP, distribution-invariant microdata.

Cost is the whole budget ε (every processed column counts, released or
not). With the default ``dp`` reference a stated share of ε buys a noisy
histogram estimate of the data's distribution (a joint histogram up to 4
columns; beyond, a Gaussian copula of per-column DP histograms and a DP
correlation matrix, ``copula.py``) and the rest runs DIP, so the whole
release is ε-DP with every row released; ``parametric`` and
``public`` references are public, so all of ε goes to DIP; ``holdout``
spends ε on the released rows and leaves the hold-out rows outside DP
(they are only never released; the guarantee says so).

The table has one column per released column in the column's own domain
(continuous float64, integer int64, categorical **category names**) plus
``_row``, the int64 index of each released record in the dataset; rows are
in dataset order. Only the hold-out reference drops rows. Values are first
clipped to the declared domain (missing values count as its lowest value,
category codes outside the list as the nearest valid code), so every output
is a valid, finite value of the column.

Categorical columns are one discrete variable on their codes (declared
order), not s − 1 dummies as in the paper (spec §3.3): the randomized PIT is
exact for any order of a finite support, so invariance is the same, and the
column keeps a whole ε/p share instead of splitting it over s − 1 dummies.

Service contract beyond ``Mechanism``:

* ``public``: after ``load_params`` the service resolves ``dataset_id`` and
  injects ``params["_reference"] = {column: 1-D array}`` keyed by this
  dataset's column names (numbers; categorical as category names or as
  codes of this dataset's categories), and may call
  ``check_public_reference`` with the public dataset's metadata first.
* ``holdout``: the service may inject ``params["_holdout"]``, a boolean mask
  of N entries with exactly m true, to persist its own split; otherwise the
  fixed nested split of ``empirical.split_holdout`` is used.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms import sampling
from mechanisms.base import (
    Budget,
    ColumnMeta,
    DatasetMeta,
    MechanismInputError,
    Output,
    RecordMechanism,
    Work,
    batch_columns,
    bounds_problem,
    read_epsilon,
)
from mechanisms.dip import families
from mechanisms.dip.accuracy import rank_correlation_at_scale
from mechanisms.dip.chain import privatize
from mechanisms.dip.continualize import Continualizer, Continuous, Lattice, Mixed
from mechanisms.dip.copula import (
    MAX_STEPS,
    QUANTUM,
    Copula,
    CorrelationStatistic,
    correlation_noise_scale,
    correlation_noise_sd,
    dp_marginals,
    noisy_copula,
)
from mechanisms.dip.empirical import Empirical, holdout_size, split_holdout
from mechanisms.dip.histogram import (
    MAX_CELLS,
    CellStatistic,
    abs_noise_bound,
    default_bins,
    histogram_edges,
    mean_abs_noise,
    noise_scale,
    noisy_histogram,
)
from mechanisms.dip.noise import (
    DEFAULT_RESOLUTION,
    MAX_RESOLUTION,
    MIN_RESOLUTION,
    NoiseStep,
)
from mechanisms.dip.params import DipParamsSchema
from mechanisms.dip.reference import Reference
from mechanisms.dip.univariate import finite
from mechanisms.exact import fmt
from mechanisms.statistics import Joint, Partial, Statistic

#: budgets above this are refused as absurd (as for the baselines)
MAX_HOLDOUT = 0.9
#: the joint-histogram model's most columns (B^p cells); more columns use the copula
MAX_DP_COLUMNS = 4
#: vectorized passes over a record's value per column in the chain (work estimate)
PASSES_PER_COLUMN = 64.0
DEFAULT_CORRELATION_SHARE = 0.5
MAX_BINS = 4096
DEFAULT_SHARE = 0.5
DEFAULT_FRACTION = 0.25
#: integer ranges wider than this cannot be continualized exactly in doubles
MAX_INTEGER_RANGE = 2**52
ROW_COLUMN = "_row"
PRIVACY_UNIT = "neighbouring datasets differ in one record replaced; n_rows public"
#: warn when the hold-out has fewer rows than this many per column (spec §7.6)
ROWS_PER_COLUMN = 5


@dataclass
class Plan:
    """Everything about a release that follows from public inputs."""

    columns: tuple[ColumnMeta, ...]
    kind: str
    epsilon: Fraction
    epsilon_ref: Fraction
    epsilon_dip: Fraction
    step: NoiseStep
    order: tuple[str, ...] | None  # None: random, drawn in run
    release: tuple[str, ...]
    continualizers: dict[str, Continualizer] = field(default_factory=dict)
    parametric: Reference | None = None
    holdout: int = 0
    bins: dict[str, int] = field(default_factory=dict)
    fraction: float = 0.0
    share: float = 0.0
    dataset_id: str = ""
    #: dp reference: "joint" (one histogram) or "copula" (marginals + correlations)
    model: str = ""
    correlation_share: float = 0.0
    epsilon_corr: Fraction = Fraction(0)

    @property
    def epsilon_marginal(self) -> Fraction:
        """The dp reference's ε for histograms (all columns together)."""
        return self.epsilon_ref - self.epsilon_corr

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def per_column(self) -> Fraction:
        return self.epsilon_dip / len(self.columns)


def _decimal(value: float) -> Fraction:
    """The fraction a decimal literal such as 0.3 means (3/10, not its binary neighbour)."""
    return Fraction(repr(float(value)))


def _finite_bounds(column: ColumnMeta) -> tuple[float, float] | None:
    if column.bounds is None:
        return None
    lo, hi = (float(b) for b in column.bounds)
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def continualizer_for(
    column: ColumnMeta, atoms: Sequence[float] | None, field_name: str = "params.columns"
) -> Continualizer:
    """The continualization of a column from its metadata (and declared atoms)."""
    if column.type == "categorical":
        if not column.categories:
            raise MechanismInputError(field_name, f"column {column.name!r} declares no categories")
        return Lattice(0, len(column.categories) - 1)
    if column.type == "integer":
        bounds = _finite_bounds(column)
        if bounds is None:
            raise MechanismInputError(
                field_name, f"integer column {column.name!r} needs finite declared bounds"
            )
        lo, hi = math.ceil(bounds[0]), math.floor(bounds[1])
        if hi < lo or max(abs(lo), abs(hi)) >= MAX_INTEGER_RANGE:
            raise MechanismInputError(
                field_name, f"declared bounds of integer column {column.name!r} are unusable"
            )
        return Lattice(lo, hi)
    if column.type == "continuous":
        raw = (-math.inf, math.inf) if column.bounds is None else column.bounds
        low = float(raw[0]) if math.isfinite(float(raw[0])) else None
        high = float(raw[1]) if math.isfinite(float(raw[1])) else None
        if low is not None and high is not None and not low < high:
            raise MechanismInputError(
                field_name, f"column {column.name!r} has an empty declared range"
            )
        if low is not None and high is not None:
            # finite but beyond float64's working range (±1e308: hi - lo overflows)
            problem = bounds_problem(low, high)
            if problem is not None:
                raise MechanismInputError(field_name, f"column {column.name!r}: {problem}")
        if atoms:
            try:
                return Mixed(sorted(set(atoms)), low, high)
            except ValueError as exc:
                raise MechanismInputError(f"params.atoms.{column.name}", str(exc)) from None
        return Continuous(low, high)
    raise MechanismInputError(
        field_name, f"column {column.name!r} is {column.type}; dip takes continuous, integer"
        " or categorical columns"
    )


@dataclass(frozen=True)
class _Model:
    """What every partition of a row-map release needs: the plan, the chain's variable
    order and the reference (public: from public inputs, or released with noise)."""

    plan: Plan
    order: tuple[str, ...]
    reference: Reference


class DipMechanism(RecordMechanism):
    """Distribution-invariant privatized microdata (Bi & Shen), pure ε-DP.

    A row map (``RecordMechanism``) for a parametric, public, joint-histogram or copula
    reference: the histogram's exact counts are the fit statistic, and the noisy
    histogram the model every partition maps its rows through; the copula's marginals
    are noised first, then its correlation sums under them are a second exact pass
    (``refit``). A hold-out (a permutation of all the rows; its model is the held-out
    sample itself) reads whole columns (``run_whole``)."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 16.0
    fixed_bytes = 16 * 2**20
    #: a row map's (``mechanisms.memory``): its table's bytes per row, and the fixed part
    map_row_bytes = 8.0
    map_fixed_bytes = 16 * 2**20

    record_level = True  # one output per record: the dataset's opt-in
    record_row_column = ROW_COLUMN

    name = "dip"
    measures = ("epsilon",)
    params_schema = DipParamsSchema
    description = (
        "Pure epsilon-DP microdata that keep the data's distribution: each record is mapped"
        " through a reference CDF, perturbed with exact discrete Laplace noise and mapped back"
        " (distribution-invariant privatization). Reference: a DP histogram of the data"
        " (default), a public parametric family, a public dataset, or a hold-out."
    )

    # ------------------------------------------------------------------ plan

    def plan(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta) -> Plan:
        """Resolve params against metadata and budget; raises MechanismInputError."""
        epsilon = read_epsilon(budget, "dip")
        if meta.n_rows < 1:
            raise MechanismInputError("params.columns", "the dataset has no rows")
        names = list(params["columns"])
        if ROW_COLUMN in names:
            raise MechanismInputError("params.columns", f"{ROW_COLUMN!r} is reserved")
        columns = tuple(meta.column(n, "params.columns") for n in names)
        order = self._order(params.get("order"), names)
        release = tuple(params.get("release") or names)
        if len(set(release)) != len(release) or not set(release) <= set(names):
            raise MechanismInputError(
                "params.release", "must list distinct columns among params.columns"
            )
        reference = dict(params.get("reference") or {"kind": "dp"})
        kind = reference["kind"]
        atoms = dict(params.get("atoms") or {})
        for name in atoms:
            if name not in names or meta.columns[name].type != "continuous":
                raise MechanismInputError(
                    f"params.atoms.{name}", "atoms are declared for continuous columns in"
                    " params.columns only"
                )
        if atoms and kind == "parametric":
            raise MechanismInputError(
                "params.atoms", "a parametric reference declares atoms with the mixture family"
            )
        resolution = params.get("resolution", DEFAULT_RESOLUTION)
        if not (
            MIN_RESOLUTION <= resolution <= MAX_RESOLUTION and resolution & (resolution - 1) == 0
        ):
            raise MechanismInputError(
                "params.resolution",
                f"must be a power of two in [{MIN_RESOLUTION}, {MAX_RESOLUTION}]",
            )
        share = reference.get("share", DEFAULT_SHARE) if kind == "dp" else 0.0
        if kind == "dp" and not 0.0 < share < 1.0:
            raise MechanismInputError("params.reference.share", "must be in (0, 1)")
        epsilon_ref = epsilon * _decimal(share) if kind == "dp" else Fraction(0)
        epsilon_dip = epsilon - epsilon_ref
        try:
            step = NoiseStep.calibrate(epsilon_dip / len(columns), resolution)
        except ValueError:
            raise MechanismInputError(
                "budget.epsilon", "epsilon too small: the noise would exceed the sampler's range"
            ) from None
        plan = Plan(columns, kind, epsilon, epsilon_ref, epsilon_dip, step, order, release,
                    share=share)
        if kind == "parametric":
            plan.parametric = families.reference(
                reference["family"], reference.get("params", {}), columns
            )
            return plan
        plan.continualizers = {
            c.name: continualizer_for(c, atoms.get(c.name)) for c in columns
        }
        if kind == "holdout":
            self._plan_holdout(plan, reference, meta)
        elif kind == "public":
            self._plan_public(plan, reference)
        else:
            self._plan_dp(plan, reference, meta)
        return plan

    @staticmethod
    def _order(raw: Any, names: list[str]) -> tuple[str, ...] | None:
        if raw == "random":
            return None
        if raw is None:
            return tuple(names)
        if sorted(raw) != sorted(names):
            raise MechanismInputError("params.order", "must be a permutation of params.columns")
        return tuple(raw)

    @staticmethod
    def _plan_holdout(plan: Plan, reference: Mapping[str, Any], meta: DatasetMeta) -> None:
        if not meta.allow_holdout:
            raise MechanismInputError(
                "params.reference.kind",
                "this dataset does not allow a hold-out reference: the held-out rows would not"
                " be protected by DP (its operator can register it with allow_holdout: true);"
                " use the dp or a public reference",
            )
        fraction = float(reference.get("fraction", DEFAULT_FRACTION))
        if not 0.0 < fraction <= MAX_HOLDOUT:
            raise MechanismInputError(
                "params.reference.fraction", f"must be in (0, {MAX_HOLDOUT}]"
            )
        m = holdout_size(meta.n_rows, fraction)
        if m < 2 or meta.n_rows - m < 1:
            raise MechanismInputError(
                "params.reference.fraction",
                "the hold-out needs at least 2 rows and must leave at least 1 to release",
            )
        plan.fraction, plan.holdout = fraction, m

    @staticmethod
    def _plan_public(plan: Plan, reference: Mapping[str, Any]) -> None:
        plan.dataset_id = str(reference["dataset_id"])
        mapping = reference.get("columns") or {}
        for name in mapping:
            if name not in plan.names:
                raise MechanismInputError(
                    f"params.reference.columns.{name}", "maps a column not in params.columns"
                )

    @staticmethod
    def _plan_dp(plan: Plan, reference: Mapping[str, Any], meta: DatasetMeta) -> None:
        p = len(plan.columns)
        model = reference.get("model") or ("joint" if p <= MAX_DP_COLUMNS else "copula")
        if model == "joint" and p > MAX_DP_COLUMNS:
            raise MechanismInputError(
                "params.reference.model", f"a joint histogram takes at most {MAX_DP_COLUMNS}"
                " columns; use the copula model"
            )
        if model == "copula" and p < 2:
            raise MechanismInputError(
                "params.reference.model", "the copula model needs at least two columns"
            )
        if "correlation_share" in reference and model != "copula":
            raise MechanismInputError(
                "params.reference.correlation_share", "only the copula model has correlations"
            )
        for c in plan.columns:
            if c.type == "continuous" and _finite_bounds(c) is None:
                raise MechanismInputError(
                    "params.columns", f"the dp reference needs finite declared bounds for"
                    f" column {c.name!r}"
                )
        plan.model = model
        conts = [plan.continualizers[n] for n in plan.names]
        if model == "copula":
            share = reference.get("correlation_share", DEFAULT_CORRELATION_SHARE)
            if not 0.0 < share < 1.0:
                raise MechanismInputError(
                    "params.reference.correlation_share", "must be in (0, 1)"
                )
            plan.correlation_share = share
            plan.epsilon_corr = plan.epsilon_ref * _decimal(share)
            if correlation_noise_scale(p, plan.epsilon_corr) > sampling.MAX_SCALE:
                raise MechanismInputError(
                    "budget.epsilon", "epsilon too small for the correlation noise"
                )
            histogram_epsilon = plan.epsilon_marginal / p
            if meta.n_rows * (QUANTUM - 1) ** 2 >= 2**53:
                raise MechanismInputError("params.reference.model", "too many rows for the"
                                          " copula's exact correlation sums")
        else:
            histogram_epsilon = plan.epsilon_ref
        if noise_scale(histogram_epsilon) > sampling.MAX_SCALE:
            raise MechanismInputError("budget.epsilon", "epsilon too small for the histogram")
        if model == "copula":
            # one column each: the mean-bound minimiser (no one-bin-per-value rule; only
            # categorical columns keep all their values, below)
            one = default_bins(meta.n_rows, histogram_epsilon, [Continuous(0.0, 1.0)])[0]
            auto = [min(one, c.max_bins() or one) for c in conts]
        else:
            auto = default_bins(meta.n_rows, histogram_epsilon, conts)
        raw = reference.get("bins")
        bins: dict[str, int] = {}
        for name, cont, default in zip(plan.names, conts, auto, strict=True):
            wanted = raw if isinstance(raw, int) else (raw or {}).get(name, default)
            limit = cont.max_bins()
            bins[name] = default if meta.columns[name].type == "categorical" else min(
                int(wanted), limit if limit is not None else int(wanted)
            )
        if isinstance(raw, dict):
            for name in raw:
                if name not in plan.names:
                    raise MechanismInputError(
                        f"params.reference.bins.{name}", "names a column not in params.columns"
                    )
        if any(b > MAX_BINS for b in bins.values()):
            raise MechanismInputError("params.reference.bins", f"at most {MAX_BINS} per column")
        sizes = [len(cont.edges(bins[n])) - 1 for n, cont in zip(plan.names, conts, strict=True)]
        cells = sum(sizes) if model == "copula" else math.prod(sizes)
        if cells > MAX_CELLS:
            raise MechanismInputError(
                "params.reference.bins", f"the joint histogram would have more than {MAX_CELLS}"
                " cells; use fewer bins"
            )
        plan.bins = bins

    # ------------------------------------------------------------------ contract

    def cost(
        self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
    ) -> dict[str, Fraction]:
        plan = self.plan(params, budget, meta)
        return {"epsilon": plan.epsilon}

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        """An upper bound on the run's work from public inputs (p, N, bins, reference).

        The chain: about ``PASSES_PER_COLUMN`` vectorized passes per record and
        column (noise, uniformization, the reference's maps), times p for the
        copula's O(p) conditional mean per column; a hold-out or public sample
        is sorted per column; the joint histogram touches its cells per column;
        the copula fit adds the n·p² correlation sums and, per pair, Owen's T
        on 25 latent nodes times the pair's threshold grid (~100 units each).
        The planning needs a budget; this reads only shapes, so it plans at ε = 1.
        """
        n = float(max(meta.n_rows, 1))
        p = len(params["columns"])
        units = n * p * PASSES_PER_COLUMN
        field = "params.columns"
        kind = (params.get("reference") or {}).get("kind", "dp")
        if kind == "public":
            units += n * p * 64.0  # a public sample of unknown size: counted as n rows
        if kind in ("holdout", "public") and p > 1:
            units += n * p * 16.0  # the box chain's lookups
        if kind == "dp":
            try:
                plan = self.plan(params, {"epsilon": Fraction(1)}, meta)
            except MechanismInputError:
                return Work(units, field)
            sizes = [len(plan.continualizers[c].edges(plan.bins[c])) - 1 for c in plan.names]
            if plan.model == "copula":
                units *= p
                steps = [min(s, MAX_STEPS) for s in sizes]
                pairs = sum(a * b for i, a in enumerate(steps) for b in steps[i + 1:])
                units += n * p * p + pairs * 25.0 * 100.0
            else:
                units += float(math.prod(sizes)) * p * 4.0
                field = "params.reference.bins"
        return Work(units, field, "use fewer columns or bins")

    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        return self._accuracy(self.plan(params, cost, meta), meta)

    def _accuracy(self, plan: Plan, meta: DatasetMeta) -> dict[str, Any]:
        p = len(plan.columns)
        b = plan.step.b
        rho = rank_correlation_at_scale(b)
        out: dict[str, Any] = {
            "reference": plan.kind,
            "epsilon": {
                "total": float(plan.epsilon),
                "reference": float(plan.epsilon_ref),
                "dip": float(plan.epsilon_dip),
                "per_column": float(plan.per_column),
            },
            "noise": "discrete_laplace",
            "resolution": plan.step.resolution,
            "laplace_scale_u": b,
            "rank_correlation": rho,
            "released_rows": meta.n_rows - plan.holdout,
            "warnings": [],
        }
        invariance = {
            "parametric": "exact: the output follows the public reference distribution for any"
            " epsilon (it matches the data only as far as the data follow it)",
            "public": "exact relative to the public sample's smoothed distribution; close to the"
            " data when the public sample comes from the same population",
            "holdout": "asymptotic as the hold-out grows (Theorem 2); released values stay inside"
            " the hold-out's range",
            "dp": "exact relative to the noisy histogram estimate, which approaches the data's"
            " distribution as n grows",
        }[plan.kind]
        out["invariance"] = invariance
        if plan.kind == "holdout":
            out["holdout_rows"] = plan.holdout
            out["holdout_ties"] = (
                "repeated values of a continuous hold-out column are jittered uniformly"
                " between the midpoints to their neighbouring distinct hold-out values"
                " (declared atoms excepted), so released values never equal them; the hold-out"
                " is not protected by DP"
            )
            if plan.holdout < ROWS_PER_COLUMN * p:
                out["warnings"].append(
                    f"hold-out of {plan.holdout} rows for {p} columns: the released rows are"
                    " effectively a resample of few hold-out rows (fewer than 5 per column)"
                )
        if plan.kind == "dp" and plan.model == "copula":
            out["copula"] = self._copula_accuracy(plan, meta)
        elif plan.kind == "dp":
            out["histogram"] = self._histogram_accuracy(plan, meta)
        out["statement"] = (
            f"Each record's {p} column(s) are perturbed with epsilon={float(plan.per_column):.4g}"
            f" each: the expected rank correlation between a record's input and output in each"
            f" column is {rho:.3f} (record-level fidelity is weak by design); distribution:"
            f" {invariance}."
        )
        return out

    @classmethod
    def _copula_accuracy(cls, plan: Plan, meta: DatasetMeta) -> dict[str, Any]:
        """Each marginal's histogram bounds (one column, ε_marg/p) and the correlation noise."""
        p = len(plan.columns)
        per = plan.epsilon_marginal / p
        marginals = {}
        for c in plan.columns:
            single = Plan((c,), plan.kind, plan.epsilon, per, plan.epsilon - per, plan.step,
                          None, (c.name,), {c.name: plan.continualizers[c.name]},
                          bins={c.name: plan.bins[c.name]})
            marginals[c.name] = cls._histogram_accuracy(single, meta)
        sd = correlation_noise_sd(p, plan.epsilon_corr, meta.n_rows)
        return {
            "model": "gaussian_copula",
            "epsilon_per_marginal": float(per),
            "epsilon_correlation": float(plan.epsilon_corr),
            "marginals": marginals,
            "correlation_noise_scale": correlation_noise_scale(p, plan.epsilon_corr),
            "spearman_noise_sd": sd,
            "correlation_noise_sd_max": math.pi / 3.0 * sd,
            "statement": (
                "marginals: each column's reference is its own noisy histogram (bounds as for a"
                " one-column dp reference at epsilon_per_marginal); dependence: a Gaussian copula"
                " whose correlations carry noise of standard deviation at most"
                " correlation_noise_sd_max each (plus sampling error ~1/sqrt(n)) and keep only"
                " pairwise monotone dependence; categorical codes enter in their declared order"
            ),
        }

    @staticmethod
    def _histogram_accuracy(plan: Plan, meta: DatasetMeta) -> dict[str, Any]:
        """What the noisy histogram does to the reference, from public inputs only.

        Projection onto {c >= 0, Σc = N} moves at most 2·max(Ση⁺, Ση⁻) <= 2Σ|η|
        of count (its shift τ has one sign), so TV(reference, exact binned
        histogram) <= Σ|η|/N: in expectation C·E|η|/N, with 95 % probability
        the Chernoff bound ``abs_noise_bound``/N. For a numeric column of range
        R with bins at most w wide the reference's mean is then within
        R·TV + w/2 of the data's mean, and its q-quantile lies between the
        data's (q − TV)- and (q + TV)-quantiles widened by w.
        """
        scale = noise_scale(plan.epsilon_ref)
        mean_abs = mean_abs_noise(scale)
        n = meta.n_rows
        cells = math.prod(
            len(plan.continualizers[name].edges(plan.bins[name])) - 1 for name in plan.names
        )
        tv = min(1.0, cells * mean_abs / n)
        tv95 = min(1.0, abs_noise_bound(scale, cells) / n)
        columns: dict[str, Any] = {}
        for c in plan.columns:
            if c.type == "categorical":
                continue
            cont = plan.continualizers[c.name]
            base = cont.base if isinstance(cont, Mixed) else cont
            edges = base.edges(plan.bins[c.name])
            width = float(np.max(np.diff(edges)))
            lo, hi = (float(edges[0]), float(edges[-1]))
            if isinstance(base, Lattice):
                lo, width = lo + 1.0, width - 1.0  # integers lo..hi; a bin holds width of them
            span = hi - lo
            columns[c.name] = {
                "bin_span": width,
                "mean_error_bound": span * tv + width / 2.0,
                "mean_error_bound_95": span * tv95 + width / 2.0,
                "quantile_level_shift_95": tv95,
                "quantile_value_slack": width,
            }
        return {
            "bins": dict(plan.bins),
            "cells": cells,
            "noise_scale": scale,
            "mean_abs_noise_per_cell": mean_abs,
            "tv_noise_approx": min(1.0, cells * mean_abs / (2.0 * n)),
            "tv_bound": tv,
            "tv_bound_95": tv95,
            "columns": columns,
            "statement": (
                "reference vs data: total variation at most tv_bound in expectation and"
                " tv_bound_95 with probability 0.95; so each numeric column's reference mean is"
                " within mean_error_bound(_95) of the data's mean, and its q-quantile lies between"
                " the data's (q - tv_bound_95)- and (q + tv_bound_95)-quantiles, widened by one"
                " bin width (quantile_value_slack). The released rows add sampling error of"
                " about the column's standard deviation / sqrt(n)."
            ),
        }

    def reference_datasets(self, params: Mapping[str, Any]) -> list[str]:
        reference = params.get("reference") or {}
        return [reference["dataset_id"]] if reference.get("kind") == "public" else []

    def check_reference(self, params: Mapping[str, Any], meta: DatasetMeta,
                        public: DatasetMeta) -> None:
        self.check_public_reference(params, meta, public)

    def bind_references(
        self, params: Mapping[str, Any],
        references: Mapping[str, tuple[DatasetMeta, Mapping[str, np.ndarray]]],
    ) -> dict[str, Any]:
        """Attach the public sample as ``_reference``: this dataset's column names, and
        categorical values as the public dataset's category names."""
        ids = self.reference_datasets(params)
        if not ids:
            return dict(params)
        public_meta, columns = references[ids[0]]
        mapping = (params.get("reference") or {}).get("columns") or {}
        sample: dict[str, np.ndarray] = {}
        for name in params["columns"]:
            theirs = public_meta.columns[mapping.get(name, name)]
            values = np.asarray(columns[theirs.name])
            if theirs.type == "categorical":
                values = np.asarray(theirs.categories or (), dtype=object)[values]
            sample[name] = values
        return {**params, "_reference": sample}

    def check_public_reference(
        self, params: Mapping[str, Any], meta: DatasetMeta, public: DatasetMeta
    ) -> None:
        """For the service: the public dataset has compatible columns for every processed one."""
        reference = params.get("reference") or {}
        mapping = reference.get("columns") or {}
        for name in params["columns"]:
            mine = meta.column(name, "params.columns")
            theirs_name = mapping.get(name, name)
            theirs = public.columns.get(theirs_name)
            field_name = f"params.reference.columns.{name}"
            if theirs is None:
                raise MechanismInputError(
                    field_name, f"the public dataset has no column {theirs_name!r}"
                )
            numeric = {"continuous", "integer"}
            ok = (mine.type == theirs.type) or (
                mine.type == "continuous" and theirs.type in numeric
            )
            if mine.type == "categorical" and ok:
                ok = set(theirs.categories or ()) <= set(mine.categories or ())
            if not ok:
                raise MechanismInputError(
                    field_name, f"public column {theirs_name!r} ({theirs.type}) does not fit"
                    f" column {name!r} ({mine.type})"
                )

    # ------------------------------------------------------------------ row map

    def mappable(self, params: Mapping[str, Any], meta: DatasetMeta) -> bool:
        """Every reference but the hold-out: its split is a permutation of all the rows
        and its model is the held-out sample itself."""
        return bool((params.get("reference") or {}).get("kind", "dp") != "holdout")

    def fit_statistic(self, params: Mapping[str, Any], cost: Budget,
                      meta: DatasetMeta) -> Statistic | None:
        """The joint histogram's exact counts, or the copula's per-column counts."""
        plan = self.plan(params, cost, meta)
        if plan.kind != "dp":
            return None
        edges = histogram_edges(plan.continualizers, plan.bins)
        if plan.model == "copula":
            return Joint(tuple(CellStatistic({c: cont}, {c: edges[c]})
                               for c, cont in plan.continualizers.items()))
        return CellStatistic(plan.continualizers, edges)

    def refit_statistic(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                        model: Any) -> Statistic | None:
        """The copula's correlation sums under its released marginals (``fit`` leaves
        the independent copula of them)."""
        fitted: _Model = model
        if fitted.plan.kind != "dp" or fitted.plan.model != "copula":
            return None
        assert isinstance(fitted.reference, Copula)
        return CorrelationStatistic(fitted.reference)

    def refit(self, params: Mapping[str, Any], model: Any, partial: Partial, cost: Budget,
              meta: DatasetMeta, rng: np.random.Generator) -> _Model:
        """The copula with its noised correlations, drawn after the marginals' noise (as
        ``dp_copula`` draws them)."""
        fitted: _Model = model
        assert isinstance(fitted.reference, Copula)
        if partial.rows != meta.n_rows:
            raise ValueError(f"column {fitted.plan.names[0]!r} does not have n_rows entries")
        sums = CorrelationStatistic(fitted.reference).sums(partial)
        reference = noisy_copula(fitted.reference.marginals, sums, meta.n_rows,
                                 fitted.plan.epsilon_corr, rng)
        return dataclasses.replace(fitted, reference=reference)

    def fit(self, params: Mapping[str, Any], partial: Partial | None, cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> _Model:
        """The draws a release makes before its chain, in its order: the variable order
        (if random), then the reference's noise (the copula's marginals: ``refit`` then
        draws its correlations' noise, as ``dp_copula`` does)."""
        plan = self.plan(params, cost, meta)
        names = plan.names
        order = plan.order if plan.order is not None else tuple(
            names[i] for i in rng.permutation(len(names))
        )
        reference: Reference
        if plan.kind == "parametric":
            assert plan.parametric is not None
            reference = plan.parametric
        elif plan.kind == "public":
            reference = Empirical(self._public_sample(params, plan, meta),
                                  plan.continualizers, rng)
        else:
            assert partial is not None
            if partial.rows != meta.n_rows:
                raise ValueError(f"column {names[0]!r} does not have n_rows entries")
            edges = histogram_edges(plan.continualizers, plan.bins)
            if plan.model == "copula":  # the marginals; ``refit`` adds the correlations
                counts = {c: CellStatistic({c: cont}, {c: edges[c]}).counts(
                    Joint.member(partial, i)) for i, (c, cont) in
                    enumerate(plan.continualizers.items())}
                marginals = dp_marginals(counts, plan.continualizers, plan.bins,
                                         plan.epsilon_marginal, rng)
                reference = Copula(marginals, np.eye(len(marginals)))
            else:
                counts_joint = CellStatistic(plan.continualizers, edges).counts(partial)
                reference = noisy_histogram(counts_joint, plan.continualizers, edges,
                                            plan.epsilon_ref, rng)
        return _Model(plan, tuple(order), reference)

    def privatize(self, rows: Mapping[str, np.ndarray], start: int,
                  params: Mapping[str, Any], cost: Budget, meta: DatasetMeta, model: Any,
                  rng: np.random.Generator) -> dict[str, np.ndarray]:
        fitted: _Model = model
        plan = fitted.plan
        columns = batch_columns(rows, plan.names)
        m = len(columns[plan.names[0]])
        released = privatize(columns, fitted.reference, plan.epsilon_dip, rng,
                             order=fitted.order, resolution=plan.step.resolution)
        table: dict[str, np.ndarray] = {
            ROW_COLUMN: np.arange(start, start + m, dtype=np.int64)}
        for name in plan.release:
            table[name] = self._output_column(meta.columns[name], released[name])
        return table

    def describe(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 model: Any, released: Partial | None) -> Output:
        fitted: _Model = model
        return Output(
            result=self._result(fitted.plan, fitted.order, meta.n_rows, meta.n_rows),
            accuracy=self._accuracy(fitted.plan, meta),
            guarantee=self._guarantee(fitted.plan),
            row_column=ROW_COLUMN,
        )

    # ------------------------------------------------------------------ whole columns

    def run_whole(
        self,
        data: Mapping[str, np.ndarray],
        params: Mapping[str, Any],
        cost: Budget,
        meta: DatasetMeta,
        rng: np.random.Generator,
    ) -> Output:
        plan = self.plan(params, cost, meta)
        names = plan.names
        n_rows = meta.n_rows
        columns = {}
        for name in names:
            x = np.asarray(data[name])
            if x.ndim != 1 or x.shape[0] != n_rows:
                raise ValueError(f"column {name!r} does not have n_rows entries")
            columns[name] = x
        order = plan.order if plan.order is not None else tuple(
            names[i] for i in rng.permutation(len(names))
        )
        # every other reference is a row map (``mappable``): only the hold-out runs here
        assert plan.kind == "holdout"
        held = self._holdout_mask(params, plan, n_rows)
        sample = {n: columns[n][held] for n in names}
        private = {n: columns[n][~held] for n in names}
        rows = np.arange(n_rows, dtype=np.int64)[~held]
        reference = Empirical(sample, plan.continualizers, rng)
        released = privatize(
            private, reference, plan.epsilon_dip, rng, order=order,
            resolution=plan.step.resolution,
        )
        table: dict[str, np.ndarray] = {ROW_COLUMN: rows}
        for name in plan.release:
            table[name] = self._output_column(meta.columns[name], released[name])
        return Output(
            result=self._result(plan, order, rows.size, n_rows),
            accuracy=self._accuracy(plan, meta),
            guarantee=self._guarantee(plan),
            table=table,
            row_column=ROW_COLUMN,
        )

    @staticmethod
    def _holdout_mask(params: Mapping[str, Any], plan: Plan, n_rows: int) -> NDArray[np.bool_]:
        injected = params.get("_holdout")
        if injected is None:
            return split_holdout(n_rows, plan.fraction)
        mask = np.asarray(injected)
        if mask.dtype != np.bool_ or mask.shape != (n_rows,) or int(mask.sum()) != plan.holdout:
            raise ValueError("_holdout must be a boolean mask of n_rows entries with m true")
        return mask

    @staticmethod
    def _public_sample(
        params: Mapping[str, Any], plan: Plan, meta: DatasetMeta
    ) -> dict[str, NDArray[np.generic]]:
        injected = params.get("_reference")
        if not isinstance(injected, Mapping):
            raise MechanismInputError(
                "params.reference", "the public reference sample was not provided"
            )
        sample: dict[str, NDArray[np.generic]] = {}
        keep: NDArray[np.bool_] | None = None
        for name in plan.names:
            if name not in injected:
                raise MechanismInputError(
                    f"params.reference.columns.{name}", "missing from the public reference"
                )
            x = np.asarray(injected[name])
            if x.ndim != 1:
                raise MechanismInputError(
                    f"params.reference.columns.{name}", "public column must be 1-D"
                )
            column = meta.columns[name]
            if column.type == "categorical":
                categories = list(column.categories or ())
                if x.dtype.kind in "USO":
                    index = {c: i for i, c in enumerate(categories)}
                    names, inverse = np.unique(x.astype(str), return_inverse=True)
                    lookup = np.array([index.get(str(v), -1) for v in names], dtype=np.int64)
                    codes = lookup[inverse.reshape(-1)]
                else:
                    codes = np.where(np.isnan(x.astype(np.float64)), -1,
                                     x.astype(np.float64)).astype(np.int64)
                valid = (codes >= 0) & (codes < len(categories))
                sample[name] = codes
            else:
                values = x.astype(np.float64)
                valid = np.isfinite(values)
                sample[name] = values
            if keep is not None and valid.shape != keep.shape:
                raise MechanismInputError(
                    "params.reference", "public reference columns differ in length"
                )
            keep = valid if keep is None else keep & valid
        assert keep is not None
        if int(keep.sum()) < 2:
            raise MechanismInputError(
                "params.reference", "the public reference has fewer than 2 usable rows"
            )
        return {n: v[keep] for n, v in sample.items()}

    @staticmethod
    def _output_column(column: ColumnMeta, values: NDArray[np.generic]) -> np.ndarray:
        if column.type == "categorical":
            names = np.asarray(column.categories or (), dtype=str)
            return names[np.clip(np.asarray(values, dtype=np.int64), 0, names.size - 1)]
        if column.type == "integer":
            return np.asarray(values, dtype=np.int64)
        out = np.asarray(values, dtype=np.float64)
        return out if np.isfinite(out).all() else finite(out)  # quantiles are always finite

    def _result(self, plan: Plan, order: Sequence[str], released: int, total: int
                ) -> dict[str, Any]:
        reference: dict[str, Any] = {"kind": plan.kind}
        if plan.kind == "holdout":
            reference.update(fraction=plan.fraction, holdout_rows=plan.holdout)
        elif plan.kind == "dp":
            reference.update(share=plan.share, bins=dict(plan.bins), model=plan.model)
            if plan.model == "copula":
                reference.update(correlation_share=plan.correlation_share)
        elif plan.kind == "public":
            reference.update(dataset_id=plan.dataset_id)
        return {
            "n_rows": released,
            "n_input_rows": total,
            "columns": list(plan.names),
            "released_columns": list(plan.release),
            "order": list(order),
            "reference": reference,
            "epsilon": {
                "total": float(plan.epsilon),
                "reference": float(plan.epsilon_ref),
                "dip": float(plan.epsilon_dip),
                "per_column": float(plan.per_column),
            },
            "row_column": ROW_COLUMN,
            "categorical_output": "category names",
        }

    @staticmethod
    def _guarantee(plan: Plan) -> str:
        p = len(plan.columns)
        core = (
            f"pure epsilon-DP (DIP, epsilon={fmt(plan.epsilon)} nats"
        )
        split = (
            f"; epsilon={fmt(plan.per_column)} per column over {p} column(s), exact discrete"
            " Laplace noise"
        )
        if plan.kind == "dp" and plan.model == "copula":
            return (
                f"{core}: {fmt(plan.epsilon_ref)} for a Gaussian-copula estimate of the"
                f" distribution ({fmt(plan.epsilon_marginal / p)} for each of {p} marginal"
                f" histograms and {fmt(plan.epsilon_corr)} for the correlation matrix) and"
                f" {fmt(plan.epsilon_dip)} for DIP{split}), {PRIVACY_UNIT}; every row is"
                " released and protected by DP"
            )
        if plan.kind == "dp":
            return (
                f"{core}: {fmt(plan.epsilon_ref)} for a noisy-histogram estimate of the"
                f" distribution and {fmt(plan.epsilon_dip)} for DIP{split}), {PRIVACY_UNIT};"
                " every row is released and protected by DP"
            )
        if plan.kind == "parametric":
            return (
                f"{core}{split}, public parametric reference), {PRIVACY_UNIT}; every row is"
                " released and protected by DP"
            )
        if plan.kind == "public":
            return (
                f"{core}{split}, reference from public dataset {plan.dataset_id!r}, not"
                f" charged), {PRIVACY_UNIT}; every row is released and protected by DP"
            )
        return (
            f"{core}{split}) for the released rows only, conditional on the hold-out,"
            f" {PRIVACY_UNIT}. CAVEAT: the {plan.holdout} hold-out rows are NOT protected by"
            " differential privacy; they are protected only by not being released. They define"
            " the reference distribution: released values never leave the hold-out's range,"
            " and released rows can closely reproduce hold-out rows. Repeated values of a"
            " continuous hold-out column are jittered within the gap to their neighbouring"
            " hold-out values (fresh per release) so that no released value equals one; the"
            " operator's dataset view counts the rows that have served as hold-out."
        )
