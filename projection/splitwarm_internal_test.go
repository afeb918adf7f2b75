package projection

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// A split handed to the partitions' passes readies a connection for each
// half while the parent runs its last batch (warmHalves): every half's
// first pass runs on it, its read already planned there, and no
// connection is left taken once the dispatcher stops (a connection kept
// for a half that never took it goes back to the pool).
func TestSplitHalvesStartOnReadiedConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	if err := store.CreatePartitionIndex(ctx); err != nil {
		t.Fatal(err)
	}
	p := NewAsync("w", AsyncConfig{Partitions: 2})
	if err := On(p, types.Commented, func(context.Context, pgx.Tx, projector.Event, testevents.TicketCommented) error { return nil }); err != nil {
		t.Fatal(err)
	}
	appendOne := func(id string, v int64) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", id), projector.ExactVersion(v), testevents.TicketCommented{Body: id})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 16 {
		appendOne(fmt.Sprint("s", i), 0)
	}
	pool := pgtest.NewPool(t, 8)
	own, err := postgres.New(ctx, pool, postgres.Config{Schema: store.Schema(), Registry: types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Store: own, Projections: []*Async{p}, Recheck: 20 * time.Millisecond, PollMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var warm []string
	d.warmTaken = func(id ShardID) {
		mu.Lock()
		warm = append(warm, id.Instance)
		mu.Unlock()
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewAdmin(store).Split(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		appendOne(fmt.Sprint("s", i), 1)
	}
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := slices.Sorted(slices.Values(warm))
	mu.Unlock()
	want := []string{PartitionPrefix + "0/4", PartitionPrefix + "1/4", PartitionPrefix + "2/4", PartitionPrefix + "3/4"}
	if !slices.Equal(got, want) {
		t.Errorf("halves whose first pass ran on a readied connection: %v, want each of %v once", got, want)
	}
	stop, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.Stop(stop); err != nil {
		t.Fatal(err)
	}
	// Some connection still counts as taken for up to tens of
	// milliseconds after Stop returns (seen with warmHalves turned off
	// too): wait for the count to reach zero, which a connection kept for
	// a half and never put back would keep it from.
	deadline := time.Now().Add(10 * time.Second)
	for pool.Stat().AcquiredConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still taken 10 s after the dispatcher stopped", pool.Stat().AcquiredConns())
		}
		time.Sleep(5 * time.Millisecond) // polling a count, not synchronising
	}
}
