"""API keys are stored hashed and a bootstrap token is registered once; console sessions
expire, end with their key, and the console's secret is made once; a key the API looked
up is kept a second per process (``apikeys.KeyCache``), and a revocation made elsewhere
takes effect once that second is over (on the session's key store, PostgreSQL)."""

from __future__ import annotations

import secrets
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from service import apikeys
from service.api import auth
from service.config import Config
from service.console import session
from service.storage.keys import KeyStore
from service.storage.pg_keys import PgKeyStore
from tests.integration import record_state
from tests.integration.conftest import TOKEN


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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """The store, counting its lookups by digest."""

    def __init__(self, inner: KeyStore) -> None:
        self.inner, self.lookups = inner, 0

    def key_by_digest(self, token_digest: str) -> Any:
        self.lookups += 1
        return self.inner.key_by_digest(token_digest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_the_key_cache_keeps_found_keys_by_digest_for_its_seconds(keys: KeyStore) -> None:
    """A key found is answered from the cache until its seconds are over, then looked up
    again; an unknown token is looked up every time (never a cached "no"); the cache
    holds digests, never a token; a revocation in this process drops the key at once,
    one made elsewhere (the record changed under the cache) shows once the entry lapses."""
    clock, store = Clock(), Counting(keys)
    cache = apikeys.KeyCache(1.0, clock=clock)
    key, token = apikeys.create(keys, "analyst", label="cached")
    assert cache.lookup(store, token) == key and store.lookups == 1  # type: ignore[arg-type]
    clock.now += 0.9
    assert cache.lookup(store, token) == key and store.lookups == 1  # type: ignore[arg-type]
    assert token not in repr(cache._entries) and apikeys.digest(token) in cache._entries
    for _ in range(2):
        assert cache.lookup(store, token + "x") is None  # type: ignore[arg-type]
    assert store.lookups == 3 and len(cache._entries) == 1
    # revoked by another process: this one answers from its entry until it lapses
    assert keys.remove_key(key.id)
    assert cache.lookup(store, token) == key and store.lookups == 3  # type: ignore[arg-type]
    clock.now += 0.1
    assert cache.lookup(store, token) is None and store.lookups == 4  # type: ignore[arg-type]
    assert not cache._entries
    # revoked in this process: at once, in every cache of the process
    other, other_token = apikeys.create(keys, "consumer", label="cached 2")
    assert cache.lookup(store, other_token) == other  # type: ignore[arg-type]
    assert apikeys.revoke(keys, other.id)
    assert cache.lookup(store, other_token) is None  # type: ignore[arg-type]
    # 0 seconds: no cache
    off = apikeys.KeyCache(0.0, clock=clock)
    third, third_token = apikeys.create(keys, "consumer", label="uncached")
    before = store.lookups
    assert off.lookup(store, third_token) == off.lookup(store, third_token) == third  # type: ignore[arg-type]
    assert store.lookups == before + 2 and not off._entries


def test_the_key_cache_is_bounded(keys: KeyStore) -> None:
    """Full, it drops its lapsed entries first; full of fresh ones, it starts again."""
    clock = Clock()
    cache = apikeys.KeyCache(1.0, max_entries=3, clock=clock)
    made = [apikeys.create(keys, "consumer", label=f"bound {i}") for i in range(5)]
    for key, token in made[:3]:
        assert cache.lookup(keys, token) == key
    assert len(cache._entries) == 3
    clock.now += 2  # every entry lapsed: the next insert prunes them
    assert cache.lookup(keys, made[3][1]) == made[3][0] and len(cache._entries) == 1
    for key, token in (made[4], made[0]):
        assert cache.lookup(keys, token) == key
    assert len(cache._entries) == 3
    assert cache.lookup(keys, made[1][1]) == made[1][0] and len(cache._entries) == 1


def test_a_key_revoked_by_another_process_is_refused_after_the_cache_seconds(
        app: Flask, keys: KeyStore) -> None:
    """Through the API, with the service's own setting (PRIVRELEASE_KEY_CACHE_SECONDS):
    a key revoked in the record by another API process still passes here while this
    process's entry is fresh, and is refused (401) once it lapsed; revoked through this
    process (``DELETE /v1/keys/{id}``) it is refused on the next request."""
    seconds = app.config["PRIVRELEASE"].key_cache_seconds
    assert 0 < seconds <= 2, seconds
    client = app.test_client()
    key, token = apikeys.create(keys, "consumer", label="revoked elsewhere")
    headers = {"Authorization": f"Bearer {token}"}
    looked_up = time.monotonic()
    assert client.get("/v1/datasets", headers=headers).status_code == 200
    assert keys.remove_key(key.id)  # the record, as another API process's revoke leaves it
    asked = time.monotonic()
    lagging = client.get("/v1/datasets", headers=headers)
    if asked < looked_up + seconds:  # the entry was fresh (a loaded machine may be slower)
        assert lagging.status_code == 200
    time.sleep(max(0.0, looked_up + seconds - time.monotonic()) + 0.05)
    refused = client.get("/v1/datasets", headers=headers)
    assert refused.status_code == 401
    assert refused.get_json()["detail"] == "unknown or revoked API key"
    assert apikeys.digest(token) not in auth.key_cache(app)._entries

    key, token = apikeys.create(keys, "consumer", label="revoked here")
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get("/v1/datasets", headers=headers).status_code == 200
    operator = {"Authorization": f"Bearer {TOKEN}"}
    assert client.delete(f"/v1/keys/{key.id}", headers=operator).status_code == 204
    assert client.get("/v1/datasets", headers=headers).status_code == 401


def test_the_key_cache_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """PRIVRELEASE_KEY_CACHE_SECONDS: 1 s unless set; 0 turns the cache off; a negative,
    infinite or non-number value is refused at start."""
    monkeypatch.delenv("PRIVRELEASE_KEY_CACHE_SECONDS", raising=False)
    assert Config.from_env().key_cache_seconds == Config.key_cache_seconds == 1.0
    for raw, seconds in (("0", 0.0), ("2.5", 2.5)):
        monkeypatch.setenv("PRIVRELEASE_KEY_CACHE_SECONDS", raw)
        assert Config.from_env().key_cache_seconds == seconds
    for bad in ("-1", "inf", "nan", "soon"):
        monkeypatch.setenv("PRIVRELEASE_KEY_CACHE_SECONDS", bad)
        with pytest.raises(SystemExit, match="PRIVRELEASE_KEY_CACHE_SECONDS"):
            Config.from_env()
