-- The claims consumer's gaps and handler failures, made exact.
--
-- held_version names the LOWEST version held behind a missing one and
-- held_max the highest, so a gap reads: first missing version
-- last_version + 1, held versions held_version..held_max. (Before, held_version
-- was whichever version was held last, which could send an operator's
-- SkipTo past held events.) Rows held before this migration get a one-version
-- range; the next hold of their stream widens it.

ALTER TABLE {{schema}}.projector_jetstream_streams
    ADD COLUMN held_max bigint;

UPDATE {{schema}}.projector_jetstream_streams SET held_max = held_version WHERE held_version IS NOT NULL;

-- Handler failures per event, which ConsumerConfig.MaxDeliver counts: a
-- hold behind a predecessor, or a redelivery after a lost acknowledgement, is
-- not a failure of the handler. A row lives from an event's first failure
-- until the event is applied or dead-lettered (both delete it in their
-- transaction); PurgeClaims also deletes rows older than the claims retention.
CREATE TABLE {{schema}}.projector_jetstream_failures (
    subscription text        NOT NULL,
    event_id     uuid        NOT NULL,
    failures     bigint      NOT NULL CHECK (failures > 0),
    last_error   text        NOT NULL,
    failed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription, event_id)
);
