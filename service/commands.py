"""Client subcommands of ``privrelease``: datasets, budget, keys, release, jobs.

They talk to a running server through :class:`service.client.Client`, print small
tables for people and raw JSON (``--json``) for scripts. The server and key come from
``--url``/``--key`` or ``PRIVRELEASE_URL``/``PRIVRELEASE_KEY``. Exit codes: 0 done,
1 the server refused or the release did not succeed, 2 a usage error found locally.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from service.client import ApiError, Client

DEFAULT_URL = "http://127.0.0.1:8000"
WAIT_TIMEOUT = 120.0
_CELL = 60  # widest table cell
_NESTED = 200  # longest nested JSON value shown in human output


class UsageError(Exception):
    """A mistake found before talking to the server (exit 2, like argparse's own)."""


@dataclass
class Output:
    """What a command produced: the JSON document, how to show it, how it ended."""

    doc: Any
    render: Callable[[Any], str]
    status: int = 0
    error: str | None = None


Handler = Callable[[Client, argparse.Namespace], Output]


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


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
                 empty: str = "(none)") -> str:
    """Left-aligned columns two spaces apart; ``empty`` when there are no rows."""
    cells = [[_compact(v, _CELL) for v in row] for row in rows]
    if not cells:
        return empty
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [list(headers), *cells]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def format_fields(pairs: Iterable[tuple[str, Any]]) -> str:
    """``name: value`` lines, names aligned; absent (None) fields are skipped."""
    items = [(k, _compact(v)) for k, v in pairs if v is not None]
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{(k + ':').ljust(width + 1)} {v}" for k, v in items)


def _render_dataset(doc: Mapping[str, Any]) -> str:
    head = format_fields([
        ("id", doc.get("id")), ("name", doc.get("name")), ("version", doc.get("version")),
        ("status", doc.get("status")), ("rows", doc.get("n_rows")),
        ("budgets", doc.get("budgets")), ("created", doc.get("created_at")),
    ])
    rows = []
    for name, col in (doc.get("columns") or {}).items():
        col = col if isinstance(col, Mapping) else {}
        bounds = col.get("bounds")
        domain = (f"[{_compact(bounds[0])}, {_compact(bounds[1])}]"
                  if isinstance(bounds, list) and len(bounds) == 2 else col.get("categories"))
        rows.append((name, col.get("type"), domain))
    return head + "\n\n" + format_table(["COLUMN", "TYPE", "DOMAIN"], rows, empty="no columns")


def _render_datasets(docs: Sequence[Mapping[str, Any]]) -> str:
    return format_table(
        ["ID", "NAME", "VERSION", "ROWS", "STATUS", "CREATED"],
        [(d.get("id"), d.get("name"), d.get("version"), d.get("n_rows"), d.get("status"),
          d.get("created_at")) for d in docs], empty="no datasets")


_BUDGET_COLS = ("cap", "committed", "reserved", "remaining")


def _render_budget(doc: Mapping[str, Any]) -> str:
    out = format_table(
        ["MEASURE", *(c.upper() for c in _BUDGET_COLS)],
        [(m, *(row.get(c) for c in _BUDGET_COLS))
         for m, row in (doc.get("measures") or {}).items()], empty="no measures")
    allocations = doc.get("allocations") or {}
    if allocations:
        out += "\n\nallocations:\n" + format_table(
            ["KEY", "MEASURE", *(c.upper() for c in _BUDGET_COLS)],
            [(key_id, m, *(row.get(c) for c in _BUDGET_COLS))
             for key_id, rows in allocations.items() for m, row in rows.items()])
    return out


def _key_fields(doc: Mapping[str, Any]) -> list[tuple[str, Any]]:
    grants = doc.get("datasets")
    return [("id", doc.get("id")), ("role", doc.get("role")), ("label", doc.get("label")),
            ("datasets", "all" if grants is None else ", ".join(grants) or "none"),
            ("expires", doc.get("expires_at") or "never"), ("created", doc.get("created_at"))]


#: secrets a key's creation answers with, once; never shown anywhere else
_SECRETS = ("token", "callback_secret")


def _render_new_key(doc: Mapping[str, Any]) -> str:
    # the one place a token is printed: the server shows it once and keeps only a hash
    shown = [(name, doc[name]) for name in _SECRETS if doc.get(name)]
    return (format_fields(_key_fields(doc)) + "\n\n" + format_fields(shown)
            + "\n(shown once: store them now, they cannot be retrieved again)")


def _render_keys(docs: Sequence[Mapping[str, Any]]) -> str:
    return format_table(
        ["ID", "ROLE", "LABEL", "DATASETS", "EXPIRES", "CREATED"],
        [[v for _, v in _key_fields(d)] for d in docs], empty="no keys")


def _render_result(result: Any) -> str:
    if not isinstance(result, Mapping):
        return f"result: {_compact(result)}"
    values = result.get("values")
    labels = next((result[k] for k in ("categories", "bins", "grid")
                   if isinstance(result.get(k), list)), None)
    if isinstance(values, list) and labels is not None and len(labels) >= len(values):
        rest = {k: v for k, v in result.items()
                if k not in {"values", "categories", "bins", "grid"}}
        table = format_table(["AT", "VALUE"], zip(labels, values, strict=False))
        return (format_fields(rest.items()) + "\n" if rest else "") + "result:\n" + table
    if "records" in result and isinstance(result["records"], list):
        result = {**result, "records": f"{len(result['records'])} records (see --json)"}
    return format_fields((f"result.{k}", v) for k, v in result.items())


def _render_release(doc: Mapping[str, Any]) -> str:
    dataset = doc.get("dataset_id")
    if doc.get("dataset_version") is not None:
        dataset = f"{dataset} (v{doc['dataset_version']})"
    error = doc.get("error")
    if isinstance(error, Mapping):
        error = error.get("message") or error
    out = format_fields([
        ("id", doc.get("id")), ("status", doc.get("status")), ("dataset", dataset),
        ("mechanism", doc.get("mechanism")), ("params", doc.get("params")),
        ("cost", doc.get("cost")), ("replayed", doc.get("replayed") or None),
        ("seeded", doc.get("seeded") or None), ("created", doc.get("created_at")),
        ("finished", doc.get("finished_at")), ("guarantee", doc.get("guarantee")),
        ("accuracy", doc.get("accuracy")), ("error", error),
    ])
    if doc.get("result") is not None:
        out += "\n\n" + _render_result(doc["result"])
    return out


def _render_releases(docs: Sequence[Mapping[str, Any]]) -> str:
    return format_table(
        ["ID", "DATASET", "MECHANISM", "STATUS", "COST", "CREATED"],
        [(d.get("id"), d.get("dataset_id"), d.get("mechanism"), d.get("status"),
          d.get("cost"), d.get("created_at")) for d in docs], empty="no releases")


def _render_jobs(docs: Sequence[Mapping[str, Any]]) -> str:
    def age(value: Any) -> str:
        return f"{value:.0f}s" if isinstance(value, int | float) else "-"

    return format_table(
        ["ID", "DATASET", "MECHANISM", "STATUS", "AGE", "CREATED"],
        [(d.get("id"), d.get("dataset_id"), d.get("mechanism"), d.get("status"),
          age(d.get("age_seconds")), d.get("created_at")) for d in docs], empty="no jobs")


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


# -- handlers --------------------------------------------------------------------------

def _datasets_upload(c: Client, a: argparse.Namespace) -> Output:
    meta = a.metadata_json if a.metadata_json is not None else _read_text(a.metadata,
                                                                           "metadata")
    if not Path(a.file).is_file():
        raise UsageError(f"cannot read CSV file {a.file}")
    return Output(c.upload_dataset(a.file, meta), _render_dataset)


def _datasets_list(c: Client, a: argparse.Namespace) -> Output:
    return Output(c.list_datasets(), _render_datasets)


def _datasets_show(c: Client, a: argparse.Namespace) -> Output:
    return Output(c.get_dataset(a.id), _render_dataset)


def _budget_show(c: Client, a: argparse.Namespace) -> Output:
    return Output(c.get_budget(a.dataset), _render_budget)


def _budget_set(c: Client, a: argparse.Namespace) -> Output:
    caps = _amounts(a.cap, "--cap")
    allocations = _allocations(a.allocation)
    if not caps and not allocations:
        raise UsageError("budget set needs --cap and/or --allocation")
    doc = c.set_budget(a.dataset, caps=caps or None, allocations=allocations or None)
    return Output(doc, _render_budget)


def _keys_create(c: Client, a: argparse.Namespace) -> Output:
    doc = c.create_key(a.role, label=a.label, datasets=a.dataset, expires_at=a.expires)
    return Output(doc, _render_new_key)


def _keys_list(c: Client, a: argparse.Namespace) -> Output:
    # a token must never be listed, even if a server sent one by mistake
    docs = [{k: v for k, v in d.items() if k not in _SECRETS} for d in c.list_keys()]
    return Output(docs, _render_keys)


def _keys_revoke(c: Client, a: argparse.Namespace) -> Output:
    c.revoke_key(a.key_id)
    return Output({"id": a.key_id, "revoked": True}, lambda d: f"revoked {d['id']}")


class Progress:
    """A spinner with elapsed seconds on stderr while waiting; silent unless a TTY."""

    FRAMES = "|/-\\"

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.last: dict[str, Any] | None = None
        self._frame = 0
        self._shown = False

    def __call__(self, doc: dict[str, Any], elapsed: float) -> None:
        self.last = doc
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


def _release_create(c: Client, a: argparse.Namespace) -> Output:
    params = _json_object(a.params, "--params")
    budget = _amounts(a.budget, "--budget")
    if not budget:
        raise UsageError("release create needs --budget MEASURE=NUMBER")
    doc = c.create_release(a.dataset, a.mechanism, params, budget)
    if not a.wait:
        return Output(doc, _render_release)
    progress = Progress(sys.stderr)
    try:
        final = c.wait(doc["id"], a.timeout, on_poll=progress)
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
        error = final.get("error")
        message = error.get("message") if isinstance(error, Mapping) else error
        return Output(final, _render_release, 1,
                      f"release_{final.get('status')}: {message or 'no detail'}")
    return Output(final, _render_release)


def _release_show(c: Client, a: argparse.Namespace) -> Output:
    return Output(c.get_release(a.id), _render_release)


def _release_list(c: Client, a: argparse.Namespace) -> Output:
    return Output(c.list_releases(dataset_id=a.dataset, limit=a.limit), _render_releases)


def _release_data(c: Client, a: argparse.Namespace) -> Output:
    text = c.release_data(a.id)
    if a.output:
        with open(a.output, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        rows = max(text.count("\n") - 1, 0)
        return Output({"file": a.output, "rows": rows}, lambda d: f"{d['rows']} rows -> "
                      f"{d['file']}")
    return Output(text, str)


def _render_analysis(doc: Mapping[str, Any]) -> str:
    head = format_fields([("id", doc.get("id")), ("analysis", doc.get("analysis")),
                          ("release", doc.get("release_id")), ("status", doc.get("status"))])
    body = doc.get("result") if doc.get("status") == "succeeded" else doc.get("error")
    return head + ("\n\n" + json.dumps(body, indent=2) if body is not None else "")


def _release_analyze(c: Client, a: argparse.Namespace) -> Output:
    doc = c.analyze(a.id, a.analysis, _json_object(a.params, "--params"), a.others or ())
    if not a.wait:
        return Output(doc, _render_analysis)
    final = c.wait_analysis(a.id, doc["id"], a.timeout)
    return Output(final, _render_analysis, 0 if final.get("status") == "succeeded" else 1)


def _jobs_list(c: Client, a: argparse.Namespace) -> Output:
    return Output(c.list_jobs(), _render_jobs)


def _jobs_cancel(c: Client, a: argparse.Namespace) -> Output:
    return Output(c.cancel_job(a.id), _render_release)


# -- running ---------------------------------------------------------------------------

def _client(a: argparse.Namespace) -> Client:
    url = a.url or os.environ.get("PRIVRELEASE_URL") or DEFAULT_URL
    key = a.key or os.environ.get("PRIVRELEASE_KEY")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"server URL must start with http:// or https://, not {url!r}")
    if not key:
        raise UsageError("no API key: pass --key or set PRIVRELEASE_KEY")
    return Client(url, key)


def _format_error(err: ApiError) -> str:
    return (f"error: {err.code}: {_clean(err.detail)}"
            + (f" (field: {_clean(err.field)})" if err.field else ""))


def _runner(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """Wrap a handler: build the client, print the outcome, map failures to exit codes."""

    def run(a: argparse.Namespace) -> int:
        key = a.key or os.environ.get("PRIVRELEASE_KEY") or ""

        def redact(text: str) -> str:  # a key must never reach the output by accident
            return text.replace(key, "<key>") if len(key) >= 8 else text

        try:
            with _client(a) as client:
                out = handler(client, a)
        except UsageError as err:
            print(f"error: {redact(str(err))}", file=sys.stderr)
            return 2
        except ApiError as err:
            print(redact(_format_error(err)), file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130
        try:
            if a.as_json:
                print(json.dumps(out.doc, indent=2))
            else:
                print(out.render(out.doc))
            sys.stdout.flush()
        except BrokenPipeError:  # `... | head`: the reader is gone, not an error of ours
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if out.error:
            print(f"error: {redact(out.error)}", file=sys.stderr)
        return out.status

    return run


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client subcommands (datasets, budget, keys, release, jobs) to ``privrelease``."""
    common = argparse.ArgumentParser(add_help=False)
    server = common.add_argument_group("server")
    server.add_argument("--url", help=f"server URL (env PRIVRELEASE_URL; default {DEFAULT_URL})")
    server.add_argument("--key", help="API key (env PRIVRELEASE_KEY, preferred: a flag is "
                                      "visible to other local users in the process list)")
    common.add_argument("--json", dest="as_json", action="store_true",
                        help="print the raw JSON answer (for scripts)")

    def group(name: str, help_text: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        p = subparsers.add_parser(name, help=help_text, description=help_text)
        return p.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")

    def leaf(parent: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
             handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = parent.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=_runner(handler))
        return p

    g = group("datasets", "upload and inspect datasets (client of a running server)")
    p = leaf(g, "upload", _datasets_upload, "register a CSV with its public metadata")
    p.add_argument("file", metavar="FILE", help="CSV with a header row")
    meta = p.add_mutually_exclusive_group(required=True)
    meta.add_argument("--metadata", metavar="JSONFILE", help="metadata JSON file")
    meta.add_argument("--metadata-json", metavar="STR", help="metadata JSON text")
    leaf(g, "list", _datasets_list, "datasets this key may see")
    p = leaf(g, "show", _datasets_show, "one dataset's metadata")
    p.add_argument("id", metavar="ID")

    g = group("budget", "show and set a dataset's privacy budget")
    p = leaf(g, "show", _budget_show, "cap, committed, reserved and remaining per measure")
    p.add_argument("dataset", metavar="DATASET")
    p = leaf(g, "set", _budget_set, "change caps and per-key allocations")
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--cap", action="append", metavar="MEASURE=NUMBER",
                   help="new cap, e.g. epsilon=5 (repeatable)")
    p.add_argument("--allocation", action="append", metavar="KEY_ID:MEASURE=NUMBER",
                   help="a key's share, e.g. key_1:epsilon=1 (repeatable)")

    g = group("keys", "create, list and revoke API keys")
    p = leaf(g, "create", _keys_create, "a new key; its token is printed once")
    p.add_argument("--role", required=True, choices=["operator", "analyst", "consumer"])
    p.add_argument("--label")
    p.add_argument("--dataset", action="extend", nargs="+", metavar="ID",
                   help="datasets the key may use (default: all)")
    p.add_argument("--expires", metavar="ISO", help="expiry, ISO 8601 (default: never)")
    leaf(g, "list", _keys_list, "every key (never their tokens)")
    p = leaf(g, "revoke", _keys_revoke, "revoke a key at once")
    p.add_argument("key_id", metavar="KEY_ID")

    g = group("release", "request and read releases")
    p = leaf(g, "create", _release_create, "request a release (reserves its cost)")
    p.add_argument("--dataset", required=True, metavar="ID")
    p.add_argument("--mechanism", required=True, metavar="M")
    p.add_argument("--params", default="{}", metavar="JSON",
                   help='mechanism parameters, e.g. \'{"statistic": "mean", "column": "age"}\'')
    p.add_argument("--budget", action="append", metavar="MEASURE=NUMBER",
                   help="what to spend, e.g. epsilon=0.5 (repeatable)")
    p.add_argument("--wait", action="store_true", help="wait for the result")
    p.add_argument("--timeout", type=float, default=WAIT_TIMEOUT, metavar="S",
                   help=f"seconds to --wait (default {WAIT_TIMEOUT:g})")
    p = leaf(g, "show", _release_show, "status, result, cost, accuracy, provenance")
    p.add_argument("id", metavar="ID")
    p = leaf(g, "list", _release_list, "recent releases, newest first")
    p.add_argument("--dataset", metavar="ID")
    p.add_argument("--limit", type=int, metavar="N")

    p = leaf(g, "data", _release_data, "download a release's record-level data as CSV")
    p.add_argument("id", metavar="ID")
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
    p = leaf(g, "analyze", _release_analyze, "free post-processing of a release's output")
    p.add_argument("id", metavar="ID")
    p.add_argument("--analysis", required=True, metavar="NAME", help="e.g. npmle, estimate")
    p.add_argument("--params", default="{}", metavar="JSON")
    p.add_argument("--with", dest="others", action="append", metavar="RELEASE_ID",
                   help="another release the analysis combines (repeatable)")
    p.add_argument("--wait", action="store_true", help="wait for the result")
    p.add_argument("--timeout", type=float, default=WAIT_TIMEOUT, metavar="S")

    g = group("jobs", "the job queue (operators)")
    leaf(g, "list", _jobs_list, "queued and running jobs")
    p = leaf(g, "cancel", _jobs_cancel, "cancel a queued job; its budget is refunded")
    p.add_argument("id", metavar="ID")
