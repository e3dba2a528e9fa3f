"""Where API keys and console sessions are kept (``KeyStore``), whatever keeps them.

``service.storage.pg_keys.PgKeyStore`` keeps it on PostgreSQL, beside the ledger (issue
#29); ``service.apikeys`` and ``service.console.session`` hold the logic and reach the
store through this interface only.

A key's record (``KeyRecord``) is what the old Valkey store kept as JSON: the public fields of
``service.apikeys.ApiKey`` (``id``, ``role``, ``label``, ``datasets``: a list or None,
``expires_at``: ISO 8601 or None, ``created_at``: ISO 8601) and its ``callback_secret``.
A token is never stored: a key is found by the SHA-256 digest of its token (hex), a
console session by the digest of its id. A session names its key's id; it ends when it
expires, when it is closed, or when its key is revoked (a session of a revoked key is
never answered).
"""

from __future__ import annotations

from typing import Any, Protocol

#: a key's stored record (see the module docstring)
KeyRecord = dict[str, Any]


class KeyStore(Protocol):
    """API keys by token digest and by id, the console's sessions and its secret."""

    def add_key(self, token_digest: str, record: KeyRecord) -> KeyRecord:
        """Store ``record`` under ``token_digest`` unless a key has that digest already:
        the record stored under it either way (the existing one wins)."""
        ...

    def key_by_digest(self, token_digest: str) -> KeyRecord | None:
        """The key whose token has this digest (expired ones included), or None."""
        ...

    def key_by_id(self, key_id: str) -> KeyRecord | None: ...

    def all_keys(self) -> list[KeyRecord]:
        """Every key, oldest first (by ``created_at``, then id)."""
        ...

    def has_key(self, key_id: str) -> bool: ...

    def remove_key(self, key_id: str) -> bool:
        """Delete the key (its token stops at once, its console sessions end); False if
        there was none."""
        ...

    # -- the console ---------------------------------------------------------------------

    def console_secret(self, candidate: str) -> str:
        """The console's cookie-signing secret, shared by every API process: the one
        stored, or ``candidate`` stored now if there was none (made once)."""
        ...

    def add_session(self, session_digest: str, key_id: str, seconds: int) -> None:
        """A console session of ``key_id`` that expires ``seconds`` from now."""
        ...

    def session_key_id(self, session_digest: str) -> str | None:
        """The key id of a live session (not expired, not closed), or None."""
        ...

    def remove_session(self, session_digest: str) -> None: ...
