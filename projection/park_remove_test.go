package projection_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// A removed consumer's open parks are discarded with its shards, their
// pending retry requests cancelled, and recorded as such: the consumer
// registered again from its start applies the parked stream itself, once,
// in order, and the old park can be neither retried nor asked to be.
func TestRemoveConsumerDiscardsItsParks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, parked, failing := e.parkedPoison()
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	failing.Store(false)
	if err := projection.RequestParkRetry(e.ctx, e.store, parked.ID, "bob"); err != nil {
		t.Fatal(err)
	}
	r, err := projection.NewAdmin(e.store).RemoveAs(e.ctx, "parking", "", "alice")
	if err != nil || len(r.Shards) != 1 || r.ParksClosed != 1 || r.RetriesCancelled != 1 {
		t.Fatalf("remove: %+v, %v; want its shard, its park and the park's retry request", r, err)
	}
	pk, err := projection.ParkByID(e.ctx, e.store, parked.ID)
	if err != nil || pk.Status != projection.ParkDiscarded || pk.ResolvedBy != "alice"+projection.RemovedBy || pk.Events != 2 ||
		pk.RetryRequestedAt != nil || pk.ResolvedAt == nil {
		t.Fatalf("park after remove: %+v, %v; want it discarded by alice (consumer removed) with its 2 events", pk, err)
	}
	var held int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.table("projector_parked_events")).Scan(&held); err != nil || held != 0 {
		t.Fatalf("parked events left: %d, %v", held, err)
	}
	p := poisoned(e, "parking", parkCfg, failing)
	if _, err := projection.RetryPark(e.ctx, e.store, p, parked.ID, "bob", nil); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("retry of the removed consumer's park: %v; want it refused", err)
	}
	if err := projection.RequestParkRetry(e.ctx, e.store, parked.ID, "bob"); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("retry request of the removed consumer's park: %v; want it refused", err)
	}

	// Registered again, from the log's start, over a fresh model.
	e.exec(`DELETE FROM `+e.table("counts")+` WHERE consumer = $1`, "parking")
	e.catchUp(e.dispatcher(projection.Config{Projections: []*projection.Async{p}}))
	e.checkCounts("parking", map[string]int64{"p": 2})
	if open := e.openParks("parking"); len(open) != 0 {
		t.Fatalf("open parks after registering again: %+v", open)
	}
}

// A retry request committing while a removal waits on its park's row is
// cancelled, and counted, by the removal; a retry holding the shard's lock
// (a pass's, or `parked retry --here`'s) makes the removal refuse,
// changing nothing.
func TestRemoveConsumerRacingParkRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, parked, _ := e.parkedPoison()
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)

	// A retry, --here: the shard's lock and the park's row.
	here, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := projection.LockShard(e.ctx, here, e.store, projection.ShardID{Consumer: "parking"}); err != nil {
		t.Fatal(err)
	}
	if _, err := here.Exec(e.ctx, `SELECT 1 FROM `+e.table("projector_parks")+` WHERE id = $1 FOR UPDATE`, parked.ID); err != nil {
		t.Fatal(err)
	}
	_, err = admin.RemoveAs(e.ctx, "parking", "", "alice")
	var inUse *projection.InUseError
	if !errors.As(err, &inUse) {
		t.Fatalf("remove while a retry holds the shard: %v; want an InUseError", err)
	}
	_ = here.Rollback(e.ctx)
	if open := e.openParks("parking"); len(open) != 1 || open[0].RetryRequestedAt != nil {
		t.Fatalf("refused remove changed the park: %+v", open)
	}

	// A retry request, in the gap: its update of the park's row is not yet
	// committed when the removal reaches the row.
	req, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = req.Rollback(e.ctx) }()
	if _, err := req.Exec(e.ctx, `UPDATE `+e.table("projector_parks")+` SET retry_requested_at = now(), resolved_by = 'bob' WHERE id = $1`, parked.ID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   projection.Removal
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := admin.RemoveAs(e.ctx, "parking", "", "alice")
		done <- result{r, err}
	}()
	eventually(t, 30*time.Second, "the removal to wait for the park's row", func() bool {
		var waiting bool
		_ = e.store.Pool().QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted
			AND database IS NULL AND pid <> pg_backend_pid())`).Scan(&waiting)
		return waiting
	})
	if err := req.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || res.r.ParksClosed != 1 || res.r.RetriesCancelled != 1 {
		t.Fatalf("remove racing a retry request: %+v, %v; want the park closed and the request committed in the gap cancelled", res.r, res.err)
	}
	if pk, err := projection.ParkByID(e.ctx, e.store, parked.ID); err != nil || pk.Status != projection.ParkDiscarded || pk.RetryRequestedAt != nil {
		t.Fatalf("park: %+v, %v", pk, err)
	}
}

// Removing one instance's shard closes that shard's parks alone; removing
// the consumer closes the rest, a rebuild's shadow's and a partition's
// included, and so do open parks an earlier release's removal left
// without a shard. With neither a shard nor an open park, the consumer is
// not found.
func TestRemoveConsumerParksByInstance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	admin := projection.NewAdmin(e.store)
	park := func(instance, stream string) int64 {
		var id int64
		if err := e.store.Pool().QueryRow(e.ctx, `INSERT INTO `+e.table("projector_parks")+`
			(consumer, instance_id, tenant_id, stream_type, stream_id, event_id, event_type, version, error, attempts)
			VALUES ('rm', $1, '', 'ticket', $2, $3, 'ticket.opened', 1, 'x', 2) RETURNING id`, instance, stream, uuid.New()).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	pod, shadow, part := park("pod-1", "a"), park(projection.RebuildInstance, "b"), park(projection.PartitionInstance(0, 2), "c")
	e.exec(`INSERT INTO ` + e.table("projector_consumers") + ` (name, instance_id) VALUES ('rm', 'pod-1'), ('rm', 'pod-2')`)

	r, err := admin.RemoveAs(e.ctx, "rm", "pod-1", "alice")
	if err != nil || len(r.Shards) != 1 || r.ParksClosed != 1 {
		t.Fatalf("remove --instance pod-1: %+v, %v; want its shard and its one park", r, err)
	}
	status := func(id int64) string {
		pk, err := projection.ParkByID(e.ctx, e.store, id)
		if err != nil {
			t.Fatal(err)
		}
		return pk.Status
	}
	if status(pod) != projection.ParkDiscarded || status(shadow) != projection.ParkOpen || status(part) != projection.ParkOpen {
		t.Fatalf("after removing pod-1: %s %s %s; want only pod-1's park discarded", status(pod), status(shadow), status(part))
	}
	r, err = admin.RemoveAs(e.ctx, "rm", "", "alice")
	if err != nil || len(r.Shards) != 1 || r.ParksClosed != 2 {
		t.Fatalf("remove: %+v, %v; want pod-2's shard and the shadow's and partition's parks", r, err)
	}
	// Left by an earlier release's removal: a park with no shard.
	orphan := park(projection.SharedInstance, "d")
	r, err = admin.RemoveAs(e.ctx, "rm", "", "alice")
	if err != nil || len(r.Shards) != 0 || r.ParksClosed != 1 || status(orphan) != projection.ParkDiscarded {
		t.Fatalf("remove of parks with no shard: %+v, %v", r, err)
	}
	if _, err := admin.RemoveAs(e.ctx, "rm", "", "alice"); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("remove with nothing left: %v; want not found", err)
	}
	if _, err := admin.RemoveAs(context.Background(), "rm", "", ""); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("remove by nobody: %v; want it refused", err)
	}
	// A name that fits alone but not with the suffix the closed parks
	// record: refused, the reason would be cut where it is printed.
	long := strings.Repeat("a", projector.MaxNameLength-len(projection.RemovedBy)+1)
	if _, err := admin.RemoveAs(context.Background(), "rm", "", long); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("remove by a %d-byte name: %v; want it refused", len(long), err)
	}
}
