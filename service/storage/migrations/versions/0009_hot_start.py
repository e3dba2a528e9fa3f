"""A run's start rewrites no index entry of ``releases`` (issue #29's ledger benchmark:
write amplification).

PostgreSQL writes an UPDATE as a HOT update (the new row version on the same page, no
index entry) only if no column any index of the table names changes: its keys, its
INCLUDE columns and the columns of its predicate. Before this revision ``status`` was in
the predicate of six of the 11 indexes of ``releases`` (and a key of ``releases_sweep``),
``started_at`` in ``releases_started_seq``'s, so a start (queued to running) and a commit
each wrote a new entry in every index whose predicate held: 7 at insert, 8 at start, 5
at commit, 20 per release (besides its events').

Here no index names a column that a start changes (``status``, ``started_at``,
``worker``, ``attempt``, ``lease_token``, ``lease_until``; a lease renewal changed none
already): what the indexes need of ``status`` they read from stored generated columns
(computed by PostgreSQL from ``status`` on every write, so they cannot disagree with it)
that keep their value from queued to running:

- ``pending``: status IN ('pricing', 'queued', 'running') (the pending lists, the
  sweeper's range), ``failed``: status IN ('failed', 'refused') (the failed lists);
- ``pricing``: status = 'pricing': the sweeper's two kinds of marks (a pricing job's
  message, a run's: queued and running alike) are the two ranges of ``releases_sweep``
  (pricing, sweep_seq, created_at), where 0008 had one per status;
- ``ran_at``: ``started_at`` of a release that started and ended (NULL while pending):
  ``releases_ran_seq`` (created_seq) INCLUDE (ran_at) replaces ``releases_started_seq``
  for the ended releases;
- the running releases (the sweeper's lapsed leases, the witnesses still running) are
  the rows of ``release_runs`` (release id only), which the triggers ``releases_running``
  keep: a row inserted when a release becomes running, deleted when it stops (so it
  holds as many rows as runs are under way or lapsed, never the history). They fire on
  those two transitions only (their WHEN), whichever statement makes them (the steps,
  ``privrelease migrate-from-valkey``'s inserts), AFTER the row is written.

**No BEFORE UPDATE trigger on ``releases``**: PostgreSQL locks a row before it runs the
BEFORE ROW UPDATE triggers of its table (whatever their WHEN or column list decides
later), a tuple lock and its WAL record on every UPDATE of ``releases``, a start, a lease
renewal and a settle included. 0008's ``releases_priced`` (the only one) is dropped: its
work, ``priced_at`` and the sweeper's marks cleared when a release goes from pricing to
queued, is done by the only step that makes that move, ``ledger_reserve``'s ``priced``
mode (0007's function, that UPDATE extended: ``_reserve``).

So a start is a HOT update (if its page has room: ``releases`` gets fillfactor 80, the
new pages keep a fifth free for the start's and the lease's row versions) plus one
``release_runs`` row (one index entry); the commit writes ``releases`` once more with 5
entries (the primary key, the three lists, ``releases_ran_seq``) and deletes the
``release_runs`` row. 7 + 1 + 5 = 13 entries where 0008 wrote 20.

The queries name the generated columns (``service.storage.pg_ledger``: ``PENDING_SQL``,
``FAILED_SQL``, the sweeper's statements) so that the planner proves the partial indexes
apply. The index names stay those of 0003 and 0008 but ``releases_ran_seq``.

The ALTER TABLE that adds stored generated columns rewrites ``releases`` once (under its
ACCESS EXCLUSIVE lock, as long as a copy of the table takes).

Revision ID: 0009_hot_start
Revises: 0008_sweep
Create Date: 2026-12-03
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0009_hot_start"
down_revision: str | None = "0008_sweep"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
DROP INDEX releases_pending;
DROP INDEX releases_dataset_pending;
DROP INDEX releases_failed;
DROP INDEX releases_dataset_failed;
DROP INDEX releases_sweep;
DROP INDEX releases_started_seq;

ALTER TABLE releases
    ADD COLUMN pending boolean NOT NULL
        GENERATED ALWAYS AS (status IN ('pricing', 'queued', 'running')) STORED,
    ADD COLUMN failed boolean NOT NULL
        GENERATED ALWAYS AS (status IN ('failed', 'refused')) STORED,
    ADD COLUMN pricing boolean NOT NULL GENERATED ALWAYS AS (status = 'pricing') STORED,
    ADD COLUMN ran_at timestamptz GENERATED ALWAYS AS (
        CASE WHEN status IN ('pricing', 'queued', 'running') THEN NULL
             ELSE started_at END) STORED;
ALTER TABLE releases SET (fillfactor = 80);

CREATE INDEX releases_pending ON releases (created_at, id) WHERE pending;
CREATE INDEX releases_dataset_pending ON releases (dataset_id, created_at, id) WHERE pending;
CREATE INDEX releases_failed ON releases (finished_at, id) WHERE failed;
CREATE INDEX releases_dataset_failed ON releases (dataset_id, finished_at, id) WHERE failed;
CREATE INDEX releases_sweep ON releases (pricing, sweep_seq, created_at) WHERE pending;
CREATE INDEX releases_ran_seq ON releases (created_seq) INCLUDE (ran_at)
    WHERE ran_at IS NOT NULL AND created_seq IS NOT NULL;

-- the running releases, by id
CREATE TABLE release_runs (
    release_id  text COLLATE "C" PRIMARY KEY
);
INSERT INTO release_runs (release_id) SELECT id FROM releases WHERE status = 'running';

CREATE FUNCTION releases_running() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'running' THEN
        INSERT INTO release_runs (release_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM release_runs WHERE release_id = OLD.id;
    END IF;
    RETURN NULL;  -- an AFTER trigger's result is ignored
END $$;
CREATE TRIGGER releases_running_insert AFTER INSERT ON releases FOR EACH ROW
    WHEN (NEW.status = 'running') EXECUTE FUNCTION releases_running();
CREATE TRIGGER releases_running AFTER UPDATE OF status ON releases FOR EACH ROW
    WHEN ((OLD.status = 'running') <> (NEW.status = 'running'))
    EXECUTE FUNCTION releases_running();

DROP TRIGGER releases_priced ON releases;
DROP FUNCTION releases_priced();
"""

DOWNGRADE = """
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

DROP TRIGGER releases_running ON releases;
DROP TRIGGER releases_running_insert ON releases;
DROP FUNCTION releases_running();
DROP TABLE release_runs;
DROP INDEX releases_ran_seq;
DROP INDEX releases_sweep;
DROP INDEX releases_dataset_failed;
DROP INDEX releases_failed;
DROP INDEX releases_dataset_pending;
DROP INDEX releases_pending;
ALTER TABLE releases RESET (fillfactor);
ALTER TABLE releases DROP COLUMN ran_at, DROP COLUMN pricing, DROP COLUMN failed,
    DROP COLUMN pending;

CREATE INDEX releases_pending ON releases (created_at, id)
    WHERE status IN ('pricing', 'queued', 'running');
CREATE INDEX releases_dataset_pending ON releases (dataset_id, created_at, id)
    WHERE status IN ('pricing', 'queued', 'running');
CREATE INDEX releases_failed ON releases (finished_at, id)
    WHERE status IN ('failed', 'refused');
CREATE INDEX releases_dataset_failed ON releases (dataset_id, finished_at, id)
    WHERE status IN ('failed', 'refused');
CREATE INDEX releases_sweep ON releases (status, sweep_seq, created_at)
    WHERE status IN ('pricing', 'queued', 'running');
CREATE INDEX releases_started_seq ON releases (created_seq) INCLUDE (started_at)
    WHERE started_at IS NOT NULL AND created_seq IS NOT NULL;
"""


#: 0007's UPDATE of a priced release, and what 0009 adds to it (0008's trigger's work)
PRICED = ("UPDATE releases SET status = 'queued', request = p_request,",
          "UPDATE releases SET status = 'queued', request = p_request,\n"
          "                priced_at = now(), sweep_seq = NULL, sweep_phase = NULL,\n"
          "                sweep_at = NULL,")


def _reserve(priced_sets_its_marks: bool) -> str:
    """``ledger_reserve`` as 0007_ledger_locks defined it (CREATE OR REPLACE), with its
    priced release's UPDATE extended if ``priced_sets_its_marks``."""
    text = Path(__file__).with_name("0007_ledger_locks.py").read_text()
    found = re.search(r"CREATE OR REPLACE FUNCTION ledger_reserve\(.*?\nEND \$\$;", text, re.S)
    assert found is not None, "0007_ledger_locks no longer defines ledger_reserve"
    body = found.group(0)
    assert body.count(PRICED[0]) == 1, "0007's ledger_reserve no longer has its priced UPDATE"
    return body.replace(*PRICED) if priced_sets_its_marks else body


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_reserve(priced_sets_its_marks=True))


def downgrade() -> None:
    op.execute(_reserve(priced_sets_its_marks=False))
    op.execute(DOWNGRADE)
