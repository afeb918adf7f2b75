-- Consumer state and dead letters for the async dispatcher.
--
-- One row per consumer shard: (name, instance_id), with instance_id
-- '__shared__' for shared consumers. The dispatcher locks its row with
-- FOR UPDATE SKIP LOCKED for the length of a batch and updates it on every
-- batch, so only the primary key is indexed (every update is HOT) and the
-- fillfactor leaves room on each page for the new row versions.

CREATE TABLE {{schema}}.projector_consumers (
    name            text        NOT NULL,
    instance_id     text        NOT NULL,
    cursor_tx_id    xid8        NOT NULL DEFAULT '0',
    cursor_seq      bigint      NOT NULL DEFAULT 0,
    status          text        NOT NULL DEFAULT 'idle'
                    CHECK (status IN ('idle', 'processing', 'dead', 'disabled')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    last_error_at   timestamptz,
    failed_tx_id    xid8,
    failed_seq      bigint,
    failed_event_id uuid,
    next_retry_at   timestamptz,
    processed       bigint      NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, instance_id)
) WITH (fillfactor = 50);

-- Events a consumer gave up on: skipped by an operator, or skipped by a
-- consumer in continuous mode. Never pruned.
CREATE TABLE {{schema}}.projector_dead_letters (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer     text        NOT NULL,
    instance_id  text        NOT NULL,
    event_id     uuid        NOT NULL,
    event_tx_id  xid8        NOT NULL,
    event_seq    bigint      NOT NULL,
    event_type   text        NOT NULL,
    tenant_id    text        NOT NULL,
    stream_type  text        NOT NULL,
    stream_id    text        NOT NULL,
    version      bigint      NOT NULL,
    error        text        NOT NULL,
    attempts     integer     NOT NULL,
    reason       text        NOT NULL CHECK (reason IN ('apply-error', 'skipped')),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX projector_dead_letters_consumer ON {{schema}}.projector_dead_letters (consumer, instance_id, id);
