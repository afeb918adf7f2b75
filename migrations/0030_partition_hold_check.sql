-- A merge's hold no longer waits for the halves' running batches
-- (docs/scaling.md, "How a merge runs"). `consumer merge` used to take both
-- halves' shard locks, behind the consumer's layout gate, so that no pass
-- read its state before the hold and moved its cursor after it: every
-- partition then waited, up to a batch, for the longest batch running.
-- With this check the database itself refuses a cursor past its hold, in
-- every statement that writes one: a pass that read its state before the
-- hold committed, and whose batch went past it, fails at its cursor update
-- and rolls back whole (its handlers' writes with it); the dispatcher runs
-- it again at once, cut at the hold. A hold the check refuses (a pass
-- moved the cursor past it meanwhile) rolls back to be taken the old way,
-- under the locks.
--
-- NOT VALID: the check applies to every row written from now on, without
-- reading the table under its lock first. The consumers table is small,
-- but a row written before this release that broke the rule (none should)
-- would otherwise fail the migration instead of its next write.
--
-- Adding the constraint needs the table's exclusive lock for a moment, and
-- a request for it queues every pass behind it while it waits for the
-- transactions already reading the table (a rebuild's long shadow batch).
-- So it waits at most 5 s, as migration 29 does: behind a longer one it
-- fails with a lock timeout (SQLSTATE 55P03), nothing applied, and is run
-- again once that transaction has ended.
SET LOCAL lock_timeout = '5s';
ALTER TABLE {{schema}}.projector_consumers DROP CONSTRAINT IF EXISTS projector_consumers_cursor_within_hold;
ALTER TABLE {{schema}}.projector_consumers ADD CONSTRAINT projector_consumers_cursor_within_hold
    CHECK (hold_tx_id IS NULL OR (cursor_tx_id, cursor_seq) <= (hold_tx_id, hold_seq)) NOT VALID;
SET LOCAL lock_timeout TO DEFAULT;
