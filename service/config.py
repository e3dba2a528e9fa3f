"""All configuration, read once from ``PRIVRELEASE_*`` environment variables.

Each field documents its variable; the README's configuration table is
generated from the same names, so keep them in sync.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ENV_PREFIX = "PRIVRELEASE_"


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name, default)


def _int(name: str, default: int) -> int:
    raw = _env(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{ENV_PREFIX}{name} must be an integer") from None


def _bool(name: str) -> bool:
    return (_env(name) or "").lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Config:
    """Runtime settings shared by the API, the worker and the CLI."""

    #: PRIVRELEASE_DATA_DIR: datasets (and the embedded Valkey's AOF) live here
    data_dir: Path = field(default_factory=lambda: Path("var").resolve())
    #: PRIVRELEASE_REDIS_URL: external Redis/Valkey; unset -> standalone embeds one
    redis_url: str | None = None
    #: PRIVRELEASE_MAX_UPLOAD_BYTES: largest accepted request body (CSV upload)
    max_upload_bytes: int = 100 * 1024 * 1024
    #: PRIVRELEASE_MAX_ROWS: largest accepted dataset
    max_rows: int = 10_000_000
    #: PRIVRELEASE_ALLOW_SEEDS: accept client-chosen seeds (tests only)
    allow_seeds: bool = False
    #: PRIVRELEASE_BOOTSTRAP_KEY: register this token as an operator key at start
    bootstrap_key: str | None = None
    #: PRIVRELEASE_IDEMPOTENCY_TTL: seconds an Idempotency-Key is remembered
    idempotency_ttl: int = 24 * 3600

    @classmethod
    def from_env(cls) -> Config:
        """Build the configuration from the process environment."""
        return cls(
            data_dir=Path(_env("DATA_DIR") or "var").resolve(),
            redis_url=_env("REDIS_URL") or None,
            max_upload_bytes=_int("MAX_UPLOAD_BYTES", cls.max_upload_bytes),
            max_rows=_int("MAX_ROWS", cls.max_rows),
            allow_seeds=_bool("ALLOW_SEEDS"),
            bootstrap_key=_env("BOOTSTRAP_KEY") or None,
            idempotency_ttl=_int("IDEMPOTENCY_TTL", cls.idempotency_ttl),
        )

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def valkey_dir(self) -> Path:
        return self.data_dir / "valkey"

    def require_redis_url(self) -> str:
        """The Redis URL, or a clear exit when none is configured."""
        if not self.redis_url:
            raise SystemExit(
                f"{ENV_PREFIX}REDIS_URL is not set (use `privrelease standalone` to run "
                "an embedded Valkey)"
            )
        return self.redis_url
