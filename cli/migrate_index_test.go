package cli

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// `migrate partition-index` creates the index partitioned consumers need,
// which no migration creates: a newcomer found only the SQL in an error
// message, and no command to run it. Run again, it changes nothing.
func TestMigratePartitionIndex(t *testing.T) {
	t.Parallel()
	store := pgtest.Store(t, projector.NewRegistry())
	if err := store.CheckPartitionIndex(context.Background()); !errors.Is(err, postgres.ErrNoPartitionIndex) {
		t.Fatalf("a fresh schema's partition index: %v, want ErrNoPartitionIndex", err)
	}
	out, code := runIn(t, store.Schema(), projector.NewRegistry(), "migrate", "partition-index")
	if code != 0 || !strings.Contains(out, "is ready") {
		t.Fatalf("migrate partition-index: exit %d\n%s", code, out)
	}
	if err := store.CheckPartitionIndex(context.Background()); err != nil {
		t.Fatalf("after migrate partition-index: %v", err)
	}
	out, code = runIn(t, store.Schema(), projector.NewRegistry(), "migrate", "partition-index")
	if code != 0 || !strings.Contains(out, "exists") {
		t.Fatalf("migrate partition-index again: exit %d\n%s", code, out)
	}
}
