-- miniflow schema version 2: the receiver's idempotency records, and retention of done outbox rows.

CREATE TABLE idempotency (
    key          TEXT    NOT NULL PRIMARY KEY,
    -- SHA-256 of the canonical JSON of the first request's business intent, in hex.
    digest       TEXT    NOT NULL,
    reserved_at  INTEGER NOT NULL,
    -- Canonical JSON of the stored result; NULL while the key is only reserved.
    result       TEXT,
    completed_at INTEGER,
    -- When retention starts counting: completed_at once finished, reserved_at before.
    settled_at   INTEGER NOT NULL,
    CHECK ((result IS NULL) = (completed_at IS NULL)),
    CHECK (settled_at = COALESCE(completed_at, reserved_at))
) WITHOUT ROWID;

-- `purge` deletes the oldest records in bounded batches.
CREATE INDEX idempotency_settled ON idempotency (settled_at);

-- `purge_done` finds old done rows without walking the live ones.
CREATE INDEX outbox_done ON outbox (processed_at) WHERE status = 'done';
