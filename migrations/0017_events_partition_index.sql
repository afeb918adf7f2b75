-- A partitioned consumer's read: each partition reads the buckets of its
-- hash segment in log order through this index and merges them, so a
-- partition's batch costs the events it returns, not the other partitions'
-- rows it would walk past (stores/postgres readLogPartitionSQL). It costs
-- every append one more index entry; docs/performance.md has the figures.
--
-- On a large existing log this builds the index under the migration's
-- lock, blocking appends until it is done; to avoid that, apply migration
-- 0016 (or create its two functions), create the index first with CREATE
-- INDEX CONCURRENTLY under this name, and the migration skips it:
--
--   CREATE INDEX CONCURRENTLY projector_events_partition ON <schema>.projector_events
--       (<schema>.projector_stream_bucket(tenant_id, stream_type, stream_id), tx_id, seq);

CREATE INDEX IF NOT EXISTS projector_events_partition ON {{schema}}.projector_events
    ({{schema}}.projector_stream_bucket(tenant_id, stream_type, stream_id), tx_id, seq);
