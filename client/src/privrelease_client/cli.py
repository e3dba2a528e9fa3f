"""The ``privrelease-client`` command (Click): every route of a running server.

An analyst who installs only ``privrelease-client`` has these commands; the server's
``privrelease`` offers the same ones beside standalone/api/worker (``service.processes.cli``).
They talk to the server through :class:`privrelease_client.Client`, print Rich tables for
people (:mod:`privrelease_client.terminal`) and raw JSON (``--json``) for scripts. The
server and key come from ``--url``/``--key`` or ``PRIVRELEASE_URL``/``PRIVRELEASE_KEY``.
Exit codes: 0 done, 1 the server refused or the release did not succeed, 2 a usage error
found locally, 130 interrupted.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem, get_completion_class
from rich.console import RenderableType

from privrelease_client import terminal
from privrelease_client._version import __version__
from privrelease_client.client import DEFAULT_URL, Client
from privrelease_client.draft import MAX_CATEGORIES, draft
from privrelease_client.errors import ApiError, MissingExtra, ReleaseFailed
from privrelease_client.objects import Progress

WAIT_TIMEOUT = 120.0
#: the console script's name (``[project.scripts]`` in client/pyproject.toml)
PROG = "privrelease-client"


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



# -- running ---------------------------------------------------------------------------

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
        fail([terminal.format_error(err), *terminal.amount_notes(err.body)])
        return 1
    except KeyboardInterrupt:
        fail(["error: interrupted"])
        return 130
    try:
        if as_json:
            terminal.show(json.dumps(out.doc, indent=2))
        else:
            terminal.show(out.render(out.doc))
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader is gone, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if out.error:
        fail([f"error: {out.error}", *out.notes])
    return out.status


# -- the command tree ------------------------------------------------------------------

#: what both ``cli`` and the server's ``privrelease`` group are made with
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


@click.group(name=PROG, context_settings=CONTEXT_SETTINGS)
@click.version_option(message="%(version)s", version=f"{PROG} {__version__}",
                      package_name=PROG)
def cli() -> None:
    """privrelease-client: use a running privrelease server.

    The commands read the server from PRIVRELEASE_URL and the key from PRIVRELEASE_KEY.
    Shell completion: `eval "$(privrelease-client completion bash)"`.
    """


def complete_var(prog: str) -> str:
    """Click's environment variable for ``prog``'s completion (``_PRIVRELEASE_COMPLETE``)."""
    return f"_{prog}_COMPLETE".replace("-", "_").upper()


def _prog() -> str:
    """The name this run was called by: ``privrelease`` (the server's) or ours."""
    return click.get_current_context().find_root().info_name or PROG


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

@datasets.command("draft", short_help="a metadata template drafted from a local file")
@click.argument("file", metavar="FILE", type=click.Path(exists=True, dir_okay=False))
@click.option("--max-categories", type=click.IntRange(1, 10_000), default=MAX_CATEGORIES,
              show_default=True, help="most distinct values a categorical column may have")
def _datasets_draft(file: str, max_categories: int) -> None:
    """Print a metadata template for FILE (CSV or Parquet, read here, sent nowhere):
    column names, types and the categories of columns with few values. Bounds and budgets
    are left for you to write (why: on stderr); then `datasets upload FILE --metadata`."""
    try:
        made = draft(file, max_categories)
    except MissingExtra as err:
        raise click.ClickException(str(err)) from None
    except (OSError, ValueError) as err:  # unreadable, not CSV nor Parquet
        raise click.ClickException(f"cannot read {file}: {type(err).__name__}") from None
    click.echo(json.dumps(made.metadata, indent=2))
    for note in made.notes:
        click.echo(f"note: {note}", err=True)


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
    return Output(c.upload_dataset(file, meta), terminal.render_dataset)


@client_command(datasets, "register", "register Parquet already in storage (a file or a "
                "folder, under a root the server allows) with its public metadata")
@click.option("--source", required=True, metavar="URL",
              help="storage URL: s3://bucket/prefix, s3://bucket/key.parquet, file:///path")
@click.option("--metadata", metavar="JSONFILE", help="metadata JSON file")
@click.option("--metadata-json", metavar="STR", help="metadata JSON text")
def _datasets_register(c: Client, source: str, metadata: str | None,
                       metadata_json: str | None) -> Output:
    if (metadata is None) == (metadata_json is None):
        raise UsageError("give exactly one of --metadata and --metadata-json")
    meta = _metadata_object(_metadata_text(metadata, metadata_json))
    assert meta is not None  # one of the two was given
    return Output(c.register_dataset(source, meta), terminal.render_dataset)


@datasets.group("versions")
def versions() -> None:
    """versions of a dataset: the same people, one budget"""


def _metadata_text(metadata: str | None, metadata_json: str | None) -> str | None:
    if metadata is not None and metadata_json is not None:
        raise UsageError("give at most one of --metadata and --metadata-json")
    if metadata is not None:
        return _read_text(metadata, "metadata")
    return metadata_json


def _metadata_object(text: str | None) -> dict[str, Any] | None:
    """Metadata text as the object a registration by reference sends (a JSON body, not
    text in a form field): a key given twice is refused here, as the server refuses it
    in an upload's text, since decoding would keep only the last (a column lost)."""
    if text is None:
        return None

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in pairs:
            if name in out:
                raise UsageError(f"duplicate key {name!r} in the metadata")
            out[name] = value
        return out

    try:
        value = json.loads(text, object_pairs_hook=unique)
    except ValueError:
        raise UsageError("the metadata is not valid JSON") from None
    if not isinstance(value, dict):
        raise UsageError("the metadata must be a JSON object")
    return value


def _version_options(command: Handler) -> Handler:
    """The options a new version takes, by upload or by reference: its metadata if it
    changed, whether that change is compatible, and whether it becomes current."""
    for option in reversed([
        click.option("--metadata", metavar="JSONFILE",
                     help="changed metadata JSON file (default: the dataset's)"),
        click.option("--metadata-json", metavar="STR", help="changed metadata JSON text"),
        click.option("--compatible", is_flag=True,
                     help="declare the changed metadata compatible (needed with --metadata)"),
        click.option("--make-current", is_flag=True,
                     help="make it the current version at once")]):
        command = option(command)
    return command


@client_command(versions, "upload", "upload the next version (spends the dataset's "
                "budget; not current unless --make-current)")
@click.argument("dataset_id", metavar="ID")
@click.argument("file", metavar="FILE")
@_version_options
def _versions_upload(c: Client, dataset_id: str, file: str, metadata: str | None,
                     metadata_json: str | None, compatible: bool,
                     make_current: bool) -> Output:
    meta = _metadata_text(metadata, metadata_json)
    if not Path(file).is_file():
        raise UsageError(f"cannot read data file {file}")
    doc = c.upload_version(dataset_id, file, meta, compatible=compatible,
                           make_current=make_current)
    return Output(doc, terminal.render_version)


@client_command(versions, "register", "the next version from Parquet already in storage "
                "(spends the dataset's budget; not current unless --make-current)")
@click.argument("dataset_id", metavar="ID")
@click.option("--source", required=True, metavar="URL",
              help="storage URL: s3://bucket/prefix, s3://bucket/key.parquet, file:///path")
@_version_options
def _versions_register(c: Client, dataset_id: str, source: str, metadata: str | None,
                       metadata_json: str | None, compatible: bool,
                       make_current: bool) -> Output:
    meta = _metadata_object(_metadata_text(metadata, metadata_json))
    doc = c.register_version(dataset_id, source, meta, compatible=compatible,
                             make_current=make_current)
    return Output(doc, terminal.render_version)


@client_command(versions, "list", "every version of a dataset, oldest first")
@click.argument("dataset_id", metavar="ID")
def _versions_list(c: Client, dataset_id: str) -> Output:
    return Output(c.list_versions(dataset_id), terminal.render_versions)


@client_command(versions, "show", "one version of a dataset")
@click.argument("dataset_id", metavar="ID")
@click.argument("version", type=int, metavar="VERSION")
def _versions_show(c: Client, dataset_id: str, version: int) -> Output:
    return Output(c.get_version(dataset_id, version), terminal.render_version)


@client_command(versions, "current", "make a version current (releases default to it)")
@click.argument("dataset_id", metavar="ID")
@click.argument("version", type=int, metavar="VERSION")
def _versions_current(c: Client, dataset_id: str, version: int) -> Output:
    return Output(c.set_current_version(dataset_id, version), terminal.render_version)


@client_command(versions, "retire", "no new releases on a version (not the current one);"
                " its releases stay readable")
@click.argument("dataset_id", metavar="ID")
@click.argument("version", type=int, metavar="VERSION")
def _versions_retire(c: Client, dataset_id: str, version: int) -> Output:
    return Output(c.retire_version(dataset_id, version), terminal.render_version)


@client_command(datasets, "list", "datasets this key may see")
def _datasets_list(c: Client) -> Output:
    return Output(c.list_datasets(), terminal.render_datasets)


@client_command(datasets, "show", "one dataset's metadata")
@click.argument("dataset_id", metavar="ID")
def _datasets_show(c: Client, dataset_id: str) -> Output:
    return Output(c.get_dataset(dataset_id), terminal.render_dataset)


@client_command(datasets, "retire", "retire a dataset: no new releases; kept for audit")
@click.argument("dataset_id", metavar="ID")
def _datasets_retire(c: Client, dataset_id: str) -> Output:
    return Output(c.retire_dataset(dataset_id), terminal.render_dataset)


# budget and ledger ---------------------------------------------------------------------

@client_command(budget_group, "show", "cap, committed, reserved and remaining per measure")
@click.argument("dataset", metavar="DATASET")
def _budget_show(c: Client, dataset: str) -> Output:
    return Output(c.get_budget(dataset), terminal.render_budget)


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
    return Output(doc, terminal.render_budget)


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
                      lambda d: terminal.plain(f"{d['events']} events -> {d['file']}"))
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
    return Output(doc, terminal.render_new_key)


@client_command(keys, "list", "every key (never their tokens)")
def _keys_list(c: Client) -> Output:
    # a token must never be listed, even if a server sent one by mistake
    docs = [{k: v for k, v in d.items() if k not in terminal.SECRETS} for d in c.list_keys()]
    return Output(docs, terminal.render_keys)


@client_command(keys, "revoke", "revoke a key at once")
@click.argument("key_id", metavar="KEY_ID")
def _keys_revoke(c: Client, key_id: str) -> Output:
    c.revoke_key(key_id)
    return Output({"id": key_id, "revoked": True}, lambda d: terminal.plain(f"revoked {d['id']}"))


# releases ----------------------------------------------------------------------------

def _request_options(fn: Callable[..., Output]) -> Callable[..., Output]:
    """--dataset, --mechanism, --params, --budget: what a release and an estimate take."""
    for opt in reversed([
        click.option("--dataset", required=True, metavar="ID"),
        click.option("--mechanism", required=True, metavar="M",
                     help="a name from the `mechanisms` command"),
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
        return Output(doc, terminal.render_release)
    progress = Progress(sys.stderr, enabled=sys.stderr.isatty())
    try:
        final = c.wait(doc["id"], timeout, on_poll=progress)
    except TimeoutError as err:
        return Output(progress.last or doc, terminal.render_release, 1, f"timeout: {err}")
    except KeyboardInterrupt:
        return Output(progress.last or doc, terminal.render_release, 130,
                      f"interrupted: release {doc['id']} goes on on the server")
    finally:
        progress.clear()
    if final.get("replayed") is None and doc.get("replayed"):
        final = {**final, "replayed": True}
    if final.get("status") != "succeeded":
        failed = ReleaseFailed.of(final)
        message = f"release_{final.get('status')}: "
        if failed.code != f"release_{final.get('status')}":
            message += f"{failed.code}: "
        return Output(final, terminal.render_release, 1, message + terminal.clean(failed.detail),
                      terminal.amount_notes(failed.body))
    return Output(final, terminal.render_release)


@client_command(release, "estimate", "cost, expected accuracy and remaining budget; "
                "spends nothing", aliases=[cli])
@_request_options
@click.option("--target", type=float, metavar="HALF_WIDTH",
              help="instead of --budget: the smallest budget whose stated 95 % interval is"
                   " within ± this (with --budget delta=... held fixed for (ε, δ))")
@click.option("--level", type=float, default=0.95, show_default=True,
              help="the target's level: the one the statement gives (0.95, or a table's"
                   " params confidence.level)")
def _release_estimate(c: Client, dataset: str, mechanism: str, params: str,
                      budget: tuple[str, ...], dataset_version: int | None,
                      target: float | None, level: float) -> Output:
    if target is None:
        body, amounts = _request(params, budget, "estimate")
        return Output(c.estimate_release(dataset, mechanism, body, amounts,
                                         version=dataset_version), terminal.render_estimate)
    fixed = _amounts(budget, "--budget")
    if set(fixed) - {"delta"}:
        raise UsageError("give --budget or --target; with --target, --budget names only"
                         " delta (held fixed)")
    return Output(c.estimate_release(dataset, mechanism, _json_object(params, "--params"),
                                     target={"half_width": target, "level": level, **fixed},
                                     version=dataset_version), terminal.render_estimate)


@client_command(release, "show", "status, result, cost, accuracy, provenance")
@click.argument("release_id", metavar="ID")
def _release_show(c: Client, release_id: str) -> Output:
    return Output(c.get_release(release_id), terminal.render_release)


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
    return Output(docs, terminal.render_releases)


@client_command(datasets, "dummy", "dummy rows of a dataset, drawn from its public metadata"
                " only (not data, free of budget), as CSV")
@click.argument("dataset_id", metavar="ID")
@click.option("--rows", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), help="the same seed, the same rows")
@click.option("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
def _datasets_dummy(c: Client, dataset_id: str, rows: int, seed: int | None,
                    output: str | None) -> Output:
    text = c.dummy_rows(dataset_id, rows=rows, seed=seed)
    if output:
        _write(output, text)
        return Output({"file": output, "rows": rows}, lambda d: terminal.plain(
            f"{d['rows']} dummy rows (from the metadata only: not data) -> {d['file']}"))
    return Output(text, lambda t: t)


@client_command(release, "data", "download a release's record-level data as CSV")
@click.argument("release_id", metavar="ID")
@click.option("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
def _release_data(c: Client, release_id: str, output: str | None) -> Output:
    text = c.release_data(release_id)
    if output:
        _write(output, text)
        rows = max(len(text.splitlines()) - 1, 0)
        return Output({"file": output, "rows": rows},
                      lambda d: terminal.plain(f"{d['rows']} rows -> {d['file']}"))
    return Output(text, lambda t: t)


def _is_svg(path: str) -> bool:
    """Whether a plot's output file asks for SVG (by its suffix; anything else is PNG)."""
    return path.lower().endswith(".svg")


def _written(output: str, content: bytes) -> Output:
    _write(output, content)
    return Output({"file": output, "bytes": len(content)},
                  lambda d: terminal.plain(f"{d['bytes']} bytes -> {d['file']}"))


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
    return Output(c.cancel_job(release_id), terminal.render_release)


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
        return Output(doc, terminal.render_analysis)
    try:
        final = c.wait_analysis(release_id, doc["id"], timeout)
    except TimeoutError as err:
        return Output(doc, terminal.render_analysis, 1, f"timeout: {err}")
    if final.get("status") != "succeeded":
        failed = ReleaseFailed.of(final)
        return Output(final, terminal.render_analysis, 1,
                      f"analysis_{final.get('status')}: {failed.code}: "
                      f"{terminal.clean(failed.detail)}")
    return Output(final, terminal.render_analysis)


# the name this command had before `analyses` existed
release.add_command(_analyses_run, "analyze")


@client_command(analyses, "list", "a release's analyses, newest first (all pages)")
@click.argument("release_id", metavar="RELEASE")
def _analyses_list(c: Client, release_id: str) -> Output:
    return Output(list(c.iter_analyses(release_id)), terminal.render_analyses)


@client_command(analyses, "show", "one analysis: status, params, result")
@click.argument("release_id", metavar="RELEASE")
@click.argument("analysis_id", metavar="ANALYSIS")
def _analyses_show(c: Client, release_id: str, analysis_id: str) -> Output:
    return Output(c.get_analysis(release_id, analysis_id), terminal.render_analysis)


@client_command(analyses, "cancel", "cancel an analysis that has not finished")
@click.argument("release_id", metavar="RELEASE")
@click.argument("analysis_id", metavar="ANALYSIS")
def _analyses_cancel(c: Client, release_id: str, analysis_id: str) -> Output:
    return Output(c.cancel_analysis(release_id, analysis_id), terminal.render_analysis)


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
    return Output(list(c.iter_jobs(status=status, page_size=limit)), terminal.render_jobs)


@client_command(jobs, "cancel", "cancel a queued job; its budget is refunded")
@click.argument("job_id", metavar="ID")
def _jobs_cancel(c: Client, job_id: str) -> Output:
    return Output(c.cancel_job(job_id), terminal.render_release)


@client_command(cli, "mechanisms", "the mechanism catalog (one mechanism with NAME)")
@click.argument("name", required=False, metavar="[NAME]")
def _mechanisms(c: Client, name: str | None) -> Output:
    docs = c.mechanisms()
    if name is None:
        return Output(docs, terminal.render_mechanisms)
    found = [d for d in docs if d.get("name") == name]
    if not found:
        raise UsageError(f"no mechanism {name!r} (see `{_prog()} mechanisms`)")
    return Output(found[0], terminal.render_mechanism)


@client_command(cli, "health", "the server's version, whether it is up (healthz) and ready"
                " (readyz)")
def _health(c: Client) -> Output:
    doc: dict[str, Any] = {"healthz": c.health()}
    try:  # the front door names the server's version (a server before it had none: 404)
        doc = {"version": c.index().get("version"), **doc}
    except ApiError:
        doc = {"version": None, **doc}
    try:
        doc["readyz"] = c.ready()
    except ApiError as err:  # 503 while Valkey or the workers are away: said, exit 1
        doc["readyz"] = err.body
        return Output(doc, terminal.render_health, 1,
                      f"not ready: {err.code}: {terminal.clean(err.detail)}")
    return Output(doc, terminal.render_health)


@client_command(cli, "openapi", "the server's OpenAPI document (e.g. to generate a client)")
@click.option("--output", "-o", metavar="FILE", help="write to FILE (default: stdout)")
def _openapi(c: Client, output: str | None) -> Output:
    doc = c.openapi()
    if output:
        _write(output, json.dumps(doc, indent=2) + "\n")
        return Output({"file": output, "paths": len(doc.get("paths") or {})},
                      lambda d: terminal.plain(f"{d['paths']} paths -> {d['file']}"))
    return Output(doc, lambda d: json.dumps(d, indent=2))


@cli.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def _completion(shell: str) -> None:
    """print the shell completion script, e.g. eval "$(privrelease completion bash)" (or
    privrelease-client)"""
    cls = get_completion_class(shell)
    assert cls is not None  # the Choice above lists only shells Click supports
    root = click.get_current_context().find_root()
    prog = _prog()
    click.echo(cls(root.command, {}, prog, complete_var(prog)).source())


def run(group: click.Group, argv: Sequence[str], prog: str) -> int:
    """Run ``group`` as the console script ``prog``: its exit status (Click exits)."""
    try:
        group.main(args=list(argv), prog_name=prog, complete_var=complete_var(prog))
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``privrelease-client ARGS`` (the console script): the command's exit status."""
    return run(cli, sys.argv[1:] if argv is None else argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
