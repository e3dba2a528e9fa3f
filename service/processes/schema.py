"""Which Alembic revision a database's schema is at, for ``privrelease db`` and
``standalone``, which say it after they upgrade (``service.storage.database.upgrade``)."""

from __future__ import annotations

import psycopg
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from service.storage import database

#: what reading or upgrading a database raises when it cannot be done (the server is
#: unreachable or refuses us, a migration fails, the URL is not PostgreSQL's)
FAILURES = (SQLAlchemyError, psycopg.Error, CommandError, ValueError)


def current(url: str) -> str | None:
    """The revision ``url``'s schema is at; None for a database never upgraded."""
    engine = create_engine(database.sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            revision: str | None = MigrationContext.configure(connection).get_current_revision()
            return revision
    finally:
        engine.dispose()


def reason(err: BaseException) -> str:
    """One of FAILURES, said as the server or driver said it (not SQLAlchemy's wrapper)."""
    cause = err.orig if isinstance(err, DBAPIError) and err.orig is not None else err
    return f"{type(cause).__name__}: {str(cause).strip()}"


def revisions() -> list[str]:
    """The package's migrations, newest first."""
    config = Config()
    config.set_main_option("script_location", database.migrations_path())
    return [script.revision for script in ScriptDirectory.from_config(config).walk_revisions()]


def describe(revision: str | None) -> str:
    """``revision`` as the commands print it: where it stands against the newest."""
    known = revisions()
    if revision is None:
        return "none (an empty database: run `privrelease db upgrade`)"
    if revision == known[0]:
        return f"{revision} (head)"
    if revision in known:
        return f"{revision} (head is {known[0]}: run `privrelease db upgrade`)"
    return f"{revision} (unknown here: the database is newer than this privrelease)"


def redacted(url: str) -> str:
    """``url`` without its password, to print."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (SQLAlchemyError, ValueError):  # not a URL SQLAlchemy reads: print none of it
        return "(the configured URL)"
