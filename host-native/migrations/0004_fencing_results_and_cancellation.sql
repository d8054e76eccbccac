-- miniflow schema version 4: fenced receiver reservations, timers their workflow refused, results
-- fed back into workflows and cancelled commands.

-- The token of the current (or last) reservation of a key; it only grows, also across abandoned
-- reservations, so a stale holder's token never becomes current again.
ALTER TABLE idempotency ADD COLUMN token INTEGER NOT NULL DEFAULT 0;
-- 1 when the holder released the key without an effect; the next `begin` is fresh.
ALTER TABLE idempotency ADD COLUMN abandoned INTEGER NOT NULL DEFAULT 0 CHECK (abandoned IN (0, 1));

-- A timer whose event its workflow refused ends `rejected`, with the reason. SQLite cannot change a
-- CHECK constraint in place, so the table is rebuilt (inside the migration's transaction).
CREATE TABLE timers_v4 (
    timer_id      TEXT    NOT NULL PRIMARY KEY,
    workflow_id   TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    event_kind    TEXT    NOT NULL,
    event_payload TEXT    NOT NULL,
    fire_at       INTEGER NOT NULL,
    -- When a firer may next take it: fire_at, or the end of a firer's lease.
    available_at  INTEGER NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('scheduled', 'fired', 'cancelled', 'rejected')),
    created_at    INTEGER NOT NULL,
    processed_at  INTEGER,
    -- Why the workflow refused it (rejected timers only).
    last_error    TEXT,
    CHECK ((status = 'scheduled') = (processed_at IS NULL)),
    CHECK ((status = 'rejected') = (last_error IS NOT NULL))
) WITHOUT ROWID;

INSERT INTO timers_v4 (timer_id, workflow_id, name, event_kind, event_payload, fire_at, available_at,
                       status, created_at, processed_at)
SELECT timer_id, workflow_id, name, event_kind, event_payload, fire_at, available_at,
       status, created_at, processed_at
FROM timers;

DROP TABLE timers;
ALTER TABLE timers_v4 RENAME TO timers;

-- The indexes of version 3, on the rebuilt table.
CREATE INDEX timers_due ON timers (available_at, timer_id) WHERE processed_at IS NULL;
CREATE INDEX timers_scheduled_by_name ON timers (workflow_id, name) WHERE processed_at IS NULL;
CREATE INDEX timers_by_workflow ON timers (workflow_id, timer_id);

-- Results back into the workflow and cancelled commands: the outbox gains the `cancelled` status and
-- three columns. Rebuilt like the timers (same columns, same order, then the new ones).
CREATE TABLE outbox_v4 (
    workflow_id      TEXT    NOT NULL,
    event_seq        INTEGER NOT NULL,
    idx              INTEGER NOT NULL CHECK (idx >= 0),
    command_id       TEXT    GENERATED ALWAYS AS (workflow_id || ':' || event_seq || ':' || idx) VIRTUAL,
    kind             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    status           TEXT    NOT NULL
                     CHECK (status IN ('pending', 'leased', 'done', 'dead', 'cancelled')),
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
    CHECK ((status IN ('pending', 'leased')) = (processed_at IS NULL)),
    PRIMARY KEY (workflow_id, event_seq, idx),
    FOREIGN KEY (workflow_id, event_seq) REFERENCES events (workflow_id, seq)
) WITHOUT ROWID;

INSERT INTO outbox_v4 (workflow_id, event_seq, idx, kind, payload, status, attempts, last_error,
                       available_at, lease_owner, lease_expires_at, lease_token, created_at,
                       processed_at, manual_retries, resolution)
SELECT workflow_id, event_seq, idx, kind, payload, status, attempts, last_error, available_at,
       lease_owner, lease_expires_at, lease_token, created_at, processed_at, manual_retries, resolution
FROM outbox;

DROP TABLE outbox;
ALTER TABLE outbox_v4 RENAME TO outbox;

-- The indexes of versions 1 and 2, on the rebuilt table; retention now also removes cancelled rows.
CREATE INDEX outbox_unfinished ON outbox (workflow_id, event_seq, idx) WHERE processed_at IS NULL;
CREATE INDEX outbox_due ON outbox (available_at, workflow_id, event_seq, idx)
    WHERE processed_at IS NULL;
CREATE INDEX outbox_dead ON outbox (workflow_id, event_seq, idx) WHERE status = 'dead';
CREATE INDEX outbox_done ON outbox (processed_at) WHERE status IN ('done', 'cancelled');
