-- Parked streams (error mode ParkStream): a consumer that gave up on an
-- event after MaxAttempts parks the event's stream instead of stopping.
-- The failing event and every later event of that stream the consumer
-- reads go to the park, in log order, without reaching the handler; the
-- cursor moves on, and other streams go on.
--
-- projector_parks has one row per park of a stream by a consumer shard.
-- It is open ('parked') until a retry applies the whole sequence
-- ('resolved') or an operator discards it ('discarded'); neither deletes
-- the row, which stays the record of what was done, by whom and to how
-- many events. At most one open park per stream and shard.
CREATE TABLE {{schema}}.projector_parks (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    instance_id     text        NOT NULL,
    tenant_id       text        NOT NULL,
    stream_type     text        NOT NULL,
    stream_id       text        NOT NULL,
    status          text        NOT NULL DEFAULT 'parked' CHECK (status IN ('parked', 'resolved', 'discarded')),
    -- The event that failed and parked the stream, and its error; error is
    -- replaced by that of a failed retry.
    event_id        uuid        NOT NULL,
    event_type      text        NOT NULL,
    version         bigint      NOT NULL,
    error           text        NOT NULL,
    attempts        integer     NOT NULL,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    last_retried_at timestamptz,
    -- Set while a retry request waits for a dispatcher that has the
    -- projection's code (`projector parked retry` without --here).
    retry_requested_at timestamptz,
    resolved_at     timestamptz,
    -- Who resolved or discarded it, and how many events the sequence held
    -- then.
    resolved_by     text,
    events          integer
);

CREATE UNIQUE INDEX projector_parks_open ON {{schema}}.projector_parks (consumer, instance_id, tenant_id, stream_type, stream_id)
    WHERE status = 'parked';
CREATE INDEX projector_parks_consumer ON {{schema}}.projector_parks (consumer, instance_id, id);

-- The parked sequence of an open park, by stream version (which is log
-- order within a stream: promise 4), so no transaction id is stored and a
-- restored-cluster repair has nothing here to remap. Rows are deleted when
-- the park is resolved or discarded; while they exist, `events prune` keeps
-- their events (the cursor passed them, the park did not).
CREATE TABLE {{schema}}.projector_parked_events (
    park_id  bigint NOT NULL REFERENCES {{schema}}.projector_parks (id) ON DELETE CASCADE,
    version  bigint NOT NULL,
    event_id uuid   NOT NULL,
    PRIMARY KEY (park_id, version)
);

CREATE INDEX projector_parked_events_event ON {{schema}}.projector_parked_events (event_id);
