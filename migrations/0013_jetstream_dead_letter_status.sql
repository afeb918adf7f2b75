-- Dead letters of the claims-based JetStream consumer keep their record, as
-- the dispatcher's do since 0010: a dead letter is open until an operator
-- retries it successfully (resolved) or discards it (discarded). Neither
-- deletes the row: it stays as the record of what failed and what was done
-- about it. last_retried_at is when a retry last ran, failed or not.
-- Rows of earlier releases were all still open (retry and discard deleted
-- theirs), so the default is right for them.

ALTER TABLE {{schema}}.projector_jetstream_dead_letters
    ADD COLUMN status          text        NOT NULL DEFAULT 'open'
        CHECK (status IN ('open', 'resolved', 'discarded')),
    ADD COLUMN resolved_at     timestamptz,
    ADD COLUMN last_retried_at timestamptz;

-- What `relay dead-letters list` shows by default, and what needs an
-- operator: a subscription's open ones, in id order, without walking past
-- every resolved and discarded one. The index of 0009 on (subscription, id)
-- still serves the listing of all or of another status.
CREATE INDEX projector_jetstream_dead_letters_open ON {{schema}}.projector_jetstream_dead_letters (subscription, id)
    WHERE status = 'open';
