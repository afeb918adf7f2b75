-- Archived streams: a small hot log.
--
-- `projector streams archive` moves the events of closed streams out of
-- projector_events into projector_events_archive, a table of the same
-- columns, so the hot table and its five indexes hold only what is still
-- being written and read. The archive keeps each event's log position
-- (tx_id, seq): `streams unarchive` puts the rows back where they were. An
-- archive table rather than partitioning projector_events: partitioning
-- would need a partition key in every unique constraint (the primary key,
-- the stream version and the event id), a rewrite of the log to convert,
-- and leaves the append path to route rows; see docs/scaling.md.
--
-- The stream head records the archiving: an append to a stream whose head
-- has archived_at set is refused (ErrStreamArchived) by the head write, the
-- same statement that checks the expected version.

CREATE TABLE {{schema}}.projector_events_archive (
    tx_id          xid8        NOT NULL,
    seq            bigint      NOT NULL,
    id             uuid        NOT NULL,
    tenant_id      text        NOT NULL,
    stream_type    text        NOT NULL,
    stream_id      text        NOT NULL,
    version        bigint      NOT NULL,
    type           text        NOT NULL,
    schema_version integer     NOT NULL,
    data           jsonb       NOT NULL,
    correlation_id uuid        NOT NULL,
    causation_id   uuid,
    actor          text        NOT NULL,
    headers        jsonb,
    recorded_at    timestamptz NOT NULL,
    archived_at    timestamptz NOT NULL DEFAULT now(),
    -- Keyed by stream version, not by position: `repair` renumbers
    -- positions in place, and the archive is read by stream, never in log
    -- order (events go back to projector_events to be read that way).
    PRIMARY KEY (tenant_id, stream_type, stream_id, version)
);

-- A rebuild asks whether any event of the types it reads is archived.
CREATE INDEX projector_events_archive_type ON {{schema}}.projector_events_archive (type);

COMMENT ON TABLE {{schema}}.projector_events_archive IS
    'Projector archived events: the events of streams moved out of projector_events by `projector streams archive`. Same columns, same positions.';

-- A column without a default: adding it rewrites nothing, and the head
-- table keeps its size.
ALTER TABLE {{schema}}.projector_streams ADD COLUMN archived_at timestamptz;
