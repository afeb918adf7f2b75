-- Rebuilds: replaying a projection from the log, in place or blue/green.
--
-- A consumer shard's row gains the version of the read model it maintains
-- (a dispatcher runs a shard only with the same projection version, which is
-- what fences old binaries off a switched model during a rolling deploy), the
-- position up to which it is replaying (handlers see Replaying(ctx) for
-- events at or before it, and skip side effects), and, for the shadow shard
-- of a blue/green rebuild, the schema its handlers write into.

ALTER TABLE {{schema}}.projector_consumers
    ADD COLUMN version            integer NOT NULL DEFAULT 1 CHECK (version > 0),
    ADD COLUMN replay_until_tx_id xid8,
    ADD COLUMN replay_until_seq   bigint,
    ADD COLUMN shadow_schema      text;

-- What each projection version declares, recorded by every dispatcher that
-- starts with it, so an ops binary without the projection's code can request
-- a rebuild: the read-model tables it owns (schema-qualified, as resolved in
-- the dispatcher's session) and the event types it reads.
CREATE TABLE {{schema}}.projector_projections (
    name        text        NOT NULL,
    version     integer     NOT NULL CHECK (version > 0),
    tables      text[]      NOT NULL,
    event_types text[]      NOT NULL,
    delivery    text        NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

-- One row per rebuild, kept after it ends as its record. At most one active
-- rebuild per projection.
CREATE TABLE {{schema}}.projector_rebuilds (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text        NOT NULL,
    version       integer     NOT NULL CHECK (version > 0),
    mode          text        NOT NULL CHECK (mode IN ('in-place', 'blue-green')),
    status        text        NOT NULL CHECK (status IN ('building', 'ready', 'switched', 'done', 'cancelled')),
    hold          boolean     NOT NULL DEFAULT false,
    -- Set once a dispatcher of the version ran the projection's
    -- PrepareShadow on the shadow tables (or had none to run).
    prepared      boolean     NOT NULL DEFAULT false,
    tables        text[]      NOT NULL,
    shadow_schema text,
    old_schema    text,
    -- The log's last event when the rebuild started: progress is measured
    -- up to it.
    target_tx_id  xid8        NOT NULL DEFAULT '0',
    target_seq    bigint      NOT NULL DEFAULT 0,
    total_events  bigint      NOT NULL DEFAULT 0,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    switch_ms     double precision,
    note          text
);

CREATE UNIQUE INDEX projector_rebuilds_active ON {{schema}}.projector_rebuilds (name)
    WHERE status IN ('building', 'ready');

-- Event types whose events retention has deleted: a rebuild of a projection
-- that reads them cannot be exact and is refused.
CREATE TABLE {{schema}}.projector_pruned (
    event_type  text        PRIMARY KEY,
    deleted     bigint      NOT NULL,
    last_at     timestamptz NOT NULL DEFAULT now()
);
