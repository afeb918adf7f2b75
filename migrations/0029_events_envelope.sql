-- An event's envelope beside its payload (docs/privacy.md, "Keys";
-- docs/performance.md, "Where the envelope lives").
--
-- A type declared with Personal.EnvelopeApart (and OneEnvelope) has its
-- personal fields sealed in one envelope whose bytes go here, while each
-- sealed field of the payload holds the placeholder "pjx2.". A read
-- carries the envelope as bytes, where inside the jsonb it was a base64
-- string the server writes out a character at a time; the client puts it
-- back in the payload (projector.AttachEnvelope) before anything opens,
-- exports or relays it, so no reader sees the difference. NULL for every
-- other event: plain ones, and sealed ones written with the envelope in
-- the payload, which stay as they are.
--
-- A nullable column without a default: adding it rewrites no row and
-- holds the tables' lock only for the catalog change. The archive gets it
-- too, at the same place in the column order, since the archive's moves
-- and the archived reads take the two tables' rows as one shape.
--
-- The catalog change still needs each table's exclusive lock, and a
-- request for it queues every later append and read behind it while it
-- waits for the transactions already in the table. So it waits at most
-- 5 s: behind a long transaction (an export, a rebuild's read) the
-- migration fails with a lock timeout (SQLSTATE 55P03), nothing applied
-- and the log never held up longer, and is run again once it has ended
-- (docs/operations.md, "Upgrading").
SET LOCAL lock_timeout = '5s';
ALTER TABLE {{schema}}.projector_events ADD COLUMN IF NOT EXISTS envelope bytea;
ALTER TABLE {{schema}}.projector_events_archive ADD COLUMN IF NOT EXISTS envelope bytea;
SET LOCAL lock_timeout TO DEFAULT;

COMMENT ON COLUMN {{schema}}.projector_events.envelope IS
    'Projector: the event envelope of a payload sealed with Personal.EnvelopeApart (its fields hold "pjx2."); NULL otherwise. Never edit.';
