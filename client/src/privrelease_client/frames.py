"""Results as tables and pictures; pandas, polars and matplotlib are imported lazily.

A result document becomes columns in plain Python first (``result_columns``), so the
shape rules are tested without any DataFrame library and both libraries agree.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Mapping
from typing import Any

from privrelease_client.errors import MissingExtra
from privrelease_client.reading import Reading, read_release

__all__ = ["csv_to_pandas", "csv_to_polars", "frame_upload", "plot_reading", "plot_result",
           "release_columns", "release_to_pandas", "release_to_polars", "result_columns",
           "to_pandas", "to_polars"]

PARQUET_TYPE = "application/vnd.apache.parquet"

#: the keys that label the points of ``values`` (one per value, or bin edges: one more)
_LABELS = ("grid", "categories", "bins", "support", "x")
_SCALAR = (int, float, str, bool, type(None))


def _module(name: str, extra: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise MissingExtra(name, extra, what) from None


def _flat(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Scalars of nested objects as ``a.b`` keys; lists of scalars kept as they are."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _scalar_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, _SCALAR) for v in value)


def _pair_list(value: Any) -> bool:
    """``[[left, right], ...]``: cells or intervals, one pair per row."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(e, _SCALAR) for e in v)
        for v in value)


def _lists(flat: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The non-empty lists of scalars, pairs split into ``name_left``/``name_right``."""
    out: dict[str, list[Any]] = {}
    for k, v in flat.items():
        if _pair_list(v):
            out[f"{k}_left"] = [p[0] for p in v]
            out[f"{k}_right"] = [p[1] for p in v]
        elif _scalar_list(v) and v:
            out[k] = list(v)
    return out


def result_columns(result: Any) -> dict[str, list[Any]]:
    """Columns (name -> equally long lists) for a release's or analysis' result.

    - ``records`` (a list of objects): one row per record.
    - ``values`` with a label list (``grid``, ``categories``, ``bins``...): one row per
      value, the label first, every other list of that length beside it (bands such as
      ``lower``/``upper``); bin edges (one more than the values) become ``left``/``right``.
    - otherwise the longest lists of one length are the columns (lists of pairs, such
      as the NPMLE's ``cells``, split into ``cells_left``/``cells_right``); with no lists
      at all, one row of every scalar (nested objects flattened to ``a.b``).
    """
    if not isinstance(result, Mapping):
        return {"value": [result]}
    records = result.get("records")
    if isinstance(records, list) and records and all(isinstance(r, Mapping) for r in records):
        names = list(dict.fromkeys(k for r in records for k in r))
        return {k: [r.get(k) for r in records] for k in names}
    flat = _flat(result)
    lists = _lists(flat)
    values = lists.get("values")
    if values is None and lists:
        n = max(len(v) for v in lists.values())
        return {k: list(v) for k, v in lists.items() if len(v) == n}
    if values is None:
        return {k: [v] for k, v in flat.items() if isinstance(v, _SCALAR)}
    n = len(values)
    cols: dict[str, list[Any]] = {}
    for label in _LABELS:
        edges = lists.get(label)
        if edges is None:
            continue
        if len(edges) == n:
            cols[label] = list(edges)
            break
        if len(edges) == n + 1:
            cols["left"], cols["right"] = list(edges[:-1]), list(edges[1:])
            break
    cols["values"] = list(values)
    for k, v in lists.items():
        if k not in cols and k not in _LABELS and len(v) == n:
            cols[k] = list(v)
    return cols


def to_pandas(result: Any) -> Any:
    """The result as a ``pandas.DataFrame`` (extra ``pandas``)."""
    pd = _module("pandas", "pandas", "to_pandas()")
    return pd.DataFrame(result_columns(result))


def to_polars(result: Any) -> Any:
    """The result as a ``polars.DataFrame`` (extra ``polars``)."""
    pl = _module("polars", "polars", "to_polars()")
    return pl.DataFrame(result_columns(result), strict=False)


def release_columns(doc: Mapping[str, Any]) -> dict[str, list[Any]]:
    """A release document as columns: its rows with ``estimate``, ``lower``, ``upper`` and
    ``level`` (``reading.read_release``), or, for a result with no released statistic
    (record-level releases), ``result_columns`` of its result."""
    reading = read_release(doc)
    if reading is None:
        return result_columns(doc.get("result"))
    return reading.columns()


def _about(reading: Reading | None) -> dict[str, Any]:
    """What a frame says about its interval (pandas ``attrs``)."""
    if reading is None:
        return {}
    return {"statistic": reading.statistic, "budget": reading.budget,
            "level": reading.level, "interval": reading.interval,
            "accuracy": reading.sentence}


def release_to_pandas(doc: Mapping[str, Any]) -> Any:
    """A release as a ``pandas.DataFrame`` with ``lower``/``upper`` at ``level`` (a column,
    and ``attrs`` naming the statistic, the level and where the interval comes from)."""
    pd = _module("pandas", "pandas", "to_pandas()")
    frame = pd.DataFrame(release_columns(doc))
    frame.attrs.update(_about(read_release(doc)))
    return frame


def release_to_polars(doc: Mapping[str, Any]) -> Any:
    """A release as a ``polars.DataFrame`` with ``lower``/``upper`` and its ``level``
    column (polars frames carry no attrs)."""
    pl = _module("polars", "polars", "to_polars()")
    return pl.DataFrame(release_columns(doc), strict=False)


def csv_to_pandas(text: str) -> Any:
    pd = _module("pandas", "pandas", "to_pandas()")
    return pd.read_csv(io.StringIO(text))


def csv_to_polars(text: str) -> Any:
    pl = _module("polars", "polars", "to_polars()")
    return pl.read_csv(io.BytesIO(text.encode("utf-8")))


def plot_result(result: Any, *, title: str | None = None, ax: Any = None) -> Any:
    """Draw a result on matplotlib axes (new ones unless ``ax``); returns the axes.

    A function over a numeric grid is a line with its band (``lower``/``upper``) when
    the result has one; labelled values (categories, bins) are bars with error bars
    from a band; anything else is refused (``ValueError``): there is nothing to draw.
    """
    _module("matplotlib", "plot", "plot()")
    plt = importlib.import_module("matplotlib.pyplot")
    cols = result_columns(result)
    if "values" not in cols and not ("cdf" in cols and "cells_right" in cols):
        raise ValueError("this result has no values to draw")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    if "values" not in cols:  # an NPMLE: a step CDF jumping at the right end of each cell
        ax.step(cols["cells_right"], cols["cdf"], where="post", color="C0", label="NPMLE")
        ax.plot(cols["cells_right"], cols["cdf"], "o", color="C0", markersize=3)
        ax.set_xlabel("support (right ends of the cells)")
        ax.set_ylabel("CDF")
        ax.set_ylim(0, 1.02)
        if title:
            ax.set_title(title)
        return ax
    values = cols["values"]
    lower, upper = cols.get("lower"), cols.get("upper")
    label = next((k for k in ("grid", "support", "x") if k in cols), None)
    if label is not None and all(isinstance(v, int | float) for v in cols[label]):
        xs = cols[label]
        ax.plot(xs, values, color="C0", label="released")
        if lower is not None and upper is not None:
            ax.fill_between(xs, lower, upper, color="C0", alpha=0.25, label="band")
            ax.legend()
        ax.set_xlabel(label)
    else:
        if "left" in cols:
            names = [f"[{a:g}, {b:g})" for a, b in zip(cols["left"], cols["right"],
                                                       strict=True)]
        else:
            key = next((k for k in ("categories", "bins") if k in cols), None)
            names = [str(v) for v in cols[key]] if key else [str(i) for i in
                                                               range(len(values))]
        err = None
        if lower is not None and upper is not None:
            err = [[v - lo for v, lo in zip(values, lower, strict=True)],
                   [hi - v for v, hi in zip(values, upper, strict=True)]]
        ax.bar(names, values, yerr=err, color="C0", capsize=3)
        ax.tick_params(axis="x", labelrotation=45)
    ax.set_ylabel("value")
    if title:
        ax.set_title(title)
    return ax


def plot_reading(reading: Reading, *, ax: Any = None) -> Any:
    """Draw a release's reading on matplotlib axes (new ones unless ``ax``): a function as
    a line with its 95 % band, other rows as bars or points with their intervals as error
    bars; axis titles and the statistic with its budget as the title. Returns the axes."""
    _module("matplotlib", "plot", "plot()")
    plt = importlib.import_module("matplotlib.pyplot")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    values = [float("nan") if v is None else v for v in reading.estimates]
    lower = [float("nan") if v is None else v for v in reading.lower]
    upper = [float("nan") if v is None else v for v in reading.upper]
    level = "" if reading.level is None else f"{reading.level:.0%} "
    if reading.kind == "curve":
        xs = next(iter(reading.keys.values()))
        ax.plot(xs, values, color="C0", label="released")
        if reading.level is not None:
            ax.fill_between(xs, lower, upper, color="C0", alpha=0.25, label=f"{level}band")
        ax.legend()
    else:
        names = reading.labels
        err = [[v - lo if lo == lo else 0.0 for v, lo in zip(values, lower, strict=True)],
               [hi - v if hi == hi else 0.0 for v, hi in zip(values, upper, strict=True)]]
        if reading.kind == "bars":
            ax.bar(names, values, yerr=err, color="C0", capsize=3)
        else:
            ax.errorbar(names, values, yerr=err, fmt="o", color="C0", capsize=4)
        ax.tick_params(axis="x", labelrotation=45 if len(names) > 6 else 0)
    ax.set_xlabel(reading.label_name)
    ax.set_ylabel(reading.value_name)
    ax.set_title(reading.title)
    return ax


def show_png(png: bytes, *, ax: Any = None) -> Any:
    """Show a server's PNG drawing on matplotlib axes (new ones, sized to the image at
    100 dpi, unless ``ax``), without axis ticks; returns the axes."""
    _module("matplotlib", "plot", "plot()")
    plt = importlib.import_module("matplotlib.pyplot")
    image = importlib.import_module("matplotlib.image").imread(io.BytesIO(png), format="png")
    if ax is None:
        height, width = image.shape[:2]
        _, ax = plt.subplots(figsize=(width / 100, height / 100), dpi=100)
    ax.imshow(image)
    ax.set_axis_off()
    return ax


def _kind(frame: object) -> str | None:
    """"pandas" or "polars" for a DataFrame of either library, without importing them."""
    module = type(frame).__module__.split(".", 1)[0]
    if type(frame).__name__ == "DataFrame" and module in {"pandas", "polars"}:
        return module
    return None


def frame_upload(frame: object) -> tuple[bytes, str, str] | None:
    """A pandas or polars DataFrame as an upload: (content, file name, content type).

    Parquet when a writer is at hand (polars writes it itself, pandas through
    pyarrow): typed columns, so no number goes through text and categoricals stay
    dictionary-encoded; otherwise CSV (pandas writes floats with full precision and
    missing values as empty cells, both read back exactly by the server). The index of
    a pandas frame is not a column and is left out. None for anything else.
    """
    kind = _kind(frame)
    if kind is None:
        return None
    buffer = io.BytesIO()
    if kind == "polars":
        frame.write_parquet(buffer)  # type: ignore[attr-defined]
        return buffer.getvalue(), "data.parquet", PARQUET_TYPE
    try:
        pa = importlib.import_module("pyarrow")
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError:
        text = frame.to_csv(index=False)  # type: ignore[attr-defined]
        return text.encode("utf-8"), "data.csv", "text/csv"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buffer)
    return buffer.getvalue(), "data.parquet", PARQUET_TYPE
