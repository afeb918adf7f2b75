-- Data subjects' keys for personal fields (crypto-shredding; docs/privacy.md).
--
-- One row per data subject of a tenant. wrapped is the subject's 32-byte
-- AES-256 data key, encrypted (AES-256-GCM) under the master key named by
-- master_key_id, which lives outside the database (PROJECTOR_MASTER_KEY, or
-- a KMS). A row is created in the transaction of the first append that
-- seals a field of the subject; the primary key makes two such appends
-- racing for a new subject end with one key.
--
-- Forgetting the subject sets wrapped to NULL and forgotten_at to the
-- commit's time: the row stays as a tombstone, so a later append for the
-- same subject writes its personal fields as null instead of quietly
-- starting a new key, and a second forget is told the subject is already
-- forgotten. No other column holds key material.

CREATE TABLE {{schema}}.projector_subject_keys (
    tenant_id     text        NOT NULL,
    subject       text        NOT NULL,
    master_key_id text        NOT NULL,
    wrapped       bytea,
    created_at    timestamptz NOT NULL DEFAULT now(),
    forgotten_at  timestamptz,
    PRIMARY KEY (tenant_id, subject),
    CHECK ((wrapped IS NULL) = (forgotten_at IS NOT NULL))
);

COMMENT ON TABLE {{schema}}.projector_subject_keys IS
    'Projector data-subject keys, wrapped by the master key. Deleting a row makes its subject''s personal fields unreadable forever.';
