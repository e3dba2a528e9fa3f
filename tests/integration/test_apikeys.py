"""API keys are stored hashed and a bootstrap token is registered once."""

from __future__ import annotations

import stat
from pathlib import Path

import redis

from service import apikeys


def test_tokens_are_stored_only_hashed(r: redis.Redis) -> None:
    key, token = apikeys.create(r, "analyst", label="a")
    assert token.startswith("pr_") and len(token) > 40
    readers = {"hash": r.hgetall, "string": r.get,  # the releases a key requested: a zset
               "zset": lambda k: r.zrange(k, 0, -1, withscores=True)}
    dump = [str(readers[r.type(k)](k)) for k in r.scan_iter("pr:*key*")]
    assert not any(token in d for d in dump)
    assert apikeys.lookup(r, token) == key
    assert apikeys.lookup(r, token + "x") is None


def test_bootstrap_token_is_registered_once(r: redis.Redis) -> None:
    first, _ = apikeys.create(r, "operator", token="pr_bootstrap_once_123")
    again, _ = apikeys.create(r, "operator", token="pr_bootstrap_once_123")
    assert again.id == first.id
    digests = list(r.hgetall("pr:apikeys").values())
    assert digests.count(apikeys.digest("pr_bootstrap_once_123")) == 1


def test_data_dir_bootstrap_keeps_one_key_until_it_is_revoked(r: redis.Redis,
                                                              tmp_path: Path) -> None:
    """Catches issue #18's finding: each `standalone` start without
    PRIVRELEASE_BOOTSTRAP_KEY minted another valid operator key."""
    path = tmp_path / "bootstrap-key"
    token, made = apikeys.data_dir_bootstrap(r, path)
    assert made and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = apikeys.lookup(r, token)
    assert key is not None and key.role == "operator"
    before = r.hlen("pr:apikeys")
    assert apikeys.data_dir_bootstrap(r, path) == (token, False)
    assert r.hlen("pr:apikeys") == before  # no second key
    # rotation: revoke it, and the next start makes a new one (the old stays dead)
    apikeys.revoke(r, key.id)
    rotated, made = apikeys.data_dir_bootstrap(r, path)
    assert made and rotated != token and path.read_text().strip() == rotated
    assert apikeys.lookup(r, token) is None
