"""A settle rewrites no index entry of ``releases`` either (issue #29's ledger benchmark:
write amplification); 0009_hot_start did it for the start.

A commit, a fail, a refund, a cancel and a refusal change ``status`` and ``finished_at``
(and the output, the error, the lease...). Under 0009 the indexes of ``releases`` named
what those change: the pending lists' and the sweeper's predicate (``pending``, a
generated column of ``status``), the failed lists' (``failed``) and key (``finished_at``),
the witness index's ``ran_at``. So a settle was never a HOT update: it wrote a new entry
in five indexes, and the whole row's new version on another page if need be.

Here every list whose membership a settle changes is a side table, keyed and indexed
for its reads, and ``releases`` keeps only indexes on what never changes after the
insert (``id``, ``created_at``, ``dataset_id``, ``actor``, ``created_seq``) and on
``priced_at`` (set once, by a pricing job's reserve, never by a settle):

- ``release_pending`` (``created_at``, release id, dataset, ``pricing``): a row per
  pending release (pricing, queued, running), inserted with it, deleted when it ends;
  the pending lists (its primary key (created_at, release_id), oldest first, and
  ``release_pending_dataset``) and the sweeper's stale releases. (A primary key on the
  release id alone would be one more index entry per reserve; a release's
  ``created_at`` never changes, so (created_at, id) finds its row as well: the steps
  and the sweeper read it from the release's row first.) The sweeper's marks of a
  pending release (``sweep_seq``, ``sweep_phase``, ``sweep_at``, 0008_sweep) are
  columns of it (they concern pending releases only), in the two ranges of
  ``release_pending_sweep`` (pricing, sweep_seq, created_at);
- ``release_failed`` (release id, dataset, ``finished_at``): a row per failed or refused
  release (the failed lists: ``release_failed_at``, ``release_failed_dataset``);
- ``release_ran`` (``created_seq`` INCLUDE ``ran_at``): the witnesses that ended (a row
  per release that started and ended, as 0009's ``releases_ran_seq`` had an entry);
- ``release_runs`` (0009): the running releases.

One AFTER trigger keeps the four (``releases_lists``, on an insert and on a change of
``status``, or of what the lists copy: ``created_at``, ``finished_at``, ``dataset_id``,
which no step changes, and ``started_at``, which a start changes with the status or, a
lapsed run's restart, alone; whichever statement makes it, the steps or ``migrate-from-valkey``'s
inserts), so a release's place in each list still follows from its row (0003's rule) and
no step can forget it; it replaces 0009's ``releases_running``. Its inserts are plain
ones (each runs on the one transition that makes the row: a status moves once into or
out of a list), not ``ON CONFLICT``, which writes a second WAL record per row (the
speculative insertion's confirmation). A pricing job's reserve (pricing to queued)
clears the release's marks there (0009 did it in ``ledger_reserve``'s UPDATE: the
columns have moved); ``ledger_reserve`` is 0007's again with only ``priced_at`` added to
that UPDATE. Still no BEFORE trigger (0009: it would lock every row an UPDATE changes).

What a settle writes now: the row's new version on its page (HOT: no index entry; the
table keeps fillfactor 80 from 0009, and an output over about 2 kB is TOASTed, so the
version fits where the start's did), the ``release_pending`` and ``release_runs`` rows
deleted (a deletion writes no index entry), a ``release_ran`` row (one entry) and, for a
failure, a ``release_failed`` row. A reserve writes one ``release_pending`` row (three
entries) where it wrote three entries in ``releases``' partial indexes.

The upgrade fills the side tables from the rows (every pending release listed with its
marks, every failed one, every ended run) before it drops 0009's columns and indexes;
the downgrade puts them back from the side tables.

Revision ID: 0010_hot_settle
Revises: 0009_hot_start
Create Date: 2026-12-04
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0010_hot_settle"
down_revision: str | None = "0009_hot_start"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
CREATE TABLE release_pending (
    created_at   timestamptz NOT NULL,
    release_id   text COLLATE "C" NOT NULL,
    dataset_id   text NOT NULL,
    pricing      boolean NOT NULL,
    sweep_seq    bigint CHECK (sweep_seq >= 0),
    sweep_phase  smallint CHECK (sweep_phase BETWEEN 0 AND 2),
    sweep_at     timestamptz,
    PRIMARY KEY (created_at, release_id)
);
INSERT INTO release_pending (release_id, dataset_id, created_at, pricing, sweep_seq,
                             sweep_phase, sweep_at)
    SELECT id, dataset_id, created_at, pricing, sweep_seq, sweep_phase, sweep_at
    FROM releases WHERE pending;
CREATE INDEX release_pending_dataset ON release_pending (dataset_id, created_at, release_id);
CREATE INDEX release_pending_sweep ON release_pending (pricing, sweep_seq, created_at);

CREATE TABLE release_failed (
    release_id   text COLLATE "C" PRIMARY KEY,
    dataset_id   text NOT NULL,
    finished_at  timestamptz
);
INSERT INTO release_failed (release_id, dataset_id, finished_at)
    SELECT id, dataset_id, finished_at FROM releases WHERE failed;
CREATE INDEX release_failed_at ON release_failed (finished_at, release_id);
CREATE INDEX release_failed_dataset ON release_failed (dataset_id, finished_at, release_id);

CREATE TABLE release_ran (
    created_seq  bigint NOT NULL,
    ran_at       timestamptz NOT NULL,
    PRIMARY KEY (created_seq) INCLUDE (ran_at)
);
INSERT INTO release_ran (created_seq, ran_at)
    SELECT created_seq, ran_at FROM releases
    WHERE ran_at IS NOT NULL AND created_seq IS NOT NULL;

DROP TRIGGER releases_running ON releases;
DROP TRIGGER releases_running_insert ON releases;
DROP FUNCTION releases_running();

DROP INDEX releases_pending;
DROP INDEX releases_dataset_pending;
DROP INDEX releases_failed;
DROP INDEX releases_dataset_failed;
DROP INDEX releases_sweep;
DROP INDEX releases_ran_seq;
ALTER TABLE releases DROP COLUMN ran_at, DROP COLUMN pricing, DROP COLUMN failed,
    DROP COLUMN pending, DROP COLUMN sweep_at, DROP COLUMN sweep_phase,
    DROP COLUMN sweep_seq;

-- a release's place in the lists its status, its times or its dataset move it in or out of
CREATE FUNCTION releases_lists() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_was     text := CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END;
    v_pending boolean := NEW.status IN ('pricing', 'queued', 'running');
    v_was_pending boolean := COALESCE(v_was IN ('pricing', 'queued', 'running'), false);
    v_failed  boolean := NEW.status IN ('failed', 'refused');
    v_was_failed boolean := COALESCE(v_was IN ('failed', 'refused'), false);
BEGIN
    IF v_pending AND NOT v_was_pending THEN
        INSERT INTO release_pending (created_at, release_id, dataset_id, pricing)
            VALUES (NEW.created_at, NEW.id, NEW.dataset_id, NEW.status = 'pricing');
    ELSIF v_was_pending AND NOT v_pending THEN
        DELETE FROM release_pending WHERE created_at = OLD.created_at AND release_id = OLD.id;
    ELSIF v_pending AND v_was = 'pricing' AND NEW.status <> 'pricing' THEN
        -- priced: its marks were about its pricing job's message, its run's is new
        UPDATE release_pending SET created_at = NEW.created_at, dataset_id = NEW.dataset_id,
            pricing = false, sweep_seq = NULL, sweep_phase = NULL, sweep_at = NULL
            WHERE created_at = OLD.created_at AND release_id = OLD.id;
    ELSIF v_pending AND (OLD.created_at, OLD.dataset_id) <> (NEW.created_at, NEW.dataset_id)
            THEN
        UPDATE release_pending SET created_at = NEW.created_at, dataset_id = NEW.dataset_id
            WHERE created_at = OLD.created_at AND release_id = OLD.id;
    END IF;
    IF NEW.status = 'running' THEN
        IF v_was IS DISTINCT FROM 'running' THEN
            INSERT INTO release_runs (release_id) VALUES (NEW.id);
        END IF;
    ELSIF v_was = 'running' THEN
        DELETE FROM release_runs WHERE release_id = OLD.id;
    END IF;
    IF v_failed AND NOT v_was_failed THEN
        INSERT INTO release_failed (release_id, dataset_id, finished_at)
            VALUES (NEW.id, NEW.dataset_id, NEW.finished_at);
    ELSIF v_was_failed AND NOT v_failed THEN
        DELETE FROM release_failed WHERE release_id = OLD.id;
    ELSIF v_failed AND (OLD.finished_at, OLD.dataset_id) IS DISTINCT FROM
            (NEW.finished_at, NEW.dataset_id) THEN
        UPDATE release_failed SET finished_at = NEW.finished_at, dataset_id = NEW.dataset_id
            WHERE release_id = OLD.id;
    END IF;
    IF NOT v_pending AND v_was IS NOT NULL AND NOT v_was_pending
            AND OLD.started_at IS DISTINCT FROM NEW.started_at THEN
        DELETE FROM release_ran WHERE created_seq = OLD.created_seq;  -- ended, started anew
    END IF;
    IF NOT v_pending AND (v_was IS NULL OR v_was_pending
                          OR OLD.started_at IS DISTINCT FROM NEW.started_at)
            AND NEW.started_at IS NOT NULL AND NEW.created_seq IS NOT NULL THEN
        INSERT INTO release_ran (created_seq, ran_at) VALUES (NEW.created_seq, NEW.started_at);
    END IF;
    RETURN NULL;  -- an AFTER trigger's result is ignored
END $$;
CREATE TRIGGER releases_lists_insert AFTER INSERT ON releases FOR EACH ROW
    EXECUTE FUNCTION releases_lists();
CREATE TRIGGER releases_lists
    AFTER UPDATE OF status, created_at, finished_at, started_at, dataset_id ON releases
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.created_at <> NEW.created_at
          OR OLD.finished_at IS DISTINCT FROM NEW.finished_at
          OR OLD.started_at IS DISTINCT FROM NEW.started_at
          OR OLD.dataset_id <> NEW.dataset_id)
    EXECUTE FUNCTION releases_lists();
"""

DOWNGRADE = """
DROP TRIGGER releases_lists ON releases;
DROP TRIGGER releases_lists_insert ON releases;
DROP FUNCTION releases_lists();

ALTER TABLE releases
    ADD COLUMN sweep_seq bigint CHECK (sweep_seq >= 0),
    ADD COLUMN sweep_phase smallint CHECK (sweep_phase BETWEEN 0 AND 2),
    ADD COLUMN sweep_at timestamptz,
    ADD COLUMN pending boolean NOT NULL
        GENERATED ALWAYS AS (status IN ('pricing', 'queued', 'running')) STORED,
    ADD COLUMN failed boolean NOT NULL
        GENERATED ALWAYS AS (status IN ('failed', 'refused')) STORED,
    ADD COLUMN pricing boolean NOT NULL GENERATED ALWAYS AS (status = 'pricing') STORED,
    ADD COLUMN ran_at timestamptz GENERATED ALWAYS AS (
        CASE WHEN status IN ('pricing', 'queued', 'running') THEN NULL
             ELSE started_at END) STORED;
UPDATE releases r SET sweep_seq = p.sweep_seq, sweep_phase = p.sweep_phase,
    sweep_at = p.sweep_at FROM release_pending p
    WHERE r.id = p.release_id AND p.sweep_phase IS NOT NULL;

CREATE INDEX releases_pending ON releases (created_at, id) WHERE pending;
CREATE INDEX releases_dataset_pending ON releases (dataset_id, created_at, id) WHERE pending;
CREATE INDEX releases_failed ON releases (finished_at, id) WHERE failed;
CREATE INDEX releases_dataset_failed ON releases (dataset_id, finished_at, id) WHERE failed;
CREATE INDEX releases_sweep ON releases (pricing, sweep_seq, created_at) WHERE pending;
CREATE INDEX releases_ran_seq ON releases (created_seq) INCLUDE (ran_at)
    WHERE ran_at IS NOT NULL AND created_seq IS NOT NULL;

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

DROP TABLE release_ran;
DROP TABLE release_failed;
DROP TABLE release_pending;
"""

#: 0007's UPDATE of a priced release, and what it becomes: 0009's (which also cleared
#: the marks on ``releases``) or 0010's (the trigger clears them in ``release_pending``)
PRICED = "UPDATE releases SET status = 'queued', request = p_request,"
PRICED_0009 = ("UPDATE releases SET status = 'queued', request = p_request,\n"
               "                priced_at = now(), sweep_seq = NULL, sweep_phase = NULL,\n"
               "                sweep_at = NULL,")
PRICED_0010 = ("UPDATE releases SET status = 'queued', request = p_request,\n"
               "                priced_at = now(),")


def _reserve(priced: str) -> str:
    """``ledger_reserve`` as 0007_ledger_locks defined it (CREATE OR REPLACE), its priced
    release's UPDATE made ``priced``."""
    text = Path(__file__).with_name("0007_ledger_locks.py").read_text()
    found = re.search(r"CREATE OR REPLACE FUNCTION ledger_reserve\(.*?\nEND \$\$;", text, re.S)
    assert found is not None, "0007_ledger_locks no longer defines ledger_reserve"
    body = found.group(0)
    assert body.count(PRICED) == 1, "0007's ledger_reserve no longer has its priced UPDATE"
    return body.replace(PRICED, priced)


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_reserve(PRICED_0010))


def downgrade() -> None:
    op.execute(_reserve(PRICED_0009))
    op.execute(DOWNGRADE)
