-- A split carried out by the partition's own pass (docs/scaling.md,
-- "Splitting and merging live"). `consumer split` marks the partitions to
-- split, when it asked for the split, instead of waiting for their
-- running batches; the pass of each, at the end of its batch, under its
-- own lock and in its own transaction, replaces its row by its two halves'
-- rows, which start at its cursor. NULL: no split asked for.
ALTER TABLE {{schema}}.projector_consumers ADD COLUMN IF NOT EXISTS split_requested_at timestamptz;
