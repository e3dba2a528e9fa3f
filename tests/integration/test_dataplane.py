"""The data plane's edges (issue 15 items 8-12), against a real record and a real worker:
error-path logs, storage errors at upload, indexed and paged lists, the enqueue outbox."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from psycopg_pool import ConnectionPool

from service import apikeys, wiring
from service.api import inputs
from service.api.app import create_app
from service.api.observability import log_handler
from service.config import Config
from service.releases import pricing, submit, sweeper
from service.storage.ledger import Reservation
from service.storage.pg_keys import PgKeyStore
from service.storage.pg_ledger import PgLedger
from tests.conftest import ROOT
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.test_ledger_paging import CountingPool

SECRET = "31337.25"  # a data value an exception message quotes; it must reach no log


def _fresh_app(env: dict[str, str], **overrides: str) -> Flask:
    """An app of its own (routes may still be added to it), built from ``env``."""
    saved = dict(os.environ)
    handler = log_handler()
    stream = handler.stream if handler is not None else None
    os.environ.update({**env, **overrides})
    try:
        return create_app(Config.from_env())
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if stream is not None:  # not this test's captured stderr, closed after it
            _swap(stream)


def _swap(buf: io.StringIO) -> Any:
    """Point the service's JSON log handler at ``buf``; returns (handler, old stream)."""
    handler = log_handler()
    assert handler is not None
    return handler, handler.setStream(buf)


def _records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- item 11: error-path logs --------------------------------------------------------

def test_500_is_logged_as_json_with_request_id_and_type_only(
        app: Flask, service_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """Item 11: main logged a 500 through ``service.api.problems``, a logger outside the JSON
    setup: plain text on stderr, no request id, the exception's message (a data value)
    and its full traceback. Now one JSON record: request id, exception type, frames."""
    fresh = _fresh_app(service_env)

    @fresh.route("/boom")
    def boom() -> str:
        raise ValueError(f"could not convert {SECRET!r}")

    buf = io.StringIO()
    handler, old = _swap(buf)
    try:
        resp = fresh.test_client().get("/boom", headers={"X-Request-ID": "err-500-check"})
    finally:
        handler.setStream(old)
    assert resp.status_code == 500 and resp.get_json()["code"] == "internal_error"
    out = buf.getvalue()
    errors = [r for r in _records(out) if r["logger"] == "privrelease.errors"]
    assert len(errors) == 1, out
    assert errors[0]["request_id"] == "err-500-check"
    assert errors[0]["exc_type"] == "ValueError" and errors[0]["level"] == "ERROR"
    assert "boom" in errors[0]["traceback"]  # where it happened, for the operator
    std = capsys.readouterr()
    assert SECRET not in out + std.err + std.out


def test_503_is_logged_as_json_with_request_id(
        service_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """Item 11: the 503 handler's warning went to the plain-text last-resort handler without
    the request id on main; now a JSON record with it and the error type. The record the
    request reads its key from (PostgreSQL) is unreachable."""
    with socket.socket() as sock:  # a port nothing listens on: the database unreachable
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fresh = _fresh_app(service_env)
    svc = wiring.of(fresh)
    assert isinstance(svc.keys, PgKeyStore) and isinstance(svc.ledger, PgLedger)
    dead = ConnectionPool(f"postgresql://127.0.0.1:{port}/nowhere", min_size=1,
                          timeout=1.0, open=False)
    dead.open(wait=False)
    usual = svc.ledger.pool
    svc.keys.pool = svc.ledger.pool = dead
    try:
        _logged_503(fresh, capsys, "PoolTimeout")  # no connection within a second
    finally:
        svc.keys.pool = svc.ledger.pool = usual
        dead.close()
        usual.close()


def _logged_503(fresh: Flask, capsys: pytest.CaptureFixture[str], error_type: str) -> None:
    buf = io.StringIO()
    handler, old = _swap(buf)
    try:
        resp = fresh.test_client().get("/v1/datasets", headers={
            "Authorization": f"Bearer {TOKEN}", "X-Request-ID": "err-503-check"})
    finally:
        handler.setStream(old)
    assert resp.status_code == 503, resp.get_json()
    out = buf.getvalue()
    warnings = [r for r in _records(out) if r["logger"] == "privrelease.errors"]
    assert len(warnings) == 1, out
    assert warnings[0]["request_id"] == "err-503-check"
    assert warnings[0]["error_type"] == error_type
    assert "traceback" not in warnings[0]
    assert "store unavailable" not in capsys.readouterr().err


# --- item 12: the enqueue outbox -----------------------------------------------------

def _body(ds: str, value: int) -> dict[str, Any]:
    return {"dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": 0.1},
            "params": {"statistic": "count",
                       "condition": {"column": "age", "op": "ge", "value": value}}}


def _reserve_and_die(app: Flask, body: dict[str, Any], idem: str | None = None) -> str:
    """What an API process that died between reserve and enqueue leaves behind: the very
    steps of ``POST /v1/releases`` up to and including the reservation, and no task."""
    headers = {"Idempotency-Key": idem} if idem else {}
    with app.test_request_context(headers=headers):
        ledger = wiring.of(app).ledger
        key = apikeys.lookup(wiring.of(app).keys, TOKEN)
        assert key is not None
        prepared = pricing.prepare(ledger, body, allow_seeds=True)
        res = ledger.reserve(Reservation(
            body["dataset_id"], submit.new_id(), prepared.cost_units, actor=key.id,
            fingerprint=prepared.request_fingerprint, replay_fingerprint=prepared.fingerprint,
            request_json=prepared.job().to_json(), idempotency_key=inputs.idempotency_key(key.id)))
    assert res.outcome == "reserved"
    return res.release_id


def _outbox_due(app: Flask, rid: str) -> float | None:
    """When (epoch s) the release entered the session store's outbox; None: not in it.
    No Store method reads it (``unsent`` says only whether it is past a grace)."""
    ledger = wiring.of(app).ledger
    assert isinstance(ledger, PgLedger)
    with ledger.pool.connection() as conn:
        row = conn.execute("SELECT extract(epoch FROM due_at)::float8 FROM outbox "
                           "WHERE release_id = %s", (rid,)).fetchone()
    return None if row is None else float(row[0])


def _set_outbox_due(app: Flask, rid: str, at: float) -> None:
    """Date the release's outbox entry ``at`` (epoch s), as if it entered the outbox then."""
    ledger = wiring.of(app).ledger
    assert isinstance(ledger, PgLedger)
    with ledger.pool.connection() as conn:
        done = conn.execute("UPDATE outbox SET due_at = to_timestamp(%s) "
                            "WHERE release_id = %s", (at, rid))
        assert done.rowcount == 1


def _charges(api: Api, ds: str, rid: str) -> list[str]:
    return [e["kind"] for e in api.get(f"/v1/datasets/{ds}/ledger").get_json()
            if e["release_id"] == rid]


def test_accepted_release_runs_after_its_api_died(app: Flask, api: Api,
                                                  dataset: dict[str, Any],
                                                  worker: Any) -> None:
    """Item 12: on main a retry with the same Idempotency-Key was answered with the
    release a dead API reserved but never enqueued; it never ran and the sweeper refunded
    it. Now the retry, or the sweeper, sends it from the outbox: it runs, charged once."""
    ds, r, ledger = dataset["id"], wiring.of(app).client, wiring.of(app).ledger
    by_retry = _reserve_and_die(app, _body(ds, 30), idem="outbox-retry-1")
    by_sweeper = _reserve_and_die(app, _body(ds, 31))
    fresh = _reserve_and_die(app, _body(ds, 32), idem="outbox-retry-2")
    assert {by_retry, by_sweeper, fresh} <= ledger.unsent_ids()
    # the API that is not dead: a release still within its grace is not sent by the
    # sweeper. Its score is set ahead, before the others' grace ends, so that no sweep
    # (the session worker's own runs every 15 s) can find it past grace during the test,
    # however slow a loaded machine makes the waits below (they were a flake)
    fresh_score = time.time() + 600.0
    _set_outbox_due(app, fresh, fresh_score)
    time.sleep(submit.OUTBOX_GRACE + 0.2)
    retry = api.post("/v1/releases", _body(ds, 30), headers={"Idempotency-Key":
                                                              "outbox-retry-1"})
    assert retry.status_code == 202 and retry.get_json()["id"] == by_retry
    assert api.wait(by_retry)["status"] == "succeeded"

    # the refund pass is made to consider every reservation (min_age 0): still none is
    # refunded, since each is either sent or still in the outbox
    swept = sweeper.sweep(r, ledger, wiring.of(app).queue, min_age=0)
    assert not {by_retry, by_sweeper, fresh} & set(swept)
    assert _outbox_due(app, fresh) == pytest.approx(fresh_score, abs=1e-3)
    assert api.wait(by_sweeper)["status"] == "succeeded"
    assert _outbox_due(app, by_sweeper) is None and by_sweeper not in ledger.unsent_ids()
    for rid in (by_retry, by_sweeper):
        assert _charges(api, ds, rid) == ["reserve", "commit"]
    assert api.get(f"/v1/releases/{fresh}").get_json()["status"] == "queued"
    # the last one's retry, once past its grace, runs it as well
    _set_outbox_due(app, fresh, time.time() - submit.OUTBOX_GRACE - 1)
    retry = api.post("/v1/releases", _body(ds, 32), headers={"Idempotency-Key":
                                                              "outbox-retry-2"})
    assert retry.get_json()["id"] == fresh
    assert api.wait(fresh)["status"] == "succeeded"
    assert _charges(api, ds, fresh) == ["reserve", "commit"]
    assert _outbox_due(app, fresh) is None and fresh not in ledger.unsent_ids()


# --- item 9: indexed, paged lists ----------------------------------------------------

def _pages(api: Api, path: str) -> list[list[str]]:
    """Every page of a list, following X-Next-Cursor (and checking Link agrees)."""
    pages, url = [], path
    for _ in range(100):
        resp = api.get(url)
        assert resp.status_code == 200, resp.get_json()
        pages.append([doc["id"] for doc in resp.get_json()])
        token = resp.headers.get("X-Next-Cursor")
        if token is None:
            assert "Link" not in resp.headers
            return pages
        assert resp.headers["Link"].endswith(f'cursor={token}>; rel="next"')
        url = f"{path}{'&' if '?' in path else '?'}cursor={token}"
    raise AssertionError("the cursor never ended")


def _flat(pages: list[list[str]]) -> list[str]:
    return [item for page in pages for item in page]


@contextlib.contextmanager
def _release_reads(app: Flask) -> Iterator[Callable[[], int]]:
    """Count the releases the session store reads meanwhile: the rows PostgreSQL returns
    to the app's ledger (every query's). Yields the count so far."""
    ledger = wiring.of(app).ledger
    assert isinstance(ledger, PgLedger)
    counting = CountingPool(ledger.pool)
    ledger.pool = counting  # type: ignore[assignment]
    try:
        yield lambda: counting.returned
    finally:
        ledger.pool = counting.real


@contextlib.contextmanager
def _newer_releases_elsewhere(app: Flask, n: int) -> Iterator[None]:
    """``n`` releases of another dataset, newer than all, as far as a list can tell: ids
    rows of PostgreSQL's ``releases``."""
    ledger = wiring.of(app).ledger
    assert isinstance(ledger, PgLedger)
    ids = [f"rel_{i:024x}" for i in range(n)]
    with ledger.pool.connection() as conn:
        conn.execute(
            "INSERT INTO releases (id, dataset_id, actor, status, request, created_at) "
            "SELECT unnest(%s::text[]), 'ds_noise', 'key_noise', 'succeeded', '{}', "
            "now() + interval '1 hour'", (ids,))
    try:
        yield
    finally:
        with ledger.pool.connection() as conn:
            conn.execute("DELETE FROM releases WHERE id = ANY(%s)", (ids,))


def test_release_list_pages_by_cursor_through_the_keys_datasets_only(
        app: Flask, api: Api, dataset: dict[str, Any], worker: Any) -> None:
    """Item 9: main read every release in the system for any list (a key limited to one
    dataset scanned them all) and had no cursor. Now pages come from the dataset indexes,
    chained by X-Next-Cursor, and a limited key's listing reads its datasets' releases
    only (counted by the rows PostgreSQL returns)."""
    ds = dataset["id"]
    other = api.upload(people_csv(20), PEOPLE_META).get_json()["id"]
    mine = [api.post("/v1/releases", _body(ds, v)).get_json()["id"] for v in range(7)]
    theirs = [api.post("/v1/releases", _body(other, v)).get_json()["id"] for v in range(2)]
    _, token = apikeys.create(wiring.of(app).keys, "consumer", datasets=(ds,))
    limited = Api(api.client, token)

    pages = _pages(limited, "/v1/releases?limit=3")
    assert [len(p) for p in pages] == [3, 3, 1]
    assert _flat(pages) == mine[::-1]  # newest first, each once
    assert _flat(_pages(api, f"/v1/releases?dataset_id={other}&limit=1")) == theirs[::-1]
    assert _pages(limited, f"/v1/releases?dataset_id={other}") == [[]]  # not its dataset
    mine_pages = _pages(api, "/v1/releases?mine=true&limit=4")
    assert set(mine + theirs) <= set(_flat(mine_pages))
    assert _pages(limited, "/v1/releases?mine=true") == [[]]  # it requested none

    with _newer_releases_elsewhere(app, 2000), _release_reads(app) as reads:
        first = limited.get("/v1/releases?limit=3")
        read = reads()
    assert [d["id"] for d in first.get_json()] == mine[::-1][:3]
    assert read <= 20, read  # main: one per release in the system (> 2000)

    bad = limited.get("/v1/releases?cursor=not-a-cursor")
    assert bad.status_code == 422 and bad.get_json()["field"] == "cursor"


def test_jobs_list_pages_pending_then_failed(app: Flask, api: Api,
                                            dataset: dict[str, Any]) -> None:
    """Item 9 for ``GET /v1/jobs``: main read the pending set whole and the 1000 newest
    releases of the whole system; now the pending and failed indexes (per dataset for a
    limited key), paged: queued/running oldest first, then failed newest first."""
    ds, ledger = dataset["id"], wiring.of(app).ledger
    with app.test_request_context():
        prepared = pricing.prepare(ledger, _body(ds, 40), allow_seeds=True)
    ids = []
    for i in range(7):  # apart in time (milliseconds): created in this order
        res = ledger.reserve(Reservation(ds, submit.new_id(), prepared.cost_units, actor="key_jobs",
                             fingerprint=f"jobs-{ds}-{i}", request_json=prepared.job().to_json()))
        ids.append(res.release_id)
        time.sleep(0.005)
    queued, failed = ids[:3], ids[3:]
    for rid in failed:  # and failed in this order
        assert ledger.abort(ds, rid, '{"message": "test"}', "test")
        time.sleep(0.005)
    _, token = apikeys.create(wiring.of(app).keys, "operator", datasets=(ds,))
    try:
        pages = _pages(Api(api.client, token), "/v1/jobs?limit=2")
        newest_failed = failed[::-1]
        assert _flat(pages) == queued + newest_failed  # oldest created; newest ended
        assert all(len(p) <= 2 for p in pages)
        only_failed = _pages(Api(api.client, token), "/v1/jobs?status=failed&limit=3")
        assert _flat(only_failed) == newest_failed
    finally:
        for rid in queued:
            ledger.cancel(ds, rid, "test")
    assert _pages(Api(api.client, token), "/v1/jobs") == [newest_failed]


# --- item 10: a full data directory --------------------------------------------------

SMALL_FS = "64k"
#: rows of the upload: each column file (8 bytes a row) fits in the file object's buffer,
#: so the full disk is met when the staged files are flushed at commit
ROWS = 400
#: the fallback's file size limit (bytes): smaller than one column file
FSIZE_LIMIT = 1024


def _fill(path: str) -> None:
    """Write a file under ``path`` until its file system is full."""
    with open(os.path.join(path, "filler"), "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC


def full_disk_upload(data_dir: str, env: dict[str, str], mode: str) -> dict[str, Any]:
    """Upload a dataset to a full ``data_dir``, then free room and upload it again; what
    the API answered and what the failed upload left in ``datasets/.tmp``.

    ``mode`` "tmpfs": ``data_dir`` is a small file system, filled up first; "rlimit" (in
    a subprocess, where mounting is not allowed): a file size limit stands in for it."""
    fresh = _fresh_app(env, PRIVRELEASE_DATA_DIR=data_dir)
    api = Api(fresh.test_client())
    if mode == "tmpfs":
        _fill(data_dir)
    else:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, resource.RLIM_INFINITY))
    failed = api.upload(people_csv(ROWS), PEOPLE_META)
    tmp = os.path.join(data_dir, "datasets", ".tmp")
    left = sorted(os.listdir(tmp)) if os.path.isdir(tmp) else []
    if mode == "tmpfs":
        os.remove(os.path.join(data_dir, "filler"))
    else:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    again = api.upload(people_csv(ROWS), PEOPLE_META)
    return {"status": failed.status_code, "body": failed.get_json(), "left": left,
            "again": again.status_code}


def _mounted_small_fs(path: str) -> bool:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_FS}", "tmpfs", path],
                          capture_output=True, check=False)
    return done.returncode == 0


_RLIMITED = """
import json, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
from tests.integration.test_dataplane import full_disk_upload
print(json.dumps(full_disk_upload(sys.argv[1], json.loads(sys.argv[2]), "rlimit")))
"""


def test_full_data_directory_is_507_and_leaves_nothing(
        app: Flask, service_env: dict[str, str], tmp_path: Any) -> None:
    """Item 10: on main an upload to a full disk answered 500 and left its partial
    staging folder in ``datasets/.tmp`` (closing the staged files re-raised ENOSPC and
    stopped the removal). Now 507 insufficient_storage, nothing left, and the same upload
    succeeds once there is room. A small tmpfs where mounting is allowed (we run as
    root), else a subprocess with a file size limit."""
    data_dir = tmp_path / "small"
    data_dir.mkdir()
    if _mounted_small_fs(str(data_dir)):
        try:
            seen = full_disk_upload(str(data_dir), service_env, "tmpfs")
        finally:
            subprocess.run(["umount", str(data_dir)], check=True)
    else:
        done = subprocess.run([sys.executable, "-c", _RLIMITED, str(data_dir),
                               json.dumps(service_env)], capture_output=True, text=True,
                              cwd=ROOT, check=True)
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["status"] == 507, seen["body"]
    assert seen["body"]["code"] == "insufficient_storage"
    assert seen["left"] == []
    assert seen["again"] == 201
