-- Dead letters and the models they were recorded against, and the open ones
-- found cheaply.
--
-- A rebuild replays the whole log into a new model: in place (the live
-- tables cleared) or blue/green (shadow tables that a switch makes live).
-- It replays a dead letter's event too, which the new model's handlers
-- apply or dead-letter anew, so a dead letter recorded against the model a
-- rebuild replaced must never be retried into the new one: its event would
-- be applied twice. model_rebuild_id says which model a dead letter belongs
-- to: the id of the rebuild that built it (the latest switched or in-place
-- rebuild of the consumer; for the shadow shard, its rebuild in progress),
-- 0 for a model never rebuilt. A trigger fills it, so every writer of dead
-- letters (dispatcher passes, `consumer skip`, sagas) records it the same
-- way, under the consumer shard's lock that rebuilds take too.

ALTER TABLE {{schema}}.projector_dead_letters ADD COLUMN model_rebuild_id bigint;

-- Rows of earlier releases: the model is guessed from the times (a rebuild
-- took effect at its switch, or when an in-place one was requested).
UPDATE {{schema}}.projector_dead_letters d SET model_rebuild_id = CASE
    WHEN d.instance_id = '__rebuild__' THEN coalesce((SELECT max(r.id) FROM {{schema}}.projector_rebuilds r
        WHERE r.name = d.consumer AND r.mode = 'blue-green' AND r.requested_at <= d.created_at), 0)
    ELSE coalesce((SELECT max(r.id) FROM {{schema}}.projector_rebuilds r
        WHERE r.name = d.consumer AND ((r.status = 'switched' AND r.finished_at <= d.created_at)
            OR (r.mode = 'in-place' AND r.requested_at <= d.created_at))), 0) END;

ALTER TABLE {{schema}}.projector_dead_letters ALTER COLUMN model_rebuild_id SET NOT NULL;

CREATE FUNCTION {{schema}}.projector_dead_letter_model() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.model_rebuild_id IS NULL THEN
        IF NEW.instance_id = '__rebuild__' THEN
            SELECT max(r.id) INTO NEW.model_rebuild_id FROM {{schema}}.projector_rebuilds r
            WHERE r.name = NEW.consumer AND r.mode = 'blue-green' AND r.status IN ('building', 'ready');
        ELSE
            SELECT max(r.id) INTO NEW.model_rebuild_id FROM {{schema}}.projector_rebuilds r
            WHERE r.name = NEW.consumer AND (r.status = 'switched' OR r.mode = 'in-place');
        END IF;
        NEW.model_rebuild_id := coalesce(NEW.model_rebuild_id, 0);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER projector_dead_letter_model BEFORE INSERT ON {{schema}}.projector_dead_letters
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.projector_dead_letter_model();

-- Open dead letters: counted per consumer for the projector_dead_letters_open
-- gauge, and looked up by event when `events prune` keeps their events.
CREATE INDEX projector_dead_letters_open ON {{schema}}.projector_dead_letters (consumer) WHERE status = 'open';
CREATE INDEX projector_dead_letters_open_event ON {{schema}}.projector_dead_letters (event_id) WHERE status = 'open';
