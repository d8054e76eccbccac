-- miniflow schema version 3: durable timers and failure feedback.
-- A timer holds the event it commits into its workflow when it fires.

CREATE TABLE timers (
    timer_id      TEXT    NOT NULL PRIMARY KEY,
    workflow_id   TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    event_kind    TEXT    NOT NULL,
    event_payload TEXT    NOT NULL,
    fire_at       INTEGER NOT NULL,
    -- When a firer may next take it: fire_at, or the end of a firer's lease.
    available_at  INTEGER NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('scheduled', 'fired', 'cancelled')),
    created_at    INTEGER NOT NULL,
    processed_at  INTEGER,
    CHECK ((status = 'scheduled') = (processed_at IS NULL))
) WITHOUT ROWID;

-- Firers take the longest-due scheduled timers.
CREATE INDEX timers_due ON timers (available_at, timer_id) WHERE processed_at IS NULL;

-- Decisions cancel a workflow's scheduled timers by name.
CREATE INDEX timers_scheduled_by_name ON timers (workflow_id, name) WHERE processed_at IS NULL;

-- Listing a workflow's timers.
CREATE INDEX timers_by_workflow ON timers (workflow_id, timer_id);
