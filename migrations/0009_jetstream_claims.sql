-- The claims-based JetStream consumer (stores/jetstream): exactly-once
-- effects in the consumer's database, per-stream order, dead letters.
--
-- A claim is written in the same transaction as the handler's effects, so a
-- redelivery of a message whose effects committed finds its claim and is
-- acknowledged without running the handler again; a crash before the commit
-- leaves no claim and the redelivery runs it. JetStream deduplicates
-- publishes only, so consumers need this table.

CREATE TABLE {{schema}}.projector_jetstream_claims (
    subscription text        NOT NULL,
    event_id     uuid        NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription, event_id)
);

-- Purging claims older than the retention window.
CREATE INDEX projector_jetstream_claims_claimed_at ON {{schema}}.projector_jetstream_claims (claimed_at);

-- The last version handled per source stream and subscription: an event
-- whose predecessor is not handled yet is held back (negative
-- acknowledgement with a delay) instead of applied out of order. held_*
-- record the event being held, so a real gap (a predecessor that will never
-- come) is visible and an operator can skip it.
CREATE TABLE {{schema}}.projector_jetstream_streams (
    subscription  text        NOT NULL,
    tenant_id     text        NOT NULL,
    stream_type   text        NOT NULL,
    stream_id     text        NOT NULL,
    last_version  bigint      NOT NULL CHECK (last_version >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    held_version  bigint,
    held_since    timestamptz,
    PRIMARY KEY (subscription, tenant_id, stream_type, stream_id)
);

-- Messages whose handler failed MaxDeliver times, or that could not be
-- decoded: written with the error and acknowledged, never retried forever
-- or dropped silently.
CREATE TABLE {{schema}}.projector_jetstream_dead_letters (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription  text        NOT NULL,
    event_id      uuid,
    subject       text        NOT NULL,
    headers       jsonb       NOT NULL,
    data          bytea       NOT NULL,
    error         text        NOT NULL,
    deliveries    bigint      NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX projector_jetstream_dead_letters_subscription ON {{schema}}.projector_jetstream_dead_letters (subscription, id);
