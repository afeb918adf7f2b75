-- Parked saga instances (a saga under ParkStream): a step that failed
-- MaxAttempts times parks its instance, keyed by its correlation key, not
-- the stream of the event: an instance hears from several streams. The park
-- is a row of projector_parks of kind 'saga-instance' (stream_type '',
-- stream_id the key), so `parked list|show|retry|discard`, the metrics and
-- the console cover it; its parked events are numbered 1, 2, … in log order
-- in projector_parked_events.version, as they come from several streams.
-- The instance is marked 'parked': it keeps its state and its pending
-- timeouts, which the runner leaves alone until a retry makes it active.
--
-- Adding a column with a constant default rewrites nothing; the checks
-- read projector_parks and projector_saga_instances once, never the log.

ALTER TABLE {{schema}}.projector_parks
    ADD COLUMN kind text NOT NULL DEFAULT 'stream' CHECK (kind IN ('stream', 'saga-instance'));

ALTER TABLE {{schema}}.projector_saga_instances
    DROP CONSTRAINT projector_saga_instances_status_check,
    ADD CONSTRAINT projector_saga_instances_status_check CHECK (status IN ('active', 'completed', 'failed', 'parked'));
