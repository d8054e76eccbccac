-- The receiver's idempotency records: part of the outbox's first migration, and the whole of the
-- receiver's track (a supplier's database holding keys and nothing else). Written to run on a
-- database that already has the table from the other track, changing nothing there.
CREATE TABLE IF NOT EXISTS idempotency (
    key          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    -- SHA-256 of the canonical JSON of the first request's business intent, in hex.
    digest       TEXT    NOT NULL,
    reserved_at  BIGINT  NOT NULL,
    -- Canonical JSON of the stored result; NULL while the key is only reserved.
    result       TEXT,
    completed_at BIGINT,
    -- When retention starts counting: completed_at once finished, reserved_at before.
    settled_at   BIGINT  NOT NULL,
    -- The token of the current (or last) reservation; it only grows.
    token        BIGINT  NOT NULL DEFAULT 0,
    -- The holder released the key without an effect; the next `begin` is fresh.
    abandoned    BOOLEAN NOT NULL DEFAULT FALSE,
    CHECK ((result IS NULL) = (completed_at IS NULL)),
    CHECK (settled_at = COALESCE(completed_at, reserved_at))
);

-- `purge` deletes the oldest records in bounded batches.
CREATE INDEX IF NOT EXISTS idempotency_settled ON idempotency (settled_at);
