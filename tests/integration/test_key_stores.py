"""The key and analysis stores beyond what the API tests reach: an analysis's status
changes once under races (on the session's store: PostgreSQL's single UPDATEs or
Valkey's Lua scripts), every lookup of the PostgreSQL stores is an index scan on large
tables, and migration 0005_keys goes down and up again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import psycopg
import pytest

from service import analyses, apikeys
from service.console import session
from service.storage import database
from service.storage.analysis_store import AnalysisStore
from service.storage.pg_analyses import PgAnalysisStore
from service.storage.pg_keys import PgKeyStore
from tests.conftest import database_on
from tests.integration.conftest import Api

T = TypeVar("T")
RACERS = 8


def _at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Run every call in a thread of its own, released together."""
    barrier = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        out[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


@pytest.fixture(scope="module")
def release_id(api: Api, dataset: dict[str, Any], worker: Any) -> str:
    resp = api.post("/v1/releases", {"dataset_id": dataset["id"], "mechanism": "laplace",
                                     "params": {"statistic": "mean", "column": "age"},
                                     "budget": {"epsilon": 0.05}})
    assert resp.status_code == 202, resp.get_json()
    rid = str(resp.get_json()["id"])
    assert api.wait(rid)["status"] == "succeeded"
    return rid


@pytest.fixture(scope="module")
def api(app: Any) -> Api:  # module-scoped: the release above is made once
    return Api(app.test_client())


@pytest.fixture(scope="module")
def dataset(api: Api) -> dict[str, Any]:
    from tests.integration.conftest import PEOPLE_META, people_csv

    resp = api.upload(people_csv(), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    doc: dict[str, Any] = resp.get_json()
    return doc


def test_a_redelivered_start_races_to_one_run(analysis_store: AnalysisStore,
                                              release_id: str) -> None:
    """Catches a start that is not one compare-and-set: however many copies of an
    analysis's message start at once, one run gets its request; the others find it
    running and fail it ``worker_lost``, so the one run's result is not stored."""
    made = []
    for _ in range(8):
        aid = analyses.create(analysis_store, release_id, "npmle", {}, [], "key_race")
        made.append(aid)
        started = _at_once([lambda a=aid: analyses.start(analysis_store, a, 60)] * RACERS)
        assert sum(s is not None for s in started) == 1
        assert analysis_store.status(aid) == "failed"
        doc = analyses.document(analysis_store, aid)
        assert doc is not None and doc["error"]["code"] == "worker_lost"
        assert not analyses.finish(analysis_store, aid, result_json="{}")
    for aid in made:
        analyses.discard(analysis_store, release_id, aid)


def test_finish_and_cancel_race_to_one_outcome(analysis_store: AnalysisStore,
                                               release_id: str) -> None:
    """Catches a transition that reads then writes: of finishes and cancels of one
    running analysis sent at once, exactly one applies, and the status is its."""
    made = []
    for _ in range(8):
        aid = analyses.create(analysis_store, release_id, "npmle", {}, [], "key_race")
        made.append(aid)
        assert analyses.start(analysis_store, aid, 60) is not None
        calls: list[Callable[[], tuple[str, bool]]] = []
        for i in range(RACERS):
            if i % 2:
                calls.append(lambda a=aid: ("cancelled",
                                            analyses.cancel(analysis_store, a) == "running"))
            else:
                calls.append(lambda a=aid: ("succeeded", analyses.finish(
                    analysis_store, a, result_json='{"n": 1}')))
        won = [status for status, ok in _at_once(calls) if ok]
        assert len(won) == 1, won
        assert analysis_store.status(aid) == won[0]
    for aid in made:
        analyses.discard(analysis_store, release_id, aid)


# -- PostgreSQL ---------------------------------------------------------------------------

class _Recording:
    """A pool whose cursors note the statements they run, with their arguments."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.statements: list[tuple[str, Any]] = []

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with self.pool.connection() as conn:
            yield _Noting(conn, self.statements)


class _Noting:
    def __init__(self, real: Any, statements: list[tuple[str, Any]]) -> None:
        self.real, self.statements = real, statements

    def cursor(self) -> _Noting:
        return _Noting(self.real.cursor(), self.statements)

    def __enter__(self) -> _Noting:
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.close()

    def execute(self, query: str, args: Any = None) -> Any:
        self.statements.append((query, args))
        return self.real.execute(query, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


N = 20_000
FILL = f"""
INSERT INTO api_keys (id, digest, role, label, created_at, callback_secret)
SELECT 'key_' || i, md5(i::text) || md5((i + 1)::text), 'consumer', 'k' || i,
       now() - i * interval '1 second', 's'
FROM generate_series(1, {N}) AS i;
INSERT INTO console_sessions (digest, key_id, expires_at)
SELECT md5('s' || i) || md5('t' || i), 'key_' || i,
       now() + (CASE WHEN i % 1000 = 0 THEN -1 ELSE 1 END) * interval '1 hour'
FROM generate_series(1, {N}) AS i;
INSERT INTO releases (id, dataset_id, actor, status, request)
SELECT 'rel_' || i, 'ds_x', 'key_1', 'succeeded', '{{}}' FROM generate_series(1, 200) AS i;
INSERT INTO analyses (id, release_id, analysis, params, releases, actor, status, order_us,
                      created_at)
SELECT 'ana_' || i, 'rel_' || (i % 200 + 1), 'npmle', '{{}}', '[]', 'key_1', 'queued', i,
       now() FROM generate_series(1, {N}) AS i;
ANALYZE api_keys; ANALYZE console_sessions; ANALYZE releases; ANALYZE analyses;
"""


@pytest.fixture()
def big(postgres_url: str) -> Iterator[str]:
    """A database of its own at head, with 20,000 keys, sessions and analyses."""
    url = database_on(postgres_url)
    database.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL)
    try:
        yield url
    finally:
        name = urlsplit(url).path.lstrip("/")
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_every_lookup_is_an_index_scan(big: str) -> None:
    """Catches a lookup that scans a table (O(keys) per request): each statement the
    stores run to find a key by digest or id, a session, an analysis, a release's page
    or count, or the expired sessions to prune, is planned as a scan of its index on
    tables of 20,000 rows."""
    pool = database.connect(big, max_size=2)
    try:
        recording = _Recording(pool)
        keys, ana = PgKeyStore(recording), PgAnalysisStore(recording)  # type: ignore[arg-type]
        with pool.connection() as conn:
            row = conn.execute("SELECT digest FROM api_keys WHERE id = 'key_777'").fetchone()
        assert row is not None
        digest = row[0]
        expected: list[tuple[Callable[[], object], tuple[str, ...]]] = [
            (lambda: keys.key_by_digest(digest), ("api_keys_digest_key",)),
            (lambda: keys.key_by_id("key_777"), ("api_keys_pkey",)),
            (lambda: keys.has_key("key_777"), ("api_keys_pkey",)),
            (lambda: keys.session_key_id(session.session_digest("x")),
             ("console_sessions_pkey",)),
            (lambda: keys.add_session(session.session_digest("y"), "key_5", 60),
             ("console_sessions_expiry", "")),  # the prune, then the insert
            (lambda: keys.remove_session(session.session_digest("y")),
             ("console_sessions_pkey",)),
            (lambda: keys.remove_key("key_778"), ("api_keys_pkey",)),
            (lambda: ana.fields("ana_5"), ("analyses_pkey",)),
            (lambda: ana.status("ana_5"), ("analyses_pkey",)),
            (lambda: ana.transition("ana_5", ("queued",), {"status": "cancelled"}),
             ("analyses_pkey",)),
            (lambda: ana.start("ana_6", "2030-01-01T00:00:00.000Z", 1e10, "{}"),
             ("analyses_pkey",)),
            (lambda: ana.page("rel_7", 10, None), ("analyses_release_newest",)),
            (lambda: ana.page("rel_7", 10, (5000, "ana_5000")), ("analyses_release_newest",)),
            (lambda: ana.count("rel_7"), ("analyses_release_newest",)),
        ]
        with pool.connection() as conn:
            for call, indexes in expected:
                recording.statements.clear()
                call()
                assert len(recording.statements) == len(indexes), recording.statements
                for (query, args), index in zip(recording.statements, indexes, strict=True):
                    if not index:
                        continue
                    plan = "\n".join(row[0] for row in conn.execute(
                        "EXPLAIN " + query, args).fetchall())
                    assert index in plan and "Seq Scan" not in plan, (query, plan)
            conn.rollback()
    finally:
        pool.close()


def test_the_keys_migration_goes_down_and_up_again(postgres_url: str) -> None:
    """0005_keys downgrades to 0004_steps (its four tables gone, the releases kept)
    and upgrades again."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    url = database_on(postgres_url)
    tables = ("SELECT tablename FROM pg_tables WHERE tablename IN ('api_keys', "
              "'console_sessions', 'service_secrets', 'analyses') ORDER BY 1")
    try:
        database.upgrade(url)
        pool = database.connect(url, max_size=2)
        keys = PgKeyStore(pool)
        key, token = apikeys.create(keys, "operator", "down and up")
        pool.close()
        with psycopg.connect(url) as conn:
            assert [t for (t,) in conn.execute(tables)] == [
                "analyses", "api_keys", "console_sessions", "service_secrets"]
            conn.execute("INSERT INTO releases (id, dataset_id, actor, status, request) "
                         "VALUES ('rel_kept', 'ds', 'a', 'queued', '{}')")
        config = Config()
        config.set_main_option("script_location", database.migrations_path())
        engine = create_engine(database.sqlalchemy_url(url), poolclass=NullPool)
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0004_steps")
        engine.dispose()
        with psycopg.connect(url) as conn:
            assert conn.execute(tables).fetchall() == []
            assert conn.execute("SELECT id FROM releases").fetchall() == [("rel_kept",)]
            assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
                ("0004_steps",)]
        database.upgrade(url)
        pool = database.connect(url, max_size=2)
        try:
            assert apikeys.lookup(PgKeyStore(pool), token) is None  # gone with the table
            assert apikeys.create(PgKeyStore(pool), "operator", token=token)[0].id != key.id
        finally:
            pool.close()
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {urlsplit(url).path.lstrip('/')} WITH (FORCE)")
