"""Flask application factory: config, the services (``service.wiring``), blueprints, errors."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from apispec import BasePlugin
from flask import Flask
from flask_smorest import Api
from werkzeug.middleware.proxy_fix import ProxyFix

import mechanisms
from service import wiring
from service.api import apidocs, inputs, manual, observability, openapi, problems, ratelimit
from service.api.schemas import ProblemSchema
from service.config import Config


class OperationIds(BasePlugin):
    """Every operation gets an ``operationId`` from its Flask endpoint
    (``datasets.upload`` -> ``datasets_upload``), so generated clients have stable,
    readable method names."""

    def operation_helper(self, path: str | None = None,
                         operations: dict[str, dict[str, Any]] | None = None,
                         **kwargs: Any) -> None:
        rule = kwargs.get("rule")
        if rule is None or not operations:
            return
        base = rule.endpoint.replace(".", "_")
        for method, operation in operations.items():
            operation.setdefault("operationId",
                                 base if len(operations) == 1 else f"{base}_{method}")


class ProblemApi(Api):
    """flask-smorest Api whose errors are RFC 9457 problem documents."""

    ERROR_SCHEMA = ProblemSchema
    DEFAULT_ERROR_RESPONSE_NAME = None  # each route lists its statuses (api.responses)

    def _register_error_handlers(self) -> None:
        problems.register(self._app)

    def _register_responses(self) -> None:
        """A component response per error status, documented as problem+json."""
        for status in HTTPStatus:
            if status >= 400:
                self.spec.components.response(status.name, {
                    "description": status.phrase,
                    "content": {problems.PROBLEM_TYPE: {"schema": ProblemSchema}},
                }, lazy=True)


class ServiceFlask(Flask):
    """Flask, remembering which functions it found synchronous.

    Flask asks ``inspect.iscoroutinefunction`` of every hook and view on every request,
    and flask-smorest of each of its response wrappers (ten on a route): about 2 % of a
    release POST's CPU. A function found synchronous is remembered (at most
    ``SYNC_MEMORY`` of them: functions made per request do not pile up); anything else
    goes to Flask every time."""

    SYNC_MEMORY = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sync_functions: set[Any] = set()

    def ensure_sync(self, func: Any) -> Any:
        try:
            if func in self._sync_functions:
                return func
        except TypeError:  # unhashable: Flask decides
            return super().ensure_sync(func)
        wrapped = super().ensure_sync(func)
        if wrapped is func and len(self._sync_functions) < self.SYNC_MEMORY:
            self._sync_functions.add(func)
        return wrapped


def create_app(config: Config | None = None) -> Flask:
    """Build the API app; one per gunicorn worker process."""
    config = config or Config.from_env()
    app = ServiceFlask("privrelease")
    app.config.update(
        API_TITLE="privrelease",
        API_VERSION="v1",
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX="/",
        OPENAPI_JSON_PATH="openapi.json",
        OPENAPI_SWAGGER_UI_PATH="/docs",
        OPENAPI_SWAGGER_UI_URL=apidocs.ASSETS_URL,  # served here: /docs works offline
        OPENAPI_SWAGGER_UI_CONFIG={"deepLinking": True},  # /docs#/releases/releases_create
        MAX_CONTENT_LENGTH=config.max_upload_bytes,
        PRIVRELEASE=config,
    )
    if config.trusted_proxies:
        # client address and scheme from X-Forwarded-For/-Proto set by that many proxies
        n = config.trusted_proxies
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=n, x_proto=n)  # type: ignore[method-assign]
    app.extensions[wiring.EXTENSION] = wiring.build(config, "api")
    observability.init_app(app)  # first: its request id and timer precede the limiter
    ratelimit.init_app(app)
    inputs.init_app(app)  # after the limiter: hostile bodies count against the key
    apidocs.init_app(app)
    manual.init_app(app)  # the built manual at /manual/ (make docs)

    api = ProblemApi(app, spec_kwargs={
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "extra_plugins": [OperationIds(), openapi.Documentation()],
    })
    from service.api import catalog, datasets, health, jobs, keys, outputs, releases

    for module in (health, datasets, releases, outputs, catalog, keys, jobs):
        api.register_blueprint(module.blp)
    openapi.register_components(api.spec)
    # import every mechanism family (scipy, matplotlib: ~2 s) while the worker boots, not
    # in the first request that names a mechanism (a 2 s outlier per worker under load)
    mechanisms.names()
    from service import console

    console.init_app(app)  # the web console at /console (same keys, same checks)
    return app
