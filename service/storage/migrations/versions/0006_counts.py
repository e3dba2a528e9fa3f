"""What three reads need so their cost does not grow with the history (issue #29 item 7).

``counts``: named counters kept by triggers in the transaction of the change they count,
so reading one is one primary-key probe. ``datasets``: the number of registered datasets
(``/metrics``' ``privrelease_datasets``, ``PgLedger.dataset_count``), maintained by
statement-level triggers on ``datasets`` (an INSERT adds the rows it inserted, a DELETE
takes away the rows it deleted: a bulk insert updates the row once; a statement that
changed no row does not touch it; TRUNCATE sets it to 0). Registrations update the one
row, so two of them wait for each other's COMMIT there (an upload's registration is one
short transaction; uploads are rare).

``datasets.shapes``: the shapes (row count and column set) of a dataset's active
versions while the dataset is active and not public, each as ``dataset_shape`` (the
MD5 of the row count and the sorted column names), a generated column (it can never
disagree with the document, as ``status``) with a GIN index: ``reupload_warnings``
finds the datasets that may hold the same people as a new upload by one index probe of
its shape (``PgLedger.same_shape_documents``), not by reading every document. A row count
that is not a JSON number, or columns that are not an object, give no shape (never an
error: a document's write never fails on it).

``events_dataset_caps``: the ``cap`` events of a dataset (partial: a few rows per
dataset, one per change of its caps), so the console's budget chart finds the caps that
held before its window (``PgLedger.budget_window``) without reading the releases'
events.

The backfill is the statements themselves: the count from the rows there, the generated
column computed for every row when it is added (a rewrite of ``datasets``); plain CREATE
INDEX on ``events`` holds its writes for the build (seconds per 10^6 events).

Revision ID: 0006_counts
Revises: 0005_keys
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006_counts"
down_revision: str | None = "0005_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
CREATE TABLE counts (
    name   text PRIMARY KEY,
    value  bigint NOT NULL CHECK (value >= 0)
);
INSERT INTO counts (name, value) SELECT 'datasets', count(*) FROM datasets;

CREATE FUNCTION counts_datasets() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_rows bigint;
BEGIN
    SELECT count(*) INTO v_rows FROM changed;
    IF v_rows > 0 THEN
        UPDATE counts SET value = value + CASE WHEN TG_OP = 'DELETE' THEN -v_rows
                                               ELSE v_rows END
            WHERE name = 'datasets';
    END IF;
    RETURN NULL;
END $$;
CREATE FUNCTION counts_datasets_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE counts SET value = 0 WHERE name = 'datasets';
    RETURN NULL;
END $$;
CREATE TRIGGER counts_datasets_inserted AFTER INSERT ON datasets
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION counts_datasets();
CREATE TRIGGER counts_datasets_deleted AFTER DELETE ON datasets
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION counts_datasets();
CREATE TRIGGER counts_datasets_truncated AFTER TRUNCATE ON datasets
    FOR EACH STATEMENT EXECUTE FUNCTION counts_datasets_truncated();

-- a version's shape: its row count (truncated to an integer, as Python's int()) and its
-- sorted column names (the "C" order: Python's str order), hashed to a short key
CREATE FUNCTION dataset_shape(p_columns jsonb, p_rows jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(p_columns) = 'object' AND jsonb_typeof(p_rows) = 'number'
        THEN md5(trunc((p_rows #>> '{}')::numeric)::text || ' ' || COALESCE(
            (SELECT jsonb_agg(k ORDER BY k COLLATE "C") FROM jsonb_object_keys(p_columns) k)
            ::text, '[]'))
    END
$$;
-- the shapes of the active versions of an active, non-public dataset (datasets.py's
-- versions_of: the ``versions`` list, or the document itself before versions)
CREATE FUNCTION dataset_shapes(p_document text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$
    SELECT CASE WHEN d ->> 'status' = 'active' AND d -> 'public' IS DISTINCT FROM 'true'
        THEN ARRAY(
            SELECT DISTINCT dataset_shape(v -> 'columns', v -> 'n_rows')
            FROM jsonb_array_elements(CASE
                WHEN jsonb_typeof(d -> 'versions') = 'array'
                     AND jsonb_array_length(d -> 'versions') > 0 THEN d -> 'versions'
                ELSE jsonb_build_array(d) END) v
            WHERE v ->> 'status' = 'active'
              AND dataset_shape(v -> 'columns', v -> 'n_rows') IS NOT NULL
            ORDER BY 1)
        ELSE '{}' END
    FROM (SELECT p_document::jsonb AS d) doc
$$;
ALTER TABLE datasets ADD COLUMN shapes text[] NOT NULL
    GENERATED ALWAYS AS (dataset_shapes(document)) STORED;
CREATE INDEX datasets_shapes ON datasets USING gin (shapes) WITH (fastupdate = off);

CREATE INDEX events_dataset_caps ON events (dataset_id, id) WHERE kind = 'cap';
"""

DOWNGRADE = """
DROP INDEX events_dataset_caps;
DROP INDEX datasets_shapes;
ALTER TABLE datasets DROP COLUMN shapes;
DROP FUNCTION dataset_shapes(text);
DROP FUNCTION dataset_shape(jsonb, jsonb);
DROP TRIGGER counts_datasets_truncated ON datasets;
DROP TRIGGER counts_datasets_deleted ON datasets;
DROP TRIGGER counts_datasets_inserted ON datasets;
DROP FUNCTION counts_datasets_truncated();
DROP FUNCTION counts_datasets();
DROP TABLE counts;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
