-- The archive in log order: `events export --include-archived` reads the
-- hot log and the archive together, page by page in (tx_id, seq) order,
-- and without this index each page would sort the whole archive.
--
-- Only the archive is indexed (archive and unarchive moves pay one more
-- entry per event); the events table is not touched. On a large archive the
-- build blocks archive and unarchive runs while it lasts; to avoid even
-- that, build it first with
--   CREATE INDEX CONCURRENTLY projector_events_archive_position
--     ON S.projector_events_archive (tx_id, seq);
-- and the migration then finds it.

CREATE INDEX IF NOT EXISTS projector_events_archive_position ON {{schema}}.projector_events_archive (tx_id, seq);
