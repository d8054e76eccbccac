-- miniflow schema version 3: the W3C trace context of the commit that created each command, handed
-- to its deliveries so one trace runs from the producer through the outbox to the receiver.

-- `traceparent` and `tracestate` header values, as the commit was given them (NULL: not traced). A
-- value that no longer parses is ignored when read, never fatal.
ALTER TABLE outbox ADD COLUMN traceparent TEXT;
ALTER TABLE outbox ADD COLUMN tracestate TEXT;
