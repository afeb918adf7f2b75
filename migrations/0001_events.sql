-- The event log and the stream heads.
--
-- projector_events is the one table everything flows through. tx_id records the
-- writing transaction: readers only take rows whose transaction finished
-- (tx_id below the snapshot's xmin) and order them by (tx_id, seq), which is
-- what keeps a cursor from passing a row that commits later (promise 3).

CREATE TABLE {{schema}}.projector_events (
    tx_id          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    seq            bigint      GENERATED ALWAYS AS IDENTITY,
    id             uuid        NOT NULL,
    tenant_id      text        NOT NULL,
    stream_type    text        NOT NULL,
    stream_id      text        NOT NULL,
    version        bigint      NOT NULL CHECK (version > 0),
    type           text        NOT NULL,
    schema_version integer     NOT NULL CHECK (schema_version > 0),
    data           jsonb       NOT NULL,
    correlation_id uuid        NOT NULL,
    causation_id   uuid,
    actor          text        NOT NULL DEFAULT '',
    headers        jsonb,
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tx_id, seq),
    UNIQUE (tenant_id, stream_type, stream_id, version),
    UNIQUE (id)
);

COMMENT ON TABLE {{schema}}.projector_events IS
    'Projector event log. Read it in (tx_id, seq) order below pg_snapshot_xmin(pg_current_snapshot()); never by seq alone.';

-- One row per stream: its current version and the transaction that last
-- appended to it. An append from a transaction older than last_tx_id is
-- refused (promise 4), so version order and log order agree.
CREATE TABLE {{schema}}.projector_streams (
    tenant_id   text        NOT NULL,
    stream_type text        NOT NULL,
    stream_id   text        NOT NULL,
    version     bigint      NOT NULL CHECK (version > 0),
    last_tx_id  xid8        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, stream_type, stream_id)
) WITH (fillfactor = 80);
