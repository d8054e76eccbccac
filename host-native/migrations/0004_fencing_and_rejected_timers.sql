-- miniflow schema version 4: fenced receiver reservations, and timers their workflow refused.

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
