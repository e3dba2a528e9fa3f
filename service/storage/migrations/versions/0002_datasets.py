"""The dataset registry: each dataset's public document, and what open / version_change /
the policy migrations read besides it.

``datasets.document`` is TEXT, stored exactly as written, never jsonb: the service's
compare-and-set steps (``version_change``, ``migrate_policy``: version.lua and policy.lua)
compare the document they read with the stored one byte for byte, and jsonb would
normalise it (key order, whitespace, duplicate keys), so a document read back would no
longer equal the one written. ``status`` is derived from the document (a generated
column: it can never disagree with it). ``created_at`` is the registration's time; the
registry's pages are newest first by (created_at, id), the index ``datasets_newest``
(``id`` in the "C" collation: the order of Python's str, as Valkey's sorted-set ties).

Besides: ``ledgers.recharged_interval`` (recharge.lua's ``recharged:interval`` mark: the
interval recharge runs once per dataset; open sets it on a new dataset) and
``idempotency.version`` (the version an upload's Idempotency-Key stored, version.lua's
``version`` field of the key).

Revision ID: 0002_datasets
Revises: 0001_ledger
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002_datasets"
down_revision: str | None = "0001_ledger"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
CREATE TABLE datasets (
    id          text COLLATE "C" PRIMARY KEY,
    document    text NOT NULL,
    status      text GENERATED ALWAYS AS (document::jsonb ->> 'status') STORED,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL
);
CREATE INDEX datasets_newest ON datasets (created_at DESC, id DESC);

ALTER TABLE ledgers ADD COLUMN recharged_interval boolean NOT NULL DEFAULT false;
ALTER TABLE idempotency ADD COLUMN version bigint;
"""

DOWNGRADE = """
ALTER TABLE idempotency DROP COLUMN version;
ALTER TABLE ledgers DROP COLUMN recharged_interval;
DROP TABLE datasets;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
