"""gunicorn, embedded: ``privrelease api`` serves the app with a fixed config."""

from __future__ import annotations

from typing import Any

from gunicorn.app.base import BaseApplication

from service.config import Config


class _Gunicorn(BaseApplication):
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from service.app import create_app

        return create_app(Config.from_env())


def options(host: str, port: int, workers: int) -> dict[str, Any]:
    """The production settings (deploy/gunicorn.conf.py mirrors them)."""
    return {
        "bind": f"{host}:{port}",
        "workers": workers,
        "worker_class": "gthread",
        "threads": 8,
        "timeout": 60,
        "graceful_timeout": 10,
        "keepalive": 5,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
    }


def serve(config: Config, host: str, port: int, workers: int) -> None:
    config.require_redis_url()
    _Gunicorn(options(host, port, workers)).run()
