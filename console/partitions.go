package console

import (
	"cmp"
	"slices"

	"github.com/projectorhq/projector/projection"
)

// groupPartitions orders shards so that a partitioned consumer's row (its
// fence shard) comes first and its partitions follow it in the order of
// their segments (projection.PartitionOrder; the store lists them by
// instance id, where 10/16 sorts before 2/16), and turns the fence into
// the consumer's row: state "partitioned" rather
// than the fence's stored "disabled" (which would count as a disabled
// shard), with the partitions' totals of lag, rate and processed events,
// how many partitions it has and how many are hot, and its slowest
// partition's cursor (the fence's own is no position of the model).
func groupPartitions(shards []Shard) []Shard {
	rank := func(s Shard) int {
		switch {
		case s.Fence():
			return 0
		case s.Partitions > 0:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(shards, func(a, b Shard) int {
		if c := cmp.Compare(a.Consumer, b.Consumer); c != 0 {
			return c
		}
		if c := cmp.Compare(rank(a), rank(b)); c != 0 {
			return c
		}
		return projection.PartitionOrder(a.Instance, b.Instance) // by segment, whatever their sizes
	})
	fence := -1
	for i := range shards {
		s := &shards[i]
		switch {
		case s.Fence():
			fence = i
			s.State, s.LagEvents, s.LagSeconds, s.Processed, s.Rate = StatePartitioned, 0, 0, 0, 0
			s.LastError = "" // the fence's note, for binaries that do not know partitions
		case s.Partitions > 0 && fence >= 0 && shards[fence].Consumer == s.Consumer:
			f := &shards[fence]
			if f.PartitionCount == 0 || s.Cursor.Less(f.Cursor) {
				f.Cursor = s.Cursor // the consumer has applied every event up to its slowest partition's cursor
			}
			f.PartitionCount++
			f.LagEvents += s.LagEvents
			f.LagSeconds = max(f.LagSeconds, s.LagSeconds)
			f.Processed += s.Processed
			if s.Rate < 0 || f.Rate < 0 {
				f.Rate = -1 // unknown until every partition's is known
			} else {
				f.Rate += s.Rate
			}
			if s.Hot() {
				f.HotPartitions++
			}
		}
	}
	return shards
}
