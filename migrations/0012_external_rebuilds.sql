-- Rebuilds of projections whose model lives outside PostgreSQL (a
-- Meilisearch search index), blue/green like any other.
--
-- A projection version records the kind of external target it writes
-- (e.g. 'meilisearch'), so that an ops binary without the projection's
-- code can request its rebuild although it declares no tables; the
-- dispatchers of that version build the new index beside the live one.
ALTER TABLE {{schema}}.projector_projections ADD COLUMN external text;

-- The switch of such a rebuild spans two systems: PostgreSQL commits the
-- cursor and version move with the rebuild 'swapping'; the external swap
-- follows, and any dispatcher of the version finishes it ('switched'). The
-- live shard stands aside while its rebuild is 'swapping', and no second
-- rebuild of the projection may start meanwhile.
ALTER TABLE {{schema}}.projector_rebuilds DROP CONSTRAINT projector_rebuilds_status_check;
ALTER TABLE {{schema}}.projector_rebuilds ADD CONSTRAINT projector_rebuilds_status_check
    CHECK (status IN ('building', 'ready', 'swapping', 'switched', 'done', 'cancelled'));

DROP INDEX {{schema}}.projector_rebuilds_active;
CREATE UNIQUE INDEX projector_rebuilds_active ON {{schema}}.projector_rebuilds (name)
    WHERE status IN ('building', 'ready', 'swapping');
