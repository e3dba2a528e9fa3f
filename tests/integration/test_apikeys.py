"""API keys are stored hashed and a bootstrap token is registered once."""

from __future__ import annotations

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
