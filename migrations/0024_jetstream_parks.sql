-- Parked streams of the claims-based JetStream consumer (ConsumerConfig
-- .ErrorMode = jetstream.ParkStream): a handler that failed MaxDeliver times
-- parks the event's source stream for the subscription. The failing message
-- and every later message of that stream the consumer receives are stored
-- here, in version order, claimed and acknowledged, without reaching the
-- handler; other streams go on.
--
-- These are tables of their own, not projector_parks /
-- projector_parked_events (migration 0018): a dispatcher's park holds event
-- ids and reads the events back from the log in the same database, while
-- the claims consumer's database usually holds no log (the events come
-- from NATS), so its park must keep each message (subject, headers, body).
-- And projector_parks is read by `projector parked`, `events prune`,
-- archiving and the rebuild hand-over as parks over the log: rows there
-- that no dispatcher can retry, and whose events the log need not keep,
-- would mislead all of them.
--
-- A park is open ('parked') until a retry applies the whole sequence
-- ('resolved') or an operator discards it ('discarded'); neither deletes
-- the row, which stays the record of who did it, when, and to how many
-- messages. At most one open park per subscription and stream.
CREATE TABLE {{schema}}.projector_jetstream_parks (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription    text        NOT NULL,
    tenant_id       text        NOT NULL,
    stream_type     text        NOT NULL,
    stream_id       text        NOT NULL,
    status          text        NOT NULL DEFAULT 'parked' CHECK (status IN ('parked', 'resolved', 'discarded')),
    -- The event that failed and parked the stream; error is replaced by
    -- that of a failed retry.
    event_id        uuid        NOT NULL,
    event_type      text        NOT NULL,
    version         bigint      NOT NULL,
    error           text        NOT NULL,
    -- Handler failures: MaxDeliver when parked, one more per failed retry.
    failures        integer     NOT NULL,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    last_retried_at timestamptz,
    resolved_at     timestamptz,
    resolved_by     text,
    -- How many messages the sequence held when it was resolved or
    -- discarded.
    events          integer
);

CREATE UNIQUE INDEX projector_jetstream_parks_open ON {{schema}}.projector_jetstream_parks (subscription, tenant_id, stream_type, stream_id)
    WHERE status = 'parked';
CREATE INDEX projector_jetstream_parks_subscription ON {{schema}}.projector_jetstream_parks (subscription, id);

-- The parked sequence of an open park, by stream version; deleted when the
-- park is resolved or discarded (the park row keeps the count).
CREATE TABLE {{schema}}.projector_jetstream_parked_messages (
    park_id   bigint      NOT NULL REFERENCES {{schema}}.projector_jetstream_parks (id) ON DELETE CASCADE,
    version   bigint      NOT NULL,
    event_id  uuid        NOT NULL,
    subject   text        NOT NULL,
    headers   jsonb       NOT NULL,
    data      bytea       NOT NULL,
    parked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (park_id, version)
);
