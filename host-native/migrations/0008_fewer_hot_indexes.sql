-- miniflow schema version 8: a claim and an ack keep fewer indexes up to date.
--
-- Every index whose columns or condition a claim or an ack changes costs them a b-tree write or a
-- test per row. Two of them served only rare reads:
--
-- `outbox_due` (unfinished rows by due time) answered idle polls asking whether anything is due;
-- `outbox_claim` answers them as well, one priority at a time. A claim moved every row in both.
DROP INDEX outbox_due;

-- `outbox_leased` held every lease, for the count of a kind's leases against its concurrency limit;
-- only kinds with a limit need counting. A claim marks the lease of such a kind, and only marked
-- leases are indexed, so that the leases of the other kinds cost nothing here.
DROP INDEX outbox_leased;
-- 1 when the command's kind had a concurrency limit when its current or last lease was taken (or got
-- one while it was leased): that lease counts against the limit.
ALTER TABLE outbox ADD COLUMN lease_counted INTEGER NOT NULL DEFAULT 0 CHECK (lease_counted IN (0, 1));
CREATE INDEX outbox_counted_leases ON outbox (kind, available_at)
    WHERE status = 'leased' AND lease_counted = 1;
UPDATE outbox SET lease_counted = 1
WHERE status = 'leased' AND kind IN (SELECT kind FROM kind_controls WHERE concurrency_limit IS NOT NULL);
