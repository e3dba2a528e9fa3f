"""Negative controls: deliberately broken variants of the audited mechanisms.

Each event family of the audit must catch one of these, or the audit could
not fail. They reproduce real bugs, copied here so that fixing the library
does not remove the control:

* ``overspending``: the mechanism calibrates its noise for factor·ε while
  it claims (and costs) ε (interval family; learned family for many
  coordinates);
* ``truncated_discrete_laplace``: the discrete Laplace built from numpy's
  ``standard_exponential``, which never exceeds 44.43, so the noise stops at
  floor(44.43·s) + 1 lattice units (issue #14, finding 2; tail family);
* ``OldNoiseStep``: DIP's noise step recycling the uniform that chose the
  discrete noise's case as the PIT's V; when the noise is 0, V lies on a grid
  coarser than otherwise and the released float shows it (issue #14,
  finding 1; representation family);
* ``FloatLaplace``: Laplace noise added to a raw float (Mironov 2012;
  representation family);
* ``RejectionExm``: ``exm``'s old exact rejection sampler of the exponential
  mechanism, whose number of proposals — the run time an analyst sees — is
  geometric in the data's acceptance rate (issue #27; work family);
* ``old_erm_solve``: ``iclp.erm``'s old solve, which stopped at the first
  certified Newton step (issue #27; work family).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mechanisms import flip, sampling
from mechanisms.base import Budget, DatasetMeta, Mechanism, Output, read_budget
from mechanisms.competitors.exm import ExmMechanism, ExmPlan
from mechanisms.dip.mechanism import DipMechanism, Plan
from mechanisms.dip.noise import NoiseStep
from mechanisms.dip.reference import Reference
from mechanisms.dp import baselines
from mechanisms.statistics import (
    Batch,
    Partial,
    Statistic,
    check_rows,
    float_sums,
    to_float,
    whole,
)

FloatArray = NDArray[np.float64]
_LN2_63 = 63 * math.log(2.0)


def exact_bernoulli_exp(rng: np.random.Generator, gamma: list[Fraction]) -> NDArray[np.bool_]:
    """Independent Bernoulli(exp(-γ_i)) for rational γ_i >= 0, exactly (one coin per γ, floats
    and the exact tier): the coin of the old ``exm`` rejection sampler, kept for its control
    (``exm`` itself uses ``flip.Coins``)."""
    m = len(gamma)
    words = rng.integers(0, 1 << 64, size=m, dtype=np.uint64) >> np.uint64(1)
    g = np.array([float(x) for x in gamma], dtype=np.float64)
    w = words.astype(np.float64)
    ok = words >= np.uint64(1 << 43)
    with np.errstate(divide="ignore"):
        y = _LN2_63 - np.log(np.maximum(w, 1.0))  # -ln V at the cell's low end
    margin = 2.0**-40 * (1.0 + g)
    accept = ok & (y - 2.0**-42 - margin > g)  # the cell's width in -ln V is below 2^-43
    reject = ok & (y + margin < g)
    out = accept.copy()
    zero = np.array([x == 0 for x in gamma], dtype=bool)
    out |= zero
    for i in np.flatnonzero(~(accept | reject | zero)):
        out[i] = sampling.exact_accept(rng, int(words[i]), gamma[i])
    return out


# --------------------------------------------------------------------------- overspending


def _overspent(budget: Budget, factor: float) -> dict[str, Fraction]:
    return {k: v * Fraction(factor) if k == "epsilon" else Fraction(v)
            for k, v in budget.items()}


def overspending(mech: Mechanism, factor: float) -> Mechanism:
    """``mech``'s class with noise for factor·ε; it still claims and costs ε."""
    cls = type(mech)
    if isinstance(mech, baselines.Baseline):

        class Baseline(cls):  # type: ignore[valid-type,misc]
            def _plan(self, params: Any, amounts: Any, meta: DatasetMeta) -> Any:
                return super()._plan(params, _overspent(amounts, factor), meta)

        return Baseline()
    if isinstance(mech, DipMechanism):

        class Dip(DipMechanism):
            def plan(self, params: Mapping[str, Any], budget: Budget,
                     meta: DatasetMeta) -> Plan:
                plan = super().plan(params, _overspent(budget, factor), meta)
                plan.epsilon = Fraction(budget["epsilon"])  # what cost() charges
                return plan

        return Dip()

    class Function(cls):  # type: ignore[valid-type,misc]
        def _plan(self, params: Any, epsilon: Fraction, meta: DatasetMeta) -> Any:
            return super()._plan(params, epsilon * Fraction(factor), meta)

    return Function()


# --------------------------------------------------------------------------- finding 2


def truncated_signed_geometric(rng: np.random.Generator, scale: float, size: int | tuple[int, ...]
                               ) -> tuple[FloatArray, FloatArray, float]:
    """The OLD ``sampling._signed_geometric`` (scalar scale): (X, |U − 1/2|, z/2).

    |X| = floor(scale·E) + 1 with E from ``standard_exponential`` (at most
    44.43), X = 0 when |U − 1/2| <= z/2.
    """
    half_zero = 0.5 * math.tanh(0.5 / scale)
    x = rng.standard_exponential(size)
    x *= scale
    np.floor(x, out=x)
    x += 1.0
    a = rng.random(size)
    a -= 0.5
    np.copysign(x, a, out=x)
    np.abs(a, out=a)
    np.multiply(x, a > half_zero, out=x)
    return x, a, half_zero


def truncated_discrete_laplace(rng: np.random.Generator, scale: float,
                               size: int | tuple[int, ...]) -> NDArray[np.int64]:
    """The OLD discrete Laplace: its tails stop at floor(44.43·scale) + 1."""
    return truncated_signed_geometric(rng, scale, size)[0].astype(np.int64)


class TruncatedLaplace(baselines.LaplaceMechanism):
    """``laplace`` drawing its noise with the old, truncated sampler."""

    def _sample(self, rng: np.random.Generator, plan: Any, size: int) -> NDArray[np.int64]:
        return truncated_discrete_laplace(rng, plan.noise_scale, size)


# --------------------------------------------------------------------------- finding 1


class OldNoiseStep(NoiseStep):
    """DIP's OLD noise step: V recycled from the uniform that chose D's case."""

    def __call__(self, u: FloatArray, rng: np.random.Generator, exact_upper: bool = True
                 ) -> tuple[FloatArray, FloatArray]:
        x, a, half_zero = truncated_signed_geometric(rng, self.scale, np.shape(u))
        zero_rows = np.flatnonzero(x == 0.0)
        flat = a.reshape(-1)
        inside = flat[zero_rows] / half_zero  # A uniform on [0, z/2] when X = 0
        rest = 0.5 - half_zero
        if rest > 0.0:  # A uniform on (z/2, 1/2] when X != 0
            a -= half_zero
            a *= 1.0 / rest
        flat[zero_rows] = inside
        t = self.cell(u)
        t += x
        return self._uniformize(t, a, exact_upper)


def old_privatize(x: FloatArray, reference: Reference, column: str, epsilon: Fraction,
                  rng: np.random.Generator, resolution: int,
                  step_class: type[NoiseStep] = OldNoiseStep) -> FloatArray:
    """One column through DIP (``chain.privatize``'s steps) with another noise step."""
    step = step_class(resolution, NoiseStep.calibrate(epsilon, resolution).scale)
    clean = {column: reference.clean(column, x)}
    u = reference.uniformize(clean, [column], rng)
    g, h = step(u, rng, reference.needs_upper_tail)
    return np.asarray(reference.quantile(g, h, [column])[column], dtype=np.float64)


# --------------------------------------------------------------------------- Mironov


class FloatLaplace(baselines.LaplaceMechanism):
    """``laplace`` of a sum or mean as the exact statistic plus ``rng.laplace`` on floats.

    Same scale as the real mechanism (Δ/ε), but the noise is a raw double, so
    the released value's low bits depend on the statistic (Mironov 2012).
    """

    def statistic(self, params: Mapping[str, Any], cost: Budget,
                  meta: DatasetMeta) -> Statistic:
        return ClippedSum(self._plan(params, read_budget(cost, self.measures, self.name), meta))

    def release(self, params: Mapping[str, Any], partial: Partial, cost: Budget,
                meta: DatasetMeta, rng: np.random.Generator,
                statistic: Statistic | None = None) -> Output:
        values = self.noisy(partial, params, cost, meta, rng, 1)
        return Output(result={"value": float(values[0])}, accuracy={}, guarantee="")

    def draw(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any], cost: Budget,
             meta: DatasetMeta, rng: np.random.Generator, runs: int) -> FloatArray:
        """``runs`` releases at once (the vectorised form of ``run``)."""
        partial = whole(self.statistic(params, cost, meta), data)
        return self.noisy(partial, params, cost, meta, rng, runs)

    def noisy(self, partial: Partial, params: Mapping[str, Any], cost: Budget,
              meta: DatasetMeta, rng: np.random.Generator, runs: int) -> FloatArray:
        q = self._plan(params, read_budget(cost, self.measures, self.name), meta).query
        check_rows(partial, q.n, q.column.name)
        exact = to_float(partial.parts["fsum"][0]) / (q.n if q.statistic == "mean" else 1)
        scale = float(q.sensitivity / Fraction(cost["epsilon"]))
        out: FloatArray = exact + rng.laplace(0.0, scale, runs)
        return out


@dataclass(frozen=True)
class ClippedSum(Statistic):
    """FloatLaplace's data pass: the exact sum of the clipped column (``fsum`` of it)."""

    plan: Any

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.plan.query.column.name,)

    def sizes(self) -> Mapping[str, int]:
        return {"fsum": 1}

    def reduce(self, chunk: Batch) -> Mapping[str, Sequence[int]]:
        q = self.plan.query
        assert q.bounds is not None and q.statistic in ("sum", "mean")
        lo, hi = (float(b) for b in q.bounds)
        return {"fsum": float_sums(np.clip(np.asarray(chunk[q.column.name],
                                                      dtype=np.float64), lo, hi))}


# --------------------------------------------------------------------------- issue 27


class RejectionExm(ExmMechanism):
    """``exm`` before issue #27: exact draws of the exponential mechanism by rejection.

    Propose a uniformly, accept with probability exp(−γ_a): the accepted value has
    the exponential mechanism's law whatever the number of proposals, but that
    number is geometric in Σ_a exp(−γ_a)/s, a function of the counts, and it is
    what the release's run time shows.
    """

    def sample(self, plan: ExmPlan, counts: NDArray[np.int64], rng: np.random.Generator,
               draws: int) -> NDArray[np.int64]:
        """The old ``ExmMechanism.sample``, verbatim."""
        top = int(counts.max())
        by_value = [plan.per_draw * (top - int(c)) / 2 for c in counts]  # γ_a, exact
        out: list[int] = []
        batch = max(16, 2 * draws)
        while len(out) < draws:
            proposals = rng.integers(0, plan.support, size=min(batch, 1 << 20))
            keep = exact_bernoulli_exp(rng, [by_value[int(a)] for a in proposals])
            out.extend(int(p) for p in proposals[keep][: draws - len(out)])
        return np.asarray(out, dtype=np.int64)

    def runs(self, plan: ExmPlan, counts: NDArray[np.int64], rng: np.random.Generator,
             runs: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``runs`` independent releases of the old sampler, each of ``plan.draws`` draws,
        and each release's proposals (its work), vectorised over the releases.

        Every release runs the old loop (batches of max(16, 2k) proposals until k are
        accepted, the first k accepted kept), so each one's (draws, proposals) has the
        old law; with ``runs = 1`` the generator is read in the old order, and the
        draws are ``sample``'s (the coins are ``flip.Coins``, which decide a coin
        exactly as ``exact_bernoulli_exp`` does).
        """
        k = plan.draws
        coins = flip.Coins.scaled(plan.per_draw / 2, counts.max() - counts, plan.n)
        batch = min(max(16, 2 * k), 1 << 20)
        out = np.zeros((runs, k), dtype=np.int64)
        have = np.zeros(runs, dtype=np.int64)
        proposals = np.zeros(runs, dtype=np.int64)
        active = np.arange(runs)
        while active.size:
            props = rng.integers(0, plan.support, size=(active.size, batch))
            heads = coins.flip(rng, props)[0]
            proposals[active] += batch
            rank = np.cumsum(heads, axis=1)  # 1 + earlier heads in the batch, at a head
            take = heads & (rank <= (k - have[active])[:, None])  # the first ones needed
            rows, cols = np.nonzero(take)
            run = active[rows]
            out[run, have[run] + rank[rows, cols] - 1] = props[rows, cols]
            have[active] += take.sum(axis=1)
            active = active[have[active] < k]
        return out, proposals


def old_erm_solve(plan: Any, counts: FloatArray, sums: FloatArray
                  ) -> tuple[FloatArray, int, int]:
    """``iclp.erm``'s OLD solve, verbatim but for its counters: Newton steps until the first
    certified iterate and a line search halving until the objective decreases, so the
    (steps, objective evaluations) it returns depend on the data (work family)."""
    from mechanisms.iclp import erm

    b = plan.features
    psi = plan.psi
    a = np.zeros(b.shape[1])
    evaluations = 0
    for steps in range(100):
        grad, slack, hess = plan._gradient(b, counts, sums, a)
        if (float(np.linalg.norm(grad)) + slack) / (2.0 * psi) * (1.0 + 1e-6) <= (
            erm.SOLVE_TOLERANCE * plan.radius
        ):
            return a, steps, evaluations
        step = np.linalg.solve(hess, grad)
        if plan.loss == "logistic":  # damped Newton: halve until J decreases
            base = plan._objective(b, counts, sums, a)
            evaluations += 1
            t = 1.0
            while t > 2.0**-30 and plan._objective(b, counts, sums, a - t * step) > base:
                evaluations += 1
                t *= 0.5
            evaluations += 1 if t > 2.0**-30 else 0
            step = t * step
        a = a - step
    raise erm.SolveError("the ERM minimiser did not reach the certified tolerance")
