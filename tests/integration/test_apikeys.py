"""API keys are stored hashed and a bootstrap token is registered once; console sessions
expire, end with their key, and the console's secret is made once (on the session's key
store: PostgreSQL, or Valkey for a session on the Valkey store)."""

from __future__ import annotations

import secrets
import stat
import threading
from pathlib import Path

from service import apikeys
from service.console import session
from service.storage.keys import KeyStore
from service.storage.pg_keys import PgKeyStore
from tests.integration import record_state


def test_tokens_are_stored_only_hashed(keys: KeyStore) -> None:
    key, token = apikeys.create(keys, "analyst", label="a")
    assert token.startswith("pr_") and len(token) > 40
    dump = record_state.key_store_text(keys)
    assert dump and any(apikeys.digest(token) in d for d in dump)  # the dump is the store
    assert not any(token in d for d in dump)
    assert apikeys.lookup(keys, token) == key
    assert apikeys.lookup(keys, token + "x") is None


def test_bootstrap_token_is_registered_once(keys: KeyStore) -> None:
    first, _ = apikeys.create(keys, "operator", token="pr_bootstrap_once_123")
    again, _ = apikeys.create(keys, "operator", token="pr_bootstrap_once_123")
    assert again.id == first.id
    digests = record_state.key_digests(keys)
    assert digests.count(apikeys.digest("pr_bootstrap_once_123")) == 1


def test_data_dir_bootstrap_keeps_one_key_until_it_is_revoked(keys: KeyStore,
                                                              tmp_path: Path) -> None:
    """Catches issue #18's finding: each `standalone` start without
    PRIVRELEASE_BOOTSTRAP_KEY minted another valid operator key."""
    path = tmp_path / "bootstrap-key"
    token, made = apikeys.data_dir_bootstrap(keys, path)
    assert made and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = apikeys.lookup(keys, token)
    assert key is not None and key.role == "operator"
    before = len(record_state.key_digests(keys))
    assert apikeys.data_dir_bootstrap(keys, path) == (token, False)
    assert len(record_state.key_digests(keys)) == before  # no second key
    # rotation: revoke it, and the next start makes a new one (the old stays dead)
    apikeys.revoke(keys, key.id)
    rotated, made = apikeys.data_dir_bootstrap(keys, path)
    assert made and rotated != token and path.read_text().strip() == rotated
    assert apikeys.lookup(keys, token) is None


def test_a_record_reads_back_as_it_was_made(keys: KeyStore) -> None:
    """Every field of a key, by token, by id and in the list (oldest first), as made;
    an expiry given with an offset is kept in UTC (catches a store that rounds a time,
    drops the grants or the secret)."""
    made, token = apikeys.create(keys, "consumer", label="fields", datasets=("ds_a", "ds_b"),
                                 expires_at="2031-02-03T05:06:07.250+02:00")
    assert made.expires_at == "2031-02-03T03:06:07.250000Z"
    assert apikeys.lookup(keys, token) == apikeys.get(keys, made.id) == made
    listed = apikeys.list_all(keys)
    assert made in listed
    assert [k.created_at for k in listed] == sorted(k.created_at for k in listed)
    secret = apikeys.callback_secret(keys, made.id)
    assert secret is not None and len(secret) == 64
    assert apikeys.exists(keys, made.id) and apikeys.revoke(keys, made.id)
    assert not apikeys.exists(keys, made.id) and not apikeys.revoke(keys, made.id)
    assert apikeys.callback_secret(keys, made.id) is None and apikeys.get(keys, made.id) is None


def test_sessions_expire_and_end_with_their_key(keys: KeyStore) -> None:
    """A session answers its key until it expires, is closed, or its key is revoked; an
    expired one is never answered (and, on PostgreSQL, pruned by the next sign-in); a
    revoked key leaves no session behind."""
    key, _ = apikeys.create(keys, "analyst", label="sessions")
    live, closed, late = (session.session_digest(secrets.token_urlsafe(32)) for _ in range(3))
    for digest in (live, closed, late):
        keys.add_session(digest, key.id, 3600)
    assert keys.session_key_id(live) == key.id
    keys.remove_session(closed)
    assert keys.session_key_id(closed) is None
    record_state.expire_sessions(keys, key.id)
    assert keys.session_key_id(live) is None and keys.session_key_id(late) is None
    other, _ = apikeys.create(keys, "analyst", label="sessions 2")
    fresh = session.session_digest(secrets.token_urlsafe(32))
    keys.add_session(fresh, other.id, 3600)  # a sign-in: prunes what expired
    assert record_state.session_count(keys, key.id) == 0
    assert keys.session_key_id(fresh) == other.id
    apikeys.revoke(keys, other.id)
    if isinstance(keys, PgKeyStore):  # Valkey lets the orphan run out (never answered)
        assert record_state.session_count(keys, other.id) == 0
    assert keys.session_key_id(fresh) is None or apikeys.get(keys, other.id) is None
    gone = session.session_digest(secrets.token_urlsafe(32))
    keys.add_session(gone, other.id, 3600)  # signing in a key revoked meanwhile
    assert keys.session_key_id(gone) is None or apikeys.get(keys, other.id) is None


def test_the_console_secret_is_made_once(keys: KeyStore) -> None:
    """Processes starting together each offer a secret; all of them sign with the same
    one, and a later one too (catches a secret per process: a cookie from one API
    process refused by the next)."""
    first = keys.console_secret(secrets.token_hex(32))
    offered = [secrets.token_hex(32) for _ in range(8)]
    got: list[str] = []
    threads = [threading.Thread(target=lambda o=o: got.append(keys.console_secret(o)))
               for o in offered]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == [first] * len(offered)
