package projection_test

import (
	"slices"
	"testing"

	"github.com/projectorhq/projector/projection"
)

// Partitions of mixed sizes (a layout after a split) order by where their
// segment starts: the one order every wait for several partitions' locks
// takes them in.
func TestPartitionOrder(t *testing.T) {
	t.Parallel()
	ids := []string{projection.PartitionInstance(1, 2), projection.PartitionInstance(1, 4), projection.PartitionInstance(0, 4),
		projection.PartitionInstance(10, 16), projection.PartitionInstance(2, 16)}
	slices.SortFunc(ids, projection.PartitionOrder)
	want := []string{projection.PartitionInstance(0, 4), projection.PartitionInstance(2, 16), projection.PartitionInstance(1, 4),
		projection.PartitionInstance(1, 2), projection.PartitionInstance(10, 16)}
	if !slices.Equal(ids, want) {
		t.Errorf("ordered %v, want %v", ids, want)
	}
}
