"""The release lists, the sweeper's re-send count, the hold-out counters and the audit
log's time bounds: what ``service.storage.store.Store`` reads besides the ledger.

Release lists (``PgLedger.release_page``). Valkey kept one sorted set per list (every
release, a dataset's, a key's, the pending ones, the failed ones), maintained by the Lua
scripts as a release moved; here each list is an index on ``releases`` and a release's
place in it follows from its row, so no step maintains it and none can forget to. Every
page is one range scan of ``limit + 1`` index entries from the cursor, O(log N + limit)
whatever the number of releases, ordered by (time, id) as Valkey's (score, member):

- ``releases_newest`` (created_at, id): every release, newest first;
- ``releases_dataset_newest`` (dataset_id, created_at, id): a dataset's (a key's granted
  datasets: one such scan per dataset, merged), and a dataset's history; it replaces
  0001's ``releases_dataset`` (dataset_id), of which it is a superset;
- ``releases_actor_newest`` (actor, created_at, id): the releases one key asked for;
- ``releases_pending`` and ``releases_dataset_pending``, partial on the pending statuses
  (pricing, queued, running: Valkey's ``pr:pending``, which reserve.lua enters a
  ``pricing`` release into too): oldest first, and the sweeper's stale releases;
- ``releases_failed`` and ``releases_dataset_failed``, partial on failed and refused
  (Valkey's ``pr:failed``: not cancelled), by ``finished_at``: newest first.

The partial indexes stay small (only what is pending or failed) and the queries name the
same statuses literally, so the planner proves they apply.

``releases.id`` takes the "C" collation (0002 did the same for ``datasets.id``): ties on
the time are broken by the id in the order of Python's ``str``, which is Valkey's
sorted-set order for equal scores, so a cursor (time, id) means the same on both stores.

``releases.resends`` / ``resent_at``: resend.lua's fields of the release hash (the
sweeper's re-sends of a gone job and when the last one was claimed); NULL until the first
claim, as the hash has no field before it.

``holdouts``: per dataset, the largest hold-out that served and how many releases used
one (Valkey's ``pr:ds:<id>:holdout`` hash; spec §8.4 ``holdout_exposures``).

``events_at`` (at, id): ``PgLedger.audit_range`` maps a time bound of the ledger view to
the id of the first (or last) event at or after (at or before) it in one index probe.

Nothing in the service wrote to PostgreSQL before this revision, so the tables are small
when it runs and plain CREATE INDEX (in the upgrade's one transaction) is quick; on a
large table it would hold writes for the build.

Revision ID: 0003_releases
Revises: 0002_datasets
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003_releases"
down_revision: str | None = "0002_datasets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
ALTER TABLE releases ALTER COLUMN id TYPE text COLLATE "C";
ALTER TABLE releases ADD COLUMN resends integer CHECK (resends >= 0);
ALTER TABLE releases ADD COLUMN resent_at timestamptz;

DROP INDEX releases_dataset;
CREATE INDEX releases_newest ON releases (created_at, id);
CREATE INDEX releases_dataset_newest ON releases (dataset_id, created_at, id);
CREATE INDEX releases_actor_newest ON releases (actor, created_at, id);
CREATE INDEX releases_pending ON releases (created_at, id)
    WHERE status IN ('pricing', 'queued', 'running');
CREATE INDEX releases_dataset_pending ON releases (dataset_id, created_at, id)
    WHERE status IN ('pricing', 'queued', 'running');
CREATE INDEX releases_failed ON releases (finished_at, id)
    WHERE status IN ('failed', 'refused');
CREATE INDEX releases_dataset_failed ON releases (dataset_id, finished_at, id)
    WHERE status IN ('failed', 'refused');

-- rows held out of DP: the largest hold-out so far (nested splits) and the releases
CREATE TABLE holdouts (
    dataset_id  text PRIMARY KEY,
    rows        bigint NOT NULL DEFAULT 0 CHECK (rows >= 0),
    releases    bigint NOT NULL DEFAULT 0 CHECK (releases >= 0)
);

CREATE INDEX events_at ON events (at, id);
"""

DOWNGRADE = """
DROP INDEX events_at;
DROP TABLE holdouts;
DROP INDEX releases_dataset_failed;
DROP INDEX releases_failed;
DROP INDEX releases_dataset_pending;
DROP INDEX releases_pending;
DROP INDEX releases_actor_newest;
DROP INDEX releases_dataset_newest;
DROP INDEX releases_newest;
CREATE INDEX releases_dataset ON releases (dataset_id);
ALTER TABLE releases DROP COLUMN resent_at;
ALTER TABLE releases DROP COLUMN resends;
ALTER TABLE releases ALTER COLUMN id TYPE text COLLATE "default";
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
