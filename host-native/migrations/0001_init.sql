-- miniflow schema version 1: events and the transactional outbox.
-- Times are milliseconds since the Unix epoch; payloads are canonical JSON text.

CREATE TABLE events (
    workflow_id TEXT    NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 1),
    kind        TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (workflow_id, seq)
) WITHOUT ROWID;

CREATE TABLE outbox (
    workflow_id      TEXT    NOT NULL,
    event_seq        INTEGER NOT NULL,
    idx              INTEGER NOT NULL CHECK (idx >= 0),
    command_id       TEXT    GENERATED ALWAYS AS (workflow_id || ':' || event_seq || ':' || idx) VIRTUAL,
    kind             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('pending', 'leased', 'done', 'dead')),
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
    -- Unfinished (pending or leased) rows are exactly those not yet processed. The partial indexes
    -- below test `processed_at IS NULL`, a column a claim does not touch, so claiming a row does not
    -- rewrite their entries.
    CHECK ((status IN ('pending', 'leased')) = (processed_at IS NULL)),
    PRIMARY KEY (workflow_id, event_seq, idx),
    FOREIGN KEY (workflow_id, event_seq) REFERENCES events (workflow_id, seq)
) WITHOUT ROWID;

-- `pending` and strict per-workflow order read only unfinished rows, however many done rows are kept.
CREATE INDEX outbox_unfinished ON outbox (workflow_id, event_seq, idx)
    WHERE processed_at IS NULL;

-- A claim takes the longest-due claimable rows.
CREATE INDEX outbox_due ON outbox (available_at, workflow_id, event_seq, idx)
    WHERE processed_at IS NULL;

-- Dead letters wait for a person.
CREATE INDEX outbox_dead ON outbox (workflow_id, event_seq, idx)
    WHERE status = 'dead';
