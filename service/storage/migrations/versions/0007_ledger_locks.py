"""The reserve and settle steps hold the dataset's contended rows for less (issue #29's
ledger benchmark): ``ledger_reserve`` and ``ledger_settle`` of 0004_steps, replaced.

Every step is still its own transaction, and a transaction holds its row locks until its
COMMIT, WAL flush included; so a row every step of a dataset locks exclusively makes the
dataset's steps take turns at one WAL flush each. 0004's reserve locked the dataset's
``ledgers`` row FOR UPDATE (it only reads it, but for the notion lock it may set) before
anything else: all reserves of a dataset queued there, then on its ``budgets`` rows, and
each wrote the row's lock (a WAL record, the page dirtied).

The order every step takes its locks in (``service.storage.pg_ledger``): the advisory locks
of the Idempotency-Key (class 1) and the replay fingerprint (class 2), the dataset's
``datasets`` row, the release's row, the dataset's advisory lock (class 3), its
``ledgers`` row, its ``budgets`` rows by measure, the key's ``allocations`` rows by
measure; a release's outbox entry after its release row, a replay after the ``budgets``
rows. (0004 took the ``ledgers`` row before the release's row: no step that locks a
``ledgers`` row or the class-3 lock ever locks a release's row, so reserve may take the
release's row first.)

``ledger_reserve``:

- the checks that decide without the dataset's rows come first, under the locks they need
  alone: the re-sent create and the priced release (the release's row, FOR UPDATE), the
  Idempotency-Key and the replay (their advisory locks): a retry or a replay answers
  without the dataset's locks;
- the dataset's advisory lock (class 3, ``hashtext(dataset_id)``) SHARED, then the
  ``ledgers`` row read without a row lock: reserves never wait for each other there, and
  write nothing for it (an advisory lock lives in the lock manager's memory, no WAL). Every
  step that changes what reserve decides on takes that lock ALONE first
  (``PgLedger._lock_ledger`` / ``_ensure_ledger``: ``retire``, ``set_version_retired``,
  ``version_change``'s ``retired``, ``change_caps`` and ``migrate_policy``, which write the
  caps' rules reserve reads; ``recharge_interval`` too): it waits until every reserve
  holding the lock shared has committed, and a reserve that comes later waits for its
  COMMIT and then reads the row (its next statement, a new snapshot at READ COMMITTED)
  as that step left it. So no reserve passes on a dataset or a version after its
  retirement committed, nor on rules a cap change replaced. PostgreSQL queues a shared
  request behind a waiting exclusive one, so a stream of reserves never starves a
  retirement (row-level FOR KEY SHARE / FOR SHARE lockers do not queue: a ``ledgers`` row
  shared that way could be held by overlapping reserves for as long as they come). Making
  a version current again takes no lock: a reserve refused meanwhile ran before it.
- the notion lock: a reserve that may set it (it asks a notion and the row has none)
  locks the ``ledgers`` row FOR NO KEY UPDATE and reads it again: of two reserves asking
  different notions of a dataset with none, the second waits for the first's COMMIT and
  reads the notion it set (refused: ``notion_locked``; their ``budgets`` rows may differ:
  a dp and a noiseless release ask different measures). The notion lock is never
  cleared, so a reserve that read one decides on a value that cannot change, and sets
  nothing (0004 ran an UPDATE that found no row).
- two creates of one release id (a create re-sent, or two attempts of one call) no
  longer meet on the ``ledgers`` row: the later one waits on the earlier one's
  ``budgets`` rows or on the ``releases`` primary key, then fails on ``releases_pkey``,
  rolled back with nothing changed, and ``PgLedger._tx`` runs it again
  (``_retryable``): that attempt finds the release (``reserved``) or its first attempt's
  answer.
- then the caps, as before: the ``budgets`` rows of the measures asked, then the actor's
  ``allocations`` rows, FOR UPDATE by measure, decided on the locked values (two reserves
  never both take the last units): a dataset's reserves and settles take turns there, by
  design.

``ledger_settle``: the release's row (its UPDATE) first, as before; then its outbox
entry (only steps that hold the release's row, or ``enqueued`` holding nothing else,
touch it), before the ``budgets`` rows, so that the dataset's rows are held for less; a
release holding units of one measure updates its one ``budgets`` row (and
``allocations`` row) by key, which locks it (0004 locked the rows in a statement of
their own before the UPDATE: needed only to lock several in measure order). The event
is still inserted after the units move: a dataset's budget events take their ids in the
order their transactions hold its rows.

**No needless write**: 0004 had every step record its answer in ``step_calls`` (a row and
an index entry on the key every step's call id appends to: the same right-most index
page for every client) so that an attempt run again after its reply was lost answers
once. ``ledger_start``, ``ledger_touch`` and ``ledger_settle`` need no such row, their
own release row tells a re-run what an earlier attempt of the same call did:

- ``ledger_start``: the token is made once per call; if it holds the release's lease, an
  earlier attempt took it, and the release's ``attempt`` is that attempt's answer (an
  attempt that overlaps the first waits on the row's lock, then finds it the same way);
- ``ledger_settle``: the release it ends records the call's id (``settled_by``, as in
  0004): ``settled``, charged and recorded once;
- ``ledger_touch`` (renew the lease, mark the data read) run again does it again, the
  same lease held by the same token;

an attempt that changed nothing (``lost``, ``ended``, ``running``, 0, false) committed
nothing, so a re-run decides again on the rows as they are, as if it were the first.
``PgLedger`` calls these three without ``step_remember`` / ``step_recall``; reserve,
refuse and the outbox's ``enqueued`` keep them.

Revision ID: 0007_ledger_locks
Revises: 0006_counts
Create Date: 2026-12-02
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0007_ledger_locks"
down_revision: str | None = "0006_counts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = r"""
CREATE OR REPLACE FUNCTION ledger_reserve(
    p_release text, p_dataset text, p_actor text, p_mode text, p_request text,
    p_fingerprint text, p_replay_key text, p_replay boolean, p_idempotency_key text,
    p_idempotency_ttl integer, p_notion text, p_measures text[], p_units bigint[],
    p_version bigint, p_at timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_retired          boolean;
    v_retired_versions bigint[];
    v_lock             text;
    v_may_lock         boolean := false;
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

    -- the dataset's lock, shared with the other reserves (retire, versions, caps and
    -- policy take it alone), then its flags as the last such step left them
    PERFORM pg_advisory_xact_lock_shared(3, hashtext(p_dataset));
    SELECT retired, retired_versions, notion_lock
        INTO v_retired, v_retired_versions, v_lock
        FROM ledgers WHERE dataset_id = p_dataset;
    IF FOUND AND p_notion <> '' AND v_lock IS NULL THEN
        -- this reserve may set the notion lock: one such reserve at a time
        v_may_lock := true;
        SELECT retired, retired_versions, notion_lock
            INTO v_retired, v_retired_versions, v_lock
            FROM ledgers WHERE dataset_id = p_dataset FOR NO KEY UPDATE;
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
        IF v_may_lock AND v_lock IS NULL THEN  -- the row is ours (FOR NO KEY UPDATE)
            UPDATE ledgers SET notion_lock = p_notion WHERE dataset_id = p_dataset;
            v_detail := v_detail || jsonb_build_object('notion_lock', p_notion);
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

CREATE OR REPLACE FUNCTION ledger_start(p_release text, p_worker text, p_token text,
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
        -- the token is this call's: if it holds the lease, an earlier attempt of this
        -- call took it (its reply lost), and that attempt's number is the answer
        SELECT attempt INTO v_attempt FROM releases
            WHERE id = p_release AND lease_token = p_token AND status = 'running';
        RETURN to_jsonb(COALESCE(v_attempt, 0));
    END IF;
    DELETE FROM outbox WHERE release_id = p_release;
    RETURN to_jsonb(v_attempt);
END $$;

CREATE OR REPLACE FUNCTION ledger_settle(p_dataset text, p_release text, p_action text,
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
    v_only      text;
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
            SELECT status, settled_by INTO r FROM releases WHERE id = p_release;
            IF FOUND AND r.settled_by = p_call THEN
                RETURN '"settled"';  -- an earlier attempt of this call settled it
            END IF;
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
    -- the release's own rows while only its row is held, before the dataset's
    DELETE FROM outbox WHERE release_id = p_release;
    -- the rows of the measures it holds units of, locked by measure, then moved; one
    -- measure: its one row, by key (the UPDATE locks it)
    IF v_held <> '{}' THEN
        SELECT min(key) INTO v_only FROM jsonb_each_text(v_held) WHERE value::bigint <> 0
            HAVING count(*) = 1;
        IF v_only IS NOT NULL THEN
            UPDATE budgets SET reserved = reserved - (v_held ->> v_only)::bigint,
                committed = committed
                            + CASE WHEN v_charge THEN (v_held ->> v_only)::bigint ELSE 0 END
                WHERE dataset_id = p_dataset AND measure = v_only;
        ELSE
            PERFORM 1 FROM budgets WHERE dataset_id = p_dataset
                AND (v_held ->> measure)::bigint <> 0 ORDER BY measure FOR UPDATE;
            UPDATE budgets SET reserved = reserved - (v_held ->> measure)::bigint,
                committed = committed
                            + CASE WHEN v_charge THEN (v_held ->> measure)::bigint ELSE 0 END
                WHERE dataset_id = p_dataset AND (v_held ->> measure)::bigint <> 0;
        END IF;
    END IF;
    IF v_alloc <> '{}' THEN
        v_only := NULL;
        SELECT min(key) INTO v_only FROM jsonb_each_text(v_alloc) WHERE value::bigint <> 0
            HAVING count(*) = 1;
        IF v_only IS NOT NULL THEN
            UPDATE allocations SET reserved = reserved - (v_alloc ->> v_only)::bigint,
                committed = committed
                            + CASE WHEN v_charge THEN (v_alloc ->> v_only)::bigint ELSE 0 END
                WHERE dataset_id = p_dataset AND key_id = v_owner AND measure = v_only;
        ELSE
            PERFORM 1 FROM allocations WHERE dataset_id = p_dataset AND key_id = v_owner
                AND (v_alloc ->> measure)::bigint <> 0 ORDER BY measure FOR UPDATE;
            UPDATE allocations SET reserved = reserved - (v_alloc ->> measure)::bigint,
                committed = committed
                            + CASE WHEN v_charge THEN (v_alloc ->> measure)::bigint ELSE 0 END
                WHERE dataset_id = p_dataset AND key_id = v_owner
                  AND (v_alloc ->> measure)::bigint <> 0;
        END IF;
    END IF;
    IF NOT v_charge AND v_replay IS NOT NULL THEN
        -- a refunded request may be asked again; a charged one stays its answer (after
        -- the budgets rows: reserve writes a replay while it holds them)
        DELETE FROM replays WHERE fingerprint = v_replay AND release_id = p_release;
    END IF;
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


def _as_0004_made_them() -> str:
    """The functions as 0004_steps defined them (CREATE OR REPLACE): the downgrade."""
    text = (Path(__file__).with_name("0004_steps.py")).read_text()
    bodies = [re.search(rf"CREATE FUNCTION {name}\(.*?\nEND \$\$;", text, re.S)
              for name in ("ledger_reserve", "ledger_start", "ledger_settle")]
    assert all(bodies), "0004_steps no longer defines the functions 0007 replaced"
    return "\n".join(b.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
                     for b in bodies if b)


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(_as_0004_made_them())
