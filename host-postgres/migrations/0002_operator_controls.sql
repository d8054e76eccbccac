-- miniflow on PostgreSQL, schema version 2: operator controls, as the SQLite store's schema version 5.
-- Commands carry a priority; operators pause a kind or limit how many of its commands are leased at
-- once; the indexes serve claims in the new claim order and stats, none of them walking done rows.

-- Claims take a higher priority first (`OutboxRow::claim_order`). Existing commands get 0 (a
-- constant default: no table rewrite).
ALTER TABLE outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;

-- Claims in claim order: one priority at a time, then the longest due, then by command ID.
CREATE INDEX outbox_claim ON outbox (priority DESC, available_at, workflow_id, event_seq, idx)
    WHERE processed_at IS NULL;

-- The leases of a kind, counted against its concurrency limit (`OutboxRow::holds_lease`).
CREATE INDEX outbox_leased ON outbox (kind, available_at) WHERE status = 'leased';

-- Dead commands of a kind, for bulk retries and resolutions and for stats.
CREATE INDEX outbox_dead_by_kind ON outbox (kind, workflow_id, event_seq, idx) WHERE status = 'dead';

-- The operators' controls of each kind (`KindControl`), with who made the last change and when. A
-- claim that takes a limited kind locks its row (`FOR UPDATE SKIP LOCKED`), so the claims of several
-- processes count its leases one at a time.
CREATE TABLE kind_controls (
    kind              TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    paused            BOOLEAN NOT NULL DEFAULT FALSE,
    -- At most this many commands of the kind hold an unexpired lease at once; NULL for no limit.
    concurrency_limit INTEGER CHECK (concurrency_limit >= 1),
    changed_by        TEXT    NOT NULL,
    changed_at        BIGINT  NOT NULL
);
