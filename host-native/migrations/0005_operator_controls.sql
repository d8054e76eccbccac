-- miniflow schema version 5: operator controls. Commands carry a priority; operators pause a kind or
-- limit how many of its commands are leased at once; the indexes serve claims in the new claim order
-- and stats, none of them walking done rows.

-- Claims take a higher priority first (`OutboxRow::claim_order`). Existing commands get 0.
ALTER TABLE outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;

-- Claims in claim order: one priority at a time, then the longest due, then by command ID. Kind and
-- status come along so that a claim leaves paused and full kinds out, and stats count, from the index
-- alone; `processed_at` (always NULL here) too, so that SQLite sees the index covers a query that
-- names it.
CREATE INDEX outbox_claim
    ON outbox (priority DESC, available_at, workflow_id, event_seq, idx, kind, status, processed_at)
    WHERE processed_at IS NULL;

-- Idle polls ask whether anything is claimable; with the kind in the index they leave paused and
-- full kinds out without reading the rows.
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (available_at, workflow_id, event_seq, idx, kind, processed_at)
    WHERE processed_at IS NULL;

-- The leases of a kind, counted against its concurrency limit (`OutboxRow::holds_lease`).
CREATE INDEX outbox_leased ON outbox (kind, available_at) WHERE status = 'leased';

-- Dead commands of a kind, for bulk retries and resolutions and for stats.
CREATE INDEX outbox_dead_by_kind ON outbox (kind, workflow_id, event_seq, idx) WHERE status = 'dead';

-- The operators' controls of each kind (`KindControl`), with who made the last change and when.
CREATE TABLE kind_controls (
    kind              TEXT    NOT NULL PRIMARY KEY,
    -- 1 while claims skip the kind.
    paused            INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    -- At most this many commands of the kind hold an unexpired lease at once; NULL for no limit.
    concurrency_limit INTEGER CHECK (concurrency_limit >= 1),
    changed_by        TEXT    NOT NULL,
    changed_at        INTEGER NOT NULL
) WITHOUT ROWID;
