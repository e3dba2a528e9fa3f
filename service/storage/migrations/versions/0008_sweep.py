"""The sweeper reads pending work by index, never by scanning the broker's queue lists
(issue #29 item 7): which stale release's message was taken past by the workers is
learnt from marks in ``releases``, compared through indexes.

The argument (``service.releases.sweeper`` has it whole): kombu's Redis transport keeps
a queue in a list, publishes at one end (LPUSH) and delivers from the other (BRPOP), so
each queue is first in, first out. A mark is a number of one sequence,
``release_sends``. ``created_seq`` is taken when the row is inserted (a column default:
no step function changes), so before any message of the release is published; a
release that a worker started (``started_at``) or priced (``priced_at``) had one of its
messages taken off its queue, and that message was published after its
``created_seq``. ``sweep_seq`` is taken by the sweeper once the release's last message
was published (it left the outbox, or its lease lapsed, or the sweeper's own send
returned). So a release whose ``sweep_seq`` is below the ``created_seq`` of a release a
worker started had its message published before that one, and taken off the queue
before it: it waits no longer (the sweeper looks for it among the messages workers hold,
and waits for a second such mark, ``sweep_phase`` 2, before taking it for lost, since a
held message can be put back).

- ``release_sends``: the sequence of every mark;
- ``releases.created_seq``: taken at insert (existing rows stay NULL: no rewrite, and
  they are never witnesses);
- ``releases.priced_at``: when a pricing job priced the release (``pricing`` to
  ``queued``), set by the trigger ``releases_priced``, which also clears the release's
  marks (they were about its pricing job's message, not its run's); the trigger fires
  only on that transition (``WHEN``), no step function changes;
- ``releases.sweep_seq`` / ``sweep_phase`` / ``sweep_at``: the sweeper's mark of a
  pending release (``sweep_seq`` 0 with phase 0: a send of the sweeper under way since
  ``sweep_at``), the sweeper's only writes;
- ``releases_sweep`` (status, sweep_seq, created_at), partial on the pending statuses:
  the stale releases to mark (``sweep_seq IS NULL``, by creation), the marked ones taken
  past (``sweep_seq`` below a bound), the running ones: each a range of it;
- ``releases_started_seq`` / ``releases_priced_seq`` (created_seq), partial on the
  started / priced releases: the newest witness, one backward scan.

What the hot steps pay: ``nextval`` at insert, one entry of ``releases_sweep`` at insert
and at start (a lease renewal changes no indexed column: it stays a HOT update), one of
``releases_started_seq`` at start and at the end of a started release. The sweeper writes
a release only when it is stale (waited ``min(min_age, lost_age)`` s), so only a backlog
pays for marks.

Revision ID: 0008_sweep
Revises: 0007_ledger_locks
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008_sweep"
down_revision: str | None = "0007_ledger_locks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
CREATE SEQUENCE release_sends AS bigint;
ALTER TABLE releases ADD COLUMN created_seq bigint;
ALTER TABLE releases ALTER COLUMN created_seq SET DEFAULT nextval('release_sends');
ALTER SEQUENCE release_sends OWNED BY releases.created_seq;
ALTER TABLE releases ADD COLUMN priced_at timestamptz;
ALTER TABLE releases ADD COLUMN sweep_seq bigint CHECK (sweep_seq >= 0);
ALTER TABLE releases ADD COLUMN sweep_phase smallint CHECK (sweep_phase BETWEEN 0 AND 2);
ALTER TABLE releases ADD COLUMN sweep_at timestamptz;

CREATE INDEX releases_sweep ON releases (status, sweep_seq, created_at)
    WHERE status IN ('pricing', 'queued', 'running');
CREATE INDEX releases_started_seq ON releases (created_seq) INCLUDE (started_at)
    WHERE started_at IS NOT NULL AND created_seq IS NOT NULL;
CREATE INDEX releases_priced_seq ON releases (created_seq) INCLUDE (priced_at)
    WHERE priced_at IS NOT NULL AND created_seq IS NOT NULL;

-- a pricing job priced the release: when (a witness of the pricing queue), and the
-- sweeper's marks cleared (they were about its pricing job's message; its run's is new)
CREATE FUNCTION releases_priced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.priced_at := now();
    NEW.sweep_seq := NULL;
    NEW.sweep_phase := NULL;
    NEW.sweep_at := NULL;
    RETURN NEW;
END $$;
CREATE TRIGGER releases_priced BEFORE UPDATE OF status ON releases FOR EACH ROW
    WHEN (OLD.status = 'pricing' AND NEW.status = 'queued')
    EXECUTE FUNCTION releases_priced();
"""

DOWNGRADE = """
DROP TRIGGER releases_priced ON releases;
DROP FUNCTION releases_priced();
DROP INDEX releases_priced_seq;
DROP INDEX releases_started_seq;
DROP INDEX releases_sweep;
ALTER TABLE releases DROP COLUMN sweep_at;
ALTER TABLE releases DROP COLUMN sweep_phase;
ALTER TABLE releases DROP COLUMN sweep_seq;
ALTER TABLE releases DROP COLUMN priced_at;
ALTER TABLE releases DROP COLUMN created_seq;
DROP SEQUENCE IF EXISTS release_sends;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
