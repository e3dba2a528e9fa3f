"""API keys, console sessions, the console's secret and analyses: the rest of the record
Valkey kept (issue #29: Valkey keeps only what can be lost).

``api_keys`` (``service.storage.pg_keys``): a key's record, found by the SHA-256 digest of
its token (``digest``, unique: the token itself is never stored) or by its id; listed
oldest first by ``api_keys_created`` (created_at, id). ``callback_secret`` signs the
key's notifications (stored as is: signing needs it, as it did in Valkey).
``expires_at`` NULL: never.

``console_sessions``: a console session by the digest of its id, naming its key; a
revoked key's sessions go with it (ON DELETE CASCADE), an expired one is never answered
and is pruned on the next sign-in (``console_sessions_expiry``).

``service_secrets``: named secrets made once and shared by every process (``console``:
the console's cookie-signing secret, when PRIVRELEASE_CONSOLE_SECRET is not set).

``analyses`` (``service.storage.pg_analyses``): the fields of Valkey's analysis hash
(``pr:ana:<id>``) as columns; ``params``, ``releases``, ``error`` and a legacy inline
``result`` keep the exact JSON text written. ``order_us`` is the creation time in
microseconds, Valkey's score in the release's sorted set of analyses: a release's page
is one range scan of ``analyses_release_newest`` (release_id, order_us, id) from the
cursor, newest first. ``deadline`` is a running analysis's hard deadline in epoch
seconds by the clock of the worker that started it, as Valkey kept it. ``prior_status``
is the status a transition found (each transition is one ``UPDATE ... WHERE status =
ANY(expected)``; ``SET prior_status = status`` makes the old status the statement's
RETURNING). ``id`` takes the "C" collation, so ties on the time order as Valkey's
sorted-set members do.

Revision ID: 0005_keys
Revises: 0004_steps
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005_keys"
down_revision: str | None = "0004_steps"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
CREATE TABLE api_keys (
    id               text COLLATE "C" PRIMARY KEY,
    digest           text NOT NULL UNIQUE CHECK (digest ~ '^[0-9a-f]{64}$'),
    role             text NOT NULL CHECK (role IN ('operator', 'analyst', 'consumer')),
    label            text NOT NULL DEFAULT '',
    datasets         text[],
    expires_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    callback_secret  text NOT NULL
);
CREATE INDEX api_keys_created ON api_keys (created_at, id);

CREATE TABLE console_sessions (
    digest      text PRIMARY KEY CHECK (digest ~ '^[0-9a-f]{64}$'),
    key_id      text COLLATE "C" NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX console_sessions_key ON console_sessions (key_id);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);

CREATE TABLE service_secrets (
    name   text PRIMARY KEY,
    value  text NOT NULL
);

CREATE TABLE analyses (
    id            text COLLATE "C" PRIMARY KEY,
    release_id    text NOT NULL REFERENCES releases (id),
    analysis      text NOT NULL,
    params        text NOT NULL,
    releases      text NOT NULL,
    actor         text NOT NULL,
    status        text NOT NULL CHECK (status IN ('queued', 'running', 'succeeded',
                      'failed', 'cancelled')),
    prior_status  text,
    work          double precision,
    order_us      bigint NOT NULL,
    created_at    timestamptz NOT NULL,
    started_at    timestamptz,
    deadline      double precision,
    finished_at   timestamptz,
    error         text,
    result        text,
    stored        boolean NOT NULL DEFAULT false
);
CREATE INDEX analyses_release_newest ON analyses (release_id, order_us, id);
"""

DOWNGRADE = """
DROP TABLE analyses;
DROP TABLE service_secrets;
DROP TABLE console_sessions;
DROP TABLE api_keys;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
