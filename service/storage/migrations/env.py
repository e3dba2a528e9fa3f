"""Alembic's environment for the system of record: online migrations only.

``service.storage.database.upgrade`` passes an open SQLAlchemy connection in
``config.attributes["connection"]``; without one (the ``alembic`` command line) the URL is
``sqlalchemy.url`` of the configuration. The whole upgrade is one transaction (PostgreSQL
has transactional DDL) under an advisory lock, so concurrent upgrades serialise.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

#: pg_advisory_xact_lock key of schema migrations (any constant unique to this purpose)
MIGRATION_LOCK = 29_0001


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None,
                      transaction_per_migration=False)
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection and no sqlalchemy.url to migrate")
    engine = create_engine(url, poolclass=NullPool)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported")
run_migrations_online()
