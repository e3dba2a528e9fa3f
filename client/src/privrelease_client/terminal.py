"""How the CLI shows API documents on a terminal: Rich tables and ``name: value`` fields.

Pure formatting, kept apart from the commands so each command reads as what it asks the
server. Text from the server is never read as Rich markup and loses its control
characters, so a dataset name cannot drive the terminal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from privrelease_client.errors import ApiError

_CELL = 60  # widest table cell
_NESTED = 200  # longest nested JSON value shown in human output
#: secrets a key's creation answers with, once; never shown anywhere else
SECRETS = ("token", "callback_secret")


def clean(text: str) -> str:
    """Printable only: a label from the server must not drive the terminal (ANSI codes)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _num(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def compact(value: Any, limit: int | None = None) -> str:
    """One line for any JSON value, cut at ``limit`` (nested JSON at ``_NESTED`` at most).

    Human output stays readable on a terminal; ``--json`` is there for everything.
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _num(value)
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(isinstance(v, int | float | str) for v in value):
        text = ", ".join(compact(v) for v in value)
    elif isinstance(value, Mapping) and all(
            isinstance(v, int | float | str | bool) or v is None for v in value.values()):
        text = ", ".join(f"{k}={compact(v)}" for k, v in value.items())
    else:
        text = json.dumps(value, separators=(",", ":"))
        limit = min(limit or _NESTED, _NESTED)
    text = clean(text)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          empty: str = "(none)", cell: int | None = _CELL) -> RenderableType:
    """Borderless columns two spaces apart, bold headers on a terminal; ``empty`` if none.
    A cell is cut at ``cell`` characters (None: whole, folded over lines: prose)."""
    cells = [[Text(compact(v, cell)) for v in row] for row in rows]
    if not cells:
        return Text(empty)
    out = Table(box=None, show_edge=False, pad_edge=False, header_style="bold",
                highlight=False)
    for h in headers:
        out.add_column(h, overflow="fold")
    for row in cells:
        out.add_row(*row)
    return out


def fields(pairs: Iterable[tuple[str, Any]]) -> RenderableType:
    """``name: value`` lines, names aligned; absent (None) fields are skipped."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for k, v in pairs:
        if v is not None:
            grid.add_row(Text(f"{k}:", style="bold"), Text(compact(v)))
    return grid


def stack(*parts: RenderableType | None) -> RenderableType:
    """Renderables one after another, a blank line between them."""
    shown: list[RenderableType] = []
    for part in parts:
        if part is None:
            continue
        if shown:
            shown.append(Text(""))
        shown.append(part)
    return Group(*shown)


def render_dataset(doc: Mapping[str, Any]) -> RenderableType:
    head = fields([
        ("id", doc.get("id")), ("name", doc.get("name")), ("version", doc.get("version")),
        ("status", doc.get("status")), ("rows", doc.get("n_rows")),
        ("budgets", doc.get("budgets")),
        # what the operator enabled (#27.3): the notions and record-level releases
        ("notions", (", ".join(doc["notions"]) or "none") if "notions" in doc else None),
        ("record level", None if "record_level" not in doc
         else "allowed" if doc["record_level"] else "refused"),
        ("created", doc.get("created_at")),
        ("retired", doc.get("retired_at")),
    ])
    return stack(head, render_columns(doc), *_warnings(doc))


def _source(doc: Mapping[str, Any]) -> Any:
    """Where a version registered by reference was read from (None for an upload)."""
    source = doc.get("source")
    return source.get("url") if isinstance(source, Mapping) else None


def _warnings(doc: Mapping[str, Any]) -> list[Text]:
    """An answer's warnings: a possible re-upload of the same people (the dataset it
    names), or a source's hidden objects skipped."""
    out = []
    for warning in doc.get("warnings") or ():
        if isinstance(warning, Mapping):
            named = f" ({warning['dataset_id']})" if warning.get("dataset_id") else ""
            out.append(Text(f"warning: {warning.get('code')}: "
                            f"{warning.get('message', '')}{named}"))
    return out


def render_columns(doc: Mapping[str, Any]) -> RenderableType:
    rows = []
    for name, col in (doc.get("columns") or {}).items():
        col = col if isinstance(col, Mapping) else {}
        bounds = col.get("bounds")
        domain = (f"[{compact(bounds[0])}, {compact(bounds[1])}]"
                  if isinstance(bounds, list) and len(bounds) == 2 else col.get("categories"))
        rows.append((name, col.get("type"), domain))
    return table(["COLUMN", "TYPE", "DOMAIN"], rows, empty="no columns")


def render_version(doc: Mapping[str, Any]) -> RenderableType:
    head = fields([
        ("dataset", doc.get("dataset_id")), ("version", doc.get("version")),
        ("current", doc.get("current")), ("status", doc.get("status")),
        ("rows", doc.get("n_rows")), ("sha256", doc.get("sha256")),
        ("source", _source(doc)), ("created", doc.get("created_at")),
    ])
    return stack(head, render_columns(doc), *_warnings(doc))


def render_versions(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(
        ["VERSION", "CURRENT", "STATUS", "ROWS", "CREATED", "SHA256"],
        [(d.get("version"), "*" if d.get("current") else "", d.get("status"),
          d.get("n_rows"), d.get("created_at"), str(d.get("sha256") or "")[:12])
         for d in docs], empty="no versions")


def render_datasets(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(
        ["ID", "NAME", "VERSION", "ROWS", "STATUS", "CREATED"],
        [(d.get("id"), d.get("name"), d.get("version"), d.get("n_rows"), d.get("status"),
          d.get("created_at")) for d in docs], empty="no datasets")


_BUDGET_COLS = ("cap", "committed", "reserved", "remaining")


def render_budget(doc: Mapping[str, Any]) -> RenderableType:
    measures = table(
        ["MEASURE", *(c.upper() for c in _BUDGET_COLS)],
        [(m, *(row.get(c) for c in _BUDGET_COLS))
         for m, row in (doc.get("measures") or {}).items()], empty="no measures")
    allocations = doc.get("allocations") or {}
    if not allocations:
        return measures
    return stack(measures, Group(Text("allocations:"), table(
        ["KEY", "MEASURE", *(c.upper() for c in _BUDGET_COLS)],
        [(key_id, m, *(row.get(c) for c in _BUDGET_COLS))
         for key_id, rows in allocations.items() for m, row in rows.items()])))


def _key_fields(doc: Mapping[str, Any]) -> list[tuple[str, Any]]:
    grants = doc.get("datasets")
    return [("id", doc.get("id")), ("role", doc.get("role")), ("label", doc.get("label")),
            ("datasets", "all" if grants is None else ", ".join(grants) or "none"),
            ("expires", doc.get("expires_at") or "never"), ("created", doc.get("created_at"))]


def render_new_key(doc: Mapping[str, Any]) -> RenderableType:
    # the one place a token is printed: the server shows it once and keeps only a hash
    shown = [(name, doc[name]) for name in SECRETS if doc.get(name)]
    return stack(fields(_key_fields(doc)), Group(
        fields(shown), Text("(shown once: store them now, they cannot be retrieved again)")))


def render_keys(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(
        ["ID", "ROLE", "LABEL", "DATASETS", "EXPIRES", "CREATED"],
        [[v for _, v in _key_fields(d)] for d in docs], empty="no keys")


def render_result(result: Any, prefix: str = "result") -> RenderableType:
    if not isinstance(result, Mapping):
        return fields([(prefix, result)])
    values = result.get("values")
    labels = next((result[k] for k in ("categories", "bins", "grid", "support")
                   if isinstance(result.get(k), list)), None)
    if isinstance(values, list) and labels is not None and len(labels) >= len(values):
        rest = {k: v for k, v in result.items()
                if k not in {"values", "categories", "bins", "grid", "support"}}
        body = Group(Text(f"{prefix}:"), table(["AT", "VALUE"],
                                               zip(labels, values, strict=False)))
        return stack(fields(rest.items()) if rest else None, body)
    if "records" in result and isinstance(result["records"], list):
        result = {**result, "records": f"{len(result['records'])} records (see --json)"}
    return fields((f"{prefix}.{k}", v) for k, v in result.items())


def _error_message(error: Any) -> Any:
    if isinstance(error, Mapping):
        return error.get("message") or error.get("detail") or error
    return error


def render_release(doc: Mapping[str, Any]) -> RenderableType:
    dataset = doc.get("dataset_id")
    if doc.get("dataset_version") is not None:
        dataset = f"{dataset} (v{doc['dataset_version']})"
    head = fields([
        ("id", doc.get("id")), ("status", doc.get("status")), ("dataset", dataset),
        ("mechanism", doc.get("mechanism")), ("params", doc.get("params")),
        ("cost", doc.get("cost")), ("replayed", doc.get("replayed") or None),
        ("seeded", doc.get("seeded") or None), ("created", doc.get("created_at")),
        ("finished", doc.get("finished_at")), ("guarantee", doc.get("guarantee")),
        ("accuracy", doc.get("accuracy")), ("error", _error_message(doc.get("error"))),
    ])
    result = doc.get("result")
    return stack(head, render_result(result) if result is not None else None)


def render_releases(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(
        ["ID", "DATASET", "MECHANISM", "STATUS", "COST", "CREATED"],
        [(d.get("id"), d.get("dataset_id"), d.get("mechanism"), d.get("status"),
          d.get("cost"), d.get("created_at")) for d in docs], empty="no releases")


def render_estimate(doc: Mapping[str, Any]) -> RenderableType:
    known = ("mechanism", "target", "budget", "cost", "accuracy", "remaining", "fits",
             "shortfall")
    return fields([*((k, doc.get(k)) for k in known),
                   *((k, v) for k, v in doc.items() if k not in known)])


def render_jobs(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    def age(value: Any) -> str:
        return f"{value:.0f}s" if isinstance(value, int | float) else "-"

    return table(
        ["ID", "DATASET", "MECHANISM", "STATUS", "AGE", "CREATED"],
        [(d.get("id"), d.get("dataset_id"), d.get("mechanism"), d.get("status"),
          age(d.get("age_seconds")), d.get("created_at")) for d in docs], empty="no jobs")


def render_analysis(doc: Mapping[str, Any]) -> RenderableType:
    head = fields([("id", doc.get("id")), ("analysis", doc.get("analysis")),
                   ("release", doc.get("release_id")), ("status", doc.get("status")),
                   ("params", doc.get("params") or None),
                   ("with", doc.get("releases") or None), ("created", doc.get("created_at")),
                   ("finished", doc.get("finished_at")),
                   ("error", _error_message(doc.get("error")))])
    result = doc.get("result")
    return stack(head, render_result(result) if result is not None else None)


def render_analyses(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(["ID", "ANALYSIS", "STATUS", "CREATED", "FINISHED"],
                 [(d.get("id"), d.get("analysis"), d.get("status"), d.get("created_at"),
                   d.get("finished_at")) for d in docs], empty="no analyses")


def render_mechanisms(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(["NAME", "MEASURES", "ANALYSES", "DESCRIPTION"],
                 [(d.get("name"), d.get("measures"), sorted(d.get("analyses") or {}),
                   " ".join(str(d.get("summary") or d.get("description") or "").split()))
                  for d in docs],
                 empty="no mechanisms")


def _type(schema: Mapping[str, Any]) -> str:
    """A parameter's JSON type, a list's with its items' (``array of number``), a
    number-or-keyword's both (``number or string``)."""
    branches = schema.get("anyOf")
    if not schema.get("type") and isinstance(branches, list) and branches:
        return " or ".join(_type(b) for b in branches if isinstance(b, Mapping))
    kind = str(schema.get("type") or "any")
    items = schema.get("items")
    if kind == "array" and isinstance(items, Mapping) and items.get("type"):
        return f"array of {items['type']}"
    return kind


def _allowed(schema: Mapping[str, Any]) -> str | None:
    """What a parameter's schema allows beyond its type: its values (an enum, also a
    list's items'), its range and its length, as the server checks them."""
    parts: list[str] = []
    branches = schema.get("anyOf")
    for where in (schema, schema.get("items"),
                  *(branches if isinstance(branches, list) else ())):
        if not isinstance(where, Mapping):
            continue
        if where.get("enum"):
            parts.append(", ".join(str(v) for v in where["enum"]))
        low, high = where.get("minimum"), where.get("maximum")
        if low is not None or high is not None:
            parts.append(f"{'' if low is None else low}..{'' if high is None else high}")
    if schema.get("minItems") is not None or schema.get("maxItems") is not None:
        parts.append(f"{schema.get('minItems', 0)}..{schema.get('maxItems', '')} items")
    return "; ".join(parts) or None


def render_mechanism(doc: Mapping[str, Any]) -> RenderableType:
    schema = doc.get("params_schema") or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    params = table(["PARAM", "TYPE", "REQUIRED", "ALLOWED", "DESCRIPTION"],
                   [(name, _type(p), name in required, _allowed(p), p.get("description"))
                    for name, p in props.items() if isinstance(p, Mapping)],
                   empty="no parameters", cell=None)
    return stack(fields([("name", doc.get("name")), ("measures", doc.get("measures")),
                          ("analyses", sorted(doc.get("analyses") or {}) or None),
                          ("description", " ".join(str(doc.get("description") or "").split()))
                          ]), params)


def render_health(doc: Mapping[str, Any]) -> RenderableType:
    return fields([(name, compact(value)) for name, value in doc.items()])


def plain(text: str) -> RenderableType:
    return Text(text)


def amount_notes(doc: Mapping[str, Any]) -> list[str]:
    """The amounts of a budget refusal, as the server sent them (nothing if none)."""
    measure = doc.get("measure")
    unit = f" {clean(str(measure))}" if measure else ""
    parts = [f"{name}: {compact(doc[name])}{unit}" for name in ("requested", "remaining")
             if doc.get(name) is not None]
    if doc.get("shortfall") is not None:
        parts.append(f"shortfall: {compact(doc['shortfall'])}{unit}")
    if not parts:
        return []
    scope = doc.get("scope")
    return ["  " + ", ".join(parts) + (f" ({clean(str(scope))} budget)" if scope else "")]



# -- printing ------------------------------------------------------------------------

def _console(stderr: bool = False) -> Console:
    """Rich on a terminal; plain, unwrapped text when piped (scripts read whole lines)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=None if tty else 100_000, highlight=False,
                   soft_wrap=not tty, force_terminal=None,
                   color_system="auto" if tty else None)


def show(render: RenderableType | str) -> None:
    if isinstance(render, str):
        sys.stdout.write(render if render.endswith("\n") or not render else render + "\n")
        return
    console = _console()
    with console.capture() as cap:
        console.print(render)
    text = "\n".join(line.rstrip() for line in cap.get().splitlines())
    sys.stdout.write(text + "\n")


def format_error(err: ApiError) -> str:
    return (f"error: {err.code}: {clean(err.detail)}"
            + (f" (field: {clean(err.field)})" if err.field else ""))
