-- Saga (process manager) instances, their steps and their timeouts.
--
-- One instance per (saga, tenant, correlation key): the unique constraint is
-- what makes two start events for one key give one instance (the second
-- insert does nothing and the handler finds the first). Each step the
-- instance takes, from an event or a fired timeout, is a row in
-- projector_saga_steps, unique per cause, so a step applied twice would be a
-- constraint violation rather than a silent duplicate.

CREATE TABLE {{schema}}.projector_saga_instances (
    id             uuid        PRIMARY KEY,
    saga           text        NOT NULL,
    tenant_id      text        NOT NULL,
    key            text        NOT NULL CHECK (key <> ''),
    -- The correlation id every event the instance appends carries.
    correlation_id uuid        NOT NULL,
    status         text        NOT NULL DEFAULT 'active'
                   CHECK (status IN ('active', 'completed', 'failed')),
    state          jsonb       NOT NULL,
    -- Steps taken so far; the step number of the latest one.
    version        bigint      NOT NULL DEFAULT 0,
    -- Events that reached the instance after it completed or failed.
    late_events    bigint      NOT NULL DEFAULT 0,
    last_error     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    completed_at   timestamptz,
    UNIQUE (saga, tenant_id, key)
) WITH (fillfactor = 80);

-- Every step updates its instance's row. No index covers a column a step
-- changes (state, version, updated_at) — status and completed_at change once,
-- at completion — and the fillfactor leaves room on the page, so the
-- updates are HOT: no index is touched.

-- saga list NAME --status.
CREATE INDEX projector_saga_instances_status ON {{schema}}.projector_saga_instances (saga, status);

-- Pruning of completed instances.
CREATE INDEX projector_saga_instances_completed ON {{schema}}.projector_saga_instances (completed_at)
    WHERE status = 'completed';

CREATE TABLE {{schema}}.projector_saga_steps (
    instance_id uuid        NOT NULL REFERENCES {{schema}}.projector_saga_instances (id) ON DELETE CASCADE,
    step        bigint      NOT NULL,
    -- The handled event's id, or the fired timeout's id.
    cause_id    uuid        NOT NULL,
    cause       text        NOT NULL CHECK (cause IN ('event', 'timeout')),
    -- The event type, or the timeout's name.
    type        text        NOT NULL,
    appended    integer     NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, step),
    UNIQUE (instance_id, cause_id)
);

-- Pending timeouts: one per (instance, name), replaced by scheduling the
-- name again, deleted when cancelled or fired (in the firing step's
-- transaction, so a timeout fires once).
CREATE TABLE {{schema}}.projector_saga_timeouts (
    id           uuid        PRIMARY KEY,
    instance_id  uuid        NOT NULL REFERENCES {{schema}}.projector_saga_instances (id) ON DELETE CASCADE,
    saga         text        NOT NULL,
    name         text        NOT NULL,
    due_at       timestamptz NOT NULL,
    -- A failing timeout is retried at retry_at, with backoff.
    retry_at     timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    -- The event (or timeout) whose step scheduled it.
    scheduled_by uuid        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (instance_id, name)
);

-- The runner's claim: the earliest due timeouts of one saga, never a scan.
CREATE INDEX projector_saga_timeouts_due ON {{schema}}.projector_saga_timeouts (saga, due_at);
