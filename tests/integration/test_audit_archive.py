"""The audit stream's archive (service.storage.event_archive): old events move to disk,
none lost or doubled.

Against the session's Valkey: each test writes its own dataset's stream with explicit
ids, and a copy of it under a key the archive never touches is the reference every
read is compared with (XRANGE on the copy, same bounds). The last test runs a real
worker whose sweeper archives, and reads the ledger through the API.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask
from hypothesis import given, settings
from hypothesis import strategies as st

from service import apikeys, wiring
from service.api.app import create_app
from service.storage import event_archive, rkeys
from service.storage.event_archive import AuditArchive
from tests.conftest import ROOT, wait_for_worker
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv

#: the Valkey store's audit archive (stream events moved to files): PostgreSQL keeps its
#: events in ``events``, with no archive
pytestmark = pytest.mark.valkey_store

DB = 7


@pytest.fixture(scope="module")
def client(redis_url: str) -> redis.Redis:
    return rkeys.connect(redis_url)


def _stream(client: redis.Redis, n: int, gaps: list[int] | None = None) -> tuple[str, str]:
    """A dataset id whose stream holds ``n`` old events (ids in 2001, several per ms), and
    the key of an untouched copy."""
    ds = "ds_" + secrets.token_hex(8)
    copy = f"{rkeys.P}test:copy:{ds}"
    ms, seq = 978_307_200_000, 0
    for i in range(n):
        step = (gaps or [1])[i % len(gaps or [1])]
        ms, seq = (ms + step, 0) if step else (ms, seq + 1)
        fields = {"kind": ("reserve", "commit")[i % 2], "release_id": f"rel_{i:024x}",
                  "at": "2001-01-01T00:00:00.000Z", "m:epsilon": str(1000 * i)}
        for key in (rkeys.events(ds), copy):
            client.xadd(key, fields, id=f"{ms}-{seq}")
    return ds, copy


def _ids(client: redis.Redis, key: str) -> list[str]:
    return [i for i, _ in client.xrange(key)]


def _lines(archive: AuditArchive, ds: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in archive.path(ds).read_text().splitlines()]


def test_old_events_move_to_disk_whole_and_in_order(client: redis.Redis,
                                                    tmp_path: Path) -> None:
    """Catches an archive that drops, reorders or alters events, or trims what it did not
    write: after moving in batches the stream is empty, the file holds every event once,
    and the merged read equals the stream as it was, field for field."""
    archive = AuditArchive(tmp_path)
    ds, copy = _stream(client, 250, gaps=[1, 0, 0, 3])
    assert archive.archive(client, ds, hot_seconds=0, batch=100) == 100
    assert client.xlen(rkeys.events(ds)) == 150
    assert list(archive.merge(client, ds)) == client.xrange(copy)
    assert archive.archive(client, ds, hot_seconds=0, batch=100) == 100
    assert archive.archive(client, ds, hot_seconds=0, batch=100) == 50
    assert archive.archive(client, ds, hot_seconds=0, batch=100) == 0
    assert client.xlen(rkeys.events(ds)) == 0
    assert [(e["id"], e["fields"]) for e in _lines(archive, ds)] == client.xrange(copy)
    assert list(archive.merge(client, ds)) == client.xrange(copy)


def test_recent_events_stay_in_valkey(client: redis.Redis, tmp_path: Path) -> None:
    """Catches an archive that ignores its age threshold (the failover argument needs
    only old, replicated events on disk): events of the last hour stay in the stream."""
    archive = AuditArchive(tmp_path)
    ds, copy = _stream(client, 10)
    fresh = client.xadd(rkeys.events(ds), {"kind": "reserve"}, id="*")
    client.xadd(copy, {"kind": "reserve"}, id=fresh)  # the same id (two "*" may differ)
    assert archive.archive(client, ds) == 10
    assert client.xlen(rkeys.events(ds)) == 1
    assert list(archive.merge(client, ds)) == client.xrange(copy)


def test_a_crash_between_append_and_trim_doubles_nothing(client: redis.Redis,
                                                         tmp_path: Path) -> None:
    """Catches events read twice or written twice after the archiver died having written
    its lines but not trimmed: readers see each event once and the next run appends only
    what the file lacks, then trims."""
    archive = AuditArchive(tmp_path)
    ds, copy = _stream(client, 40)
    archive._append(ds, client.xrange(rkeys.events(ds), count=25))  # then died
    assert list(archive.merge(client, ds)) == client.xrange(copy)
    assert archive.archive(client, ds, hot_seconds=0) == 40
    assert [e["id"] for e in _lines(archive, ds)] == _ids(client, copy)
    assert list(archive.merge(client, ds)) == client.xrange(copy)


def test_a_torn_last_line_is_ignored_then_cut(client: redis.Redis, tmp_path: Path) -> None:
    """Catches a reader that fails on (or believes) the half line a crash mid-write left,
    and a writer that appends after it (a damaged file forever)."""
    archive = AuditArchive(tmp_path)
    ds, copy = _stream(client, 30)
    archive.archive(client, ds, hot_seconds=0, batch=10)
    with archive.path(ds).open("ab") as f:
        f.write(b'{"fields": {"kind": "res')
    assert list(archive.merge(client, ds)) == client.xrange(copy)
    assert archive.archive(client, ds, hot_seconds=0) == 20
    assert [e["id"] for e in _lines(archive, ds)] == _ids(client, copy)


ids_strategy = st.sampled_from(["-", "+", "id", "ms", "(id", "(ms"])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 400), moved=st.integers(0, 400), data=st.data(),
       count=st.none() | st.integers(1, 60))
def test_any_range_reads_the_same_as_the_stream_before(client: redis.Redis, n: int,
                                                       moved: int, data: st.DataObject,
                                                       count: int | None) -> None:
    """Property: for any split between file and stream, any bounds the ``/ledger`` view
    passes (open, an exact id, a whole millisecond, either exclusive as a page's cursor)
    and any ``count``, the merged read equals XRANGE on the untouched stream. Files of up
    to ~60 kB make the byte bisection run. Catches a count that overshoots at the
    file/stream seam and an exclusive bound read as inclusive (a page repeating its
    cursor's event)."""
    with tempfile.TemporaryDirectory() as tmp:  # one per example (tmp_path is per test)
        archive = AuditArchive(Path(tmp))
        ds, copy = _stream(client, n, gaps=[1, 0, 2])
        archive.archive(client, ds, hot_seconds=0, batch=max(moved, 1))
        ids = _ids(client, copy) or ["978307200001-0"]

        def bound(kind: str) -> str:
            if kind in ("-", "+"):
                return kind
            pick = data.draw(st.sampled_from(ids))
            return kind.removesuffix("id").removesuffix("ms") + (
                pick if kind.endswith("id") else pick.split("-")[0])

        start, end = bound(data.draw(ids_strategy)), bound(data.draw(ids_strategy))
        assert list(archive.merge(client, ds, start, end, count)) == client.xrange(
            copy, start, end, count=count)


def test_one_archiver_at_a_time_and_a_damaged_file_trims_nothing(
        redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Catches two archivers racing without a lock, and a damaged file (a line that is
    not JSON) letting the stream be trimmed: its events would be lost to readers.
    A database of its own: the sweep walks every registered dataset."""
    db = rkeys.connect(redis_url.rsplit("/", 1)[0] + f"/{DB + 1}")
    db.flushdb()
    archive = AuditArchive(tmp_path)
    ds, _ = _stream(db, 5)
    db.zadd(rkeys.DATASETS, {ds: 1})
    archive.path(ds).parent.mkdir(parents=True, exist_ok=True)
    archive.path(ds).write_text("not json\n")
    assert event_archive.archive_if_due(db, archive, interval=60, hot_seconds=1) == 0
    assert db.xlen(rkeys.events(ds)) == 5
    assert "audit archive failed" in caplog.text
    archive.path(ds).unlink()
    assert event_archive.archive_if_due(db, archive, interval=60, hot_seconds=1) == 0  # locked
    db.delete(event_archive.LOCK)
    assert event_archive.archive_if_due(db, archive, interval=60, hot_seconds=1) == 5
    assert db.xlen(rkeys.events(ds)) == 0
    db.flushdb()


@pytest.fixture(scope="module")
def rig(redis_url: str, service_env: dict[str, str], app: Flask,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Its own database, an app on it, and a real worker whose sweeper archives events
    older than half a second every second."""
    url = redis_url.rsplit("/", 1)[0] + f"/{DB}"
    db = rkeys.connect(url)
    db.flushdb()
    flask_app = create_app(dataclasses.replace(app.config["PRIVRELEASE"], redis_url=url))
    apikeys.create(wiring.of(flask_app).keys, "operator", token=TOKEN)
    env = {**service_env, "PRIVRELEASE_REDIS_URL": url, "PRIVRELEASE_SWEEP_INTERVAL": "1",
           "PRIVRELEASE_AUDIT_HOT_SECONDS": "0.5"}
    log = tmp_path_factory.mktemp("audit") / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "service.processes.cli", "worker",
                                 "--concurrency", "1", "--loglevel", "info"],
                                env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for_worker(db)
        yield {"api": Api(flask_app.test_client()), "db": db, "app": flask_app}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        db.flushdb()


def test_the_workers_sweeper_archives_and_the_ledger_view_is_unchanged(
        rig: dict[str, Any]) -> None:
    """End to end: a real worker's sweeper moves a dataset's events to
    ``<data dir>/audit/<id>.jsonl`` and trims the stream, and ``GET /ledger`` (JSON and
    the JSON Lines export, with and without ``since``) answers exactly what it did when
    the events were in Valkey. Catches the worker never archiving, and a view that reads
    the stream only (it would lose every archived event)."""
    api, db = rig["api"], rig["db"]
    resp = api.upload(people_csv(50), PEOPLE_META)
    assert resp.status_code == 201
    ds = resp.get_json()["id"]
    for value in (30, 40):
        resp = api.post("/v1/releases", {
            "dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": 0.25},
            "params": {"statistic": "count",
                       "condition": {"column": "age", "op": "ge", "value": value}}})
        assert resp.status_code == 202, resp.get_json()
        assert api.wait(resp.get_json()["id"])["status"] == "succeeded"
    views = ["", "?format=jsonl", "?since=2001-01-01T00:00:00Z", "?kind=commit"]
    before = {v: api.get(f"/v1/datasets/{ds}/ledger{v}").get_data(as_text=True)
              for v in views}
    assert [e["kind"] for e in json.loads(before[""])] == [
        "cap", "reserve", "commit", "reserve", "commit"]
    deadline = time.monotonic() + 30
    while db.xlen(rkeys.events(ds)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert db.xlen(rkeys.events(ds)) == 0
    path = rig["app"].config["PRIVRELEASE"].audit_dir / f"{ds}.jsonl"
    assert len(path.read_text().splitlines()) == 5
    for view, body in before.items():
        assert api.get(f"/v1/datasets/{ds}/ledger{view}").get_data(as_text=True) == body


@pytest.mark.parametrize("bound,low,pair", [
    ("-", True, (-1, -1)), ("+", False, (2**63, 2**63)),
    ("5-3", True, (5, 3)), ("5-3", False, (5, 3)), ("5", True, (5, 0)), ("5", False, (5, 2**63)),
    ("(5-3", True, (5, 4)), ("(5-3", False, (5, 2)), ("(5-0", False, (5, -1)),
    ("(5", True, (5, 1)), ("(5", False, (5, 2**63 - 1)),
])
def test_bounds_as_pairs_exclusive_included(bound: str, low: bool,
                                            pair: tuple[int, int]) -> None:
    """Exact: XRANGE's bounds as comparable pairs, ``(`` one step inward as Valkey does
    (an incomplete id filled with 0 as a start, the largest sequence as an end); catches
    an exclusive start read as inclusive, and ``(5-0`` as an end keeping ``5-0``."""
    assert event_archive._bound(bound, low) == pair


def test_a_file_out_of_order_is_an_error_not_an_endless_read(client: redis.Redis,
                                                              tmp_path: Path) -> None:
    """Catches a merged read that loops for ever on a damaged file (its last id inside
    the range, yet no line of the range readable before a later one): ValueError, which
    the API answers as any damaged archive."""
    archive = AuditArchive(tmp_path)
    ds = "ds_" + secrets.token_hex(8)
    archive._append(ds, [("100-0", {"kind": "cap"}), ("5-0", {"kind": "cap"})])
    with pytest.raises(ValueError, match="out of order"):
        list(archive.merge(client, ds, "-", "50"))
