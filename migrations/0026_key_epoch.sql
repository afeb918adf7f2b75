-- The key epoch: a counter that every statement destroying or replacing
-- data keys moves forward, in its own transaction (docs/privacy.md, "The
-- key cache").
--
-- A process keeps the data keys it unwrapped in a cache, each marked with
-- the epoch of the snapshot in which a read last saw its key row. Until
-- its process knows an epoch, a read brings each sealed event's key row
-- (one index probe per event) and the epoch of its snapshot. From then on
-- a read brings no key rows and no key join at all, only one more row
-- carrying its snapshot's epoch: a subject whose key was cached at that
-- very epoch (no key destroyed since) is opened with the cached key, and
-- the keys of the other subjects (cached at another epoch, or not at all)
-- are read in one more statement, once per subject, which confirms them at
-- its own epoch (stores/postgres/sql.go, personal.go; docs/privacy.md).
--
-- A forget sets wrapped to NULL (UPDATE OF wrapped); a row deleted or the
-- table truncated by hand destroys keys too; a rewrap replaces wrapped. The
-- triggers below move the epoch for each such statement, inside the
-- statement's transaction, so a snapshot that sees the destroyed key sees
-- the new epoch, and one that does not sees neither. Creating a key does not
-- move it. The function runs as the schema's owner, so whoever may destroy
-- a key moves the epoch; the roles that may read the keys may read the counter.
--
-- Each move takes a value of its own from a sequence, never epoch + 1: a
-- forget that rolls back moved the epoch in its transaction, where a read
-- may have trusted keys at that value; a later forget that commits must
-- not write the same value, or those keys would be trusted after it.

CREATE TABLE {{schema}}.projector_key_epoch (
    one   boolean PRIMARY KEY DEFAULT true CHECK (one),
    epoch bigint  NOT NULL
);

CREATE SEQUENCE {{schema}}.projector_key_epoch_seq;

INSERT INTO {{schema}}.projector_key_epoch (epoch) VALUES (nextval('{{schema}}.projector_key_epoch_seq'));

-- Whoever may read the data keys may read the epoch, and no one else: the
-- roles holding SELECT on the key table now (tenant roles granted by
-- GrantTenantRole, which grants the epoch itself from now on) get it here.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = '{{schema}}.projector_subject_keys'::regclass
          AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
    LOOP
        EXECUTE 'GRANT SELECT ON {{schema}}.projector_key_epoch TO ' || grantee;
    END LOOP;
END $$;

COMMENT ON TABLE {{schema}}.projector_key_epoch IS
    'Projector key epoch: moved forward by every statement that destroys or replaces data keys, so cached keys are trusted only in snapshots where it has not moved. Never edit.';

CREATE FUNCTION {{schema}}.projector_key_epoch_bump() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE {{schema}}.projector_key_epoch SET epoch = nextval('{{schema}}.projector_key_epoch_seq');
    RETURN NULL;
END $$;

CREATE TRIGGER projector_key_epoch_bump
    AFTER UPDATE OF wrapped OR DELETE ON {{schema}}.projector_subject_keys
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.projector_key_epoch_bump();

CREATE TRIGGER projector_key_epoch_truncate
    AFTER TRUNCATE ON {{schema}}.projector_subject_keys
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.projector_key_epoch_bump();
