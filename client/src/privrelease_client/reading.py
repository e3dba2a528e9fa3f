"""What a release says, read for a person: its statistic, budget, estimates and intervals.

One mapping from a release document (``mechanism``, ``params``, ``result``, ``accuracy``,
``cost``) to a :class:`Reading`, shared by the server's drawings (``service.plotting``),
the console and the client's DataFrames, so a plot, a page and a frame never disagree.
Intervals come from the release's public accuracy statement only (a half-width, a
per-cell error, a band or a standard error it states); nothing is re-derived from data.
Plain Python: no numpy, pandas or matplotlib here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

__all__ = ["Reading", "accuracy_sentence", "band95", "budget_text", "read_release"]

#: the normal quantile of a two-sided 95 % interval (a stated standard error times this)
Z95 = 1.959963984540054

#: bars: labelled cells; points: a few estimates; curve: a function over a grid;
#: curves and surface: functions drawn by the functional plot (``mechanisms.iclp.plot``)
ReadingKind = Literal["bars", "points", "curve", "curves", "surface"]

_MEASURES = {"epsilon": "ε", "delta": "δ", "rho": "ρ"}
_OPS = {"eq": "=", "ne": "≠", "lt": "<", "le": "≤", "gt": ">", "ge": "≥", "in": "in"}


@dataclass(frozen=True)
class Reading:
    """A release as rows: ``keys`` label each row (one list per key column), ``estimates``
    the released numbers, ``lower``/``upper`` their interval at ``level`` (None: the
    statement gives no interval for that row); ``interval`` says where it comes from."""

    mechanism: str
    statistic: str
    budget: str
    kind: ReadingKind
    #: axis titles: what the labels are, what the estimates measure
    label_name: str
    value_name: str
    keys: dict[str, list[Any]]
    estimates: list[float | None]
    lower: list[float | None]
    upper: list[float | None]
    #: 0.95, 1.0 for a deterministic bound ("always within"), None: no interval
    level: float | None
    interval: str
    sentence: str = ""
    #: other released columns beside the estimates (e.g. a table's ``noisy_values``)
    extra: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """The statistic and the budget, e.g. ``mean of age · ε = 1``."""
        return f"{self.statistic} · {self.budget}" if self.budget else self.statistic

    @property
    def labels(self) -> list[str]:
        """One text label per row (key columns joined), for bars and tables."""
        columns = list(self.keys.values())
        return [" / ".join(_text(c[i]) for c in columns) for i in range(len(self.estimates))]

    def columns(self) -> dict[str, list[Any]]:
        """The rows as columns for a DataFrame: keys, ``estimate``, ``lower``, ``upper``,
        ``level``, then any extra columns."""
        n = len(self.estimates)
        out: dict[str, list[Any]] = {k: list(v) for k, v in self.keys.items()}
        out["estimate"] = list(self.estimates)
        out["lower"], out["upper"] = list(self.lower), list(self.upper)
        out["level"] = [self.level] * n
        out.update({k: list(v) for k, v in self.extra.items() if k not in out})
        return out


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        x = float(value)
        return x if math.isfinite(x) else None
    return None


def _amount_text(raw: Any) -> str:
    """An amount as the document gives it: a number in decimals (0.5), an exact fraction
    (``"1/3"``) as itself while its denominator is small."""
    number = _number(raw)
    if number is not None:
        return f"{number:.6g}"
    try:
        value = Fraction(str(raw))
    except (TypeError, ValueError, ZeroDivisionError):
        return "?"
    return str(value) if value.denominator <= 1000 else f"{float(value):.4g}"


def budget_text(cost: Mapping[str, Any]) -> str:
    """The cost in words: ``ε = 1, δ = 1e-06``; other measures by name (``bits = 3``)."""
    parts = []
    for measure in sorted(cost, key=lambda m: (m not in _MEASURES, list(_MEASURES).index(m)
                                               if m in _MEASURES else 0, m)):
        raw = cost[measure]
        value = _amount_text(raw)
        parts.append(f"{_MEASURES.get(measure, measure)} = {value}")
    return ", ".join(parts)


def band95(mechanism: str, accuracy: Mapping[str, Any]) -> float | None:
    """Half-width of a released function's 95 % band: ``band95``, else 1.96 × the RMS
    privacy error per point (``expected_sq_l2_error``; a density's is integrated over the
    column's range, so its per-point mean square is that divided by the range)."""
    band = _number(accuracy.get("band95"))
    if band is not None:
        return band
    mse = _number(accuracy.get("expected_sq_l2_error"))
    if mse is None or mse < 0:
        return None
    if mechanism.endswith(".kde"):
        kernel = accuracy.get("kernel")
        domain = kernel.get("domain") if isinstance(kernel, Mapping) else None
        if not isinstance(domain, list | tuple) or len(domain) != 2:
            return None
        lo, hi = _number(domain[0]), _number(domain[1])
        if lo is None or hi is None or not hi > lo:
            return None
        mse /= hi - lo
    return 1.96 * math.sqrt(mse)


def accuracy_sentence(accuracy: Any) -> str:
    """The accuracy statement's sentence in words (``sentence``, else ``statement``); ""
    when it has none."""
    if not isinstance(accuracy, Mapping):
        return ""
    for key in ("sentence", "statement"):
        text = accuracy.get(key)
        if isinstance(text, str) and text:
            return text
    return ""


def _around(values: Sequence[float | None], errors: Sequence[Any]
            ) -> tuple[list[float | None], list[float | None]]:
    """``value ± error`` per cell: ``error`` a half-width, a ``[below, above]`` pair or
    None (no interval)."""
    lower: list[float | None] = []
    upper: list[float | None] = []
    for v, e in zip(values, errors, strict=True):
        if isinstance(e, list | tuple) and len(e) == 2:
            below, above = _number(e[0]), _number(e[1])
        else:
            below = above = _number(e)
        if v is None or below is None or above is None:
            lower.append(None)
            upper.append(None)
        else:
            lower.append(v - below)
            upper.append(v + above)
    return lower, upper


def _numbers(raw: Any) -> list[float | None] | None:
    if not isinstance(raw, list) or not raw:
        return None
    if not all(v is None or _number(v) is not None for v in raw):
        return None
    return [_number(v) for v in raw]


def read_release(doc: Mapping[str, Any]) -> Reading | None:
    """The release document read as rows with intervals; None when its result holds no
    released statistic (record-level data, intervals per record: its numbers are in
    ``/data`` and its analyses)."""
    mechanism = str(doc.get("mechanism", ""))
    params = doc.get("params") or {}
    result = doc.get("result")
    accuracy = doc.get("accuracy") or {}
    if not isinstance(result, Mapping) or not isinstance(accuracy, Mapping):
        return None
    budget = budget_text(doc.get("cost") or {})
    base = {"mechanism": mechanism, "budget": budget, "sentence": accuracy_sentence(accuracy)}
    for reader in (_function, _table, _histogram, _quantiles, _covariance, _vector,
                   _columns_mean, _scalar, _draws, _subset_estimate, _record_mean):
        reading = reader(params, result, accuracy, base)
        if reading is not None:
            return reading
    return None


# --------------------------------------------------------------------------- readers
# each takes (params, result, accuracy, base) and returns a Reading or None (not its shape)


def _column(params: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    return str(params.get("column") or result.get("column") or "")


def _function(params: Mapping[str, Any], result: Mapping[str, Any],
              accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    mechanism = base["mechanism"]
    kind = result.get("kind")
    grid = _numbers(result.get("grid"))
    if grid is None:
        return None
    if kind == "curves":
        names = [str(n) for n in result.get("names", [])]
        raw = result.get("values")
        bands = result.get("band95") or []
        if not isinstance(raw, list) or len(names) != len(raw):
            return None
        keys: dict[str, list[Any]] = {"term": [], "t": []}
        est: list[float | None] = []
        lower: list[float | None] = []
        upper: list[float | None] = []
        for k, (name, row) in enumerate(zip(names, raw, strict=True)):
            values = _numbers(row) or []
            band = _number(bands[k]) if k < len(bands) else None
            keys["term"] += [name] * len(values)
            keys["t"] += grid[: len(values)]
            est += values
            lower += [None if v is None or band is None else v - band for v in values]
            upper += [None if v is None or band is None else v + band for v in values]
        response = str(params.get("response", "Y"))
        return Reading(**base, statistic=f"coefficient functions of {response}",
                       kind="curves", label_name=f"t (grid of {response})",
                       value_name=f"beta_k(t) of {response}", keys=keys, estimates=est,
                       lower=lower, upper=upper, level=0.95 if any(bands) else None,
                       interval="95 % band per curve: result.band95")
    if kind == "surface":
        raw = result.get("values")
        grid_y = _numbers(result.get("grid_y")) or grid
        if not isinstance(raw, list):
            return None
        band = band95(mechanism, accuracy)
        keys = {"s": [], "t": []}
        est = []
        for s, row in zip(grid, raw, strict=False):
            values = _numbers(row) or []
            keys["s"] += [s] * len(values)
            keys["t"] += grid_y[: len(values)]
            est += values
        lower = [None if v is None or band is None else v - band for v in est]
        upper = [None if v is None or band is None else v + band for v in est]
        if mechanism == "iclp.kde2d":
            cols = [str(c) for c in params.get("columns", ["x", "y"])]
            statistic, label = f"density of {cols[0]} and {cols[1]}", cols[0]
            keys = {cols[0]: keys["s"], cols[1]: keys["t"]}
            value_name = "density"
        else:
            column = _column(params, result)
            what = "covariance" if result.get("centred", True) else "second moment"
            statistic, label = f"{what} of {column}", f"s (grid of {column})"
            value_name = statistic
        return Reading(**base, statistic=statistic, kind="surface", label_name=label,
                       value_name=value_name, keys=keys, estimates=est, lower=lower,
                       upper=upper, level=None if band is None else 0.95,
                       interval=("95 % band: accuracy.band95, one half-width for every cell"
                                 " (about 95 % at each cell, not at all at once)"))
    curve = _numbers(result.get("values"))
    if curve is None or len(curve) != len(grid):
        return None
    values = curve
    band = band95(mechanism, accuracy)
    lower = [None if v is None or band is None else v - band for v in values]
    upper = [None if v is None or band is None else v + band for v in values]
    if mechanism == "iclp.erm":
        response, covariate = str(params.get("response", "y")), str(params.get("covariate", "x"))
        if params.get("loss") == "logistic":
            value_name = f"log-odds of {response} = 1"
            statistic = f"logistic regression of {response} on {covariate}"
        else:
            value_name = f"E[{response} | {covariate}]"
            statistic = f"regression of {response} on {covariate}"
        label = key = covariate
    elif mechanism.endswith(".kde"):
        column = _column(params, result)
        statistic, value_name = f"density of {column}", "density"
        label = key = column
    else:
        column = _column(params, result)
        statistic = f"mean function of {column}"
        label, value_name, key = f"t (grid of {column})", f"mean of {column}", "t"
    how = ("95 % band: accuracy.band95" if _number(accuracy.get("band95")) is not None
           else "95 % band: ±1.96 × the RMS privacy error per point (accuracy)")
    return Reading(**base, statistic=statistic, kind="curve", label_name=label,
                   value_name=value_name, keys={key: grid}, estimates=values, lower=lower,
                   upper=upper, level=None if band is None else 0.95, interval=how)


def _confidence(accuracy: Mapping[str, Any]) -> tuple[float, str]:
    """The level of a table's or matrix's intervals and how to say it: per entry (the
    default, 0.95) or all at once (``accuracy.confidence.simultaneous``)."""
    stated = accuracy.get("confidence")
    if not isinstance(stated, Mapping):
        return 0.95, "95 % interval"
    level = _number(stated.get("level")) or 0.95
    if stated.get("simultaneous"):
        return level, f"{_text(level * 100)} % simultaneous interval (all hold at once)"
    return level, f"{_text(level * 100)} % interval"


def _table(params: Mapping[str, Any], result: Mapping[str, Any],
           accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    """A cross-tab (``group_by``): cells with their 95 % errors (``result.errors``)."""
    group_by = result.get("group_by")
    values = _numbers(result.get("values"))
    cells, errors = result.get("cells"), result.get("errors")
    if not (isinstance(group_by, list) and values is not None and isinstance(cells, list)
            and isinstance(errors, list) and len(cells) == len(values) == len(errors)):
        return None
    statistic = str(params.get("statistic", "count"))
    names = [str(g) for g in group_by]
    what = statistic if statistic == "count" else f"{statistic} of {_column(params, result)}"
    keys = {name: [str(c[i]) if isinstance(c, list) and i < len(c) else "" for c in cells]
            for i, name in enumerate(names)}
    extra: dict[str, list[Any]] = {}
    level, said = _confidence(accuracy)
    noisy = _numbers(result.get("noisy_values"))
    if noisy is not None and len(noisy) == len(values):
        # consistency: the intervals are the noisy cells'; values are their projection
        lower, upper = _around(noisy, errors)
        extra["noisy_estimate"] = noisy
        how = (f"{said} of each noisy cell (noisy_estimate ± result.errors); estimate"
               " is the consistent table post-processed from the noisy cells")
    else:
        lower, upper = _around(values, errors)
        how = (f"{said} containing the exact mean: result.errors" if statistic == "mean"
               else f"{said}: estimate ± result.errors")
    return Reading(**base, statistic=f"{what} by {' × '.join(names)}", kind="bars",
                   label_name=" / ".join(names), value_name=what, keys=keys,
                   estimates=values, lower=lower, upper=upper, level=level, interval=how,
                   extra=extra)


def _histogram(params: Mapping[str, Any], result: Mapping[str, Any],
               accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    values, bins = _numbers(result.get("values")), result.get("bins")
    categories = result.get("categories")
    half = _number(accuracy.get("ci95_halfwidth"))
    column = _column(params, result)
    if values is not None and isinstance(categories, list) and bins is None \
            and params.get("statistic") == "histogram" \
            and len(categories) == len(values):  # a categorical column: one bar a category
        lower, upper = _around(values, [half] * len(values))
        return Reading(**base, statistic=f"histogram of {column}", kind="bars",
                       label_name=column, value_name="count",
                       keys={column: [str(c) for c in categories]},
                       estimates=values, lower=lower, upper=upper,
                       level=None if half is None else 0.95,
                       interval="95 % interval: estimate ± accuracy.ci95_halfwidth per category")
    if values is None or not isinstance(bins, list) or len(bins) != len(values):
        return None
    if not all(isinstance(b, list) and len(b) == 2 for b in bins):
        return None
    lower, upper = _around(values, [half] * len(values))
    return Reading(**base, statistic=f"histogram of {column}", kind="bars",
                   label_name=f"bin of {column}", value_name="count",
                   keys={"bin": [f"[{_text(float(a))}, {_text(float(b))})" for a, b in bins]},
                   estimates=values, lower=lower, upper=upper,
                   level=None if half is None else 0.95,
                   interval="95 % interval: estimate ± accuracy.ci95_halfwidth per bin",
                   extra={"left": [float(a) for a, _ in bins],
                          "right": [float(b) for _, b in bins]})


def _quantiles(params: Mapping[str, Any], result: Mapping[str, Any],
               accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    values, levels = _numbers(result.get("values")), _numbers(result.get("quantiles"))
    if values is None or levels is None or len(values) != len(levels):
        return None
    column = _column(params, result)
    rank = _number(accuracy.get("ci95_rank_error"))
    intervals = result.get("intervals")
    if (isinstance(intervals, list) and len(intervals) == len(values)
            and all(isinstance(i, list) and len(i) == 2 for i in intervals)):
        # ``interval: true``: each quantile's [L, U] in the column's units (its own draws)
        return Reading(**base, statistic=f"quantiles of {column}", kind="points",
                       label_name="quantile level", value_name=column,
                       keys={"quantile": [float(q) for q in levels if q is not None]},
                       estimates=values, lower=[_number(i[0]) for i in intervals],
                       upper=[_number(i[1]) for i in intervals],
                       level=_number(result.get("interval_level")),
                       interval="interval in the column's units: result.intervals (two more"
                                " private draws per quantile, accuracy.statement)",
                       extra={"rank_error_95": [rank] * len(values)})
    none: list[float | None] = [None] * len(values)
    # without ``interval: true`` no units interval exists (mechanisms/dp/quantiles.py says why)
    how = ("no interval in units of the column: with 95 % the rank of each released"
           f" quantile is off its level × n by at most {rank:.4g} records more than the best"
           " grid point's (accuracy)" if rank is not None else "no interval stated")
    return Reading(**base, statistic=f"quantiles of {column}", kind="points",
                   label_name="quantile level", value_name=column,
                   keys={"quantile": [float(q) for q in levels if q is not None]},
                   estimates=values, lower=none, upper=list(none), level=None, interval=how,
                   extra={"rank_error_95": [rank] * len(values)})


def _covariance(params: Mapping[str, Any], result: Mapping[str, Any],
                accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    matrix, columns = result.get("matrix"), result.get("columns")
    if not isinstance(matrix, list) or not isinstance(columns, list):
        return None
    k = len(columns)
    pairs = [(j, i) for j in range(k) for i in range(j, k)]  # the upper triangle, row-major
    try:
        values = [_number(matrix[j][i]) for j, i in pairs]
    except (IndexError, TypeError):
        return None
    level, said = _confidence(accuracy)
    key = "halfwidths" if isinstance(accuracy.get("halfwidths"), list) else "ci95_halfwidths"
    halves = accuracy.get(key)
    errors = (list(halves) if isinstance(halves, list) and len(halves) == len(pairs)
              else [accuracy.get("ci95_halfwidth")] * len(pairs))
    lower, upper = _around(values, errors)
    names = [str(c) for c in columns]
    return Reading(**base, statistic=f"covariance of {', '.join(names)}", kind="bars",
                   label_name="entry", value_name="covariance",
                   keys={"row": [names[j] for j, _ in pairs],
                         "column": [names[i] for _, i in pairs]},
                   estimates=values, lower=lower, upper=upper, level=level,
                   interval=f"{said} per entry: accuracy.{key}")


def _vector(params: Mapping[str, Any], result: Mapping[str, Any],
            accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    """noiseless.vector: one value per query, each within its ``max_error`` always."""
    coords, values = result.get("coordinates"), _numbers(result.get("values"))
    errors = accuracy.get("max_error")
    if not (isinstance(coords, list) and values is not None and isinstance(errors, list)
            and len(coords) == len(values) == len(errors)):
        return None
    queries = [f"{c.get('statistic')} of {c.get('column')}" if isinstance(c, Mapping)
               else "" for c in coords]
    lower, upper = _around(values, errors)
    return Reading(**base, statistic="query vector", kind="points", label_name="query",
                   value_name="value", keys={"query": queries}, estimates=values,
                   lower=lower, upper=upper, level=1.0,
                   interval="always within accuracy.max_error (no randomness)")


def _columns_mean(params: Mapping[str, Any], result: Mapping[str, Any],
                  accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    """opm.mean: one mean per column, within ``ci95_halfwidth_chebyshev`` at 95 %."""
    columns, values = result.get("columns"), _numbers(result.get("values"))
    per = accuracy.get("columns")
    if not (isinstance(columns, list) and values is not None and isinstance(per, Mapping)
            and len(columns) == len(values)):
        return None
    errors = [per.get(str(c), {}).get("ci95_halfwidth_chebyshev")
              if isinstance(per.get(str(c)), Mapping) else None for c in columns]
    lower, upper = _around(values, errors)
    names = [str(c) for c in columns]
    return Reading(**base, statistic=f"mean of {', '.join(names)}", kind="points",
                   label_name="column", value_name="mean", keys={"column": names},
                   estimates=values, lower=lower, upper=upper, level=0.95,
                   interval=("95 % interval (Chebyshev, any noise law): estimate ±"
                             " accuracy.columns[c].ci95_halfwidth_chebyshev"))


def _scalar(params: Mapping[str, Any], result: Mapping[str, Any],
            accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    value = _number(result.get("value"))
    if value is None:
        return None
    statistic = str(params.get("statistic") or result.get("statistic") or "value")
    column = _column(params, result)
    condition = params.get("condition")
    if column:
        what = f"{statistic} of {column}"
    elif isinstance(condition, Mapping):
        op = str(condition.get("op"))
        what = (f"{statistic} of rows with {condition.get('column')} {_OPS.get(op, op)}"
                f" {condition.get('value')}")
    else:
        what = statistic
    half = _number(accuracy.get("ci95_halfwidth"))
    exact = _number(accuracy.get("max_error"))
    given = result.get("interval")  # an interval around the released value (std, variance)
    if isinstance(given, list) and len(given) == 2 and None not in map(_number, given):
        return Reading(**base, statistic=what, kind="points", label_name="statistic",
                       value_name=what, keys={"statistic": [what]}, estimates=[value],
                       lower=[_number(given[0])], upper=[_number(given[1])], level=0.95,
                       interval="95 % interval: result.interval")
    if half is not None:
        level: float | None = 0.95
        how = "95 % interval: estimate ± accuracy.ci95_halfwidth"
    elif exact is not None and accuracy.get("deterministic"):
        half, level = exact, 1.0
        how = "always within accuracy.max_error (no randomness)"
    else:
        level, how = None, "no interval stated"
    lower, upper = _around([value], [half])
    return Reading(**base, statistic=what, kind="points", label_name="statistic",
                   value_name=what, keys={"statistic": [what]}, estimates=[value],
                   lower=lower, upper=upper, level=level, interval=how)


def _draws(params: Mapping[str, Any], result: Mapping[str, Any],
           accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    """exm: how many of the draws took each value (a synthetic sample; no interval)."""
    counts = _numbers(result.get("histogram"))
    if counts is None:
        return None
    column = _column(params, result)
    labels: list[Any] | None = result.get("categories")
    support = result.get("support")
    if labels is None and isinstance(support, list) and len(support) == 2:
        lo = int(support[0])
        labels = list(range(lo, lo + len(counts)))
    if not isinstance(labels, list) or len(labels) != len(counts):
        return None
    none: list[float | None] = [None] * len(counts)
    shortfall = _number(accuracy.get("count_shortfall_95"))
    how = ("no interval: each draw is a value whose count is, with 95 %, within"
           f" {shortfall:.4g} of the largest count (accuracy.count_shortfall_95)"
           if shortfall is not None else "no interval stated")
    return Reading(**base, statistic=f"draws of {column}", kind="bars",
                   label_name=f"value of {column}", value_name="draws",
                   keys={column or "value": labels}, estimates=counts, lower=none,
                   upper=list(none), level=None, interval=how)


def _subset_estimate(params: Mapping[str, Any], result: Mapping[str, Any],
                     accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    """Subset releases: each variable's estimated category shares ŵ, ± 1.96 × the standard
    error the accuracy states under a uniform population (approximate)."""
    variables, stated = result.get("variables"), accuracy.get("variables")
    if not isinstance(variables, list) or not variables:
        return None
    keys: dict[str, list[Any]] = {"variable": [], "category": []}
    est: list[float | None] = []
    ses: list[Any] = []
    for i, var in enumerate(variables):
        estimate = var.get("estimate") if isinstance(var, Mapping) else None
        if not isinstance(estimate, Mapping):
            return None
        w, cats = _numbers(estimate.get("w")), estimate.get("categories")
        if w is None or not isinstance(cats, list) or len(cats) != len(w):
            return None
        se: Any = None
        if isinstance(stated, list) and i < len(stated) and isinstance(stated[i], Mapping):
            block = stated[i].get("standard_errors_under_uniform_prior")
            se = block.get(str(estimate.get("method"))) if isinstance(block, Mapping) else None
        se_list = se if isinstance(se, list) and len(se) == len(w) else [None] * len(w)
        keys["variable"] += [str(var.get("name"))] * len(w)
        keys["category"] += [str(c) for c in cats]
        est += w
        ses += [_scaled(s) for s in se_list]
    lower, upper = _around(est, ses)
    names = ", ".join(dict.fromkeys(keys["variable"]))
    return Reading(**base, statistic=f"category shares of {names}", kind="bars",
                   label_name="category", value_name="estimated share",
                   keys=keys if len(variables) > 1 else {"category": keys["category"]},
                   estimates=est, lower=lower, upper=upper,
                   level=0.95 if any(s is not None for s in ses) else None,
                   interval=("≈95 %: estimate ± 1.96 × the standard error under a uniform"
                             " population (accuracy.variables[].standard_errors_under_"
                             "uniform_prior)"))


def _scaled(sd: Any) -> float | None:
    """A stated standard deviation as a 95 % half-width (normal approximation)."""
    x = _number(sd)
    return None if x is None else Z95 * x


def _record_mean(params: Mapping[str, Any], result: Mapping[str, Any],
                 accuracy: Mapping[str, Any], base: dict[str, Any]) -> Reading | None:
    """Record-level releases that state the mean of what they released (lrm's ``means``,
    opm.l2ball's ``mean``), ± 1.96 × the stated standard deviation of that mean."""
    means = result.get("means")
    if isinstance(means, Mapping) and means:
        per = accuracy.get("columns") or {}
        names = [str(c) for c in means]
        values = [_number(means[c]) for c in names]
        sds = [per.get(c, {}).get("mean_noise_sd") if isinstance(per.get(c), Mapping)
               else None for c in names]
    elif _number(result.get("mean")) is not None and isinstance(result.get("columns"), list):
        names = [str(c) for c in result["columns"]]
        values = [_number(result["mean"])]
        sds = [accuracy.get("mean_sd_bound")]
        names = names[:1]
    else:
        return None
    errors = [_scaled(s) for s in sds]
    lower, upper = _around(values, errors)
    return Reading(**base, statistic=f"mean of released {', '.join(names)}", kind="points",
                   label_name="column", value_name="mean of the released values",
                   keys={"column": names}, estimates=values, lower=lower, upper=upper,
                   level=0.95, interval=("≈95 % (normal approximation): estimate ± 1.96 ×"
                                         " the stated standard deviation of the mean"))
