"""PRIVRELEASE_REDIS_URL as a Sentinel URL: one spelling, read alike by our clients,
the Celery broker and the rate limiter."""

from __future__ import annotations

import pytest
from celery import Celery

from service.config import Config
from service.releases.queue import SentinelBrokerTransport, configure
from service.storage import rkeys

URL = "sentinel://privrelease:p%40ss@10.0.0.1:26379,10.0.0.2:26380,vk-2/ledger/3"


def test_sentinel_url_parts() -> None:
    s = rkeys.parse_sentinel(URL + "?sentinel_password=sp")
    assert s == rkeys.SentinelURL(
        (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("vk-2", 26379)), "ledger", 3,
        "privrelease", "p@ss", None, "sp")
    bare = rkeys.parse_sentinel("sentinel://h/m")
    assert bare == rkeys.SentinelURL((("h", 26379),), "m")
    assert rkeys.parse_sentinel("redis://h:6379/0") is None
    for bad in ("sentinel://h", "sentinel://h/m/0/x", "sentinel://:26379/m"):
        with pytest.raises(ValueError, match="sentinel://"):
            rkeys.parse_sentinel(bad)


def test_celery_broker_speaks_kombus_sentinel_spelling() -> None:
    """kombu wants one sentinel:// URL per sentinel joined by ';' and master_name; the
    data nodes' password in the URL, none sent to sentinels that were not given one."""
    app = configure(Celery("t"), Config(redis_url=URL))
    assert app.conf.broker_url == ";".join(
        f"sentinel://privrelease:p%40ss@{h}/3" for h in
        ("10.0.0.1:26379", "10.0.0.2:26380", "vk-2:26379"))
    assert app.conf.broker_transport is SentinelBrokerTransport
    options = app.conf.broker_transport_options
    assert options["master_name"] == "ledger"
    assert "password" not in options["sentinel_kwargs"]
    assert options["visibility_timeout"] > 0


def test_client_is_the_masters() -> None:
    client = rkeys.connect(URL)
    pool = client.connection_pool
    assert pool.service_name == "ledger"
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (3, "privrelease", "p@ss")
    assert kwargs["socket_timeout"] == rkeys.REPLY_TIMEOUT


