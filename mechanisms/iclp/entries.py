"""Registry entries: ``iclp.mean``, ``iclp.ar``, ``iclp.kde`` and the baselines ``frl.mean``,
``frl.kde``, ``bernstein.kde``, ``bernstein.mean`` and ``gp.adp`` ((ε, δ), charged in both).

Each entry maps validated params + public metadata + ε to a plan of the
library (``mean``, ``kde``, ``bernstein``); cost and accuracy come from the
plan alone. Cost equals the budget: the noise is calibrated to it. A plan whose data
pass is exact sums (``sums``: mean, kde, kde2d, cov, fos, erm) is a
``StreamingFunction``: its statistic streams over batches of rows and ``release`` adds
the noise to the merged partial's coefficients; the others (ar's soft thresholds, gp,
bernstein) are ``FunctionMechanism``s whose ``run`` is the plan's release on the columns.
"""

from __future__ import annotations

import abc
import contextlib
import math
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any, ClassVar, Protocol

import numpy as np

from mechanisms.base import (
    Budget,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
    StreamingMechanism,
    check_numeric_column,
    read_budget,
    read_epsilon,
)
from mechanisms.exact import fmt
from mechanisms.iclp import ar, bernstein, domain, gp, kde, mean, noise, params, pss, sums
from mechanisms.iclp.kernels import Family, Kernel
from mechanisms.iclp.release import FunctionRelease, jsonable
from mechanisms.registry import register
from mechanisms.statistics import Partial, Statistic

#: budgets above this are refused as absurd (as for the DP baselines)
PRIVACY_UNIT = "replace-one neighbours, n public"
MEAN_RHO = 0.1
MATERN_NU = 1.5

#: a plan whose numbers leave float64's range (a huge declared bound at a small ε)
OVERFLOW = ("epsilon too small for the column's declared bounds: the noise or its stated"
            " error would exceed the floating-point range")


class _Plan(Protocol):
    def release(self, values: Any, rng: np.random.Generator) -> FunctionRelease: ...
    def accuracy(self) -> dict[str, Any]: ...


class Priced(Mechanism):
    """Pure ε-DP function release: cost and accuracy from the plan; subclasses build it."""

    measures: ClassVar[tuple[str, ...]] = ("epsilon",)
    #: what the guarantee string calls the mechanism
    label: ClassVar[str]

    def cost(
        self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
    ) -> dict[str, Fraction]:
        epsilon = read_epsilon(budget, self.name)
        self._calibrated(params, epsilon, meta)
        return {"epsilon": epsilon}

    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        plan = self._calibrated(params, read_epsilon(cost, self.name), meta)
        try:
            out: dict[str, Any] = jsonable(plan.accuracy())
        except OverflowError:
            raise MechanismInputError("budget.epsilon", OVERFLOW) from None
        return out

    def columns(self, params: Mapping[str, Any]) -> list[str]:
        """The columns the plan reads, in the order its release takes them."""
        return [params["column"]]

    def output(self, plan: Any, released: Any, epsilon: Fraction) -> Output:
        """The release's output: the plan's result, accuracy and the guarantee."""
        result = released.to_result() if isinstance(released, FunctionRelease) else jsonable(
            released)
        return Output(
            result=result,
            accuracy=jsonable(plan.accuracy()),
            guarantee=(
                f"pure epsilon-DP ({self.label}, epsilon={fmt(epsilon)} nats), {PRIVACY_UNIT}"
            ),
        )

    def _calibrated(
        self, params: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta
    ) -> _Plan:
        if meta.n_rows < 1:
            raise MechanismInputError("params.column", "the dataset has no rows")
        try:
            return self._plan(params, epsilon, meta)
        except noise.CalibrationError as exc:
            raise MechanismInputError("budget.epsilon", str(exc)) from None
        except OverflowError:  # public inputs only: bounds so large the floats overflow
            raise MechanismInputError("budget.epsilon", OVERFLOW) from None
        except ValueError as exc:  # library checks of public params (messages hold no data)
            if isinstance(exc, MechanismInputError):
                raise
            raise MechanismInputError("params", str(exc)) from None

    @abc.abstractmethod
    def _plan(self, params: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        """Resolve params against the metadata and calibrate to ε (public inputs only)."""


class FunctionMechanism(Priced):
    """A function release whose plan reads whole columns (``run``)."""

    #: measured memory (``mechanisms.memory``): bytes per row beyond the loaded columns
    row_bytes = 72.0
    fixed_bytes = 4 * 2**20

    def run(
        self,
        data: Mapping[str, np.ndarray],
        params: Mapping[str, Any],
        cost: Budget,
        meta: DatasetMeta,
        rng: np.random.Generator,
    ) -> Output:
        epsilon = read_epsilon(cost, self.name)
        plan = self._calibrated(params, epsilon, meta)
        return self.output(plan, plan.release(data[params["column"]], rng), epsilon)


class StreamingFunction(Priced, StreamingMechanism):
    """A function release whose data pass is its plan's exact sums (``sums.PlanPass``):
    streamed over batches of rows, the noise added to the coefficients of the merged
    partial (``publish``), the same output as the plan's release on whole columns."""

    #: measured memory (``mechanisms.memory``, ``tests/memory_probe.py``): per row of the
    #: held row group and per named cell (the batch read, the clipped curves), and the
    #: plans' calibrations with ``statistics.column_sums``' two chunks (1 MiB)
    row_bytes = 16.0
    cell_bytes = 48.0
    fixed_bytes = 4 * 2**20

    def statistic(self, params: Mapping[str, Any], cost: Budget,
                  meta: DatasetMeta) -> Statistic:
        plan: Any = self._calibrated(params, read_epsilon(cost, self.name), meta)
        return sums.PlanPass(plan, tuple(self.columns(params)))

    def release(self, params: Mapping[str, Any], partial: Partial, cost: Budget,
                meta: DatasetMeta, rng: np.random.Generator,
                statistic: Statistic | None = None) -> Output:
        epsilon = read_epsilon(cost, self.name)
        plan: Any = (statistic.plan if isinstance(statistic, sums.PlanPass)
                     else self._calibrated(params, epsilon, meta))
        return self.output(plan, plan.publish(plan.coefficients(partial), rng), epsilon)


class IclpMean(StreamingFunction):
    name = "iclp.mean"
    label = "ICLP-QR mean"
    params_schema = params.IclpMeanSchema
    description = (
        "Pure epsilon-DP mean function of a functional column: ridge-smoothed (ICLP-QR)"
        " mean with Independent Component Laplace Process noise on the kernel's eigenbasis."
    )

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        grid, tau = _functional_column(meta, p["column"], self.name)
        spec = p.get("kernel", {})
        base = _noise_kernel(spec)
        kernel: Kernel | tuple[Kernel, ...] = base
        if _auto(spec.get("rho")) is None:  # ρ left open: the tuning picks it
            kernel = tuple(Kernel(base.family, rho, base.nu) for rho in pss.RHO_CANDIDATES)
        smoothing = p.get("smoothing", {})
        eta = _auto(smoothing.get("eta"))
        if eta is not None and eta <= 0.5:
            raise MechanismInputError("params.smoothing.eta", "eta must be > 1/2 for the mean")
        raw_psi = smoothing.get("psi", "auto")
        psi: float | mean.PsiRule = (
            "free" if raw_psi == "free" else "balanced" if raw_psi == "balanced"
            else "auto" if isinstance(raw_psi, str) else float(raw_psi)
        )
        return mean.plan_iclp_mean(
            grid, tau, meta.n_rows, epsilon, kernel, eta, psi, p.get("max_components"),
            noise_profile=smoothing.get("noise_profile", "auto"),
            frl_guard=smoothing.get("frl_guard", True),
        )


@contextlib.contextmanager
def _components_refused() -> Iterator[None]:
    """An FRL plan's ValueError names ``params.components`` (a calibration error stays)."""
    try:
        yield
    except ValueError as exc:
        if isinstance(exc, noise.CalibrationError):
            raise
        raise MechanismInputError("params.components", str(exc)) from None


class FrlMean(StreamingFunction):
    name = "frl.mean"
    label = "FRL mean baseline"
    params_schema = params.FrlMeanSchema
    description = (
        "Pure epsilon-DP mean function baseline (FRL): i.i.d. Laplace noise on the first M"
        " eigen-coefficients of a kernel's basis, M minimising a data-free risk by default."
    )

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        grid, tau = _functional_column(meta, p["column"], self.name)
        kernel = _noise_kernel(p.get("kernel", {}))
        m = _auto(p.get("components"))
        with _components_refused():
            return mean.plan_frl_mean(
                grid, tau, meta.n_rows, epsilon, kernel, None if m is None else int(m)
            )


class IclpKde(StreamingFunction):
    #: measured memory: grid counts only (no exact float sums)
    fixed_bytes = 2**20
    name = "iclp.kde"
    label = "ICLP-QR kernel density estimate"
    params_schema = params.IclpKdeSchema
    description = (
        "Pure epsilon-DP density of a bounded continuous column: KDE with the power kernel"
        " C^eta and Independent Component Laplace Process noise on C's eigenbasis."
    )

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        bounds = _density_column(meta, p["column"], self.name)
        family, nu, rho = _density_kernel(p.get("kernel", {}))
        eta = _auto(p.get("smoothing", {}).get("eta"))
        if eta is not None and eta <= 1.0:
            raise MechanismInputError("params.smoothing.eta", "eta must be > 1 for the KDE")
        return kde.plan_iclp_kde(
            bounds,
            meta.n_rows,
            epsilon,
            grid_size=p.get("grid_size", kde.DEFAULT_GRID_SIZE),
            family=family,
            nu=nu,
            bandwidth=rho,
            eta=eta,
            normalize=p.get("normalize", True),
        )


class BernsteinKde(FunctionMechanism):
    name = "bernstein.kde"
    label = "Bernstein mechanism density baseline"
    params_schema = params.BernsteinKdeSchema
    description = (
        "Pure epsilon-DP density baseline: a KDE evaluated on K+1 lattice points with"
        " Laplace noise, released as a Bernstein polynomial (Alda & Rubinstein 2017)."
    )

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        bounds = _density_column(meta, p["column"], self.name)
        family, nu, rho = _density_kernel(p.get("kernel", {}))
        return bernstein.plan_bernstein_kde(
            bounds,
            meta.n_rows,
            epsilon,
            lattice_size=p.get("lattice_size", bernstein.DEFAULT_LATTICE),
            grid_size=p.get("grid_size", kde.DEFAULT_GRID_SIZE),
            family=family,
            nu=nu,
            bandwidth=rho,
            normalize=p.get("normalize", True),
        )


# --------------------------------------------------------------------------- resolution


def _functional_column(meta: DatasetMeta, name: str, mechanism: str) -> tuple[
    tuple[float, ...], float
]:
    column = meta.column(name)
    if column.type != "functional":
        raise MechanismInputError(
            "params.column", f"{mechanism} needs a functional column; {name!r} is {column.type}"
        )
    try:
        grid, tau = domain.validate_functional_meta(column.grid or (), column.norm_bound or 0.0)
    except ValueError as exc:
        raise MechanismInputError("params.column", f"functional column {name!r}: {exc}") from None
    if len(grid) > params.MAX_GRID_POINTS:
        raise MechanismInputError(
            "params.column",
            f"functional column {name!r} has {len(grid)} grid points; {mechanism} supports"
            f" at most {params.MAX_GRID_POINTS}",
        )
    return grid, tau


def _density_column(meta: DatasetMeta, name: str, mechanism: str) -> tuple[float, float]:
    column = meta.column(name)
    if column.type != "continuous":
        raise MechanismInputError(
            "params.column", f"{mechanism} needs a continuous column; {name!r} is {column.type}"
        )
    bounds = column.bounds
    if bounds is None or not all(math.isfinite(b) for b in bounds) or not bounds[0] < bounds[1]:
        raise MechanismInputError(
            "params.column", f"column {name!r} has no finite, non-empty declared bounds"
        )
    # finite is not enough: on ±1e308 hi - lo overflows and the density comes out all zero
    return check_numeric_column(column)


def _noise_kernel(spec: Mapping[str, Any]) -> Kernel:
    family = spec.get("family", "matern")
    nu = spec.get("nu", MATERN_NU) if family == "matern" else None
    if family != "matern" and "nu" in spec:
        raise MechanismInputError("params.kernel.nu", "nu applies only to the matern family")
    rho = _auto(spec.get("rho"))
    return Kernel(family, MEAN_RHO if rho is None else rho, nu)


def _density_kernel(spec: Mapping[str, Any]) -> tuple[Family, float | None, float | None]:
    family: Family = spec.get("family", "gaussian")
    if family != "matern" and "nu" in spec:
        raise MechanismInputError("params.kernel.nu", "nu applies only to the matern family")
    nu = spec.get("nu", MATERN_NU) if family == "matern" else None
    return family, nu, _auto(spec.get("rho"))


def _auto(value: Any) -> float | None:
    """None for an omitted option or a keyword rule; the number otherwise."""
    return None if value is None or isinstance(value, str) else float(value)


iclp_mean = register(IclpMean())
frl_mean = register(FrlMean())
iclp_kde = register(IclpKde())
bernstein_kde = register(BernsteinKde())


# --------------------------------------------------------------------------- functionals
# ERM, covariance, function-on-scalar regression and the 2-D density (issue 16 item 2):
# several columns each, streamed in the order the plan's data pass reads them.

from mechanisms.base import Work  # noqa: E402
from mechanisms.iclp import cov as _cov  # noqa: E402
from mechanisms.iclp import erm as _erm  # noqa: E402
from mechanisms.iclp import fos as _fos  # noqa: E402
from mechanisms.iclp import kde2d as _kde2d  # noqa: E402
from mechanisms.iclp import params_functionals as _fparams  # noqa: E402


class MultiColumn(StreamingFunction):
    """A streamed function release of several columns (``columns``: in its plan's order)."""

    def summary(self, plan: Any, columns: list[np.ndarray]) -> Any:
        """The plan's non-private coefficients (the audit's neighbour search)."""
        return plan.summary(*columns)


def _bounded(meta: DatasetMeta, name: str, field: str, mechanism: str) -> tuple[float, float]:
    """A continuous column's finite declared bounds; errors name ``field``."""
    try:
        return _density_column(meta, name, mechanism)
    except MechanismInputError as exc:
        raise MechanismInputError(field, exc.message) from None


def _smoothing(p: Mapping[str, Any]) -> tuple[float | None, float | None]:
    s = p.get("smoothing", {})
    return _auto(s.get("eta")), _auto(s.get("psi"))


def _share(value: Any, default: Fraction) -> Fraction:
    """A decimal share read exactly (0.25 -> 1/4)."""
    return default if value is None else Fraction(repr(float(value)))


class IclpErm(MultiColumn):
    #: measured memory: the grouped exact sums of the responses take more per row
    row_bytes = 112.0
    fixed_bytes = 3 * 2**20
    name = "iclp.erm"
    label = "ICLP-QR regularised ERM"
    params_schema = _fparams.IclpErmSchema
    description = (
        "Pure epsilon-DP function of a bounded covariate from regularised ERM (kernel ridge"
        " for a bounded response, logistic for a 0/1 response) with ICLP noise."
    )

    def columns(self, params: Mapping[str, Any]) -> list[str]:
        return [params["covariate"], params["response"]]

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        """A pass over the rows, plus the solve's fixed Newton steps (a function of the loss
        and grid only): per step about 4 + |LINE_SEARCH| passes over the M x J features
        (J <= M) and a J x J factorisation, counted at 1/64 unit per flop (BLAS)."""
        m = int(params.get("grid_size", _erm.DEFAULT_GRID_SIZE))
        steps = (_erm.LOGISTIC_ITERATIONS if params.get("loss") == "logistic"
                 else _erm.SQUARE_ITERATIONS)
        solve = steps * ((4 + len(_erm.LINE_SEARCH)) * m * m + m**3 / 64)
        return Work(float(max(meta.n_rows, 1)) * m + solve, "params.grid_size")

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        xb = _bounded(meta, p["covariate"], "params.covariate", self.name)
        yb = check_numeric_column(meta.column(p["response"], "params.response"),
                                  "params.response")
        eta, psi = _smoothing(p)
        if eta is not None and eta <= 1.0:
            raise MechanismInputError("params.smoothing.eta", "eta must be > 1 for ERM")
        loss = p.get("loss", "square")
        if loss == "logistic" and not (yb[0] >= 0 and yb[1] <= 1):
            raise MechanismInputError("params.response",
                                      "the logistic loss needs a response bounded in [0, 1]")
        plan: Any = _erm.plan_iclp_erm(
            loss, xb, yb, meta.n_rows, epsilon, p.get("grid_size", _erm.DEFAULT_GRID_SIZE),
            _noise_kernel(p.get("kernel", {})), eta, psi)
        return plan


def _grid_points(meta: DatasetMeta, name: Any) -> int:
    """Grid size of a functional column for a work bound (1 if it is not one: the
    plan refuses it with a proper message)."""
    column = meta.columns.get(str(name))
    return len(column.grid) if column is not None and column.grid else 1


class IclpCov(MultiColumn):
    name = "iclp.cov"
    label = "ICLP-QR covariance function"
    params_schema = _fparams.IclpCovSchema
    description = (
        "Pure epsilon-DP covariance function of a functional column: ICLP-QR second moment"
        " on H x H and a separately released mean (epsilon split), symmetrised."
    )

    def columns(self, params: Mapping[str, Any]) -> list[str]:
        return [params["column"]]

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        m = _grid_points(meta, params.get("column"))
        return Work(float(max(meta.n_rows, 1)) * m * m, "params.column")

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        grid, tau = _functional_column(meta, p["column"], self.name)
        if len(grid) > _cov.MAX_COV_GRID:
            raise MechanismInputError(
                "params.column", f"{self.name} supports grids of at most"
                f" {_cov.MAX_COV_GRID} points (an M x M output)")
        eta, psi = _smoothing(p)
        plan: Any = _cov.plan_iclp_cov(
            grid, tau, meta.n_rows, epsilon, _noise_kernel(p.get("kernel", {})), eta, psi,
            p.get("max_components"), p.get("centred", True),
            _share(p.get("mean_share"), _cov.DEFAULT_MEAN_SHARE))
        return plan


class IclpFos(MultiColumn):
    name = "iclp.fos"
    label = "ICLP function-on-scalar regression"
    params_schema = _fparams.IclpFosSchema
    description = (
        "Pure epsilon-DP function-on-scalar regression: Laplace Gram of bounded covariates"
        " (epsilon1) and ICLP-QR means of x_k*Y (epsilon2), beta = G^-1 S; p functions."
    )

    def columns(self, params: Mapping[str, Any]) -> list[str]:
        return [*params["covariates"], params["response"]]

    def summary(self, plan: Any, columns: list[np.ndarray]) -> Any:
        return plan.summary(columns[:-1], columns[-1])

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        m = _grid_points(meta, params.get("response"))
        p = len(params.get("covariates", [])) + 1
        return Work(float(max(meta.n_rows, 1)) * m * (m + p), "params.response")

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        try:
            grid, tau = _functional_column(meta, p["response"], self.name)
        except MechanismInputError as exc:
            raise MechanismInputError("params.response", exc.message) from None
        bounds = []
        for i, name in enumerate(p["covariates"]):
            field = f"params.covariates.{i}"
            bounds.append(check_numeric_column(meta.column(name, field), field))
        eta, psi = _smoothing(p)
        plan: Any = _fos.plan_iclp_fos(
            p["covariates"], bounds, grid, tau, meta.n_rows, epsilon, p.get("intercept", True),
            _noise_kernel(p.get("kernel", {})), eta, psi,
            _share(p.get("gram_share"), _fos.DEFAULT_GRAM_SHARE))
        return plan


class IclpKde2d(MultiColumn):
    #: measured memory: grid counts only (no exact float sums)
    fixed_bytes = 2**20
    name = "iclp.kde2d"
    label = "ICLP-QR 2-D kernel density estimate"
    params_schema = _fparams.IclpKde2dSchema
    description = (
        "Pure epsilon-DP joint density of two bounded continuous columns on a product grid:"
        " product exponential kernel, ICLP noise on its Kronecker eigenbasis (heat map)."
    )

    def columns(self, params: Mapping[str, Any]) -> list[str]:
        return list(params["columns"])

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        bounds = tuple(_bounded(meta, name, f"params.columns.{i}", self.name)
                       for i, name in enumerate(p["columns"]))
        eta = _auto(p.get("eta"))
        if eta is not None and eta <= 1.0:
            raise MechanismInputError("params.eta", "eta must be > 1 for the KDE")
        plan: Any = _kde2d.plan_iclp_kde2d(
            (bounds[0], bounds[1]), meta.n_rows, epsilon,
            p.get("grid_size", _kde2d.DEFAULT_GRID_SIZE), _auto(p.get("bandwidth")), eta,
            p.get("normalize", True))
        return plan


iclp_erm = register(IclpErm())
iclp_cov = register(IclpCov())
iclp_fos = register(IclpFos())
iclp_kde2d = register(IclpKde2d())


# ----------------------------------------------------- ICLP-AR, GP-ADP, FRL-KDE, Bernstein mean


class IclpArMean(FunctionMechanism):
    name = "iclp.ar"
    label = "ICLP-AR mean"
    params_schema = params.IclpArMeanSchema
    description = (
        "Pure epsilon-DP mean function of a functional column: soft-thresholded (ICLP-AR,"
        " l1-penalised) eigen-coefficients with Independent Component Laplace Process noise."
    )

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        grid, tau = _functional_column(meta, p["column"], self.name)
        kernel = _noise_kernel(p.get("kernel", {}))
        smoothing = p.get("smoothing", {})
        eta = _auto(smoothing.get("eta"))
        if eta is not None and eta < 1.0:
            raise MechanismInputError("params.smoothing.eta", "eta must be >= 1 for ICLP-AR")
        return ar.plan_iclp_ar_mean(grid, tau, meta.n_rows, epsilon, kernel, eta,
                                    _auto(smoothing.get("psi")))


class GpAdpMean(FunctionMechanism):
    name = "gp.adp"
    label = "GP-ADP mean baseline"
    measures: ClassVar[tuple[str, ...]] = ("epsilon", "delta")
    params_schema = params.GpAdpMeanSchema
    description = (
        "Approximate (epsilon, delta)-DP mean function baseline (Mirshani et al. 2019):"
        " ridge mean plus a Gaussian process with the kernel's covariance, as exact"
        " discrete Gaussian noise on its eigen-coefficients."
    )

    def cost(
        self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
    ) -> dict[str, Fraction]:
        amounts = read_budget(budget, self.measures, self.name)
        self._gp_plan(params, amounts, meta)
        return amounts

    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        amounts = read_budget(cost, self.measures, self.name)
        out: dict[str, Any] = jsonable(self._gp_plan(params, amounts, meta).accuracy())
        return out

    def run(
        self,
        data: Mapping[str, np.ndarray],
        params: Mapping[str, Any],
        cost: Budget,
        meta: DatasetMeta,
        rng: np.random.Generator,
    ) -> Output:
        amounts = read_budget(cost, self.measures, self.name)
        plan = self._gp_plan(params, amounts, meta)
        released = plan.release(data[params["column"]], rng)
        return Output(
            result=released.to_result(),
            accuracy=jsonable(plan.accuracy()),
            guarantee=(
                f"approximate (epsilon, delta)-DP ({self.label},"
                f" epsilon={fmt(amounts['epsilon'])} nats, delta={fmt(amounts['delta'])}),"
                f" {PRIVACY_UNIT}"
            ),
        )

    def _gp_plan(self, params: Mapping[str, Any], amounts: Mapping[str, Fraction],
                 meta: DatasetMeta) -> gp.GpPlan:
        if meta.n_rows < 1:
            raise MechanismInputError("params.column", "the dataset has no rows")
        grid, tau = _functional_column(meta, params["column"], self.name)
        kernel = _noise_kernel(params.get("kernel", {}))
        smoothing = params.get("smoothing", {})
        eta = _auto(smoothing.get("eta"))
        if eta is not None and eta < 0.5:
            raise MechanismInputError("params.smoothing.eta", "eta must be >= 1/2 for GP-ADP")
        try:
            return gp.plan_gp_mean(grid, tau, meta.n_rows, amounts["epsilon"],
                                   amounts["delta"], kernel, eta, _auto(smoothing.get("psi")))
        except noise.CalibrationError as exc:
            raise MechanismInputError("budget", str(exc)) from None
        except ValueError as exc:
            raise MechanismInputError("params", str(exc)) from None

    def _plan(self, params: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        raise NotImplementedError("gp.adp is planned from (epsilon, delta) by _gp_plan")


class FrlKde(StreamingFunction):
    #: measured memory: grid counts only (no exact float sums), and the default M's
    #: search (one sensitivity per candidate M: 8.6 MB measured at 10^5 rows)
    fixed_bytes = 10 * 2**20
    name = "frl.kde"
    label = "FRL density baseline"
    params_schema = params.FrlKdeSchema
    description = (
        "Pure epsilon-DP density baseline (FRL): the KDE's first M eigen-coefficients with"
        " i.i.d. Laplace noise, M minimising a data-free risk by default."
    )

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        bounds = _density_column(meta, p["column"], self.name)
        family, nu, rho = _density_kernel(p.get("kernel", {}))
        m = _auto(p.get("components"))
        with _components_refused():
            return kde.plan_frl_kde(
                bounds, meta.n_rows, epsilon,
                grid_size=p.get("grid_size", kde.DEFAULT_GRID_SIZE), family=family, nu=nu,
                bandwidth=rho, components=None if m is None else int(m),
                normalize=p.get("normalize", True),
            )


class BernsteinMean(FunctionMechanism):
    name = "bernstein.mean"
    label = "Bernstein mechanism mean baseline"
    params_schema = params.BernsteinMeanSchema
    description = (
        "Pure epsilon-DP mean function baseline: the mean of pointwise-clipped curves on"
        " K+1 lattice points with Laplace noise, released as a Bernstein polynomial."
    )

    def _plan(self, p: Mapping[str, Any], epsilon: Fraction, meta: DatasetMeta) -> _Plan:
        grid, tau = _functional_column(meta, p["column"], self.name)
        sup = _auto(p.get("sup_bound"))
        return bernstein.plan_bernstein_mean(
            grid, tau if sup is None else sup, meta.n_rows, epsilon,
            p.get("lattice_size", bernstein.DEFAULT_MEAN_LATTICE),
        )


iclp_ar = register(IclpArMean())
gp_adp = register(GpAdpMean())
frl_kde = register(FrlKde())
bernstein_mean = register(BernsteinMean())
