-- Live merging of partitions (docs/scaling.md, "Splitting and merging").
--
-- Two sibling partitions merge into their parent only when their cursors
-- are equal: the parent's cursor must mean that every event of both was
-- applied up to it, and none after. `projector consumer merge` sets the
-- same hold on both, the cursor of the one ahead; a partition's pass never
-- moves its cursor past its hold, so the one ahead waits there while the
-- other catches up to it, and the merge swaps the two rows for the parent's
-- once both stand at the hold. NULL: no merge under way. The consumers
-- table is small (a row per shard): adding nullable columns rewrites nothing.
ALTER TABLE {{schema}}.projector_consumers
    ADD COLUMN IF NOT EXISTS hold_tx_id xid8,
    ADD COLUMN IF NOT EXISTS hold_seq   bigint;

-- On a partitioned consumer's fence row (its unpartitioned row): the
-- partition count its code last declared (AsyncConfig.Partitions). A
-- dispatcher declaring the same count runs whatever layout operators made
-- live; one declaring another count is a change of code, refused unless the
-- partitions already have that count (ErrPartitionsChanged names the
-- command to run). NULL elsewhere.
ALTER TABLE {{schema}}.projector_consumers ADD COLUMN IF NOT EXISTS partitions integer;
