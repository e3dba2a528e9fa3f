"""Releases, analyses and downloaded tables as objects a notebook can hold on to."""

from __future__ import annotations

import html
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from privrelease_client import frames
from privrelease_client.errors import ReleaseFailed

if TYPE_CHECKING:
    from privrelease_client.client import Client

__all__ = ["PENDING", "TERMINAL", "Analysis", "Progress", "Release", "Table"]

#: a release's statuses; ``pricing`` is a job computing its cost before it is reserved
PENDING = frozenset({"pricing", "queued", "running"})
#: ``refused``: pricing found the request refused (budget, params); nothing was held
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "refused"})


def _clean(text: str) -> str:
    """Printable only: text from the server must not drive the terminal (ANSI codes)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _in_notebook() -> bool:
    """A Jupyter kernel: its output area understands ``\\r`` though it is not a tty."""
    return "ipykernel" in sys.modules


class Progress:
    """One ``\\r`` status line (spinner, id, status, seconds) while waiting.

    Shown on a terminal or in a notebook, silent otherwise (logs and pipes stay clean);
    ``clear()`` erases it before the result is printed.
    """

    FRAMES = "|/-\\"

    def __init__(self, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty()) or _in_notebook()
        self.enabled = enabled
        self.last: dict[str, Any] | None = None
        self._frame = 0
        self._shown = False

    def __call__(self, doc: Mapping[str, Any], elapsed: float) -> None:
        self.last = dict(doc)
        if not self.enabled:
            return
        frame = self.FRAMES[self._frame % len(self.FRAMES)]
        self._frame += 1
        self.stream.write(f"\r{frame} {_clean(str(doc.get('id')))} "
                          f"{_clean(str(doc.get('status')))} {elapsed:4.1f}s\x1b[K")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


class Table:
    """A release's record-level data (``GET /data``) as CSV text, with conversions."""

    def __init__(self, csv: str, name: str = "data") -> None:
        self.csv = csv
        self.name = name

    def __repr__(self) -> str:
        return f"Table({self.name!r}, rows={self.rows})"

    @property
    def rows(self) -> int:
        """Data rows (the header is not one)."""
        return max(len(self.csv.splitlines()) - 1, 0)

    def to_pandas(self) -> Any:
        return frames.csv_to_pandas(self.csv)

    def to_polars(self) -> Any:
        return frames.csv_to_polars(self.csv)

    def save(self, path: str | os.PathLike[str]) -> Path:
        out = Path(path)
        out.write_text(self.csv, encoding="utf-8", newline="")
        return out


class _Job:
    """What releases and analyses share: a document refreshed by polling until it ends."""

    _terminal: frozenset[str] = TERMINAL

    def __init__(self, client: Client, doc: Mapping[str, Any]) -> None:
        self.client = client
        self.doc: dict[str, Any] = dict(doc)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, status={self.status!r})"

    @property
    def id(self) -> str:
        return str(self.doc["id"])

    @property
    def status(self) -> str:
        return str(self.doc.get("status"))

    @property
    def done(self) -> bool:
        return self.status in self._terminal

    @property
    def result(self) -> Any:
        return self.doc.get("result")

    @property
    def error(self) -> dict[str, Any] | None:
        error = self.doc.get("error")
        return dict(error) if isinstance(error, Mapping) else None

    def _fetch(self) -> dict[str, Any]:
        raise NotImplementedError

    #: the document fields a notebook shows above the result table
    _SHOWN: tuple[str, ...] = ("id", "status", "mechanism", "analysis", "dataset_id",
                               "release_id", "cost", "guarantee", "accuracy", "error")
    _ROWS = 20  # result rows shown in a notebook; to_pandas() has them all

    def _repr_html_(self) -> str:
        """A notebook's view: the main fields, then the result's first rows as a table.

        Everything from the server is escaped: a label cannot inject markup.
        """
        def cell(value: Any) -> str:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            return html.escape(text if len(text) <= 200 else text[:199] + "…")

        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{cell(self.doc[k])}</td></tr>"
                       for k in self._SHOWN if self.doc.get(k) is not None)
        out = f"<table>{rows}</table>"
        if self.result is not None:
            cols = frames.result_columns(self.result)
            n = max((len(v) for v in cols.values()), default=0)
            head = "".join(f"<th>{html.escape(k)}</th>" for k in cols)
            body = "".join("<tr>" + "".join(f"<td>{cell(v[i])}</td>" for v in cols.values())
                           + "</tr>" for i in range(min(n, self._ROWS)))
            more = f"<p>{n - self._ROWS} more rows: to_pandas()</p>" if n > self._ROWS else ""
            out += f"<table><tr>{head}</tr>{body}</table>{more}"
        return out

    def refresh(self) -> _Job:
        self.doc = self._fetch()
        return self

    def wait(self, timeout: float = 300.0, poll: float = 0.2, *,
             progress: bool | Callable[[Mapping[str, Any], float], None] | None = None,
             check: bool = True) -> Any:
        """Poll until the job ends; returns itself (for chaining).

        ``progress``: None shows a status line on a terminal or in a notebook, False never,
        True always, or a callable ``(doc, elapsed)``. With ``check`` a failed, refused or
        cancelled job raises :class:`ReleaseFailed` (its ``code``, ``field``, amounts;
        :class:`BudgetRefused`, also a :class:`BudgetExhausted`, when refused for budget).
        ``TimeoutError`` after ``timeout`` s; the job goes on on the server regardless.
        """
        show: Any = progress if callable(progress) else Progress(
            enabled=None if progress is None else bool(progress))
        start = time.monotonic()
        try:
            while True:
                if not self.done:
                    self.doc = self._fetch()
                elapsed = time.monotonic() - start
                show(self.doc, elapsed)
                if self.done:
                    break
                if elapsed + poll > timeout:
                    raise TimeoutError(
                        f"{self.id} still {self.status} after {timeout:g} s")
                time.sleep(poll)
        finally:
            if isinstance(show, Progress):
                show.clear()
        if check:
            self.raise_for_status()
        return self

    def raise_for_status(self) -> None:
        """Raise :class:`ReleaseFailed` if the job ended failed, refused or cancelled."""
        if self.status in {"failed", "refused", "cancelled"}:
            raise ReleaseFailed.of(self.doc)

    def to_pandas(self) -> Any:
        """The result as a pandas DataFrame (see ``frames.result_columns`` for shapes)."""
        return frames.to_pandas(self.result)

    def to_polars(self) -> Any:
        return frames.to_polars(self.result)


class Release(_Job):
    """One release: ``wait()``, ``result``, ``to_pandas()``, ``data()``, ``plot()``,
    ``analyze()``. Statuses: pricing, queued, running, then succeeded, failed, refused or
    cancelled."""

    def _fetch(self) -> dict[str, Any]:
        return self.client.get_release(self.id)

    def refresh(self) -> Release:
        super().refresh()
        return self

    def wait(self, timeout: float = 300.0, poll: float = 0.2, *,
             progress: bool | Callable[[Mapping[str, Any], float], None] | None = None,
             check: bool = True) -> Release:
        super().wait(timeout, poll, progress=progress, check=check)
        return self

    @property
    def cost(self) -> dict[str, Any]:
        return dict(self.doc.get("cost") or {})

    @property
    def accuracy(self) -> dict[str, Any] | None:
        return self.doc.get("accuracy")

    @property
    def guarantee(self) -> str | None:
        return self.doc.get("guarantee")

    def data(self) -> Table:
        """The privatized microdata (mechanisms that release records)."""
        return Table(self.client.release_data(self.id), self.id)

    def plot(self, path: str | os.PathLike[str] | None = None, *, ax: Any = None) -> Any:
        """With ``path``: save the server's drawing there (SVG for a ``.svg`` name, else
        PNG; returns the path). Without: draw
        the result locally with matplotlib (extra ``plot``) and return the axes."""
        if path is not None:
            out = Path(path)
            svg = out.suffix.lower() == ".svg"
            out.write_bytes(self.client.release_plot_svg(self.id) if svg
                            else self.client.release_plot(self.id))
            return out
        return frames.plot_result(self.result, title=f"{self.doc.get('mechanism')} "
                                  f"· {self.id}", ax=ax)

    def analyze(self, analysis: str, params: Mapping[str, Any] | None = None,
                releases: tuple[str, ...] | list[str] = ()) -> Analysis:
        """Queue free post-processing of this release (spends no budget)."""
        return Analysis(self.client, self.client.analyze(self.id, analysis, params, releases))

    def analyses(self) -> list[Analysis]:
        """Every analysis of this release, newest first (all pages)."""
        return [Analysis(self.client, d) for d in self.client.iter_analyses(self.id)]

    def cancel(self) -> Release:
        """Cancel the release's job while it is queued (the reservation is refunded)."""
        self.doc = self.client.cancel_job(self.id)
        return self


class Analysis(_Job):
    """An analysis of a release (NPMLE, estimates...): ``wait()``, ``result``, frames."""

    @property
    def release_id(self) -> str:
        return str(self.doc["release_id"])

    @property
    def name(self) -> str:
        return str(self.doc.get("analysis"))

    def _fetch(self) -> dict[str, Any]:
        return self.client.get_analysis(self.release_id, self.id)

    def refresh(self) -> Analysis:
        super().refresh()
        return self

    def wait(self, timeout: float = 300.0, poll: float = 0.2, *,
             progress: bool | Callable[[Mapping[str, Any], float], None] | None = None,
             check: bool = True) -> Analysis:
        super().wait(timeout, poll, progress=progress, check=check)
        return self

    def cancel(self) -> Analysis:
        self.doc = self.client.cancel_analysis(self.release_id, self.id)
        return self

    def plot(self, path: str | os.PathLike[str] | None = None, *, ax: Any = None,
             local: bool = False) -> Any:
        """The server's drawing of the result. With ``path``: saved there, as SVG when
        the name ends in ``.svg``, else PNG (returns the path). Without: shown on
        matplotlib axes (extra ``plot``; inline in notebooks) and the axes returned.
        ``local=True`` draws the result's numbers locally instead (no request)."""
        if local:
            return frames.plot_result(self.result, title=f"{self.name} · {self.id}", ax=ax)
        if path is not None:
            out = Path(path)
            svg = out.suffix.lower() == ".svg"
            fetch = self.client.analysis_plot_svg if svg else self.client.analysis_plot
            out.write_bytes(fetch(self.release_id, self.id))
            return out
        return frames.show_png(self.client.analysis_plot(self.release_id, self.id), ax=ax)
