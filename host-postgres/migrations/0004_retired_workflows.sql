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

-- How many workflows retention has retired: each retention transaction that retires some adds them
-- here. A first commit to a workflow in a REPEATABLE READ or SERIALIZABLE transaction reads this row
-- `FOR SHARE`, which fails with a serialization error when a retention committed after the
-- transaction's snapshot: such a snapshot cannot see the retirement, and would start the retired
-- ID again.
CREATE TABLE retirements (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    retired BIGINT  NOT NULL
);
INSERT INTO retirements (id, retired) VALUES (1, 0);
