-- Aggregate snapshots: an aggregate's folded state, stored every N events so
-- loads start near their target instead of at version 1.
--
-- A row is keyed by the stream, the aggregate's name (two aggregate types may
-- fold the same stream), the snapshot version (the shape of the state the
-- aggregate declares; rows of any other shape are ignored, never decoded) and
-- the stream version the state was folded up to. The key's order serves the
-- one lookup: the newest snapshot of one shape at or below a version.
-- event_recorded_at is the recorded_at of the event at that version, so a load
-- as of a point in time can pick a snapshot without reading the log.
--
-- A snapshot is written in the transaction of the append that produced its
-- state, so it commits with those events or not at all. Rows are only ever
-- inserted and deleted; nothing reads this table in the write path of an
-- append.

CREATE TABLE {{schema}}.projector_snapshots (
    tenant_id         text        NOT NULL,
    stream_type       text        NOT NULL,
    stream_id         text        NOT NULL,
    aggregate         text        NOT NULL,
    snapshot_version  integer     NOT NULL CHECK (snapshot_version > 0),
    version           bigint      NOT NULL CHECK (version > 0),
    state             jsonb       NOT NULL,
    event_recorded_at timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, stream_type, stream_id, aggregate, snapshot_version, version)
);

COMMENT ON TABLE {{schema}}.projector_snapshots IS
    'Projector aggregate snapshots. Disposable: deleting rows only makes loads fold more events.';
