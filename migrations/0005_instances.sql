-- Dispatcher instances and their heartbeats.
--
-- One row per dispatcher instance id. A dispatcher writes its row when it
-- starts (in the transaction that registers its shards) and refreshes
-- last_seen_at every heartbeat_every while it runs. From this row:
--
--   * `status` tells a shard a live dispatcher holds (seen within three
--     heartbeats, not stopped) from one nobody runs;
--   * a per-instance shard whose instance has not been seen for expire_after
--     is stale: it no longer holds retention back. `events prune` removes
--     stale shards of a random instance id (no process can ever resume them)
--     and halts (marks dead, with the reason) a stale shard of a fixed id
--     whose unapplied events it deletes, so that instance does not resume
--     over a gap unknowingly when it returns.
--
-- consumers lists the consumers the instance runs, which is how a shared
-- shard (no instance of its own) knows whether any live dispatcher runs it.
-- The row is small and written every few seconds; nothing indexes it but the
-- key.

CREATE TABLE {{schema}}.projector_instances (
    instance_id     text        PRIMARY KEY,
    random_id       boolean     NOT NULL DEFAULT false,
    consumers       text[]      NOT NULL DEFAULT '{}',
    heartbeat_every interval    NOT NULL DEFAULT '10 seconds',
    expire_after    interval    NOT NULL DEFAULT '24 hours',
    started_at      timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now(),
    stopped_at      timestamptz
) WITH (fillfactor = 50);

-- Per-instance shards registered before heartbeats existed: their instance
-- was last seen when its shard last moved, and, not knowing better, its id
-- counts as fixed (its shards are halted rather than removed when pruned)
-- and as stopped (not live) until its dispatcher's first heartbeat.
INSERT INTO {{schema}}.projector_instances (instance_id, consumers, started_at, last_seen_at, stopped_at)
SELECT instance_id, array_agg(name ORDER BY name), min(created_at), max(updated_at), max(updated_at)
FROM {{schema}}.projector_consumers
WHERE instance_id <> '__shared__'
GROUP BY instance_id;
