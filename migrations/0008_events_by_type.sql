-- Filtered log reads: a consumer of a few event types reads each of its
-- types in log order through this index and merges them, instead of walking
-- the whole log and filtering (stores/postgres readLogTypesSQL). It costs
-- every append one more index entry; docs/performance.md has the figures.
--
-- On a large existing log this builds the index under the migration's
-- lock, blocking appends until it is done; to avoid that, create it first
-- with CREATE INDEX CONCURRENTLY under this name, and the migration skips it.

CREATE INDEX IF NOT EXISTS projector_events_type ON {{schema}}.projector_events (type, tx_id, seq);
