"""The ledger core: budgets, allocations, releases, replays, idempotency, events, outbox.

Every amount is a whole number of ledger units (``mechanisms.base.LEDGER_UNITS``) in a
BIGINT: the largest cap ``service.budget.MEASURES`` accepts is 10**6 epsilon at 10**9
units per 1.0, i.e. 10**15 units (delta: 1.0 at 10**15), and committed + reserved never
pass the cap, far below BIGINT's 9.2 * 10**18 (Valkey's HINCRBY was 64-bit as well).
Units inside JSON (``releases.cost``, ``events.units``) are JSON integers, exact in
Python. Never floats.

Revision ID: 0001_ledger
Revises:
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0001_ledger"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
-- per-dataset flags reserve.lua reads: retired, retired versions, the notion lock
CREATE TABLE ledgers (
    dataset_id        text PRIMARY KEY,
    retired           boolean NOT NULL DEFAULT false,
    retired_versions  bigint[] NOT NULL DEFAULT '{}',
    notion_lock       text CHECK (notion_lock IN ('dp', 'noiseless')),
    opened_by         text,
    opened_at         timestamptz NOT NULL DEFAULT now()
);

-- the dataset's caps: a row per measure its caps name (cap 0 included), the only
-- measures it admits; committed and reserved in units
CREATE TABLE budgets (
    dataset_id  text NOT NULL,
    measure     text NOT NULL,
    cap         bigint NOT NULL CHECK (cap >= 0),
    committed   bigint NOT NULL DEFAULT 0 CHECK (committed >= 0),
    reserved    bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    PRIMARY KEY (dataset_id, measure)
);

-- an analyst key's allocation inside the dataset's caps, per measure it lists
CREATE TABLE allocations (
    dataset_id  text NOT NULL,
    key_id      text NOT NULL,
    measure     text NOT NULL,
    cap         bigint NOT NULL CHECK (cap >= 0),
    committed   bigint NOT NULL DEFAULT 0 CHECK (committed >= 0),
    reserved    bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    PRIMARY KEY (dataset_id, key_id, measure)
);

-- the allocation's rule (service.storage.ledger.ALLOCATION_SCOPES): 'listed' (only the
-- measures it lists) or 'legacy' (unlisted measures unlimited); no row: no allocation
CREATE TABLE allocation_scopes (
    dataset_id  text NOT NULL,
    key_id      text NOT NULL,
    scope       text NOT NULL CHECK (scope IN ('listed', 'legacy')),
    PRIMARY KEY (dataset_id, key_id)
);

-- a release and, while it is queued or running, its hold: cost (units per measure,
-- held on the dataset) and alloc_cost (the part held on the actor's allocation)
CREATE TABLE releases (
    id              text PRIMARY KEY,
    dataset_id      text NOT NULL,
    actor           text NOT NULL,
    status          text NOT NULL CHECK (status IN ('pricing', 'queued', 'running',
                        'succeeded', 'failed', 'cancelled', 'refused')),
    request         text NOT NULL,
    replay_key      text,
    version         bigint,
    cost            jsonb NOT NULL DEFAULT '{}',
    alloc_cost      jsonb NOT NULL DEFAULT '{}',
    error           text,
    output          text,
    result_attempt  integer,
    output_table    bigint,
    worker          text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    attempt         integer NOT NULL DEFAULT 0,
    lease_token     text,
    lease_until     timestamptz,
    data_read       boolean NOT NULL DEFAULT false,
    charged         boolean NOT NULL DEFAULT false,
    settled_by      text
);
CREATE INDEX releases_dataset ON releases (dataset_id);

-- a request's replay: the release an identical request is answered with
CREATE TABLE replays (
    fingerprint  text PRIMARY KEY,
    release_id   text NOT NULL
);

-- an Idempotency-Key: the request it was first sent with and what it made (a release,
-- or a dataset for open); a row past expires_at is as good as absent
CREATE TABLE idempotency (
    key          text PRIMARY KEY,
    fingerprint  text NOT NULL,
    release_id   text,
    dataset_id   text,
    expires_at   timestamptz NOT NULL
);

-- the audit trail: one row per change, written in the transaction of the change
CREATE TABLE events (
    id          bigserial PRIMARY KEY,
    dataset_id  text NOT NULL,
    kind        text NOT NULL,
    release_id  text NOT NULL DEFAULT '',
    actor       text NOT NULL,
    at          timestamptz NOT NULL,
    units       jsonb NOT NULL DEFAULT '{}',
    detail      jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX events_dataset ON events (dataset_id, id);

CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit events are append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

-- releases whose task may not have been published yet (due_at: when it was queued)
CREATE TABLE outbox (
    release_id  text PRIMARY KEY,
    due_at      timestamptz NOT NULL
);
"""

DOWNGRADE = """
DROP TABLE outbox;
DROP TABLE events;
DROP FUNCTION events_append_only();
DROP TABLE idempotency;
DROP TABLE replays;
DROP TABLE releases;
DROP TABLE allocation_scopes;
DROP TABLE allocations;
DROP TABLE budgets;
DROP TABLE ledgers;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
