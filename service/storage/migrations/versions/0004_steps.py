"""Each ledger write step answers once per call, and the steps every release takes run as
one server-side function call each.

**A step run again after its COMMIT's reply was lost** (``PgLedger._tx`` re-runs a step
whose connection broke: the server may have committed it) must answer what its first run
answered and change nothing more. ``step_calls`` keeps, per call, the answer of the
transaction that made it: every write step of ``PgLedger`` is given a call id once per
call (not per attempt) and records its answer under it (``step_remember``) in the step's
own transaction, so the answer is there if and only if the step's changes are; every
attempt after the first looks it up first (``step_recall``: found, the step committed
before and its answer is returned, nothing else runs). Two attempts of one call can
overlap (the first one's COMMIT still on its way when the connection broke): the later
one waits on the first one's row locks or on the id's primary key, and if the first
commits it fails with a unique violation of ``step_calls_pkey``, which ``PgLedger._tx``
runs again (that attempt finds the answer). A call id starts with its time (milliseconds
since the epoch, 12 hex digits, then 16 random hex digits), so expired rows are one
range of the primary key: ``PgLedger`` prunes them (``CALL_MEMORY``) with no index of
their own.

**The steps every release takes** (reserve, start, lease, settle; refuse and the
outbox's ``enqueued`` besides) are PL/pgSQL functions, one per step, so a step is one
statement sent, ``SELECT step_remember(<call id>, ledger_...(...))`` (a re-run:
``SELECT COALESCE(step_recall(<id>), step_remember(<id>, ledger_...(...)))``), and that
statement is the step's whole transaction (sent outside a transaction block), where the
Python steps sent BEGIN, 3 to 10 statements and COMMIT: each statement a client sends
costs about as much as the work a ledger statement asks for, and PL/pgSQL runs its
statements with plans cached for the session. Each function is the Python step it
replaces, in the same order, deciding the same way; it takes its row locks in the global
order of ``service.storage.pg_ledger`` (advisory locks, the ``ledgers`` row, the
release's row, ``budgets`` rows by measure, ``allocations`` rows by measure), locking a
set of rows with ``SELECT ... ORDER BY measure FOR UPDATE`` (PostgreSQL locks them in the
sorted order) before an UPDATE changes them, and inserts its audit event in the same
transaction. A function returns its answer as jsonb (what ``step_remember`` stores).
Changing a function later means a new migration with ``CREATE OR REPLACE FUNCTION``.

Revision ID: 0004_steps
Revises: 0003_releases
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004_steps"
down_revision: str | None = "0003_releases"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = r"""
-- the answer of each write step's call, written in the step's transaction
CREATE TABLE step_calls (
    id      text COLLATE "C" PRIMARY KEY,
    answer  jsonb NOT NULL
);

-- the answer the call made, if its transaction committed (SQL NULL if none)
CREATE FUNCTION step_recall(p_call text) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT answer FROM step_calls WHERE id = p_call);
END $$;

-- record the call's answer (in the step's transaction) and return it
CREATE FUNCTION step_remember(p_call text, p_answer jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO step_calls (id, answer) VALUES (p_call, p_answer);
    RETURN p_answer;
END $$;

-- an Idempotency-Key and what it made (PgLedger._remember_key)
CREATE FUNCTION ledger_remember_key(p_key text, p_fingerprint text, p_ttl integer,
                                    p_release text, p_dataset text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO idempotency (key, fingerprint, release_id, dataset_id, version, expires_at)
        VALUES (p_key, p_fingerprint, p_release, p_dataset, NULL,
                now() + make_interval(secs => p_ttl))
        ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
            release_id = EXCLUDED.release_id, dataset_id = EXCLUDED.dataset_id,
            version = EXCLUDED.version, expires_at = EXCLUDED.expires_at;
END $$;

-- reserve.lua: hold the cost for a new release (PgLedger.reserve). Locks: the
-- Idempotency-Key's and the replay fingerprint's advisory locks, the dataset's ledgers
-- row (retired, retired versions, notion lock), the release's row, the dataset's budgets
-- rows of the measures asked (by measure), the actor's allocations rows of them (by
-- measure): every row it decides on, before it decides.
CREATE FUNCTION ledger_reserve(
    p_release text, p_dataset text, p_actor text, p_mode text, p_request text,
    p_fingerprint text, p_replay_key text, p_replay boolean, p_idempotency_key text,
    p_idempotency_ttl integer, p_notion text, p_measures text[], p_units bigint[],
    p_version bigint, p_at timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_retired          boolean;
    v_retired_versions bigint[];
    v_lock             text;
    v_status           text;
    v_found            text;
    v_found_print      text;
    v_names            text[];
    v_left             bigint[];
    v_alloc_names      text[];
    v_alloc_left       bigint[];
    v_rule             text;
    v_measure          text;
    v_units            bigint;
    v_at               integer;
    v_cost             jsonb := '{}';
    v_scoped           jsonb := '{}';
    v_detail           jsonb := '{}';
BEGIN
    IF p_idempotency_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(1, hashtext(p_idempotency_key));
    END IF;
    IF p_replay THEN  -- nothing is read or written under the fingerprint otherwise
        PERFORM pg_advisory_xact_lock(2, hashtext(p_replay_key));
    END IF;
    SELECT retired, retired_versions, notion_lock
        INTO v_retired, v_retired_versions, v_lock
        FROM ledgers WHERE dataset_id = p_dataset FOR UPDATE;
    SELECT status INTO v_status FROM releases WHERE id = p_release FOR UPDATE;
    -- a create re-sent (its reply lost): it happened, change nothing
    IF p_mode = 'pricing' AND v_status IS NOT NULL THEN
        RETURN jsonb_build_object('outcome', 'pricing', 'release_id', p_release);
    END IF;
    IF p_mode = 'new' AND v_status IS NOT NULL THEN
        RETURN jsonb_build_object('outcome', 'reserved', 'release_id', p_release);
    END IF;
    IF p_mode = 'priced' AND v_status IS DISTINCT FROM 'pricing' THEN
        RETURN jsonb_build_object('outcome', 'ended', 'release_id', p_release,
                                  'status', COALESCE(v_status, ''));
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        SELECT fingerprint, release_id INTO v_found_print, v_found FROM idempotency
            WHERE key = p_idempotency_key AND expires_at > now();
        IF FOUND THEN
            RETURN jsonb_build_object(
                'outcome', CASE WHEN v_found_print = p_fingerprint THEN 'idempotent'
                                ELSE 'idem_mismatch' END,
                'release_id', COALESCE(v_found, ''));
        END IF;
    END IF;
    IF p_replay THEN
        SELECT release_id INTO v_found FROM replays WHERE fingerprint = p_replay_key;
        IF FOUND THEN
            IF p_idempotency_key IS NOT NULL THEN
                PERFORM ledger_remember_key(p_idempotency_key, p_fingerprint,
                                            p_idempotency_ttl, v_found, p_dataset);
            END IF;
            RETURN jsonb_build_object('outcome', 'replay', 'release_id', v_found);
        END IF;
    END IF;
    IF v_retired THEN
        RETURN jsonb_build_object('outcome', 'retired');
    END IF;
    IF p_version = ANY(v_retired_versions) THEN
        RETURN jsonb_build_object('outcome', 'version_retired', 'release_id', p_version::text);
    END IF;
    IF p_notion <> '' AND v_lock IS NOT NULL AND v_lock <> p_notion THEN
        RETURN jsonb_build_object('outcome', 'notion_locked', 'notion', v_lock);
    END IF;

    -- the caps: lock the rows of the measures asked (in measure order), then decide
    SELECT array_agg(b.measure), array_agg(b.cap - b.committed - b.reserved)
        INTO v_names, v_left
        FROM (SELECT measure, cap, committed, reserved FROM budgets
              WHERE dataset_id = p_dataset AND measure = ANY(p_measures)
              ORDER BY measure FOR UPDATE) b;
    SELECT array_agg(a.measure), array_agg(a.cap - a.committed - a.reserved),
           (SELECT scope FROM allocation_scopes
            WHERE dataset_id = p_dataset AND key_id = p_actor)
        INTO v_alloc_names, v_alloc_left, v_rule
        FROM (SELECT measure, cap, committed, reserved FROM allocations
              WHERE dataset_id = p_dataset AND key_id = p_actor AND measure = ANY(p_measures)
              ORDER BY measure FOR UPDATE) a;
    FOR i IN 1 .. COALESCE(array_length(p_measures, 1), 0) LOOP
        v_measure := p_measures[i];
        v_units := p_units[i];
        v_at := array_position(v_names, v_measure);
        IF v_at IS NULL THEN
            RETURN jsonb_build_object('outcome', 'not_admitted', 'measure', v_measure);
        END IF;
        IF v_units > v_left[v_at] THEN
            RETURN jsonb_build_object('outcome', 'exhausted', 'measure', v_measure,
                                      'requested', v_units, 'remaining', v_left[v_at],
                                      'scope', 'dataset');
        END IF;
        v_at := array_position(v_alloc_names, v_measure);
        IF v_at IS NOT NULL THEN
            IF v_units > v_alloc_left[v_at] THEN
                RETURN jsonb_build_object('outcome', 'exhausted', 'measure', v_measure,
                                          'requested', v_units,
                                          'remaining', v_alloc_left[v_at],
                                          'scope', 'allocation');
            END IF;
            v_scoped := v_scoped || jsonb_build_object(v_measure, v_units);
        ELSIF v_rule = 'listed' AND v_units > 0 THEN
            RETURN jsonb_build_object('outcome', 'exhausted', 'measure', v_measure,
                                      'requested', v_units, 'remaining', 0,
                                      'scope', 'allocation', 'listed', false);
        END IF;
        v_cost := v_cost || jsonb_build_object(v_measure, v_units);
    END LOOP;

    IF p_mode = 'pricing' THEN
        INSERT INTO releases (id, dataset_id, actor, status, request, created_at)
            VALUES (p_release, p_dataset, p_actor, 'pricing', p_request,
                    COALESCE(p_at, now()));
    ELSE
        -- (the rows locked above; each measure's units by its place in p_measures)
        UPDATE budgets SET reserved = reserved + p_units[array_position(p_measures, measure)]
            WHERE dataset_id = p_dataset AND measure = ANY(p_measures);
        IF v_alloc_names IS NOT NULL THEN
            UPDATE allocations
                SET reserved = reserved + p_units[array_position(p_measures, measure)]
                WHERE dataset_id = p_dataset AND key_id = p_actor
                  AND measure = ANY(v_alloc_names);
        END IF;
        IF p_mode = 'priced' THEN
            UPDATE releases SET status = 'queued', request = p_request,
                replay_key = p_replay_key, actor = p_actor, version = p_version,
                cost = v_cost, alloc_cost = v_scoped
                WHERE id = p_release;
        ELSE
            INSERT INTO releases (id, dataset_id, actor, status, request, replay_key, version,
                                  cost, alloc_cost, created_at)
                VALUES (p_release, p_dataset, p_actor, 'queued', p_request, p_replay_key,
                        p_version, v_cost, v_scoped, COALESCE(p_at, now()));
        END IF;
        IF p_replay THEN
            INSERT INTO replays (fingerprint, release_id) VALUES (p_replay_key, p_release)
                ON CONFLICT (fingerprint) DO UPDATE SET release_id = EXCLUDED.release_id;
        END IF;
        IF p_version IS NOT NULL THEN
            v_detail := jsonb_build_object('version', p_version);
        END IF;
        IF p_notion <> '' THEN
            UPDATE ledgers SET notion_lock = p_notion
                WHERE dataset_id = p_dataset AND notion_lock IS NULL;
            IF FOUND THEN
                v_detail := v_detail || jsonb_build_object('notion_lock', p_notion);
            END IF;
        END IF;
        INSERT INTO events (dataset_id, kind, release_id, actor, at, units, detail)
            VALUES (p_dataset, 'reserve', p_release, p_actor, COALESCE(p_at, now()), v_cost,
                    v_detail);
    END IF;
    INSERT INTO outbox (release_id, due_at) VALUES (p_release, now())
        ON CONFLICT (release_id) DO UPDATE SET due_at = EXCLUDED.due_at;
    IF p_idempotency_key IS NOT NULL THEN
        PERFORM ledger_remember_key(p_idempotency_key, p_fingerprint, p_idempotency_ttl,
                                    p_release, p_dataset);
    END IF;
    RETURN jsonb_build_object(
        'outcome', CASE WHEN p_mode = 'pricing' THEN 'pricing' ELSE 'reserved' END,
        'release_id', p_release);
END $$;

-- refuse.lua: end a release still pricing as refused (PgLedger.refuse); true, or false
-- if it was no longer pricing. Locks: the release's row (the UPDATE).
CREATE FUNCTION ledger_refuse(p_dataset text, p_release text, p_error text, p_code text,
                              p_actor text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE releases SET status = 'refused', error = p_error, finished_at = now()
        WHERE id = p_release AND status = 'pricing';
    IF NOT FOUND THEN
        RETURN 'false';
    END IF;
    DELETE FROM outbox WHERE release_id = p_release;
    INSERT INTO events (dataset_id, kind, release_id, actor, at, units, detail)
        VALUES (p_dataset, 'refuse', p_release, p_actor, now(), '{}',
                jsonb_build_object('code', p_code));
    RETURN 'true';
END $$;

-- the release's task is published: out of the outbox (PgLedger.enqueued). Locks: the
-- outbox row.
CREATE FUNCTION ledger_enqueued(p_release text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM outbox WHERE release_id = p_release;
    RETURN 'null';
END $$;

-- start.lua: a run takes the release's lease (PgLedger.mark_running); the attempt
-- number, or 0 if the release ended or a live run holds it. Locks: the release's row
-- (the UPDATE, whose condition PostgreSQL checks again on the newest row version if it
-- waited for another transaction's lock).
CREATE FUNCTION ledger_start(p_release text, p_worker text, p_token text,
                             p_lease_seconds integer) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_attempt integer;
BEGIN
    UPDATE releases SET status = 'running', started_at = now(), worker = p_worker,
        attempt = attempt + 1, lease_token = p_token,
        lease_until = now() + make_interval(secs => p_lease_seconds)
        WHERE id = p_release AND (status = 'queued' OR (status = 'running'
              AND NOT COALESCE(lease_until > now(), false)))
        RETURNING attempt INTO v_attempt;
    IF NOT FOUND THEN
        RETURN '0';
    END IF;
    DELETE FROM outbox WHERE release_id = p_release;
    RETURN to_jsonb(v_attempt);
END $$;

-- lease.lua: the run holding the lease keeps it (and marks the data read); false if it
-- lost it (PgLedger.renew_lease / mark_data_read). Locks: the release's row.
CREATE FUNCTION ledger_touch(p_release text, p_token text, p_read boolean,
                             p_lease_seconds integer) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE releases SET lease_until = now() + make_interval(secs => p_lease_seconds),
        data_read = data_read OR p_read
        WHERE id = p_release AND lease_token = p_token AND lease_until > now()
          AND status = 'running';
    RETURN to_jsonb(FOUND);
END $$;

-- settle.lua: commit / fail / abort / cancel (PgLedger._settle): move the units the
-- release holds (charged, or refunded), end the release, record the event; 'settled',
-- or 'ended' / 'running' / 'lost' and nothing changed. p_holder: the run's token (only
-- while it holds the lease), '!' (service.storage.ledger.NO_LEASE: only while no run
-- holds it) or '' (whoever holds it). Locks: the release's row (the UPDATE that ends
-- it, whose condition PostgreSQL checks again on the newest row version if it waited
-- for another transaction's lock), then the dataset's budgets rows of the measures
-- held (by measure), then the owner's allocations rows of them (by measure).
CREATE FUNCTION ledger_settle(p_dataset text, p_release text, p_action text,
                              p_payload text, p_actor text, p_holder text,
                              p_table_version bigint, p_result_attempt integer,
                              p_call text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_charge    boolean := p_action IN ('commit', 'fail');
    v_owner     text;
    v_version   bigint;
    v_held      jsonb;
    v_alloc     jsonb;
    v_replay    text;
    v_detail    jsonb := '{}';
    r           record;
BEGIN
    IF p_action = 'cancel' THEN  -- a release still pricing holds nothing: it just ends
        UPDATE releases SET status = 'cancelled', finished_at = now(), error = p_payload,
            settled_by = p_call, lease_token = NULL, lease_until = NULL
            WHERE id = p_release AND status = 'pricing'
            RETURNING actor, replay_key INTO v_owner, v_replay;
        IF FOUND THEN
            v_held := '{}';
            v_alloc := '{}';
        END IF;
    END IF;
    -- else the release ends here if it may: queued or running, not a cancel of a running
    -- one, and the lease as p_holder asks; it holds its cost (unchanged by the UPDATE)
    IF v_held IS NULL THEN
        UPDATE releases SET
            status = CASE p_action WHEN 'commit' THEN 'succeeded'
                                   WHEN 'cancel' THEN 'cancelled' ELSE 'failed' END,
            finished_at = now(),
            output = CASE WHEN p_action <> 'commit' THEN output
                          WHEN p_result_attempt IS NULL THEN p_payload END,
            result_attempt = CASE WHEN p_action = 'commit' THEN p_result_attempt
                                  ELSE result_attempt END,
            output_table = CASE WHEN p_action = 'commit' THEN p_table_version
                                ELSE output_table END,
            error = CASE WHEN p_action = 'commit' THEN error ELSE p_payload END,
            charged = charged OR v_charge, settled_by = p_call,
            lease_token = NULL, lease_until = NULL
            WHERE id = p_release AND status IN ('queued', 'running')
              AND NOT (p_action = 'cancel' AND status = 'running')
              AND CASE WHEN p_holder = '!' THEN NOT (lease_token IS NOT NULL
                                                     AND COALESCE(lease_until > now(), false))
                       WHEN p_holder <> '' THEN lease_token = p_holder
                                                AND COALESCE(lease_until > now(), false)
                       ELSE true END
            RETURNING actor, version, cost, alloc_cost, replay_key
            INTO v_owner, v_version, v_held, v_alloc, v_replay;
        IF NOT FOUND THEN  -- nothing changed: say why
            SELECT status, lease_token, COALESCE(lease_until > now(), false) AS live
                INTO r FROM releases WHERE id = p_release;
            IF NOT FOUND OR r.status NOT IN ('queued', 'running', 'pricing')
                    OR (r.status = 'pricing' AND p_action <> 'cancel') THEN
                RETURN '"ended"';
            END IF;
            IF p_action = 'cancel' AND r.status = 'running' THEN
                RETURN '"running"';
            END IF;
            RETURN '"lost"';
        END IF;
    END IF;
    -- the rows of the measures it holds units of (the dataset's few rows, filtered by
    -- the held object), locked by measure, then moved
    IF v_held <> '{}' THEN
        PERFORM 1 FROM budgets WHERE dataset_id = p_dataset
            AND (v_held ->> measure)::bigint <> 0 ORDER BY measure FOR UPDATE;
        UPDATE budgets SET reserved = reserved - (v_held ->> measure)::bigint,
            committed = committed
                        + CASE WHEN v_charge THEN (v_held ->> measure)::bigint ELSE 0 END
            WHERE dataset_id = p_dataset AND (v_held ->> measure)::bigint <> 0;
    END IF;
    IF v_alloc <> '{}' THEN
        PERFORM 1 FROM allocations WHERE dataset_id = p_dataset AND key_id = v_owner
            AND (v_alloc ->> measure)::bigint <> 0 ORDER BY measure FOR UPDATE;
        UPDATE allocations SET reserved = reserved - (v_alloc ->> measure)::bigint,
            committed = committed
                        + CASE WHEN v_charge THEN (v_alloc ->> measure)::bigint ELSE 0 END
            WHERE dataset_id = p_dataset AND key_id = v_owner
              AND (v_alloc ->> measure)::bigint <> 0;
    END IF;
    IF NOT v_charge AND v_replay IS NOT NULL THEN
        -- a refunded request may be asked again; a charged one stays its answer
        DELETE FROM replays WHERE fingerprint = v_replay AND release_id = p_release;
    END IF;
    DELETE FROM outbox WHERE release_id = p_release;
    IF v_version IS NOT NULL THEN
        v_detail := jsonb_build_object('version', v_version);
    END IF;
    IF v_charge THEN
        v_detail := v_detail || jsonb_build_object(
            'outcome', CASE WHEN p_action = 'commit' THEN 'succeeded' ELSE 'failed' END);
    END IF;
    INSERT INTO events (dataset_id, kind, release_id, actor, at, units, detail)
        VALUES (p_dataset, CASE WHEN p_action = 'fail' THEN 'commit' ELSE p_action END,
                p_release, p_actor, now(), v_held, v_detail);
    RETURN '"settled"';
END $$;
"""

DOWNGRADE = """
DROP FUNCTION ledger_settle(text, text, text, text, text, text, bigint, integer, text);
DROP FUNCTION ledger_touch(text, text, boolean, integer);
DROP FUNCTION ledger_start(text, text, text, integer);
DROP FUNCTION ledger_enqueued(text);
DROP FUNCTION ledger_refuse(text, text, text, text, text);
DROP FUNCTION ledger_reserve(text, text, text, text, text, text, text, boolean, text, integer,
                             text, text[], bigint[], bigint, timestamptz);
DROP FUNCTION ledger_remember_key(text, text, integer, text, text);
DROP FUNCTION step_remember(text, jsonb);
DROP FUNCTION step_recall(text);
DROP TABLE step_calls;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
