-- Consumers read the archive (docs/operations.md, "Archiving closed
-- streams"): a rebuild's replay, a consumer registered after streams were
-- archived and one enabled again with its cursor below them read the hot
-- log and the archive merged in log order while their cursor is below the
-- archive's last event. A consumer of a few event types reads each type in
-- log order through (type, tx_id, seq), as it does in the hot log
-- (migration 8): without it each batch would walk the archive's every
-- event of other types from the cursor on. The index replaces the archive's
-- (type) index of migration 20, which it serves as well (its prefix).
--
-- On a large archive the build blocks archive and unarchive runs while it
-- lasts; to avoid even that, build it first with
--   CREATE INDEX CONCURRENTLY projector_events_archive_type_position
--     ON S.projector_events_archive (type, tx_id, seq);
-- and the migration then finds it.

CREATE INDEX IF NOT EXISTS projector_events_archive_type_position ON {{schema}}.projector_events_archive (type, tx_id, seq);
DROP INDEX IF EXISTS {{schema}}.projector_events_archive_type;
