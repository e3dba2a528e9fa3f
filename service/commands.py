"""Client subcommands of ``privrelease`` (Click + Rich): every route of a running server.

They talk to the server through :class:`privrelease_client.Client`, print Rich tables for
people and raw JSON (``--json``) for scripts. The server and key come from
``--url``/``--key`` or ``PRIVRELEASE_URL``/``PRIVRELEASE_KEY``. Exit codes: 0 done,
1 the server refused or the release did not succeed, 2 a usage error found locally,
130 interrupted. Text from the server is never read as Rich markup and loses its control
characters, so a dataset name cannot drive the terminal.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem, get_completion_class
from privrelease_client import ApiError, Client, Progress, ReleaseFailed
from privrelease_client import __version__ as client_version
from privrelease_client.client import DEFAULT_URL
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

WAIT_TIMEOUT = 120.0
_CELL = 60  # widest table cell
_NESTED = 200  # longest nested JSON value shown in human output
#: secrets a key's creation answers with, once; never shown anywhere else
_SECRETS = ("token", "callback_secret")


class UsageError(Exception):
    """A mistake found before talking to the server (exit 2, like Click's own)."""


@dataclass
class Output:
    """What a command produced: the JSON document, how to show it, how it ended."""

    doc: Any
    render: Callable[[Any], RenderableType | str]
    status: int = 0
    error: str | None = None
    notes: list[str] = field(default_factory=list)  # more lines for stderr after `error`


Handler = Callable[..., Output]


# -- formatting ------------------------------------------------------------------------

def _clean(text: str) -> str:
    """Printable only: a label from the server must not drive the terminal (ANSI codes)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _num(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _compact(value: Any, limit: int | None = None) -> str:
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
        text = ", ".join(_compact(v) for v in value)
    elif isinstance(value, Mapping) and all(
            isinstance(v, int | float | str | bool) or v is None for v in value.values()):
        text = ", ".join(f"{k}={_compact(v)}" for k, v in value.items())
    else:
        text = json.dumps(value, separators=(",", ":"))
        limit = min(limit or _NESTED, _NESTED)
    text = _clean(text)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          empty: str = "(none)") -> RenderableType:
    """Borderless columns two spaces apart, bold headers on a terminal; ``empty`` if none."""
    cells = [[Text(_compact(v, _CELL)) for v in row] for row in rows]
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
            grid.add_row(Text(f"{k}:", style="bold"), Text(_compact(v)))
    return grid


def _stack(*parts: RenderableType | None) -> RenderableType:
    """Renderables one after another, a blank line between them."""
    shown: list[RenderableType] = []
    for part in parts:
        if part is None:
            continue
        if shown:
            shown.append(Text(""))
        shown.append(part)
    return Group(*shown)


def _render_dataset(doc: Mapping[str, Any]) -> RenderableType:
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
    parts = [head, _render_columns(doc)]
    for warning in doc.get("warnings") or ():  # a possible re-upload of the same people
        if isinstance(warning, Mapping):
            parts.append(Text(f"warning: {warning.get('code')}: "
                              f"{warning.get('message', '')} ({warning.get('dataset_id')})"))
    return _stack(*parts)


def _render_columns(doc: Mapping[str, Any]) -> RenderableType:
    rows = []
    for name, col in (doc.get("columns") or {}).items():
        col = col if isinstance(col, Mapping) else {}
        bounds = col.get("bounds")
        domain = (f"[{_compact(bounds[0])}, {_compact(bounds[1])}]"
                  if isinstance(bounds, list) and len(bounds) == 2 else col.get("categories"))
        rows.append((name, col.get("type"), domain))
    return table(["COLUMN", "TYPE", "DOMAIN"], rows, empty="no columns")


def _render_version(doc: Mapping[str, Any]) -> RenderableType:
    head = fields([
        ("dataset", doc.get("dataset_id")), ("version", doc.get("version")),
        ("current", doc.get("current")), ("status", doc.get("status")),
        ("rows", doc.get("n_rows")), ("sha256", doc.get("sha256")),
        ("created", doc.get("created_at")),
    ])
    return _stack(head, _render_columns(doc))


def _render_versions(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(
        ["VERSION", "CURRENT", "STATUS", "ROWS", "CREATED", "SHA256"],
        [(d.get("version"), "*" if d.get("current") else "", d.get("status"),
          d.get("n_rows"), d.get("created_at"), str(d.get("sha256") or "")[:12])
         for d in docs], empty="no versions")


def _render_datasets(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(
        ["ID", "NAME", "VERSION", "ROWS", "STATUS", "CREATED"],
        [(d.get("id"), d.get("name"), d.get("version"), d.get("n_rows"), d.get("status"),
          d.get("created_at")) for d in docs], empty="no datasets")


_BUDGET_COLS = ("cap", "committed", "reserved", "remaining")


def _render_budget(doc: Mapping[str, Any]) -> RenderableType:
    measures = table(
        ["MEASURE", *(c.upper() for c in _BUDGET_COLS)],
        [(m, *(row.get(c) for c in _BUDGET_COLS))
         for m, row in (doc.get("measures") or {}).items()], empty="no measures")
    allocations = doc.get("allocations") or {}
    if not allocations:
        return measures
    return _stack(measures, Group(Text("allocations:"), table(
        ["KEY", "MEASURE", *(c.upper() for c in _BUDGET_COLS)],
        [(key_id, m, *(row.get(c) for c in _BUDGET_COLS))
         for key_id, rows in allocations.items() for m, row in rows.items()])))


def _key_fields(doc: Mapping[str, Any]) -> list[tuple[str, Any]]:
    grants = doc.get("datasets")
    return [("id", doc.get("id")), ("role", doc.get("role")), ("label", doc.get("label")),
            ("datasets", "all" if grants is None else ", ".join(grants) or "none"),
            ("expires", doc.get("expires_at") or "never"), ("created", doc.get("created_at"))]


def _render_new_key(doc: Mapping[str, Any]) -> RenderableType:
    # the one place a token is printed: the server shows it once and keeps only a hash
    shown = [(name, doc[name]) for name in _SECRETS if doc.get(name)]
    return _stack(fields(_key_fields(doc)), Group(
        fields(shown), Text("(shown once: store them now, they cannot be retrieved again)")))


def _render_keys(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(
        ["ID", "ROLE", "LABEL", "DATASETS", "EXPIRES", "CREATED"],
        [[v for _, v in _key_fields(d)] for d in docs], empty="no keys")


def _render_result(result: Any, prefix: str = "result") -> RenderableType:
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
        return _stack(fields(rest.items()) if rest else None, body)
    if "records" in result and isinstance(result["records"], list):
        result = {**result, "records": f"{len(result['records'])} records (see --json)"}
    return fields((f"{prefix}.{k}", v) for k, v in result.items())


def _error_message(error: Any) -> Any:
    if isinstance(error, Mapping):
        return error.get("message") or error.get("detail") or error
    return error


def _render_release(doc: Mapping[str, Any]) -> RenderableType:
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
    return _stack(head, _render_result(result) if result is not None else None)


def _render_releases(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(
        ["ID", "DATASET", "MECHANISM", "STATUS", "COST", "CREATED"],
        [(d.get("id"), d.get("dataset_id"), d.get("mechanism"), d.get("status"),
          d.get("cost"), d.get("created_at")) for d in docs], empty="no releases")


def _render_estimate(doc: Mapping[str, Any]) -> RenderableType:
    known = ("mechanism", "cost", "accuracy", "remaining", "fits", "shortfall")
    return fields([*((k, doc.get(k)) for k in known),
                   *((k, v) for k, v in doc.items() if k not in known)])


def _render_jobs(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    def age(value: Any) -> str:
        return f"{value:.0f}s" if isinstance(value, int | float) else "-"

    return table(
        ["ID", "DATASET", "MECHANISM", "STATUS", "AGE", "CREATED"],
        [(d.get("id"), d.get("dataset_id"), d.get("mechanism"), d.get("status"),
          age(d.get("age_seconds")), d.get("created_at")) for d in docs], empty="no jobs")


def _render_analysis(doc: Mapping[str, Any]) -> RenderableType:
    head = fields([("id", doc.get("id")), ("analysis", doc.get("analysis")),
                   ("release", doc.get("release_id")), ("status", doc.get("status")),
                   ("params", doc.get("params") or None),
                   ("with", doc.get("releases") or None), ("created", doc.get("created_at")),
                   ("finished", doc.get("finished_at")),
                   ("error", _error_message(doc.get("error")))])
    result = doc.get("result")
    return _stack(head, _render_result(result) if result is not None else None)


def _render_analyses(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(["ID", "ANALYSIS", "STATUS", "CREATED", "FINISHED"],
                 [(d.get("id"), d.get("analysis"), d.get("status"), d.get("created_at"),
                   d.get("finished_at")) for d in docs], empty="no analyses")


def _first_sentence(text: Any) -> str:
    text = " ".join(str(text or "").split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _render_mechanisms(docs: Sequence[Mapping[str, Any]]) -> RenderableType:
    return table(["NAME", "MEASURES", "ANALYSES", "DESCRIPTION"],
                 [(d.get("name"), d.get("measures"), sorted(d.get("analyses") or {}),
                   _first_sentence(d.get("description"))) for d in docs],
                 empty="no mechanisms")


def _render_mechanism(doc: Mapping[str, Any]) -> RenderableType:
    schema = doc.get("params_schema") or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    params = table(["PARAM", "TYPE", "REQUIRED", "DESCRIPTION"],
                   [(name, p.get("type") or p.get("enum") or "-", name in required,
                     p.get("description")) for name, p in props.items()
                    if isinstance(p, Mapping)], empty="no parameters")
    return _stack(fields([("name", doc.get("name")), ("measures", doc.get("measures")),
                          ("analyses", sorted(doc.get("analyses") or {}) or None),
                          ("description", " ".join(str(doc.get("description") or "").split()))
                          ]), params)


def _plain(text: str) -> RenderableType:
    return Text(text)


# -- arguments -------------------------------------------------------------------------

def _number(text: str) -> float | int:
    """An amount as written: ints stay ints, so the server reads exactly what was typed."""
    try:
        return int(text)
    except ValueError:
        value = float(text)  # ValueError propagates to the caller's message
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _amounts(items: Sequence[str] | None, flag: str) -> dict[str, float | int]:
    """``["epsilon=0.5", "delta=1e-6"]`` -> ``{"epsilon": 0.5, "delta": 1e-06}``."""
    out: dict[str, float | int] = {}
    for item in items or ():
        measure, sep, amount = item.rpartition("=")
        try:
            if not sep or not measure:
                raise ValueError(item)
            value = _number(amount)
        except ValueError:
            raise UsageError(f"{flag} {item!r}: expected MEASURE=NUMBER") from None
        if measure in out:
            raise UsageError(f"{flag}: {measure} given twice")
        out[measure] = value
    return out


def _allocations(items: Sequence[str] | None) -> dict[str, dict[str, float | int]]:
    """``["key_1:epsilon=1"]`` -> ``{"key_1": {"epsilon": 1}}`` (measure may hold ':')."""
    out: dict[str, dict[str, float | int]] = {}
    for item in items or ():
        key_id, sep, rest = item.partition(":")
        if not sep or not key_id:
            raise UsageError(f"--allocation {item!r}: expected KEY_ID:MEASURE=NUMBER")
        per_key = out.setdefault(key_id, {})
        for measure, value in _amounts([rest], "--allocation").items():
            if measure in per_key:
                raise UsageError(f"--allocation: {key_id}:{measure} given twice")
            per_key[measure] = value
    return out


def _json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise UsageError(f"{flag} is not valid JSON") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object")
    return value


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read {what} {path}: {err.__class__.__name__}") from None


def _write(path: str, content: str | bytes) -> None:
    try:
        if isinstance(content, bytes):
            Path(path).write_bytes(content)
        else:
            with open(path, "w", encoding="utf-8", newline="") as fh:
                fh.write(content)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.__class__.__name__}") from None


def _amount_notes(doc: Mapping[str, Any]) -> list[str]:
    """The amounts of a budget refusal, as the server sent them (nothing if none)."""
    measure = doc.get("measure")
    unit = f" {_clean(str(measure))}" if measure else ""
    parts = [f"{name}: {_compact(doc[name])}{unit}" for name in ("requested", "remaining")
             if doc.get(name) is not None]
    if doc.get("shortfall") is not None:
        parts.append(f"shortfall: {_compact(doc['shortfall'])}{unit}")
    if not parts:
        return []
    scope = doc.get("scope")
    return ["  " + ", ".join(parts) + (f" ({_clean(str(scope))} budget)" if scope else "")]


# -- running ---------------------------------------------------------------------------

_console_out: Console | None = None


def _console(stderr: bool = False) -> Console:
    """Rich on a terminal; plain, unwrapped text when piped (scripts read whole lines)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=None if tty else 100_000, highlight=False,
                   soft_wrap=not tty, force_terminal=None,
                   color_system="auto" if tty else None)


def _print(render: RenderableType | str) -> None:
    if isinstance(render, str):
        sys.stdout.write(render if render.endswith("\n") or not render else render + "\n")
        return
    console = _console()
    with console.capture() as cap:
        console.print(render)
    text = "\n".join(line.rstrip() for line in cap.get().splitlines())
    sys.stdout.write(text + "\n")


def _format_error(err: ApiError) -> str:
    return (f"error: {err.code}: {_clean(err.detail)}"
            + (f" (field: {_clean(err.field)})" if err.field else ""))


def _make_client(url: str | None, key: str | None) -> Client:
    url = url or os.environ.get("PRIVRELEASE_URL") or DEFAULT_URL
    key = key or os.environ.get("PRIVRELEASE_KEY")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"server URL must start with http:// or https://, not {url!r}")
    if not key:
        raise UsageError("no API key: pass --key or set PRIVRELEASE_KEY")
    return Client(url, key)


def client_command(group: click.Group, name: str, help_text: str,
                   aliases: Sequence[click.Group] = ()) -> Callable[[Handler], click.Command]:
    """A leaf command: ``--url``/``--key``/``--json``, a client, output and exit codes.

    The handler gets the client first and the command's own options as keywords.
    """

    def wrap(handler: Handler) -> click.Command:
        # wraps copies the handler's __click_params__ (its own options and arguments)
        @functools.wraps(handler)
        def run(url: str | None, key: str | None, as_json: bool, **kw: Any) -> None:
            sys.exit(_run(handler, url, key, as_json, kw))

        run = click.option("--json", "as_json", is_flag=True,
                           help="print the raw JSON answer (for scripts)")(run)
        run = click.option("--key", metavar="KEY", help=(
            "API key (env PRIVRELEASE_KEY, preferred: a flag is visible to other local "
            "users in the process list)"))(run)
        run = click.option("--url", metavar="URL", help=(
            f"server URL (env PRIVRELEASE_URL; default {DEFAULT_URL})"))(run)
        cmd = click.command(name, help=help_text, short_help=help_text)(run)
        cmd.params = [p for p in cmd.params if p.name not in {"url", "key", "as_json"}] + [
            p for p in cmd.params if p.name in {"url", "key", "as_json"}]
        group.add_command(cmd)
        for other in aliases:
            other.add_command(cmd)
        return cmd

    return wrap


def _run(handler: Handler, url: str | None, key: str | None, as_json: bool,
         kw: dict[str, Any]) -> int:
    secret = key or os.environ.get("PRIVRELEASE_KEY") or ""

    def redact(text: str) -> str:  # a key must never reach the output by accident
        return text.replace(secret, "<key>") if len(secret) >= 8 else text

    def fail(lines: Sequence[str]) -> None:
        for line in lines:
            sys.stderr.write(redact(line) + "\n")

    try:
        with _make_client(url, key) as client:
            out = handler(client, **kw)
    except UsageError as err:
        fail([f"error: {err}"])
        return 2
    except ApiError as err:
        fail([_format_error(err), *_amount_notes(err.body)])
        return 1
    except KeyboardInterrupt:
        fail(["error: interrupted"])
        return 130
    try:
        if as_json:
            _print(json.dumps(out.doc, indent=2))
        else:
            _print(out.render(out.doc))
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader is gone, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if out.error:
        fail([f"error: {out.error}", *out.notes])
    return out.status


# -- the command tree ------------------------------------------------------------------

def _version_message() -> str:
    try:
        from importlib.metadata import version

        server = version("privrelease")
    except Exception:  # a source checkout without installed metadata
        server = "unknown"
    return f"privrelease {server} (privrelease-client {client_version})"


@click.group(name="privrelease", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(message="%(version)s", version=_version_message(),
                      package_name="privrelease")
def cli() -> None:
    """privrelease: run the service (standalone, api, worker) or use a running one.

    The client commands read the server from PRIVRELEASE_URL and the key from
    PRIVRELEASE_KEY. Shell completion: `eval "$(privrelease completion bash)"`.
    """


@cli.group("datasets")
def datasets() -> None:
    """upload, inspect and retire datasets"""


@cli.group("budget")
def budget_group() -> None:
    """show and set a dataset's privacy budget"""


@cli.group("keys")
def keys() -> None:
    """create, list and revoke API keys"""


@cli.group("release")
def release() -> None:
    """estimate, request, read and cancel releases"""


@cli.group("analyses")
def analyses() -> None:
    """free post-processing of releases: run, list, show, cancel"""


@cli.group("jobs")
def jobs() -> None:
    """the job queue (operators)"""


# datasets ----------------------------------------------------------------------------

@client_command(datasets, "upload",
                "register a CSV or Parquet file with its public metadata")
@click.argument("file", metavar="FILE")
@click.option("--metadata", metavar="JSONFILE", help="metadata JSON file")
@click.option("--metadata-json", metavar="STR", help="metadata JSON text")
def _datasets_upload(c: Client, file: str, metadata: str | None,
                     metadata_json: str | None) -> Output:
    if (metadata is None) == (metadata_json is None):
        raise UsageError("give exactly one of --metadata and --metadata-json")
    meta = metadata_json if metadata_json is not None else _read_text(str(metadata),
                                                                       "metadata")
    if not Path(file).is_file():
        raise UsageError(f"cannot read data file {file}")
    return Output(c.upload_dataset(file, meta), _render_dataset)


@datasets.group("versions")
def versions() -> None:
    """versions of a dataset: the same people, one budget"""


def _metadata_text(metadata: str | None, metadata_json: str | None) -> str | None:
    if metadata is not None and metadata_json is not None:
        raise UsageError("give at most one of --metadata and --metadata-json")
    if metadata is not None:
        return _read_text(metadata, "metadata")
    return metadata_json


@client_command(versions, "upload", "upload the next version (spends the dataset's "
                "budget; not current unless --make-current)")
@click.argument("dataset_id", metavar="ID")
@click.argument("file", metavar="FILE")
@click.option("--metadata", metavar="JSONFILE",
              help="changed metadata JSON file (default: the dataset's)")
@click.option("--metadata-json", metavar="STR", help="changed metadata JSON text")
@click.option("--compatible", is_flag=True,
              help="declare the changed metadata compatible (needed with --metadata)")
@click.option("--make-current", is_flag=True, help="make it the current version at once")
def _versions_upload(c: Client, dataset_id: str, file: str, metadata: str | None,
                     metadata_json: str | None, compatible: bool,
                     make_current: bool) -> Output:
    meta = _metadata_text(metadata, metadata_json)
    if not Path(file).is_file():
        raise UsageError(f"cannot read data file {file}")
    doc = c.upload_version(dataset_id, file, meta, compatible=compatible,
                           make_current=make_current)
    return Output(doc, _render_version)


@client_command(versions, "list", "every version of a dataset, oldest first")
@click.argument("dataset_id", metavar="ID")
def _versions_list(c: Client, dataset_id: str) -> Output:
    return Output(c.list_versions(dataset_id), _render_versions)


@client_command(versions, "show", "one version of a dataset")
@click.argument("dataset_id", metavar="ID")
@click.argument("version", type=int, metavar="VERSION")
def _versions_show(c: Client, dataset_id: str, version: int) -> Output:
    return Output(c.get_version(dataset_id, version), _render_version)


@client_command(versions, "current", "make a version current (releases default to it)")
@click.argument("dataset_id", metavar="ID")
@click.argument("version", type=int, metavar="VERSION")
def _versions_current(c: Client, dataset_id: str, version: int) -> Output:
    return Output(c.set_current_version(dataset_id, version), _render_version)


@client_command(versions, "retire", "no new releases on a version (not the current one);"
                " its releases stay readable")
@click.argument("dataset_id", metavar="ID")
@click.argument("version", type=int, metavar="VERSION")
def _versions_retire(c: Client, dataset_id: str, version: int) -> Output:
    return Output(c.retire_version(dataset_id, version), _render_version)


@client_command(datasets, "list", "datasets this key may see")
def _datasets_list(c: Client) -> Output:
    return Output(c.list_datasets(), _render_datasets)


@client_command(datasets, "show", "one dataset's metadata")
@click.argument("dataset_id", metavar="ID")
def _datasets_show(c: Client, dataset_id: str) -> Output:
    return Output(c.get_dataset(dataset_id), _render_dataset)


@client_command(datasets, "retire", "retire a dataset: no new releases; kept for audit")
@click.argument("dataset_id", metavar="ID")
def _datasets_retire(c: Client, dataset_id: str) -> Output:
    return Output(c.retire_dataset(dataset_id), _render_dataset)


# budget and ledger ---------------------------------------------------------------------

@client_command(budget_group, "show", "cap, committed, reserved and remaining per measure")
@click.argument("dataset", metavar="DATASET")
def _budget_show(c: Client, dataset: str) -> Output:
    return Output(c.get_budget(dataset), _render_budget)


@client_command(budget_group, "set", "change caps and per-key allocations")
@click.argument("dataset", metavar="DATASET")
@click.option("--cap", multiple=True, metavar="MEASURE=NUMBER",
              help="new cap, e.g. epsilon=5 (repeatable)")
@click.option("--allocation", multiple=True, metavar="KEY_ID:MEASURE=NUMBER",
              help="a key's share, e.g. key_1:epsilon=1 (repeatable)")
def _budget_set(c: Client, dataset: str, cap: tuple[str, ...],
                allocation: tuple[str, ...]) -> Output:
    caps = _amounts(cap, "--cap")
    allocations = _allocations(allocation)
    if not caps and not allocations:
        raise UsageError("budget set needs --cap and/or --allocation")
    doc = c.set_budget(dataset, caps=caps or None, allocations=allocations or None)
    return Output(doc, _render_budget)


_KINDS = ["cap", "allocation", "reserve", "commit", "abort", "cancel", "retire", "version",
          "policy"]
#: the server judges the filter (a newer server may know more statuses, e.g. pricing)
_JOB_STATUSES = ["pricing", "queued", "running", "failed"]


def _suggest(values: Sequence[str]) -> Callable[..., list[CompletionItem]]:
    """Shell completion from a known list, without refusing other values locally: the
    server validates (and a newer server may accept more)."""

    def complete(ctx: click.Context, param: click.Parameter,
                 incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(v) for v in values if v.startswith(incomplete)]

    return complete


@client_command(cli, "ledger", "export a dataset's audit events as JSONL")
@click.argument("dataset", metavar="DATASET")
@click.option("--kind", multiple=True, shell_complete=_suggest(_KINDS),
              help=f"only these event kinds (repeatable): {', '.join(_KINDS)}")
@click.option("--since", metavar="ISO", help="events at or after this time")
@click.option("--until", metavar="ISO", help="events before this time")
@click.option("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
def _ledger(c: Client, dataset: str, kind: tuple[str, ...], since: str | None,
            until: str | None, output: str | None) -> Output:
    text = c.export_ledger(dataset, kind=list(kind) or None, since=since, until=until)
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    if output:
        _write(output, text)
        return Output({"file": output, "events": len(events)},
                      lambda d: _plain(f"{d['events']} events -> {d['file']}"))
    return Output(events, lambda _: text)


# `audit` is the same export under the name operators look for
cli.add_command(_ledger, "audit")


# keys --------------------------------------------------------------------------------

@client_command(keys, "create", "a new key; its token is printed once")
@click.option("--role", required=True, type=click.Choice(["operator", "analyst", "consumer"]))
@click.option("--label")
@click.option("--dataset", "datasets_", multiple=True, metavar="ID",
              help="a dataset the key may use (repeatable; default: all)")
@click.option("--expires", metavar="ISO", help="expiry, ISO 8601 (default: never)")
def _keys_create(c: Client, role: str, label: str | None, datasets_: tuple[str, ...],
                 expires: str | None) -> Output:
    doc = c.create_key(role, label=label, datasets=list(datasets_) or None,
                       expires_at=expires)
    return Output(doc, _render_new_key)


@client_command(keys, "list", "every key (never their tokens)")
def _keys_list(c: Client) -> Output:
    # a token must never be listed, even if a server sent one by mistake
    docs = [{k: v for k, v in d.items() if k not in _SECRETS} for d in c.list_keys()]
    return Output(docs, _render_keys)


@client_command(keys, "revoke", "revoke a key at once")
@click.argument("key_id", metavar="KEY_ID")
def _keys_revoke(c: Client, key_id: str) -> Output:
    c.revoke_key(key_id)
    return Output({"id": key_id, "revoked": True}, lambda d: _plain(f"revoked {d['id']}"))


# releases ----------------------------------------------------------------------------

def _request_options(fn: Callable[..., Output]) -> Callable[..., Output]:
    """--dataset, --mechanism, --params, --budget: what a release and an estimate take."""
    for opt in reversed([
        click.option("--dataset", required=True, metavar="ID"),
        click.option("--mechanism", required=True, metavar="M",
                     help="a name from `privrelease mechanisms`"),
        click.option("--params", default="{}", metavar="JSON",
                     help='mechanism parameters, e.g. \'{"statistic": "mean", '
                          '"column": "age"}\''),
        click.option("--budget", multiple=True, metavar="MEASURE=NUMBER",
                     help="what to spend, e.g. epsilon=0.5 (repeatable)"),
        click.option("--dataset-version", type=int, metavar="N",
                     help="the dataset version (default: its current one)"),
    ]):
        fn = opt(fn)
    return fn


def _request(params: str, budget: tuple[str, ...], what: str
             ) -> tuple[dict[str, Any], dict[str, float | int]]:
    body = _json_object(params, "--params")
    amounts = _amounts(budget, "--budget")
    if not amounts:
        raise UsageError(f"{what} needs --budget MEASURE=NUMBER")
    return body, amounts


@client_command(release, "create", "request a release (reserves its cost)")
@_request_options
@click.option("--wait", is_flag=True, help="wait for the result")
@click.option("--timeout", type=float, default=WAIT_TIMEOUT, metavar="S",
              help=f"seconds to --wait (default {WAIT_TIMEOUT:g})")
def _release_create(c: Client, dataset: str, mechanism: str, params: str,
                    budget: tuple[str, ...], dataset_version: int | None, wait: bool,
                    timeout: float) -> Output:
    body, amounts = _request(params, budget, "release create")
    doc = c.create_release(dataset, mechanism, body, amounts, version=dataset_version)
    if not wait:
        return Output(doc, _render_release)
    progress = Progress(sys.stderr, enabled=sys.stderr.isatty())
    try:
        final = c.wait(doc["id"], timeout, on_poll=progress)
    except TimeoutError as err:
        return Output(progress.last or doc, _render_release, 1, f"timeout: {err}")
    except KeyboardInterrupt:
        return Output(progress.last or doc, _render_release, 130,
                      f"interrupted: release {doc['id']} goes on on the server")
    finally:
        progress.clear()
    if final.get("replayed") is None and doc.get("replayed"):
        final = {**final, "replayed": True}
    if final.get("status") != "succeeded":
        failed = ReleaseFailed(final)
        message = f"release_{final.get('status')}: "
        if failed.code != f"release_{final.get('status')}":
            message += f"{failed.code}: "
        return Output(final, _render_release, 1, message + _clean(failed.detail),
                      _amount_notes(failed.body))
    return Output(final, _render_release)


@client_command(release, "estimate", "cost, expected accuracy and remaining budget; "
                "spends nothing", aliases=[cli])
@_request_options
def _release_estimate(c: Client, dataset: str, mechanism: str, params: str,
                      budget: tuple[str, ...], dataset_version: int | None) -> Output:
    body, amounts = _request(params, budget, "estimate")
    return Output(c.estimate_release(dataset, mechanism, body, amounts,
                                     version=dataset_version), _render_estimate)


@client_command(release, "show", "status, result, cost, accuracy, provenance")
@click.argument("release_id", metavar="ID")
def _release_show(c: Client, release_id: str) -> Output:
    return Output(c.get_release(release_id), _render_release)


@client_command(release, "list", "releases, newest first (one page unless --all)")
@click.option("--dataset", metavar="ID")
@click.option("--limit", type=int, metavar="N", help="page size")
@click.option("--all", "all_pages", is_flag=True, help="follow the cursor to the last page")
def _release_list(c: Client, dataset: str | None, limit: int | None,
                  all_pages: bool) -> Output:
    if all_pages:
        docs = list(c.iter_releases(dataset_id=dataset, page_size=limit))
    else:
        docs = c.list_releases(dataset_id=dataset, limit=limit)
    return Output(docs, _render_releases)


@client_command(release, "data", "download a release's record-level data as CSV")
@click.argument("release_id", metavar="ID")
@click.option("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
def _release_data(c: Client, release_id: str, output: str | None) -> Output:
    text = c.release_data(release_id)
    if output:
        _write(output, text)
        rows = max(len(text.splitlines()) - 1, 0)
        return Output({"file": output, "rows": rows},
                      lambda d: _plain(f"{d['rows']} rows -> {d['file']}"))
    return Output(text, lambda t: t)


def _is_svg(path: str) -> bool:
    """Whether a plot's output file asks for SVG (by its suffix; anything else is PNG)."""
    return path.lower().endswith(".svg")


def _written(output: str, content: bytes) -> Output:
    _write(output, content)
    return Output({"file": output, "bytes": len(content)},
                  lambda d: _plain(f"{d['bytes']} bytes -> {d['file']}"))


@client_command(release, "plot", "download the server's drawing of a release (PNG, or SVG "
                "for a .svg file)")
@click.argument("release_id", metavar="ID")
@click.option("--output", "-o", required=True, metavar="FILE",
              help="file to write: SVG when it ends in .svg, else PNG")
def _release_plot(c: Client, release_id: str, output: str) -> Output:
    fetch = c.release_plot_svg if _is_svg(output) else c.release_plot
    return _written(output, fetch(release_id))


@client_command(release, "cancel", "cancel a queued release; its budget is refunded")
@click.argument("release_id", metavar="ID")
def _release_cancel(c: Client, release_id: str) -> Output:
    return Output(c.cancel_job(release_id), _render_release)


# analyses ----------------------------------------------------------------------------

@client_command(analyses, "run", "free post-processing of a release's output")
@click.argument("release_id", metavar="RELEASE")
@click.option("--analysis", required=True, metavar="NAME", help="e.g. npmle, estimate")
@click.option("--params", default="{}", metavar="JSON")
@click.option("--with", "others", multiple=True, metavar="RELEASE_ID",
              help="another release the analysis combines (repeatable)")
@click.option("--wait", is_flag=True, help="wait for the result")
@click.option("--timeout", type=float, default=WAIT_TIMEOUT, metavar="S")
def _analyses_run(c: Client, release_id: str, analysis: str, params: str,
                  others: tuple[str, ...], wait: bool, timeout: float) -> Output:
    doc = c.analyze(release_id, analysis, _json_object(params, "--params"), list(others))
    if not wait:
        return Output(doc, _render_analysis)
    try:
        final = c.wait_analysis(release_id, doc["id"], timeout)
    except TimeoutError as err:
        return Output(doc, _render_analysis, 1, f"timeout: {err}")
    if final.get("status") != "succeeded":
        failed = ReleaseFailed(final)
        return Output(final, _render_analysis, 1,
                      f"analysis_{final.get('status')}: {failed.code}: "
                      f"{_clean(failed.detail)}")
    return Output(final, _render_analysis)


# the name this command had before `analyses` existed
release.add_command(_analyses_run, "analyze")


@client_command(analyses, "list", "a release's analyses, newest first (all pages)")
@click.argument("release_id", metavar="RELEASE")
def _analyses_list(c: Client, release_id: str) -> Output:
    return Output(list(c.iter_analyses(release_id)), _render_analyses)


@client_command(analyses, "show", "one analysis: status, params, result")
@click.argument("release_id", metavar="RELEASE")
@click.argument("analysis_id", metavar="ANALYSIS")
def _analyses_show(c: Client, release_id: str, analysis_id: str) -> Output:
    return Output(c.get_analysis(release_id, analysis_id), _render_analysis)


@client_command(analyses, "cancel", "cancel an analysis that has not finished")
@click.argument("release_id", metavar="RELEASE")
@click.argument("analysis_id", metavar="ANALYSIS")
def _analyses_cancel(c: Client, release_id: str, analysis_id: str) -> Output:
    return Output(c.cancel_analysis(release_id, analysis_id), _render_analysis)


@client_command(analyses, "plot", "download the server's drawing of an analysis (PNG, or "
                "SVG for a .svg file)")
@click.argument("release_id", metavar="RELEASE")
@click.argument("analysis_id", metavar="ANALYSIS")
@click.option("--output", "-o", required=True, metavar="FILE",
              help="file to write: SVG when it ends in .svg, else PNG")
def _analyses_plot(c: Client, release_id: str, analysis_id: str, output: str) -> Output:
    fetch = c.analysis_plot_svg if _is_svg(output) else c.analysis_plot
    return _written(output, fetch(release_id, analysis_id))


# jobs and catalog ----------------------------------------------------------------------

@client_command(jobs, "list", "pricing, queued and running jobs, then failed and refused ones")
@click.option("--status", shell_complete=_suggest(_JOB_STATUSES),
              help=f"only jobs in this status: {', '.join(_JOB_STATUSES)}")
@click.option("--limit", type=int, metavar="N", help="page size")
def _jobs_list(c: Client, status: str | None, limit: int | None) -> Output:
    return Output(list(c.iter_jobs(status=status, page_size=limit)), _render_jobs)


@client_command(jobs, "cancel", "cancel a queued job; its budget is refunded")
@click.argument("job_id", metavar="ID")
def _jobs_cancel(c: Client, job_id: str) -> Output:
    return Output(c.cancel_job(job_id), _render_release)


@client_command(cli, "mechanisms", "the mechanism catalog (one mechanism with NAME)")
@click.argument("name", required=False, metavar="[NAME]")
def _mechanisms(c: Client, name: str | None) -> Output:
    docs = c.mechanisms()
    if name is None:
        return Output(docs, _render_mechanisms)
    found = [d for d in docs if d.get("name") == name]
    if not found:
        raise UsageError(f"no mechanism {name!r} (see `privrelease mechanisms`)")
    return Output(found[0], _render_mechanism)


@client_command(cli, "health", "whether the server is up (healthz) and ready (readyz)")
def _health(c: Client) -> Output:
    doc = {"healthz": c.health()}
    try:
        doc["readyz"] = c.ready()
    except ApiError as err:  # 503 while Valkey or the workers are away: said, exit 1
        doc["readyz"] = err.body
        return Output(doc, _render_health, 1, f"not ready: {err.code}: {_clean(err.detail)}")
    return Output(doc, _render_health)


def _render_health(doc: Mapping[str, Any]) -> RenderableType:
    return fields([(name, _compact(value)) for name, value in doc.items()])


@client_command(cli, "openapi", "the server's OpenAPI document (e.g. to generate a client)")
@click.option("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
def _openapi(c: Client, output: str | None) -> Output:
    doc = c.openapi()
    if output:
        _write(output, json.dumps(doc, indent=2) + "\n")
        return Output({"file": output, "paths": len(doc.get("paths") or {})},
                      lambda d: _plain(f"{d['paths']} paths -> {d['file']}"))
    return Output(doc, lambda d: json.dumps(d, indent=2))


@cli.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def _completion(shell: str) -> None:
    """print the shell completion script, e.g. eval "$(privrelease completion bash)" """
    cls = get_completion_class(shell)
    assert cls is not None  # the Choice above lists only shells Click supports
    click.echo(cls(cli, {}, "privrelease", "_PRIVRELEASE_COMPLETE").source())
