-- Partitioned consumers (docs/scaling.md, "Partitioned consumers").
--
-- A stream belongs to one partition by a hash of (tenant, stream type,
-- stream id): the first four bytes, big-endian, of the SHA-256 of the three
-- names in UTF-8 joined by the unit separator (0x1f). stores/postgres
-- StreamHash computes the same in Go; a test holds the two together. The
-- hash is part of the stored format: it never changes across releases.
--
-- A partition is a hash segment: partition p of N (N a power of two, at
-- most 64) holds the streams whose hash's top log2(N) bits equal p, so a
-- segment splits into two children and two siblings merge back. A partition
-- reads the log through an index on the top six bits (the bucket, 0..63),
-- its buckets in log order, merged, and never walks another partition's
-- rows. That index is not created here: it costs every append, so only a
-- schema with partitioned consumers carries it, created without blocking
-- appends by stores/postgres Store.CreatePartitionIndex or by an operator:
--
--   CREATE INDEX CONCURRENTLY projector_events_partition ON <schema>.projector_events
--       (<schema>.projector_stream_bucket(tenant_id, stream_type, stream_id), tx_id, seq);
--
-- convert_to is only STABLE (a conversion could in principle change); to
-- UTF8 from a UTF8 database it is the identity, and to UTF8 from any other
-- it is fixed by Unicode, so the function is declared IMMUTABLE, which an
-- index expression needs.
CREATE OR REPLACE FUNCTION {{schema}}.projector_stream_hash(tenant_id text, stream_type text, stream_id text)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT ('x' || pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(pg_catalog.convert_to(
    tenant_id || E'\x1f' || stream_type || E'\x1f' || stream_id, 'UTF8')), 1, 4), 'hex'))::bit(32)::bigint $$;

CREATE OR REPLACE FUNCTION {{schema}}.projector_stream_bucket(tenant_id text, stream_type text, stream_id text)
RETURNS smallint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT ({{schema}}.projector_stream_hash(tenant_id, stream_type, stream_id) >> 26)::smallint $$;

-- The instance that works a partition, as the partitions' balancing agreed
-- (projection/balance.go). It steers which process tries a partition; the
-- exclusion itself stays the pass's advisory lock. NULL: nobody yet, or
-- released for another process to take. Not indexed, so its updates stay HOT.
ALTER TABLE {{schema}}.projector_consumers ADD COLUMN IF NOT EXISTS owner text;
