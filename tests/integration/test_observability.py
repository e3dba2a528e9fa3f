"""Request ids, JSON access logs, /metrics and per-key rate limits, against real Valkey."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from limits import parse
from prometheus_client.parser import text_string_to_metric_families

from service import apikeys, wiring
from service.api import ratelimit
from service.api.app import create_app
from service.api.observability import ClusterCollector, log_handler
from service.config import Config
from service.storage import release_metrics
from service.storage.keys import KeyStore
from tests.conftest import ROOT
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

PROBLEM = "application/problem+json"


def scrape(client: FlaskClient, token: str | None = None
           ) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics as {(name, labels): value}."""
    resp = client.get("/metrics", headers=bearer(token) if token else {})
    assert resp.status_code == 200
    assert resp.content_type.startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(resp.get_data(as_text=True))
            for s in family.samples}


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
           **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def fresh_key(keys: KeyStore, role: str = "operator") -> str:
    """A key of its own per test, so rate limit windows never leak between tests."""
    token = f"pr_obs_{uuid.uuid4().hex}"
    apikeys.create(keys, role, "observability test", token=token)
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- request id ------------------------------------------------------------------

def test_request_id_is_echoed_when_sane_and_generated_otherwise(app: Flask) -> None:
    client = app.test_client()
    echoed = client.get("/healthz", headers={"X-Request-ID": "edge-42.a_B"})
    assert echoed.headers["X-Request-ID"] == "edge-42.a_B"

    generated = client.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["X-Request-ID"])
    assert client.get("/healthz").headers["X-Request-ID"] != generated.headers["X-Request-ID"]

    for bad in ("has space", "a" * 129, "semi;colon", "tab\there", "é", ""):
        got = client.get("/healthz", headers={"X-Request-ID": bad}).headers["X-Request-ID"]
        assert re.fullmatch(r"[0-9a-f]{32}", got), bad
    assert client.get("/healthz", headers={"X-Request-ID": "b" * 128}
                      ).headers["X-Request-ID"] == "b" * 128


def test_problem_documents_carry_the_request_id(api: Api) -> None:
    missing = api.client.get("/v1/nowhere", headers={"X-Request-ID": "trace-404"})
    assert missing.status_code == 404 and missing.content_type == PROBLEM
    assert missing.headers["X-Request-ID"] == "trace-404"
    assert missing.get_json()["request_id"] == "trace-404"
    assert missing.get_json()["code"] == "not_found"

    invalid = api.post("/v1/releases", {"mechanism": "laplace"})
    assert invalid.status_code == 422 and invalid.content_type == PROBLEM
    body = invalid.get_json()
    assert body["code"] == "validation_error"
    assert body["request_id"] == invalid.headers["X-Request-ID"]

    unauthorized = api.client.get("/v1/datasets")
    assert unauthorized.status_code == 401
    assert unauthorized.get_json()["request_id"] == unauthorized.headers["X-Request-ID"]


# --- logs --------------------------------------------------------------------------

@pytest.fixture()
def logs(app: Flask) -> Iterator[io.StringIO]:
    """What the service's JSON log handler writes during the test."""
    handler = log_handler()
    assert handler is not None
    buf = io.StringIO()
    old = handler.setStream(buf)
    try:
        yield buf
    finally:
        handler.setStream(old)


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_access_log_is_json_with_route_template_and_no_secrets_or_values(
        api: Api, logs: io.StringIO) -> None:
    marker = "987.654321"  # a data value that must never reach a log
    csv = people_csv(20).replace("\n20,0.5,a\n", f"\n20,{marker},a\n")
    assert marker in csv
    uploaded = api.upload(csv, PEOPLE_META)
    assert uploaded.status_code == 201
    ds = uploaded.get_json()["id"]
    resp = api.client.get(f"/v1/datasets/{ds}?secret=hunter2",
                          headers={**bearer(TOKEN), "X-Request-ID": "log-check-1"})
    assert resp.status_code == 200
    err = logs.getvalue()

    assert marker not in err and TOKEN not in err and "hunter2" not in err
    assert apikeys.digest(TOKEN) not in err
    lines = _json_lines(err)
    access = [rec for rec in lines if rec["logger"] == "privrelease.access"]
    assert len(access) == 2
    upload_line, read_line = access
    assert upload_line["route"] == "/v1/datasets" and upload_line["method"] == "POST"
    assert upload_line["status"] == 201
    assert read_line == {
        **read_line,
        "level": "INFO", "msg": "request", "request_id": "log-check-1", "method": "GET",
        "route": "/v1/datasets/<dataset_id>", "status": 200,
    }
    assert ds not in json.dumps(read_line)  # the template, not the path
    assert isinstance(read_line["duration_ms"], float) and read_line["duration_ms"] >= 0
    key = apikeys.lookup(wiring.of(api.client.application).keys, TOKEN)
    assert key is not None and read_line["key_id"] == key.id
    assert set(read_line) == {"ts", "level", "logger", "msg", "request_id", "method", "route",
                              "status", "duration_ms", "key_id"}


def test_log_records_in_a_request_carry_its_id(app: Flask, logs: io.StringIO) -> None:
    with app.test_request_context("/anything", headers={"X-Request-ID": "inner-7"}):
        app.preprocess_request()
        logging.getLogger("privrelease.test").warning("inside", extra={"release_id": "rel_x"})
    rec = _json_lines(logs.getvalue())[-1]
    assert rec["msg"] == "inside" and rec["request_id"] == "inner-7"
    assert rec["release_id"] == "rel_x" and rec["level"] == "WARNING"


# --- metrics -------------------------------------------------------------------------

def test_metrics_count_requests_by_route_and_status(app: Flask) -> None:
    client = app.test_client()
    before = scrape(client)
    for _ in range(3):
        assert client.get("/healthz").status_code == 200
    client.get("/v1/datasets/ds_unknown")  # 401: no token
    client.get("/v1/no/such/path")
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta("privrelease_http_requests_total",
                 method="GET", route="/healthz", status="200") == 3
    assert delta("privrelease_http_request_duration_seconds_count",
                 method="GET", route="/healthz", status="200") == 3
    assert delta("privrelease_http_request_duration_seconds_bucket",
                 method="GET", route="/healthz", status="200", le="+Inf") == 3
    assert delta("privrelease_http_requests_total",
                 method="GET", route="/v1/datasets/<dataset_id>", status="401") == 1
    assert delta("privrelease_http_requests_total",
                 method="GET", route="unmatched", status="404") == 1
    assert sample(after, "privrelease_redis_up") == 1


def listed_datasets(api: Api) -> list[str]:
    """Every registered dataset's id as an operator's ``GET /v1/datasets`` lists them,
    newest first (every page)."""
    ids: list[str] = []
    url = "/v1/datasets?limit=1000"
    while url:
        resp = api.get(url)
        assert resp.status_code == 200, resp.get_json()
        ids += [d["id"] for d in resp.get_json()]
        cursor = resp.headers.get("X-Next-Cursor")
        url = f"/v1/datasets?limit=1000&cursor={cursor}" if cursor else ""
    return ids


def test_metrics_report_queue_depth_and_dataset_count(app: Flask, api: Api,
                                                      r: redis.Redis) -> None:
    samples = scrape(app.test_client())
    for name in ("releases", "analyses"):  # each queue's depth (analyses wait apart)
        assert ("privrelease_queue_depth", frozenset({("queue", name)})) in samples
    # the registered datasets, counted apart from the metric's Store.dataset_count
    assert sample(samples, "privrelease_datasets") == len(listed_datasets(api))

    queue = f"pr:test:queue:{uuid.uuid4().hex}"
    r.rpush(queue, "a", "b", "c")
    try:
        collector = ClusterCollector(r, wiring.of(app).ledger, queue, max_datasets=0)
        families = {m.name: m for m in collector.collect()}
        assert families["privrelease_queue_depth"].samples[0].value == 3
        assert families["privrelease_queue_depth"].samples[0].labels == {"queue": queue}
        assert families["privrelease_budget_remaining"].samples == []  # capped at 0
    finally:
        r.delete(queue)


SCRAPE_TOKEN = "scrape-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def scraped_app(app: Flask) -> Flask:
    """The same service with PRIVRELEASE_METRICS_TOKEN set."""
    return create_app(dataclasses.replace(app.config["PRIVRELEASE"], metrics_token=SCRAPE_TOKEN))


def test_metrics_token_guards_metrics_and_unlocks_per_dataset_series(
        scraped_app: Flask, app: Flask, api: Api) -> None:
    resp = api.upload(people_csv(), PEOPLE_META)
    assert resp.status_code == 201
    ds = resp.get_json()["id"]
    client = scraped_app.test_client()
    for headers in ({}, bearer("wrong"), bearer(TOKEN), {"Authorization": SCRAPE_TOKEN}):
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 401 and refused.content_type == PROBLEM
        assert SCRAPE_TOKEN not in refused.get_data(as_text=True)
    assert ("privrelease_budget_remaining",
            frozenset({("dataset", ds), ("measure", "epsilon")})) in scrape(client, SCRAPE_TOKEN)
    # without a token configured /metrics stays open but names no dataset and no budget
    open_samples = scrape(app.test_client())
    assert not [k for k in open_samples if k[0] == "privrelease_budget_remaining"]
    assert sample(open_samples, "privrelease_datasets") >= 1


def test_metrics_report_exact_remaining_budget(api: Api, worker: Any, scraped_app: Flask) -> None:
    resp = api.upload(people_csv(), PEOPLE_META)
    assert resp.status_code == 201
    ds = resp.get_json()["id"]
    scraper = scraped_app.test_client()
    samples = scrape(scraper, SCRAPE_TOKEN)
    assert sample(samples, "privrelease_budget_remaining", dataset=ds, measure="epsilon") == 5
    assert sample(samples, "privrelease_budget_remaining", dataset=ds, measure="delta") == 1e-5

    release = api.post("/v1/releases", {"dataset_id": ds, "mechanism": "laplace",
                                        "params": {"statistic": "mean", "column": "age"},
                                        "budget": {"epsilon": 0.3}})
    assert release.status_code == 202, release.get_json()
    assert api.wait(release.get_json()["id"])["status"] == "succeeded"
    samples = scrape(scraper, SCRAPE_TOKEN)
    assert sample(samples, "privrelease_budget_remaining", dataset=ds, measure="epsilon") == 4.7
    assert sample(samples, "privrelease_budget_remaining", dataset=ds, measure="delta") == 1e-5


def test_metrics_export_only_the_newest_datasets(app: Flask, api: Api, r: redis.Redis) -> None:
    newest = listed_datasets(api)[:2]
    if len(newest) < 2:
        pytest.skip("needs two datasets")  # pragma: no cover
    families = {m.name: m for m in ClusterCollector(r, wiring.of(app).ledger, "privrelease",
                                                    1).collect()}
    exported = {s.labels["dataset"] for s in families["privrelease_budget_remaining"].samples}
    assert exported == {newest[0]}


def test_release_counter_and_runtime_histogram_from_redis(app: Flask, r: redis.Redis) -> None:
    mech = f"test.mech_{uuid.uuid4().hex[:8]}"
    release_metrics.record_release(r, mech, "succeeded", 0.03)
    release_metrics.record_release(r, mech, "succeeded", 1.7)
    release_metrics.record_release(r, mech, "failed", 0.004)
    release_metrics.record_release(r, mech, "succeeded", 10_000.0)
    release_metrics.flush()  # the first was written at once; the others wait their spell
    samples = scrape(app.test_client())

    assert sample(samples, "privrelease_releases_total", mechanism=mech, outcome="succeeded") == 3
    assert sample(samples, "privrelease_releases_total", mechanism=mech, outcome="failed") == 1
    buckets = {le: sample(samples, "privrelease_job_seconds_bucket", mechanism=mech, le=le)
               for le in ("0.005", "0.025", "0.05", "1.0", "2.5", "600.0", "+Inf")}
    assert buckets == {"0.005": 1, "0.025": 1, "0.05": 2, "1.0": 2, "2.5": 3, "600.0": 3,
                       "+Inf": 4}
    assert sample(samples, "privrelease_job_seconds_count", mechanism=mech) == 4
    assert sample(samples, "privrelease_job_seconds_sum", mechanism=mech) == pytest.approx(
        10_001.734)


def test_release_metrics_are_written_at_once_then_once_per_spell(r: redis.Redis) -> None:
    """The first job after a quiet spell is written at once; the jobs within the next
    FLUSH_SECONDS wait and are written together at its end, every count and sum kept."""
    mech = f"test.mech_{uuid.uuid4().hex[:8]}"
    ok = f"{mech}{release_metrics.SEP}succeeded"
    total = f"{mech}{release_metrics.SEP}count"
    batch = release_metrics.Batch(r, every=0.5)
    batch.add(mech, "succeeded", 0.02)
    assert r.hget(release_metrics.RELEASES, ok) == "1"  # at once
    began = time.monotonic()
    for _ in range(9):
        batch.add(mech, "succeeded", 0.02)
    assert r.hget(release_metrics.RELEASES, ok) == "1"  # within the spell: waiting
    while r.hget(release_metrics.RELEASES, ok) != "10":
        assert time.monotonic() - began < 5, "the spell's counts were never written"
        time.sleep(0.02)
    assert time.monotonic() - began >= 0.4
    assert r.hget(release_metrics.RUNTIME, total) == "10"
    assert float(r.hget(release_metrics.RUNTIME, f"{mech}{release_metrics.SEP}sum") or 0
                 ) == pytest.approx(0.2)
    deadline = time.monotonic() + 5
    while batch._writer is not None:  # its thread ends after a spell that counted nothing
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_record_release_refuses_the_field_separator(r: redis.Redis) -> None:
    with pytest.raises(ValueError):
        release_metrics.record_release(r, "a|b", "succeeded", 1.0)


def test_multiprocess_mode_sums_every_process(service_env: dict[str, str],
                                              tmp_path: Path) -> None:
    """Two processes (as two gunicorn workers) share a directory; either one's
    /metrics reports the requests of both."""
    script = (
        "from service.api.app import create_app\n"
        "c = create_app().test_client()\n"
        "for _ in range({n}): assert c.get('/healthz').status_code == 200\n"
        "print(c.get('/metrics').get_data(as_text=True))\n"
    )
    env = {**service_env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def run(n: int) -> float:
        out = subprocess.run([sys.executable, "-c", script.format(n=n)], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=120, check=True).stdout
        samples = {(s.name, frozenset(s.labels.items())): s.value
                   for f in text_string_to_metric_families(out) for s in f.samples}
        return sample(samples, "privrelease_http_requests_total",
                      method="GET", route="/healthz", status="200")

    assert run(2) == 2
    assert run(3) == 5
    assert any(p.name.startswith("counter_") for p in tmp_path.iterdir())


# --- rate limits ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def limited_app(app: Flask) -> Iterator[Flask]:
    """The same service with a tiny per-key limit."""
    yield create_app(dataclasses.replace(app.config["PRIVRELEASE"], rate_limit="3/minute"))


def test_rate_limit_is_per_key_and_answers_429_problem(limited_app: Flask,
                                                       keys: KeyStore) -> None:
    client = limited_app.test_client()
    one, other = fresh_key(keys), fresh_key(keys)
    for i in range(3):
        ok = client.get("/v1/datasets", headers=bearer(one))
        assert ok.status_code == 200, i
        assert ok.headers["X-RateLimit-Limit"] == "3"
        assert ok.headers["X-RateLimit-Remaining"] == str(2 - i)

    refused = client.get("/v1/datasets", headers={**bearer(one), "X-Request-ID": "rl-1"})
    assert refused.status_code == 429
    assert refused.content_type == PROBLEM
    body = refused.get_json()
    assert body["code"] == "rate_limited" and body["status"] == 429
    assert body["request_id"] == "rl-1" and "3 per 1 minute" in body["detail"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert one not in json.dumps(body) and apikeys.digest(one) not in json.dumps(body)
    # every endpoint shares the key's budget
    assert client.post("/v1/releases", json={}, headers=bearer(one)).status_code == 429

    assert client.get("/v1/datasets", headers=bearer(other)).status_code == 200


def test_the_limiter_costs_one_round_trip_per_request(limited_app: Flask, keys: KeyStore,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The hit's script answers the window's count and expiry with the decision, and the
    headers are written from that answer: one Valkey command per request (flask-limiter's
    fixed-window strategy read the count and the TTL again after the view: three). A
    small limit leases one request at a time: exact, one command per request."""
    conn = limited_app.extensions[ratelimit.EXTENSION].client
    client = limited_app.test_client()
    client.get("/v1/datasets", headers=bearer(fresh_key(keys)))  # the script is loaded
    sent: list[str] = []
    real = conn.execute_command

    def counted(*args: Any, **kwargs: Any) -> Any:
        sent.append(str(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(conn, "execute_command", counted)
    token = fresh_key(keys)
    opened = time.time()
    for i in range(4):
        resp = client.get("/v1/datasets", headers=bearer(token))
        if i == 0:
            opened_by = time.time()
        assert sent == ["EVALSHA"] * (i + 1), sent
        assert resp.status_code == (200 if i < 3 else 429)
        assert resp.headers["X-RateLimit-Limit"] == "3"
        assert resp.headers["X-RateLimit-Remaining"] == str(max(2 - i, 0))
        # the window opened at the first hit, for 60 s (Reset: its end + 1, truncated)
        assert int(opened + 60) <= int(resp.headers["X-RateLimit-Reset"]) <= int(opened_by + 61)
    assert 1 <= int(resp.headers["Retry-After"]) <= 60


def test_leases_admit_exactly_the_limit_across_processes(app: Flask, keys: KeyStore,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two API processes (two apps, each its own limiter and leases) sending one key's
    requests in turns: together they admit exactly the window's limit, each admitted
    request's X-RateLimit-Remaining is the window's count as its lease numbered it (all
    distinct), and a lease saves the round trips: far fewer scripts than requests."""
    limit = 3000
    config = dataclasses.replace(app.config["PRIVRELEASE"], rate_limit=f"{limit}/minute")
    apps = [create_app(config), create_app(config)]
    sent = [0, 0]
    for i, one in enumerate(apps):
        limiter = one.extensions[ratelimit.EXTENSION]
        real = limiter.script

        def counted(*args: Any, _real: Any = real, _i: int = i, **kwargs: Any) -> Any:
            sent[_i] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(limiter, "script", counted)
    clients = [one.test_client() for one in apps]
    token = fresh_key(keys)
    admitted, remaining, turn = 0, [], 0
    refused = [False, False]
    while not all(refused):
        turn = (turn + 1) % 2 if not refused[(turn + 1) % 2] else turn
        resp = clients[turn].get("/v1/no-such-route", headers=bearer(token))
        if resp.status_code == 429:
            refused[turn] = True
            continue
        assert resp.status_code == 404
        admitted += 1
        remaining.append(int(resp.headers["X-RateLimit-Remaining"]))
    assert admitted == limit
    assert sorted(remaining) == list(range(limit))  # every count of the window, once
    assert sum(sent) < limit / 2, sent  # about 256·ln(limit / 256) + 256 per process
    # near the full window a lease is one request: the last ones were counted one by one
    assert ratelimit.lease_size(parse(f"{limit}/minute"), limit - 255) == 1


@pytest.mark.parametrize(("amount", "counted", "size"), [
    (3, 0, 1), (6000, 0, 23), (6000, 5800, 1), (10_000_000, 0, 64), (16_384, 0, 64)])
def test_lease_size_is_a_share_of_what_is_left(amount: int, counted: int, size: int) -> None:
    assert ratelimit.lease_size(parse(f"{amount}/minute"), counted) == size


def test_probes_metrics_and_docs_are_never_limited(limited_app: Flask,
                                                   keys: KeyStore) -> None:
    client = limited_app.test_client()
    token = fresh_key(keys)
    for _ in range(4):
        client.get("/v1/datasets", headers=bearer(token))
    for path in ("/healthz", "/metrics", "/openapi.json", "/docs"):
        for _ in range(5):
            resp = client.get(path, headers=bearer(token))
            assert resp.status_code == 200, path
            assert "X-RateLimit-Limit" not in resp.headers
    assert client.get("/readyz", headers=bearer(token)).status_code in {200, 503}


def test_requests_without_a_token_are_limited_per_address(limited_app: Flask) -> None:
    client = limited_app.test_client()
    addr = {"REMOTE_ADDR": f"10.{uuid.uuid4().int % 250}.7.{uuid.uuid4().int % 250}"}
    statuses = [client.get("/v1/datasets", environ_base=addr).status_code for _ in range(4)]
    assert statuses == [401, 401, 401, 429]
    other = {"REMOTE_ADDR": "192.0.2.77"}
    assert client.get("/v1/datasets", environ_base=other).status_code == 401


def test_made_up_tokens_share_their_address_bucket(limited_app: Flask) -> None:
    """A flood of random tokens must not get a fresh bucket per token."""
    client = limited_app.test_client()
    addr = {"REMOTE_ADDR": f"10.{uuid.uuid4().int % 250}.8.{uuid.uuid4().int % 250}"}
    statuses = [client.get("/v1/datasets", environ_base=addr,
                           headers=bearer(f"pr_fake_{uuid.uuid4().hex}")).status_code
                for _ in range(4)]
    assert statuses == [401, 401, 401, 429]


def test_trusted_proxy_address_is_the_forwarded_client(app: Flask) -> None:
    """With one trusted proxy, two clients behind it get separate buckets."""
    proxied = create_app(dataclasses.replace(app.config["PRIVRELEASE"], rate_limit="2/minute",
                                             trusted_proxies=1)).test_client()
    proxy = {"REMOTE_ADDR": "10.0.0.1"}
    octet = uuid.uuid4().int % 250
    first, second = f"198.51.{octet}.1", f"198.51.{octet}.2"
    statuses = [proxied.get("/v1/datasets", environ_base=proxy,
                            headers={"X-Forwarded-For": first}).status_code for _ in range(3)]
    assert statuses == [401, 401, 429]
    assert proxied.get("/v1/datasets", environ_base=proxy,
                       headers={"X-Forwarded-For": second}).status_code == 401


def test_rate_limit_off_installs_no_limiter(app: Flask, keys: KeyStore) -> None:
    unlimited = create_app(dataclasses.replace(app.config["PRIVRELEASE"], rate_limit=None))
    resp = unlimited.test_client().get("/v1/datasets", headers=bearer(fresh_key(keys)))
    assert resp.status_code == 200 and "X-RateLimit-Limit" not in resp.headers
    assert ratelimit.EXTENSION not in unlimited.extensions


def test_shared_test_app_uses_the_default_limit(app: Flask) -> None:
    """The rest of the suite runs under the default limit (its busiest key makes
    about 700 requests a minute), so the default must stay well above that."""
    assert app.config["PRIVRELEASE"].rate_limit == Config.rate_limit
    default = parse(str(Config.rate_limit))
    resp = app.test_client().get("/v1/datasets", headers=bearer(TOKEN))
    assert resp.headers["X-RateLimit-Limit"] == str(default.amount)
    assert default.amount / default.get_expiry() >= 5000 / 60
