-- miniflow on PostgreSQL, schema version 1: the columns of the SQLite store's schema version 4.
-- Times are milliseconds since the Unix epoch (BIGINT); payloads and results are canonical JSON text,
-- stored as written (TEXT, not JSONB, so they read back byte for byte). IDs compare as bytes
-- (COLLATE "C"), the order every miniflow store uses, whatever the database's locale.
-- Every table but the receiver's records is keyed by workflow ID first.

CREATE TABLE events (
    workflow_id TEXT COLLATE "C" NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 1),
    kind        TEXT   NOT NULL,
    payload     TEXT   NOT NULL,
    recorded_at BIGINT NOT NULL,
    PRIMARY KEY (workflow_id, seq)
);

CREATE TABLE outbox (
    workflow_id      TEXT COLLATE "C" NOT NULL,
    event_seq        BIGINT  NOT NULL CHECK (event_seq >= 1),
    idx              BIGINT  NOT NULL CHECK (idx >= 0),
    kind             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    status           TEXT    NOT NULL
                     CHECK (status IN ('pending', 'leased', 'done', 'dead', 'cancelled')),
    attempts         BIGINT  NOT NULL DEFAULT 0,
    last_error       TEXT,
    -- When the row may next be claimed: its due time, or for a leased row its lease expiry.
    available_at     BIGINT  NOT NULL,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    -- The fencing token of the current or last lease; only ever grows.
    lease_token      BIGINT  NOT NULL DEFAULT 0,
    created_at       BIGINT  NOT NULL,
    processed_at     BIGINT,
    manual_retries   BIGINT  NOT NULL DEFAULT 0,
    resolution       TEXT,
    -- Its decision asked for its result (a `command_completed` event on completion).
    report_result    BOOLEAN NOT NULL DEFAULT FALSE,
    -- Canonical JSON of what the handler completed it with, if anything.
    result           TEXT,
    -- Its workflow cancelled it while it was leased.
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    -- Unfinished (pending or leased) rows are exactly those not yet processed. The partial indexes
    -- test `processed_at IS NULL`, a column a claim does not touch.
    CHECK ((status IN ('pending', 'leased')) = (processed_at IS NULL)),
    PRIMARY KEY (workflow_id, event_seq, idx),
    FOREIGN KEY (workflow_id, event_seq) REFERENCES events (workflow_id, seq)
);

-- `pending` and strict per-workflow order read only unfinished rows, however many done rows are kept.
CREATE INDEX outbox_unfinished ON outbox (workflow_id, event_seq, idx) WHERE processed_at IS NULL;
-- A claim takes the longest-due claimable rows.
CREATE INDEX outbox_due ON outbox (available_at, workflow_id, event_seq, idx)
    WHERE processed_at IS NULL;
-- Dead letters wait for a person.
CREATE INDEX outbox_dead ON outbox (workflow_id, event_seq, idx) WHERE status = 'dead';
-- Retention finds old done and cancelled rows without walking the live ones.
CREATE INDEX outbox_done ON outbox (processed_at, workflow_id, event_seq, idx)
    WHERE status IN ('done', 'cancelled');

-- A timer holds the event it commits into its workflow when it fires.
CREATE TABLE timers (
    workflow_id   TEXT COLLATE "C" NOT NULL,
    timer_id      TEXT COLLATE "C" NOT NULL,
    name          TEXT   NOT NULL,
    event_kind    TEXT   NOT NULL,
    event_payload TEXT   NOT NULL,
    fire_at       BIGINT NOT NULL,
    -- When a firer may next take it: fire_at, or the end of a firer's take.
    available_at  BIGINT NOT NULL,
    status        TEXT   NOT NULL CHECK (status IN ('scheduled', 'fired', 'cancelled', 'rejected')),
    created_at    BIGINT NOT NULL,
    processed_at  BIGINT,
    -- Why the workflow refused it (rejected timers only).
    last_error    TEXT,
    CHECK ((status = 'scheduled') = (processed_at IS NULL)),
    CHECK ((status = 'rejected') = (last_error IS NOT NULL)),
    PRIMARY KEY (workflow_id, timer_id)
);

-- A timer is found by its ID alone (its workflow is part of the ID) when it fires or is rejected.
CREATE UNIQUE INDEX timers_by_id ON timers (timer_id);
-- Firers take the longest-due scheduled timers.
CREATE INDEX timers_due ON timers (available_at, timer_id) WHERE processed_at IS NULL;
-- Decisions cancel a workflow's scheduled timers by name.
CREATE INDEX timers_scheduled_by_name ON timers (workflow_id, name) WHERE processed_at IS NULL;

-- The receiver's idempotency records: `idempotency.sql`, shared with the receiver's own track.
