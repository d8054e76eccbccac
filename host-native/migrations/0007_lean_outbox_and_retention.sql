-- miniflow schema version 7: a lean outbox, and workflows retired by retention.
--
-- The outbox becomes a rowid table: a claim reaches each candidate through the claim's index by its
-- integer key and writes its lease by that key; the command ID stays unique. The status check is
-- spelt with comparisons: SQLite evaluates `status IN (five values)` by building a temporary table
-- on every update of a row, which cost a claim or an ack more than all its index writes.
-- Rebuilt like version 4 did, with every column of version 6, inside the migration's transaction.
-- (A file written before this version is also rebuilt once by `VACUUM` when it is opened, so that
-- it gives freed pages back: see `give_back_space_from_now_on`.)

CREATE TABLE outbox_v7 (
    id               INTEGER PRIMARY KEY,
    workflow_id      TEXT    NOT NULL,
    event_seq        INTEGER NOT NULL,
    idx              INTEGER NOT NULL CHECK (idx >= 0),
    command_id       TEXT    GENERATED ALWAYS AS (workflow_id || ':' || event_seq || ':' || idx) VIRTUAL,
    kind             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    status           TEXT    NOT NULL
                     CHECK (status = 'pending' OR status = 'leased' OR status = 'done'
                            OR status = 'dead' OR status = 'cancelled'),
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    -- When the row may next be claimed: its due time, or for a leased row its lease expiry.
    available_at     INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    -- The fencing token of the current or last lease; only ever grows.
    lease_token      INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    processed_at     INTEGER,
    manual_retries   INTEGER NOT NULL DEFAULT 0,
    resolution       TEXT,
    -- 1 when its decision asked for its result (a `command_completed` event on completion).
    report_result    INTEGER NOT NULL DEFAULT 0 CHECK (report_result IN (0, 1)),
    -- Canonical JSON of what the handler completed it with, if anything.
    result           TEXT,
    -- 1 when its workflow cancelled it while it was leased.
    cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    -- Claims take a higher priority first (version 5).
    priority         INTEGER NOT NULL DEFAULT 0,
    -- The W3C trace context of the commit that created it (version 6).
    traceparent      TEXT,
    tracestate       TEXT,
    CHECK ((status = 'pending' OR status = 'leased') = (processed_at IS NULL)),
    UNIQUE (workflow_id, event_seq, idx),
    FOREIGN KEY (workflow_id, event_seq) REFERENCES events (workflow_id, seq)
);

INSERT INTO outbox_v7 (workflow_id, event_seq, idx, kind, payload, status, attempts, last_error,
                       available_at, lease_owner, lease_expires_at, lease_token, created_at,
                       processed_at, manual_retries, resolution, report_result, result,
                       cancel_requested, priority, traceparent, tracestate)
SELECT workflow_id, event_seq, idx, kind, payload, status, attempts, last_error, available_at,
       lease_owner, lease_expires_at, lease_token, created_at, processed_at, manual_retries,
       resolution, report_result, result, cancel_requested, priority, traceparent, tracestate
FROM outbox ORDER BY workflow_id, event_seq, idx;

DROP TABLE outbox;
ALTER TABLE outbox_v7 RENAME TO outbox;

-- The indexes of versions 1–6 on the rebuilt table, each for a query that must not walk done rows.
-- `pending`, strict per-workflow order and cancellations read only unfinished rows.
CREATE INDEX outbox_unfinished ON outbox (workflow_id, event_seq, idx) WHERE processed_at IS NULL;
-- Dead letters wait for a person; bulk actions and stats take them by kind.
CREATE INDEX outbox_dead ON outbox (workflow_id, event_seq, idx) WHERE status = 'dead';
CREATE INDEX outbox_dead_by_kind ON outbox (kind, workflow_id, event_seq, idx) WHERE status = 'dead';
-- Claims in claim order (and stats of unfinished rows, from the index alone).
CREATE INDEX outbox_claim
    ON outbox (priority DESC, available_at, workflow_id, event_seq, idx, kind, status, processed_at)
    WHERE processed_at IS NULL;
-- Claims by due time, and idle polls asking whether anything is claimable.
CREATE INDEX outbox_due ON outbox (available_at, workflow_id, event_seq, idx, kind, processed_at)
    WHERE processed_at IS NULL;
-- The leases of a kind, counted against its concurrency limit.
CREATE INDEX outbox_leased ON outbox (kind, available_at) WHERE status = 'leased';
-- `purge_done` takes old done and cancelled rows in purge order without walking the live ones.
CREATE INDEX outbox_done ON outbox (processed_at, workflow_id, event_seq, idx)
    WHERE status = 'done' OR status = 'cancelled';

-- Workflows whose history retention deleted (`SqliteStore::purge_finished`, the rule in the core's
-- `retention` module): a retired workflow takes no new event, since a new history would start again
-- at seq 1 and repeat its old command IDs.
CREATE TABLE retired_workflows (
    workflow_id TEXT    NOT NULL PRIMARY KEY,
    -- The seq of its last event.
    last_seq    INTEGER NOT NULL,
    retired_at  INTEGER NOT NULL
) WITHOUT ROWID;
