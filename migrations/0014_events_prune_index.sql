-- Retention's filter: `events prune` looks for events of some stream types
-- recorded before a cutoff. Without an index on those columns each prune
-- (its choice of rows, the count of what the guard held back, the check for
-- stale shards it is about to pass) read the whole events table, aggregate
-- history included, and part of that while it held the consumers table in
-- SHARE mode, which every dispatcher's cursor write waits for: the stall grew
-- with the log. With it, a prune reads only its candidates. It costs every
-- append one more index entry; docs/performance.md has the figures.
--
-- On a large existing log this builds the index under the migration's
-- lock, blocking appends until it is done; to avoid that, create it first
-- with CREATE INDEX CONCURRENTLY under this name, and the migration skips it:
--
--   CREATE INDEX CONCURRENTLY projector_events_prune
--       ON <schema>.projector_events (stream_type, recorded_at);

CREATE INDEX IF NOT EXISTS projector_events_prune ON {{schema}}.projector_events (stream_type, recorded_at);
