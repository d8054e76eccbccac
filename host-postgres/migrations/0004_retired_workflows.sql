-- miniflow schema version 4: workflows retired by retention (`PostgresStore::purge_finished`, the
-- rule in the core's `retention` module), as in the SQLite store's schema version 7. A retired
-- workflow takes no new event: a new history would start again at seq 1 and repeat its old command
-- IDs, which receivers fold into the old effects.

CREATE TABLE retired_workflows (
    workflow_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    -- The seq of its last event.
    last_seq    BIGINT NOT NULL,
    retired_at  BIGINT NOT NULL
);
