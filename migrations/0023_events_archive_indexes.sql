-- Two indexes on the archive (the events table is not touched; archive
-- and unarchive moves pay two more entries per event):
--
-- - (tx_id, seq): `events export --include-archived` reads the hot log and
--   the archive together, page by page in log order; without it each page
--   would sort the whole archive.
-- - (id): an import looks its events' ids up in the archive as in the hot
--   log (the events table's unique id index does not see the archive), so
--   an archived event is never imported again into the hot log, where
--   unarchiving its stream would collide.
--
-- On a large archive the build blocks archive and unarchive runs while it
-- lasts; to avoid even that, build them first with
--   CREATE INDEX CONCURRENTLY projector_events_archive_position
--     ON S.projector_events_archive (tx_id, seq);
--   CREATE INDEX CONCURRENTLY projector_events_archive_id
--     ON S.projector_events_archive (id);
-- and the migration then finds them.

CREATE INDEX IF NOT EXISTS projector_events_archive_position ON {{schema}}.projector_events_archive (tx_id, seq);
CREATE INDEX IF NOT EXISTS projector_events_archive_id ON {{schema}}.projector_events_archive (id);
