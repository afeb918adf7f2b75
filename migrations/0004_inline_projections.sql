-- The inline projections the processes writing to this schema run, so a
-- process that lacks one cannot silently append events it covers.
--
-- A store records its inline projections when it starts (postgres.New) and
-- again when it re-reads the table and finds one missing. It refuses to
-- append an event type a recorded projection covers unless it runs that
-- projection at the recorded version (or a newer one). The newest version
-- wins: a store starting with an older version never lowers it, which is the
-- fence a rolling deploy needs. At one version the covered types only grow
-- (a union), so two definitions sharing a version are caught rather than
-- flip-flopped. An operator removes a projection that is gone for good with
-- postgres.RetireInlineProjection; nothing else deletes rows.
--
-- Stores read the whole table at start and then in the background (every
-- second by default), never inside an append, so it stays off the hot path.

CREATE TABLE {{schema}}.projector_inline_projections (
    name        text        PRIMARY KEY,
    version     integer     NOT NULL CHECK (version > 0),
    event_types text[]      NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
