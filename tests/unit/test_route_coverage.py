"""Every HTTP route has a client method and a CLI command (issue #18 §3/§4).

The routes are the app's own ``url_map``; a client method covers a route when its source
sends that method to that path (``self.send("GET", f"/v1/...")``, ``self._get(...)``, ...);
a CLI command covers it when its handler calls such a client method. No table to keep in
step by hand: a new route fails here until the client and the CLI reach it, and a method
that stops calling its route fails too.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator

import click
import pytest
from flask import Flask
from privrelease_client import Client, cli

from service.api.app import create_app
from service.config import Config

#: routes that are no API operation of a key: browser pages and their assets (the
#: manual, the API docs), the pages
#: problem documents' ``type`` names (the client raises ``ApiError`` with the code), and
#: the Prometheus scrape endpoint (its own token, PRIVRELEASE_METRICS_TOKEN, not a key)
NOT_CLIENT_ROUTES = {("GET", "/docs"), ("GET", "/docs/assets/<>"), ("GET", "/static/<>"),
                     ("GET", "/metrics"), ("GET", "/problems"), ("GET", "/problems/<>"),
                     ("GET", "/manual"), ("GET", "/manual/"), ("GET", "/manual/<>")}
HTTP = r'"(GET|POST|PATCH|PUT|DELETE)"'
PATH = r'f?"(/[^"]*)"'
CALLS = [re.compile(rf"\.(?:send|request)\(\s*{HTTP},\s*{PATH}"),
         re.compile(rf"\.(?:_get|_pages)\(\s*{PATH}")]


def _shape(path: str) -> str:
    """A path with its variables blanked: Flask's ``<conv:name>`` and f-strings' ``{..}``."""
    return re.sub(r"<[^>]*>|\{[^}]*\}", "<>", path)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Flask:
    """The app with its routes; listing them connects to nothing but the record its
    services open at start (PostgreSQL: no process runs without it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRIVRELEASE_REDIS_URL", "redis://127.0.0.1:1/0")
        mp.setenv("PRIVRELEASE_DATABASE_URL", database_url)
        mp.setenv("PRIVRELEASE_DATA_DIR", str(tmp_path_factory.mktemp("routes")))
        return create_app(Config.from_env())


def _routes(app: Flask) -> set[tuple[str, str]]:
    out = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/console"):  # the console is the browser's, tested apart
            continue
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}:
            out.add((method, _shape(rule.rule)))
    return out - NOT_CLIENT_ROUTES


def _client_methods() -> dict[str, set[tuple[str, str]]]:
    """Each public ``Client`` method and the (method, path shape) pairs it sends, its own
    or through the other methods it calls (``iter_analyses`` pages ``list_analyses``)."""
    direct: dict[str, set[tuple[str, str]]] = {}
    calls: dict[str, set[str]] = {}
    for name, fn in inspect.getmembers(Client, inspect.isfunction):
        source = inspect.getsource(fn)
        direct[name] = {(m, _shape(p)) for m, p in CALLS[0].findall(source)}
        direct[name] |= {("GET", _shape(p)) for p in CALLS[1].findall(source)}
        calls[name] = set(re.findall(r"\bself\.(\w+)\(", source)) - {name}
    found: dict[str, set[tuple[str, str]]] = {}
    for name in direct:
        if name.startswith("_"):
            continue
        seen, todo, pairs = {name}, [name], set()
        while todo:
            here = todo.pop()
            pairs |= direct.get(here, set())
            for other in calls.get(here, set()) - seen - {"send", "request", "_get", "_pages"}:
                seen.add(other)
                todo.append(other)
        if pairs and not name.startswith("_"):
            found[name] = pairs
    return found


def _leaves(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _leaves(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd


def test_the_scan_finds_known_methods() -> None:
    """The source scan itself works (catches a regex that silently finds nothing)."""
    methods = _client_methods()
    assert methods["release_plot"] == {("GET", "/v1/releases/<>/plot.png")}
    assert methods["set_budget"] == {("PATCH", "/v1/datasets/<>/budget")}
    assert ("POST", "/v1/datasets") in methods["upload_dataset"]
    assert methods["iter_jobs"] == {("GET", "/v1/jobs")}
    assert methods["iter_analyses"] == {("GET", "/v1/releases/<>/analyses")}  # via a call


def test_every_route_has_a_client_method(app: Flask) -> None:
    """Catches a route added to the API without a method in privrelease_client."""
    covered = set().union(*_client_methods().values())
    missing = sorted(_routes(app) - covered)
    assert not missing, f"routes without a Client method: {missing}"
    stale = sorted(covered - _routes(app) - NOT_CLIENT_ROUTES)
    assert not stale, f"Client methods calling routes the API does not have: {stale}"


def test_every_route_has_a_cli_command(app: Flask) -> None:
    """Catches a route with no `privrelease-client` (so `privrelease`) command reaching
    it (through the client)."""
    methods = _client_methods()
    reached: dict[tuple[str, str], list[str]] = {}
    for path, cmd in _leaves(cli.cli):  # privrelease-client's, all offered by privrelease
        if cmd.callback is None:
            continue
        source = inspect.getsource(inspect.unwrap(cmd.callback))
        for called in re.findall(r"\bc\.(\w+)\b", source):
            for route in methods.get(called, ()):
                reached.setdefault(route, []).append(path)
    missing = sorted(_routes(app) - set(reached))
    assert not missing, f"routes without a CLI command: {missing}"
    assert reached[("GET", "/v1/releases/<>/analyses/<>/plot.svg")] == ["analyses plot"]


#: API routes with no console page: the front door (it sends a browser to the console),
#: probes, the OpenAPI description and its viewer,
#: metrics, static files (the console links /docs in its navigation instead)
NOT_CONSOLE_ENDPOINTS = {"health.index", "health.healthz", "health.readyz",
                         "health.problem_types", "health.problem_type",
                         "manual.root", "manual.page", "api-docs.openapi_json",
                         "api-docs.openapi_swagger_ui", "apidocs.asset", "metrics", "static"}


def test_every_api_operation_has_a_console_way(app: Flask) -> None:
    """Each API view is run by some console page (``ops.call``/``ops.check``/``page``,
    always as ``<module>_api.<view>``): catches an operator or analyst action the HTTP
    API allows but the console cannot do."""
    from service.console import views

    source = inspect.getsource(views)
    aliases = {alias: module.__name__ for alias, module in vars(views).items()
               if inspect.ismodule(module) and module.__name__.startswith("service.api.")}
    used = {(aliases[a], name) for a, name in re.findall(r"\b(\w+_api)\.(\w+)\b", source)
            if a in aliases}
    missing = []
    for endpoint, fn in app.view_functions.items():
        if endpoint.startswith("console.") or endpoint in NOT_CONSOLE_ENDPOINTS:
            continue
        view = inspect.unwrap(fn)
        if (view.__module__, view.__name__) not in used:
            missing.append(endpoint)
    assert not missing, f"API operations without a console page: {sorted(missing)}"
    assert ("service.api.outputs", "cancel") in used  # the analysis cancel button
