-- Dead-letter recovery: a dead letter is open until an operator retries it
-- successfully (resolved) or discards it (discarded). Neither deletes the
-- row: it stays as the record of what failed and what was done about it.
-- A retry request left for a dispatcher that has the projection's code is
-- retry_requested_at; the dispatcher clears it when it has tried.

ALTER TABLE {{schema}}.projector_dead_letters
    ADD COLUMN status             text        NOT NULL DEFAULT 'open'
        CHECK (status IN ('open', 'resolved', 'discarded')),
    ADD COLUMN resolved_at        timestamptz,
    ADD COLUMN last_retried_at    timestamptz,
    ADD COLUMN retry_requested_at timestamptz;

-- What a dispatcher polls for: few rows, so a partial index.
CREATE INDEX projector_dead_letters_retry ON {{schema}}.projector_dead_letters (consumer, id)
    WHERE retry_requested_at IS NOT NULL AND status = 'open';
